"""EVICT: a member whose contributions keep failing checks is removed by a quorum of members.

The rules (protocols/negotiation.md section 3): any other member of the configuration may sign an
EVICT of a member at its exact incarnation; it takes effect only when EVICTs of that subject and
incarnation from a quorum of distinct members are committed together; the subject cannot refute it
(not by refusing the value, not by a JOIN at a higher incarnation or its own LEAVE in the batch).
"""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.protocols.negotiation import (
    ConfigurationCommitted,
    OperationCommitted,
    OpKind,
    RemovedFromRun,
    RunParams,
)
from chaosp2p.protocols.negotiation.configuration_change import (
    check_operation,
    eviction_cap,
    evictions,
    next_configuration,
)
from chaosp2p.protocols.negotiation.messages import OpsAnnounce, Prepare, RefusePast
from chaosp2p.protocols.negotiation.operations import Operation, SignatureCache, op_id, sign_operation
from chaosp2p.protocols.negotiation.run_configuration import Configuration, make_configuration
from chaosp2p.wire.identity import Identity

from .test_negotiation_machine import RUN, conf, make_net, of_type, report_all, roles

IDS = [Identity.from_seed(bytes([40 + i]) * 32) for i in range(6)]
OUTSIDER = Identity.from_seed(bytes([99]) * 32)


def config_of(n: int) -> Configuration:
    members = sorted(IDS[:n], key=lambda i: i.peer_id.raw)
    return make_configuration(
        run=RUN,
        epoch=3,
        activation_step=10,
        peers=[i.peer_id for i in members],
        incarnations=[2] * n,
        throughputs=[1.0] * n,
        links=(),
        params=RunParams(global_batch=60),
        seed=7,
    )


def evict(signer: Identity, subject: Identity, *, incarnation: int = 2, at: float = 1.0) -> Operation:
    return sign_operation(
        signer, kind=OpKind.EVICT, run=RUN, epoch=3, subject=subject.peer_id, incarnation=incarnation, detected_at=at
    )


def with_ids(*ops: Operation) -> list[tuple[bytes, Operation]]:
    return [(op_id(op), op) for op in ops]


# ================================================================================== pure rules
def test_who_may_sign_an_evict() -> None:
    config = config_of(3)
    a, b, c = IDS[:3]
    assert check_operation(evict(a, c), config) is None
    assert check_operation(evict(c, c), config) == "forged_origin"  # not about itself
    assert check_operation(evict(OUTSIDER, c), config) == "forged_origin"  # only members sign
    assert check_operation(evict(a, OUTSIDER), config) == "subject_not_member"
    assert check_operation(evict(a, c, incarnation=1), config) == "stale_incarnation"
    assert check_operation(evict(a, c, incarnation=3), config) == "stale_incarnation"  # exactly its incarnation
    assert check_operation(dataclasses.replace(evict(a, b), epoch=4), config) == "future_epoch"


@pytest.mark.parametrize(("n", "need"), [(3, 2), (4, 3), (5, 4), (6, 4)])
def test_one_signer_is_not_enough_a_quorum_is(n: int, need: int) -> None:
    config = config_of(n)
    subject, others = IDS[0], IDS[1:n]
    assert config.quorum == need
    short = [evict(s, subject) for s in others[: need - 1]]
    # Repeating a signer (a new detection time is a new operation) does not add a signer.
    repeated = [*short, *(evict(s, subject, at=2.0) for s in others[: need - 1])]
    for batch in (short[:1], short, repeated):
        assert evictions(config, with_ids(*batch)) == frozenset()
        new, results = next_configuration(config, with_ids(*batch), 12)
        assert new.peers == config.peers and new.departed == ()
        assert len(results) == len(batch) and not any(r.applied for r in results)
    enough = [*short, evict(others[need - 1], subject)]
    assert evictions(config, with_ids(*enough)) == {subject.peer_id.raw}
    new, results = next_configuration(config, with_ids(*enough), 12)
    assert not new.has_member(subject.peer_id) and len(new) == n - 1
    gone = new.departed_entry(subject.peer_id)
    assert gone is not None and (gone.incarnation, gone.activation_step) == (2, 12)
    assert sum(r.applied for r in results) == 1  # the first removes; the others find it gone


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_one_change_never_evicts_more_than_leaves_a_quorum(n: int) -> None:
    # Signatures enough to evict every member (each by all the others) used to commit an empty
    # configuration (found by the property test). One change evicts at most n - quorum members,
    # the lowest raw ids; the other subjects' EVICTs are dropped and may be committed later.
    config = config_of(n)
    members = sorted(IDS[:n], key=lambda i: i.peer_id.raw)
    batch = [evict(s, subject) for subject in members for s in members if s is not subject]
    cap = eviction_cap(config)
    assert cap == n - config.quorum
    evicted = evictions(config, with_ids(*batch))
    assert evicted == {m.peer_id.raw for m in members[:cap]}
    new, results = next_configuration(config, with_ids(*batch), 12)
    assert len(new) == n - cap >= config.quorum
    assert [p.raw for p in new.peers] == [m.peer_id.raw for m in members[cap:]]
    applied = [r.op.subject.raw for r in results if r.applied]
    assert sorted(applied) == sorted(evicted)  # one applied EVICT per evicted subject
    assert len(results) == len(batch)  # every other EVICT is reported, not applied


def test_the_subject_cannot_refute_an_eviction_in_the_same_batch() -> None:
    config = config_of(3)
    a, b, c = IDS[:3]
    rejoin = sign_operation(
        c,
        kind=OpKind.JOIN,
        run=RUN,
        epoch=3,
        subject=c.peer_id,
        incarnation=9,
        detected_at=1.0,
        throughput_samples_per_s=5.0,
    )
    leave = sign_operation(c, kind=OpKind.LEAVE, run=RUN, epoch=3, subject=c.peer_id, incarnation=2, detected_at=1.0)
    rate = sign_operation(
        c,
        kind=OpKind.THROUGHPUT,
        run=RUN,
        epoch=3,
        subject=c.peer_id,
        incarnation=2,
        detected_at=1.0,
        throughput_samples_per_s=50.0,
    )
    for own in (rejoin, leave, rate):
        assert check_operation(own, config) is None
        new, results = next_configuration(config, with_ids(evict(a, c), evict(b, c), own), 12)
        assert not new.has_member(c.peer_id)
        outcome = {r.op.kind: r.applied for r in results if r.op.origin == c.peer_id}
        assert outcome == {own.kind: False}
    # Without a quorum the subject's own operation goes through as usual.
    new, _ = next_configuration(config, with_ids(evict(a, c), rejoin), 12)
    assert new.incarnation_of(c.peer_id) == 9


def test_a_tampered_evict_does_not_verify() -> None:
    a, c = IDS[0], IDS[2]
    good = evict(a, c)
    cache = SignatureCache(16)
    assert cache.check(good) == op_id(good)
    # Another signer's name on a's signature, or another subject under it: both fail.
    assert cache.check(dataclasses.replace(good, origin=IDS[1].peer_id)) is None
    assert cache.check(dataclasses.replace(good, subject=IDS[1].peer_id)) is None


# ================================================================================== the machine
@pytest.mark.parametrize("subject_role", ["coordinator", "other"])
def test_machines_evict_only_with_a_quorum_and_the_subject_cannot_refuse(subject_role: str) -> None:
    net, peers = make_net(3)
    coord, others = roles(net, peers)
    subject = coord if subject_role == "coordinator" else others[0]
    first, second = [p for p in peers if p != subject]
    report_all(net, peers, entered=5, completed=4)
    before = conf(net, first)

    assert net.call(first, lambda m, now: m.evict(now, RUN, subject)) is True
    assert net.call(first, lambda m, now: m.evict(now, RUN, subject)) is False  # already signed
    sent: list[object] = []
    net.deliver(drop=lambda s, r, m: bool(sent.append(m)))
    net.advance(2.0, drop=lambda s, r, m: bool(sent.append(m)))
    # One signer: nobody starts an instance, the configuration stays.
    assert not any(isinstance(m, Prepare) for m in sent)
    for p in peers:
        assert conf(net, p) == before
        net.take(p)

    assert net.call(second, lambda m, now: m.evict(now, RUN, subject)) is True
    refusals: list[object] = []
    net.deliver(drop=lambda s, r, m: bool(isinstance(m, RefusePast) and refusals.append(m)))
    net.advance(2.0)
    assert refusals == []  # the subject accepted its own eviction (it has no say)
    after = conf(net, first)
    assert after.epoch == before.epoch + 1 and not after.has_member(subject)
    assert conf(net, second) == after
    evicts = [e for e in of_type(net.take(first), OperationCommitted) if e.kind is OpKind.EVICT]
    assert {e.origin for e in evicts} == {first, second} and sum(e.applied for e in evicts) == 1
    subject_events = net.take(subject)
    assert [(r.reason, r.activation_step) for r in of_type(subject_events, RemovedFromRun)] == [
        ("evicted", after.activation_step)
    ]
    assert of_type(subject_events, ConfigurationCommitted)[-1].configuration == after


def test_members_reject_forged_and_outsider_evicts() -> None:
    net, peers = make_net(3, extra=1)
    coord, others = roles(net, peers[:3])
    outsider = net.machines[peers[3]].identity
    victim = net.machines[others[0]].identity
    config = conf(net, coord)
    held = config.incarnation_of(victim.peer_id)
    assert held is not None

    def op(signer: Identity, **changes: object) -> Operation:
        signed = sign_operation(
            signer,
            kind=OpKind.EVICT,
            run=RUN,
            epoch=config.epoch,
            subject=victim.peer_id,
            incarnation=held,
            detected_at=1.0,
        )
        return dataclasses.replace(signed, **changes)  # type: ignore[arg-type]

    member = net.machines[others[1]].identity
    bad = [
        op(outsider),  # not a member
        op(outsider, origin=member.peer_id),  # a member's name, the outsider's signature
        op(victim),  # about itself
        op(member, incarnation=held + 1),  # signature no longer covers the content
    ]
    before = dict(net.machines[coord].statistics().rejected_by_reason)
    announce = OpsAnnounce(run=RUN, epoch=config.epoch, ops=tuple(bad))
    # Relayed by a member (an outsider's messages about the run are not even read).
    net.call(coord, lambda m, now: m.receive(now, member.peer_id, "negotiation", announce))
    net.advance(2.0)
    after = dict(net.machines[coord].statistics().rejected_by_reason)
    gained = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    # The deterministic rule is checked before the signature (issue 20, finding 7): the changed
    # incarnation is refused as stale without a verification.
    assert gained.get("bad_signature") == 1 and gained.get("forged_origin") == 2
    assert gained.get("stale_incarnation") == 1
    assert conf(net, coord) == config
    assert net.machines[coord].run_status(RUN).pending == ()
