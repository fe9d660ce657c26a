"""No single member removes another; cheap checks come before signatures; replays stay refused
for as long as operations stay valid (issue 20, findings 3, 7 and 10)."""

from __future__ import annotations

import dataclasses

from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import OpKind
from chaosp2p.protocols.negotiation.configuration_change import check_operation, next_configuration
from chaosp2p.protocols.negotiation.messages import Accept, Ballot, OpsAnnounce, Sync, Value
from chaosp2p.protocols.negotiation.operations import PROTOCOL, SignatureCache, op_id, sign_operation
from chaosp2p.protocols.negotiation.run_configuration import EVIDENCE_MAX_AGE_EPOCHS, MAX_OP_AGE_EPOCHS

from .test_negotiation_machine import CFG, RUN, conf, make_net, report_all, roles

IDS = {}


def identity(net, peer):  # type: ignore[no-untyped-def]
    return net.machines[peer].identity


def fail_op(net, signer, subject, *, epoch=None, **extra):  # type: ignore[no-untyped-def]
    config = conf(net, signer)
    return sign_operation(
        identity(net, signer),
        kind=OpKind.FAIL,
        run=RUN,
        epoch=config.epoch if epoch is None else epoch,
        subject=subject,
        incarnation=config.incarnation_of(subject) or 0,
        detected_at=1.0,
        **extra,
    )


def test_one_members_fail_removes_nobody() -> None:
    """Issue 20, finding 3: a FAIL needed no evidence -- one member's signature removed a live
    member. Now a FAIL takes effect only with FAIL_SIGNERS (2) distinct members' first-hand FAILs."""
    net, peers = make_net(4)
    liar, victim = peers[1], peers[2]
    before = conf(net, peers[0])
    # The liar claims the victim failed, with a huge observed incarnation (the staleness check used it).
    forged = fail_op(net, liar, victim, observed_incarnation=10**9)
    for p in peers:
        if p != liar:
            net.call(
                p,
                lambda m, now: m.receive(now, liar, PROTOCOL, OpsAnnounce(run=RUN, epoch=before.epoch, ops=(forged,))),
            )
    net.call(liar, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 10**9))
    net.advance(2.0)
    assert conf(net, peers[0]).has_member(victim)
    assert {conf(net, p).digest for p in peers} == {conf(net, peers[0]).digest}
    # As the proposer, the liar cannot get a lone FAIL accepted either: the value is refused.
    config = conf(net, peers[0])
    lone = fail_op(net, liar, victim)
    value = Value(ops=(lone,), activation_step=config.activation_step)
    accept = Accept(run=RUN, epoch=config.epoch + 1, ballot=Ballot(round=50, proposer=liar), value=value)
    m = net.machines[peers[0]]
    m.receive(net.now, liar, PROTOCOL, accept)
    assert dict(m.statistics().rejected_by_reason).get("bad_value", 0) >= 1
    # And a committed value with a lone FAIL would change nothing (the rule is in next_configuration).
    new, results = next_configuration(config, [(op_id(lone), lone)], config.activation_step)
    assert new.has_member(victim) and not any(r.applied for r in results)


def test_two_first_hand_observers_remove_a_crashed_member_fast() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    victim = others[0]
    report_all(net, peers, entered=3, completed=2)
    net.crashed.add(victim)
    start = net.now
    for p in peers:
        if p != victim:
            net.call(p, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver()
    assert net.now == start  # decided without any timer
    final = conf(net, coord)
    assert not final.has_member(victim)
    failing = [op for _, _, m in net.delivered if isinstance(m, Accept) for op in m.value.ops]
    assert len({op.origin for op in failing if op.kind is OpKind.FAIL}) >= 2


def test_in_a_run_of_three_a_lone_fail_does_nothing() -> None:
    net, peers = make_net(3)
    config = conf(net, peers[0])
    lone = fail_op(net, peers[0], peers[1])
    assert check_operation(lone, config) is None
    # n = 3: a lone FAIL does nothing; with two members only one other can ever sign.
    new, _ = next_configuration(config, [(op_id(lone), lone)], config.activation_step)
    assert new.has_member(peers[1])
    two = dataclasses.replace(config)  # the rule is per configuration size: see fail_signers_needed
    from chaosp2p.protocols.negotiation.configuration_change import fail_signers_needed

    assert fail_signers_needed(two, peers[1]) == 2


def test_non_members_operations_are_refused_before_any_signature_check() -> None:
    """Issue 20, finding 7: operations from non-members got an Ed25519 check before the cheap
    checks, and a failed check was not remembered (the same forged op cost a verification again)."""
    net, peers = make_net(3, extra=1)
    a, b, _, outsider = peers
    m = net.machines[a]
    epoch = conf(net, a).epoch
    garbage = dataclasses.replace(fail_op(net, b, peers[2]), signature=bytes(64))
    before = m.statistics().signature_verifications
    for _ in range(5):
        m.receive(net.now, outsider, PROTOCOL, OpsAnnounce(run=RUN, epoch=epoch, ops=(garbage,)))
    assert m.statistics().signature_verifications == before  # not even looked at
    # From a member: verified once, then refused from the negative cache.
    for _ in range(5):
        m.receive(net.now, b, PROTOCOL, OpsAnnounce(run=RUN, epoch=epoch, ops=(garbage,)))
    assert m.statistics().signature_verifications == before + 1
    rejected = dict(m.statistics().rejected_by_reason)
    assert rejected.get("not_member", 0) >= 5 and rejected.get("bad_signature", 0) == 5


def test_the_signature_cache_remembers_failures() -> None:
    net, peers = make_net(2)
    good = fail_op(net, peers[0], peers[1])
    bad = dataclasses.replace(good, signature=bytes(63) + b"\x01")
    cache = SignatureCache(16)
    assert cache.check(bad) is None and cache.check(bad) is None
    assert cache.verifications == 1 and cache.rejected_cached == 1
    assert cache.check(good) is not None


def test_committed_operations_are_remembered_as_long_as_they_stay_valid() -> None:
    """Issue 20, finding 10: committed op ids were forgotten after max_history (64) epochs while
    operations stay valid for MAX_OP_AGE_EPOCHS (256): a replay in between passed as new."""
    config = dataclasses.replace(CFG, max_history=4)
    net, peers = make_net(3, config=config)
    a, b, c = peers
    op = sign_operation(
        identity(net, b),
        kind=OpKind.THROUGHPUT,
        run=RUN,
        epoch=conf(net, a).epoch,
        subject=b,
        incarnation=conf(net, a).incarnation_of(b) or 0,
        detected_at=1.0,
        throughput_samples_per_s=50.0,
    )
    net.call(b, lambda m, now: m.receive(now, c, PROTOCOL, OpsAnnounce(run=RUN, epoch=op.epoch, ops=(op,))))
    net.advance(0.5)
    assert conf(net, a).throughputs[conf(net, a).index_of(b)] == 50.0
    for i in range(8):  # many more epochs than the history holds
        net.call(c, lambda m, now, r=float(i + 2): m.set_throughput(now, RUN, r * 10))
        net.advance(0.5)
    net.call(b, lambda m, now: m.set_throughput(now, RUN, 3.0))
    net.advance(0.5)
    assert conf(net, a).epoch - op.epoch < MAX_OP_AGE_EPOCHS
    assert check_operation(op, conf(net, a)) is None  # still valid by the rule...
    m = net.machines[a]
    m.receive(net.now, c, PROTOCOL, OpsAnnounce(run=RUN, epoch=conf(net, a).epoch, ops=(op,)))
    assert dict(m.statistics().rejected_by_reason).get("replayed") == 1  # ...but known as committed
    assert m.run_status(RUN).pending == ()


def test_failure_and_eviction_evidence_expires() -> None:
    """Issue 20, finding 10: pending EVICT (and FAIL) evidence stayed valid for 256 epochs, so
    observations many changes apart added up to a removal."""
    net, peers = make_net(3)
    config = conf(net, peers[0])
    old_epoch = config.epoch
    evict = sign_operation(
        identity(net, peers[0]),
        kind=OpKind.EVICT,
        run=RUN,
        epoch=old_epoch,
        subject=peers[1],
        incarnation=config.incarnation_of(peers[1]) or 0,
        detected_at=1.0,
    )
    later = dataclasses.replace(config, epoch=old_epoch + EVIDENCE_MAX_AGE_EPOCHS + 1)
    assert check_operation(evict, config) is None
    assert check_operation(evict, later) == "too_old"
    assert check_operation(fail_op(net, peers[0], peers[1]), later) == "too_old"


def test_a_member_told_of_a_failure_checks_the_subject_itself() -> None:
    # The failover path stays fast: one observer's FAIL makes the others check the subject at once
    # (a SYNC to it); a member whose driver cannot reach it signs its own FAIL, the second signer.
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    victim, helper = others[0], others[1]
    report_all(net, peers, entered=3, completed=2)
    net.crashed.add(victim)
    net.call(coord, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver()
    assert conf(net, coord).has_member(victim)  # one signer: nothing yet
    checked = [s for s, out in net.queue if out.to == victim] + [s for s, r, m in net.delivered if r == victim]
    assert helper in checked or victim.raw in net.machines[helper]._fail_hints
    net.call(helper, lambda m, now: m.peer_unreachable(now, victim))  # its SYNC found nobody
    net.deliver()
    assert not conf(net, coord).has_member(victim)
    assert {conf(net, p).digest for p in peers if p != victim} == {conf(net, coord).digest}


def test_a_live_subject_answering_is_not_failed() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    victim, helper = others[0], others[1]
    report_all(net, peers, entered=3, completed=2)
    forged = fail_op(net, coord, victim)
    net.call(
        helper, lambda m, now: m.receive(now, coord, PROTOCOL, OpsAnnounce(run=RUN, epoch=forged.epoch, ops=(forged,)))
    )
    assert net.machines[helper]._fail_hints
    net.call(helper, lambda m, now: m.receive(now, victim, PROTOCOL, Sync(run=RUN, epoch=0, digest=bytes(32))))
    net.call(helper, lambda m, now: m.peer_unreachable(now, victim))  # a late, stale report
    assert net.machines[helper].run_status(RUN).pending == ()
