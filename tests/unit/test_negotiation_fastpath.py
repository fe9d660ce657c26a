"""Latency changes of the negotiation machine: who proposes when, and who announces what.

Each test shows the message or round a change saves (it fails on the code before the change) and
that the outcome -- the decided configuration -- is the one the slower path reached.
"""

from __future__ import annotations

from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import ProposerPhase, ResyncNeeded, RunState
from chaosp2p.protocols.negotiation.messages import Accept, Accepted, OpsAnnounce, Prepare
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.identity import PeerID
from tests.unit.test_negotiation_machine import CFG, RUN, conf, make_net, of_type, report_all, roles, state


def queued(net: ManualNet, sender: PeerID, kind: type) -> list[object]:
    return [out.message for s, out in net.queue if s == sender and isinstance(out.message, kind)]


def fail_accepted_unanswered(n: int) -> tuple[ManualNet, PeerID, PeerID, list[PeerID]]:
    """A run of ``n`` at step 3 whose member ``victim`` crashed: one observer saw it first and
    announced its FAIL; the coordinator, seeing it second (a FAIL needs two signers), proposed both
    at once (round 0); the ACCEPT reached every observer, whose answers are lost for now.
    (net, coordinator, victim, the observers but the first)."""
    net, peers = make_net(n)
    coord, others = roles(net, peers)
    victim, first, observers = others[0], others[1], list(others[2:])
    report_all(net, peers, entered=3, completed=2)
    net.crashed.add(victim)
    net.call(first, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver()
    net.call(coord, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver(drop=lambda s, r, m: isinstance(m, Accepted))
    return net, coord, victim, observers


def test_a_member_that_accepted_a_fail_holds_its_own_announcement() -> None:
    net, coord, victim, observers = fail_accepted_unanswered(8)
    for p in observers:
        assert state(net, p) is RunState.GATED
    # The coordinator announced its FAIL to the announce_fanout best proposers only: the others
    # hold none pending, and would each raise and announce their own (one signature check each
    # at the proposer). They raise it, but none announces it.
    unaware = [p for p in observers if not net.machines[p].run_status(RUN).pending]
    assert unaware
    for p in observers:
        net.call(p, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
        assert queued(net, p, OpsAnnounce) == []
        assert net.machines[p].run_status(RUN).pending  # kept pending, not forgotten
    net.advance(1.0)  # the coordinator retries phase 2 and decides
    final = conf(net, coord)
    assert not final.has_member(victim) and final.activation_step == 3
    for p in observers:
        assert conf(net, p).digest == final.digest
        assert not net.machines[p].run_status(RUN).pending  # the commit made the held FAILs void


def test_held_fail_announcements_still_decide_when_the_proposer_dies() -> None:
    # Six members: two crashes leave four, a quorum of six (of five, they would not be: an odd run
    # needs a majority + 1, so that two quorums share two members, spec section 9).
    net, coord, victim, observers = fail_accepted_unanswered(6)
    for p in observers:
        net.call(p, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    # The coordinator dies before deciding: the held FAILs must not be lost.
    net.crashed.add(coord)
    for p in observers:
        net.call(p, lambda m, now: m.observe_member(now, coord, MemberState.FAILED, 0))
    net.advance(3.0)
    digests = {conf(net, p).digest for p in observers}
    assert len(digests) == 1
    final = conf(net, observers[0])
    assert not final.has_member(victim) and not final.has_member(coord) and len(final) == 4


def test_the_failed_subject_counts_towards_the_restart_threshold() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    victim, follower, ahead = others
    # The coordinator's fast value (S = its completed + 1 = 7) reaches a member that completed 7
    # already: it refuses. With the victim unable ever to accept, the value cannot reach a quorum
    # (3 of 4) at this ballot: the coordinator restarts phase 1 at once instead of after
    # phase_timeout_s, re-proposes the value as adopted, and everyone accepts it.
    for p in (coord, follower):
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=7, completed=6))
    net.call(ahead, lambda m, now: m.report_step(now, RUN, entered=8, completed=7))
    net.crashed.add(victim)
    start, seen = net.now, len(net.delivered)
    for p in (coord, follower, ahead):
        net.call(p, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver()
    assert net.now == start  # no timer fired
    final = conf(net, coord)
    assert not final.has_member(victim) and final.activation_step == 7
    assert {conf(net, p).digest for p in (coord, follower, ahead)} == {final.digest}
    assert [e.step for e in of_type(net.take(ahead), ResyncNeeded)] == [7]
    assert net.machines[coord].run_status(RUN).proposer is ProposerPhase.IDLE
    assert any(isinstance(m, Prepare) for _, _, m in net.delivered[seen:])  # one phase-1 round, no timeout


def test_an_adopted_value_does_not_count_its_subject_as_a_refuser() -> None:
    # The subject of an adopted value's FAIL accepts it (it is not refused for that): restarting
    # because of it would throw away a ballot that can still win.
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    victim = others[0]
    machine = net.machines[coord]
    report_all(net, peers, entered=3, completed=2)
    # A second observer's FAIL reaches the coordinator first (a FAIL needs two signers).
    net.call(others[1], lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver(drop=lambda s, r, m: r != coord)
    net.call(coord, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    rec = machine._runs[RUN]
    assert rec.proposer.phase is ProposerPhase.ACCEPTING
    assert machine._silent_subjects(rec) == 1
    rec.proposer.adopted = True
    assert machine._silent_subjects(rec) == 0
    assert queued(net, coord, Accept)


def test_a_leaving_coordinator_proposes_its_own_leave_at_round_0() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    report_all(net, peers, entered=5, completed=4)
    # The leaver is a live member until its LEAVE commits: as the coordinator it proposes it at
    # round 0 (no PREPARE/PROMISE round, no backoff), instead of the next member running phase 1.
    net.call(coord, lambda m, now: m.leave(now, RUN))
    assert [m.ballot.round for m in queued(net, coord, Accept)] == [0] * len(others)  # type: ignore[attr-defined]
    start, seen = net.now, len(net.delivered)
    net.deliver()
    assert net.now == start
    assert not any(isinstance(m, Prepare) for _, _, m in net.delivered[seen:])
    final = conf(net, others[0])
    assert not final.has_member(coord) and len(final) == 3
    assert {conf(net, p).digest for p in peers} == {final.digest}
    assert state(net, coord) is RunState.REMOVED


def test_members_rank_a_leaving_coordinator_first_and_other_leavers_last() -> None:
    net, peers = make_net(5)
    coord, others = roles(net, peers)
    report_all(net, peers, entered=5, completed=4)
    leaver = others[0]
    net.call(coord, lambda m, now: m.leave(now, RUN))
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    observer = others[1]
    machine = net.machines[observer]
    net.deliver(drop=lambda s, r, m: not isinstance(m, OpsAnnounce))  # only the announcements
    rec = machine._runs[RUN]
    ranked = machine._ranked(rec, 5, skip_self=True)
    assert ranked[0] == coord and leaver not in ranked


def test_accepts_go_to_the_backup_proposers_first() -> None:
    net, peers = make_net(8)
    coord, others = roles(net, peers)
    report_all(net, peers, entered=5, completed=4)
    for rate in (2.0, 3.0, 4.0, 5.0):
        # An epoch whose proposer order is not the member order (else the test would show nothing).
        coord, others = roles(net, peers)
        machine = net.machines[coord]
        backups = machine._ranked(machine._runs[RUN], CFG.announce_fanout + 1, skip_self=True)
        if backups != sorted(others, key=lambda p: p.raw)[: len(backups)]:
            break
        net.call(others[0], lambda m, now, r=rate: m.set_throughput(now, RUN, r))
        net.deliver()
    else:
        raise AssertionError("no epoch with a rotated proposer order")
    net.call(coord, lambda m, now: m.set_throughput(now, RUN, 7.0))
    order = [out.to for s, out in net.queue if s == coord and isinstance(out.message, Accept)]
    assert sorted(order, key=lambda p: p.raw) == sorted(others, key=lambda p: p.raw)
    assert order[: len(backups)] == backups
    net.deliver()
    final = conf(net, coord)
    assert final.throughputs[final.index_of(coord)] == 7.0


def test_prepares_go_to_the_backup_proposers_first() -> None:
    net, peers = make_net(8)
    report_all(net, peers, entered=5, completed=4)
    coord, others = roles(net, peers)
    members = sorted(peers, key=lambda p: p.raw)
    assert coord != members[0]  # the proposer order is rotated (else the test would show nothing)
    proposer = others[0]
    machine = net.machines[proposer]
    rec = machine._runs[RUN]
    machine.set_throughput(net.now, RUN, 9.0)
    machine.take_outgoing()
    machine._start_proposal(net.now, rec, fast=False)  # phase 1, as after its backoff
    backups = machine._ranked(rec, CFG.announce_fanout + 1, skip_self=True)
    assert backups[0] == coord
    order = [out.to for out in machine.take_outgoing() if isinstance(out.message, Prepare)]
    assert sorted(order, key=lambda p: p.raw) == [p for p in members if p != proposer]
    assert order[: len(backups)] == backups
