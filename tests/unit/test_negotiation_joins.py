"""Joins whose admitting COMMIT is late, lost or stale (spec sections 6 and 9).

* The sponsor passes on the COMMIT that admits its newcomer: the proposer may hold no address for
  it yet (membership spreads it only over the next heartbeats), and it was then admitted only by
  its own retry, ``join_retry_s`` later.
* A newcomer admitted late, by a configuration already replaced, catches up at once and redoes
  nothing it should not; one admitted by its retry is handed the configuration that governs its
  first step (handing it only the newest left it with none for the steps before that
  configuration's activation step, which the members count on it for: the run stalled).
* A delayed or duplicated COMMIT of an earlier admission does not admit a peer that rejoins.
* Two newcomers asking a run of one at once are both admitted at once: the second is handed a
  configuration two epochs past its anchor and catches up from its sponsor (it used to wait for its
  retry: in the real-process test the members had STALLed it by then).
"""

from __future__ import annotations

import random

from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import (
    Admitted,
    NegotiationConfig,
    NegotiationMachine,
    RunParams,
    RunState,
)
from chaosp2p.protocols.negotiation.messages import Commit, JoinRequest, Sync, SyncReply
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

RUN = "r"
CFG = NegotiationConfig.local()


def make_net(n: int, extra: int = 1) -> tuple[ManualNet, list[PeerID], list[PeerID]]:
    """A run of ``n`` members that completed step 3 and entered 4, plus ``extra`` outsiders."""
    ids = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(n + extra)]
    net = ManualNet(
        NegotiationMachine(identity=i, config=CFG, rng=random.Random(k), now=0.0) for k, i in enumerate(ids)
    )
    peers = [i.peer_id for i in ids]
    net.call(peers[0], lambda m, now: m.create_run(now, RUN, params=RunParams(global_batch=120)))
    for p in peers[1:n]:
        net.call(p, lambda m, now: m.request_join(now, RUN, peers[0], incarnation=1, throughput=1.0))
        net.deliver()
    net.advance(0.05)
    for p in peers[:n]:
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=4, completed=3))
        net.take(p)
    return net, peers[:n], peers[n:]


def conf(net: ManualNet, peer: PeerID):  # type: ignore[no-untyped-def]
    config = net.machines[peer].configuration(RUN)
    assert config is not None
    return config


def state(net: ManualNet, peer: PeerID) -> RunState | None:
    return net.machines[peer].state_of(RUN)


def lead_of(net: ManualNet, members: list[PeerID]) -> PeerID:
    """The epoch's coordinator (it proposes at once)."""
    lead = coordinator(conf(net, members[0]))
    assert lead is not None
    return lead


def full_commit(message: Message) -> bool:
    return isinstance(message, Commit) and bool(message.configuration)


def test_the_sponsor_passes_on_the_admitting_commit_the_proposer_could_not_deliver() -> None:
    net, members, (newcomer,) = make_net(4)
    lead = lead_of(net, members)
    sponsor = next(p for p in members if p != lead)
    # The proposer cannot reach the newcomer: no address yet (what the real-process runs showed).
    unreachable = lambda s, r, m: s == lead and r == newcomer  # noqa: E731
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, sponsor, incarnation=1, throughput=1.0))
    net.deliver(unreachable)  # no time passes: the retry timer (join_retry_s) cannot be what admits it
    assert state(net, newcomer) is RunState.STABLE
    assert conf(net, newcomer).digest == conf(net, lead).digest
    passed = [(s, m) for s, r, m in net.delivered if r == newcomer and full_commit(m)]
    assert [s for s, _ in passed] == [sponsor]
    # Once admitted it is forgotten: the next commit is not passed on again.
    net.call(members[1], lambda m, now: m.set_throughput(now, RUN, 9.0))
    net.advance(0.5)
    assert conf(net, newcomer).digest == conf(net, lead).digest
    assert len([m for s, r, m in net.delivered if r == newcomer and full_commit(m)]) == 1


def test_the_sponsor_passes_on_an_admission_it_learned_in_a_catch_up() -> None:
    net, members, (newcomer,) = make_net(4)
    lead = lead_of(net, members)
    sponsor = next(p for p in members if p != lead)
    other = next(p for p in members if p not in (lead, sponsor))
    # Neither the proposer's COMMIT to the newcomer nor its COMMIT to the sponsor arrive (the
    # sponsor's was slower than a member's SYNC beacon, say).
    lost = lambda s, r, m: s == lead and r in (newcomer, sponsor) and isinstance(m, Commit)  # noqa: E731
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, sponsor, incarnation=1, throughput=1.0))
    net.deliver(lost)
    assert state(net, newcomer) is RunState.JOINING and conf(net, sponsor).epoch + 1 == conf(net, lead).epoch
    beacon = Sync(run=RUN, epoch=conf(net, other).epoch, digest=conf(net, other).digest)
    net.machines[sponsor].receive(net.now, other, "negotiation", beacon)
    net.deliver(lost)  # SYNC_REQUEST, SYNC_REPLY, the sponsor's copy: no time passes
    assert state(net, newcomer) is RunState.STABLE
    assert conf(net, newcomer).digest == conf(net, lead).digest == conf(net, sponsor).digest


def test_a_newcomer_admitted_by_a_replaced_configuration_catches_up_at_once() -> None:
    net, members, (newcomer,) = make_net(4)
    lead = lead_of(net, members)
    sponsor = next(p for p in members if p != lead)
    held: list[tuple[PeerID, Message]] = []

    def hold(s: PeerID, r: PeerID, m: Message) -> bool:
        if r == newcomer and isinstance(m, Commit):
            held.append((s, m))
            return True
        return False

    net.call(newcomer, lambda m, now: m.request_join(now, RUN, sponsor, incarnation=1, throughput=1.0))
    net.deliver(hold)
    admitting = conf(net, lead)
    since = admitting.since_steps[admitting.index_of(newcomer)]
    # The members go on (the newcomer is not an acceptor yet: a quorum decides without it).
    for p in members:
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=since, completed=since - 1))
    net.call(members[2], lambda m, now: m.set_throughput(now, RUN, 7.0))
    net.advance(0.1, hold)  # shorter than join_retry_s: the newcomer does not retry meanwhile
    newer = conf(net, lead)
    assert newer.epoch == admitting.epoch + 1 and state(net, newcomer) is RunState.JOINING
    # Now the sponsor's copy of the admitting COMMIT arrives, late.
    sender, late = next((s, m) for s, m in held if s == sponsor and full_commit(m))
    assert isinstance(late, Commit) and late.epoch == admitting.epoch
    net.machines[newcomer].receive(net.now, sender, "negotiation", late)
    net.deliver()  # no time passes: not the SYNC beacon
    assert conf(net, newcomer).digest == newer.digest
    machine = net.machines[newcomer]
    for step in range(since, newer.activation_step + 2):
        mine, theirs = machine.config_for_step(RUN, step), net.machines[lead].config_for_step(RUN, step)
        assert mine is not None and theirs is not None and mine.digest == theirs.digest


def test_a_newcomer_admitted_by_its_retry_holds_the_configuration_of_its_first_step() -> None:
    net, members, (newcomer,) = make_net(3)
    lost = lambda s, r, m: r == newcomer and isinstance(m, Commit)  # noqa: E731
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, members[0], incarnation=1, throughput=1.0))
    net.deliver(lost)
    admitting = conf(net, members[0])
    since = admitting.since_steps[admitting.index_of(newcomer)]
    assert state(net, newcomer) is RunState.JOINING
    for p in members:
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=since, completed=since - 1))
    net.call(members[1], lambda m, now: m.set_throughput(now, RUN, 5.0))
    net.advance(0.1, lost)  # shorter than join_retry_s: the newcomer does not retry meanwhile
    newer = conf(net, members[0])
    assert newer.epoch == admitting.epoch + 1 and newer.activation_step > since
    net.advance(1.0, lost)  # its retry (RUN_INFO, then SYNC) admits it
    assert state(net, newcomer) is RunState.STABLE
    admitted = [e for e in net.take(newcomer) if isinstance(e, Admitted)]
    assert [(a.configuration.epoch, a.activation_step) for a in admitted] == [(admitting.epoch, since)]
    assert conf(net, newcomer).digest == conf(net, members[0]).digest
    for step in range(since, newer.activation_step + 2):
        mine, theirs = (net.machines[p].config_for_step(RUN, step) for p in (newcomer, members[0]))
        assert mine is not None and theirs is not None and mine.digest == theirs.digest
        assert mine.takes_part(newcomer, step)


def test_an_already_admitted_newcomer_asking_again_gets_the_configuration_of_its_first_step() -> None:
    net, members, (newcomer,) = make_net(3)
    lost = lambda s, r, m: r == newcomer and isinstance(m, Commit | SyncReply)  # noqa: E731
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, members[0], incarnation=1, throughput=1.0))
    net.deliver(lost)
    admitting = conf(net, members[0])
    since = admitting.since_steps[admitting.index_of(newcomer)]
    for p in members:
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=since, completed=since - 1))
    net.call(members[1], lambda m, now: m.set_throughput(now, RUN, 5.0))
    net.advance(0.1, lost)
    assert conf(net, members[0]).epoch == admitting.epoch + 1
    # Its JOIN_REQUEST again (a retry that raced its admission): answered with a snapshot.
    request = next(m for s, r, m in net.delivered if s == newcomer and isinstance(m, JoinRequest))
    net.machines[members[0]].receive(net.now, newcomer, "negotiation", request)
    net.collect()
    replies = [out.message for p, out in net.queue if p == members[0] and isinstance(out.message, SyncReply)]
    assert len(replies) == 1 and replies[0].snapshot
    net.deliver()
    assert state(net, newcomer) is RunState.STABLE
    assert net.machines[newcomer].config_for_step(RUN, since) == net.machines[members[0]].config_for_step(RUN, since)
    assert conf(net, newcomer).digest == conf(net, members[0]).digest


def test_a_stale_commit_of_an_earlier_admission_does_not_admit_a_rejoining_peer() -> None:
    net, members, (newcomer,) = make_net(3)
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, members[0], incarnation=1, throughput=1.0))
    net.deliver()
    sender, old = next((s, m) for s, r, m in net.delivered if r == newcomer and full_commit(m))
    # It is (falsely) failed and removed; it rejoins.
    for p in members:
        net.call(p, lambda m, now: m.observe_member(now, newcomer, MemberState.FAILED, 0))
    net.advance(0.5)
    assert state(net, newcomer) is RunState.REMOVED and not conf(net, members[0]).has_member(newcomer)
    for p in members:  # membership: it refuted the suspicion
        net.call(p, lambda m, now: m.observe_member(now, newcomer, MemberState.ALIVE, 1))
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, members[0], incarnation=1, throughput=1.0))
    net.queue.clear()  # its RUN_INFO request is slow
    net.take(newcomer)
    # A duplicate of its first admission's COMMIT arrives: it must not put it back under that
    # configuration (the run replaced it; the peer is not a member at that incarnation any more).
    net.machines[newcomer].receive(net.now, sender, "negotiation", old)
    net.collect()
    assert state(net, newcomer) is RunState.JOINING
    assert not [e for e in net.take(newcomer) if isinstance(e, Admitted)]
    net.advance(1.0)  # its retries admit it properly, at a higher incarnation
    assert state(net, newcomer) is RunState.STABLE
    final = conf(net, members[0])
    assert conf(net, newcomer).digest == final.digest and final.incarnation_of(newcomer) == 2


def test_two_newcomers_asking_a_run_of_one_at_once_are_both_admitted_without_a_retry() -> None:
    net, (founder,), newcomers = make_net(1, extra=2)
    for newcomer in newcomers:
        net.call(newcomer, lambda m, now: m.request_join(now, RUN, founder, incarnation=1, throughput=1.0))
    net.deliver()  # no time passes: the retry timer (join_retry_s) cannot be what admits either
    assert [state(net, p) for p in newcomers] == [RunState.STABLE, RunState.STABLE]
    assert conf(net, founder).epoch == 2 and len(conf(net, founder).peers) == 3
    assert conf(net, newcomers[0]).digest == conf(net, newcomers[1]).digest == conf(net, founder).digest
