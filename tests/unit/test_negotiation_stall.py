"""STALL: a member that sent nothing to the others' rounds is removed by two members that waited on it.

The rules (protocols/negotiation.md section 3c, issue 19): any other member of the configuration
may sign a STALL of a present member at its incarnation (or a later one); STALLs count with FAILs,
one per signer and subject, and remove their subject only with FAIL_SIGNERS (2) distinct signers
-- so no member alone removes a live, contributing one; a batch with one is urgent (the others
redo the stuck step); unlike a FAIL, a STALL does not lapse when the subject is heard from (an
idle member is alive).
"""

from __future__ import annotations

import dataclasses

from chaosp2p.protocols.negotiation import ConfigurationCommitted, OperationCommitted, OpKind, RemovedFromRun
from chaosp2p.protocols.negotiation.configuration_change import check_operation, failures, next_configuration
from chaosp2p.protocols.negotiation.messages import Prepare
from chaosp2p.protocols.negotiation.operations import KIND_ORDER, Operation, apply_order, sign_operation
from chaosp2p.protocols.negotiation.paxos import is_urgent
from chaosp2p.wire.identity import Identity

from .test_negotiation_evict import IDS, OUTSIDER, config_of, with_ids
from .test_negotiation_machine import RUN, conf, make_net, of_type, report_all, roles


def stall(
    signer: Identity, subject: Identity, *, incarnation: int = 2, at: float = 1.0, kind: OpKind = OpKind.STALL
) -> Operation:
    return sign_operation(
        signer,
        kind=kind,
        run=RUN,
        epoch=3,
        subject=subject.peer_id,
        incarnation=incarnation,
        detected_at=at,
    )


# ================================================================================== pure rules
def test_the_kind_is_appended_and_ordered_right_after_fail() -> None:
    assert OpKind.STALL == 7 and [k.value for k in OpKind] == list(range(8))  # append-only
    assert sorted(OpKind, key=KIND_ORDER.__getitem__)[:3] == [OpKind.FAIL, OpKind.STALL, OpKind.EVICT]


def test_who_may_sign_a_stall() -> None:
    config = config_of(3)
    a, b, c = IDS[:3]
    assert check_operation(stall(a, c), config) is None
    assert check_operation(stall(a, c, incarnation=3), config) is None  # like a FAIL: at or above
    assert check_operation(stall(c, c), config) == "forged_origin"  # never about itself
    assert check_operation(stall(OUTSIDER, c), config) == "forged_origin"  # only members sign
    assert check_operation(stall(a, OUTSIDER), config) == "subject_not_member"
    assert check_operation(stall(a, c, incarnation=1), config) == "stale_incarnation"
    assert check_operation(dataclasses.replace(stall(a, b), epoch=4), config) == "future_epoch"
    new, _ = next_configuration(config, with_ids(stall(a, c), stall(b, c)), 12)
    # A departed member cannot be stalled (unlike a FAIL, which settles a leaver that died).
    later = sign_operation(
        a, kind=OpKind.STALL, run=RUN, epoch=new.epoch, subject=c.peer_id, incarnation=2, detected_at=2.0
    )
    assert check_operation(later, new) == "subject_not_member"


def test_one_member_alone_removes_nobody_two_do_and_the_batch_is_urgent() -> None:
    config = config_of(4)
    a, b, _, d = IDS[:4]
    for batch in ([stall(a, d)], [stall(a, d), stall(a, d, at=2.0)]):  # one signer, twice
        assert failures(config, with_ids(*batch)) == frozenset()
        new, results = next_configuration(config, with_ids(*batch), 12)
        assert new.peers == config.peers and not any(r.applied for r in results)
    for batch in ([stall(a, d), stall(b, d)], [stall(a, d), stall(b, d, kind=OpKind.FAIL)]):
        assert failures(config, with_ids(*batch)) == {d.peer_id.raw}
        assert is_urgent(op for _, op in with_ids(*batch))
        new, results = next_configuration(config, with_ids(*batch), 12)
        assert not new.has_member(d.peer_id) and len(new) == 3
        gone = new.departed_entry(d.peer_id)
        assert gone is not None and gone.activation_step == 12
        assert sum(r.applied for r in results) == 1
    # The subject's own JOIN at the same incarnation or its THROUGHPUT in the batch give way.
    ordered, _ = apply_order(with_ids(stall(a, d), stall(b, d)))
    assert [op.kind for _, op in ordered] == [OpKind.STALL, OpKind.STALL]


# ================================================================================== the machine
def test_machines_remove_a_stalled_member_with_two_signers_even_while_it_is_heard_from() -> None:
    net, peers = make_net(3)
    _, others = roles(net, peers)
    subject = others[0]  # not the coordinator
    first, second = [p for p in peers if p != subject]
    report_all(net, peers, entered=5, completed=4)
    before = conf(net, first)

    assert net.call(first, lambda m, now: m.stall(now, RUN, subject)) is True
    assert net.call(first, lambda m, now: m.stall(now, RUN, subject)) is False  # already signed
    assert net.call(first, lambda m, now: m.stall(now, RUN, first)) is False  # never itself
    sent: list[object] = []
    net.deliver(drop=lambda s, r, m: bool(sent.append(m)))
    # Several sync intervals: the subject is alive and talks (its SYNCs), yet the STALL stays
    # pending (a FAIL would lapse): an idle member is alive, and still does not contribute.
    net.advance(5.0, drop=lambda s, r, m: bool(sent.append(m)))
    assert any(s for s in sent)
    assert not any(isinstance(m, Prepare) for m in sent)  # one signer starts no instance
    for p in peers:
        assert conf(net, p) == before
        net.take(p)
    pending = net.machines[first].run_status(RUN).pending
    assert [(op.kind, op.subject) for op in pending] == [(OpKind.STALL, subject)]

    assert net.call(second, lambda m, now: m.stall(now, RUN, subject)) is True
    net.deliver()
    net.advance(2.0)
    after = conf(net, first)
    assert after.epoch == before.epoch + 1 and not after.has_member(subject)
    assert conf(net, second) == after
    assert after.activation_step == 5  # urgent: the first step nobody completed, redone without it
    stalls = [e for e in of_type(net.take(first), OperationCommitted) if e.kind is OpKind.STALL]
    assert {e.origin for e in stalls} == {first, second} and sum(e.applied for e in stalls) == 1
    subject_events = net.take(subject)
    assert [r.reason for r in of_type(subject_events, RemovedFromRun)] == ["stalled"]
    assert of_type(subject_events, ConfigurationCommitted)[-1].configuration == after


def test_a_stall_of_a_peer_outside_the_run_signs_nothing() -> None:
    net, peers = make_net(3, extra=1)
    assert net.call(peers[0], lambda m, now: m.stall(now, RUN, peers[3])) is False
    assert net.machines[peers[0]].run_status(RUN).pending == ()


def test_no_stall_is_signed_while_a_change_is_being_decided_here() -> None:
    # Members that accepted a pending change may be gated at the very step: silent, not stalled.
    net, peers = make_net(3)
    _, others = roles(net, peers)
    leaver, subject = others[0], next(p for p in peers if p != others[0])
    report_all(net, peers, entered=5, completed=4)
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    assert net.machines[leaver].run_status(RUN).state.name == "NEGOTIATING"
    assert net.call(leaver, lambda m, now: m.stall(now, RUN, subject)) is False
    assert all(op.kind is not OpKind.STALL for op in net.machines[leaver].run_status(RUN).pending)
    net.deliver()
    net.advance(2.0)
    assert net.machines[leaver].run_status(RUN).state.name == "REMOVED"  # the leave went through
