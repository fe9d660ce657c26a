"""The negotiation machine, driven by hand: every transition of both tables, illegal local calls,
and the scenarios the issue names (leave, failure mid-step, late members, takeover, partitions)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator, Sequence

import pytest

import chaosp2p.protocols.negotiation.core as core_module
import chaosp2p.protocols.negotiation.joins as joins_module
import chaosp2p.protocols.negotiation.learning as learning_module
import chaosp2p.protocols.negotiation.machine as machine_module
import chaosp2p.protocols.negotiation.proposer as proposer_module
from chaosp2p.errors import LocalProtocolError
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import (
    Admitted,
    ConfigurationCommitted,
    GateRaised,
    GateReleased,
    JoinRefused,
    NegotiationConfig,
    NegotiationMachine,
    OperationCommitted,
    OpKind,
    ProposerPhase,
    RemovedFromRun,
    ResyncNeeded,
    RunInfo,
    RunParams,
    RunState,
)
from chaosp2p.protocols.negotiation.messages import Accept, Accepted, Commit, Promise
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.protocols.negotiation.transitions import (
    PROPOSER_TRANSITIONS,
    TRANSITIONS,
    ProposerEvent,
    RunEvent,
    proposer_transition,
    transition,
)
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

RUN = "r"
CFG = NegotiationConfig.local()
PARAMS = RunParams(global_batch=120)


def make_net(
    n: int, *, config: NegotiationConfig = CFG, extra: int = 0, params: RunParams = PARAMS
) -> tuple[ManualNet, list[PeerID]]:
    """A run of ``n`` members founded by the first and joined one by one; ``extra`` outsiders."""
    ids = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(n + extra)]
    net = ManualNet(
        NegotiationMachine(identity=i, config=config, rng=random.Random(k), now=0.0) for k, i in enumerate(ids)
    )
    peers = [i.peer_id for i in ids]
    net.call(peers[0], lambda m, now: m.create_run(now, RUN, params=params))
    for p in peers[1:n]:
        net.call(p, lambda m, now: m.request_join(now, RUN, peers[0], incarnation=1, throughput=1.0))
        net.deliver()
    net.advance(0.05)
    for p in peers[:n]:
        assert net.machines[p].configuration(RUN) == net.machines[peers[0]].configuration(RUN)
        net.take(p)
    return net, peers


def conf(net: ManualNet, peer: PeerID):  # type: ignore[no-untyped-def]
    config = net.machines[peer].configuration(RUN)
    assert config is not None
    return config


def justify(net: ManualNet, accept: Accept, promisers: Sequence[PeerID] = ()) -> Accept:
    """``accept`` as an honest proposer sends it: signed by the ballot's proposer and, above round
    0, with the signed promises of ``promisers`` (each claiming nothing accepted, nothing completed)."""
    from chaosp2p.protocols.negotiation.configuration_change import next_configuration
    from chaosp2p.protocols.negotiation.justification import promise_statement, propose_statement
    from chaosp2p.protocols.negotiation.messages import SignedPromise
    from chaosp2p.protocols.negotiation.operations import op_id

    ballot, epoch = accept.ballot, accept.epoch
    config = conf(net, ballot.proposer)
    value = accept.value
    new, _ = next_configuration(config, [(op_id(o), o) for o in value.ops], value.activation_step)
    signed = net.machines[ballot.proposer].identity.sign(propose_statement(RUN, epoch, ballot, new.digest))
    body = promise_statement(RUN, epoch, ballot, None, b"", -1)
    proofs = tuple(SignedPromise(signer=p, signature=net.machines[p].identity.sign(body)) for p in promisers)
    return dataclasses.replace(accept, proposer_signature=signed, justification=proofs)


def roles(net: ManualNet, members: list[PeerID]) -> tuple[PeerID, list[PeerID]]:
    """The coordinator of the next instance and the other members."""
    c = coordinator(conf(net, members[0]))
    assert c is not None
    return c, [p for p in members if p != c]


def state(net: ManualNet, peer: PeerID) -> RunState:
    return net.machines[peer].run_status(RUN).state


def of_type(events: list[object], kind: type) -> list:  # type: ignore[type-arg]
    return [e for e in events if isinstance(e, kind)]


def report_all(net: ManualNet, peers: list[PeerID], *, entered: int, completed: int | None = None) -> None:
    for p in peers:
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=entered, completed=completed))


def drop_to(target: PeerID, *kinds: type) -> Callable[[PeerID, PeerID, Message], bool]:
    return lambda s, r, m: r == target and (not kinds or isinstance(m, kinds))


# ================================================================================== scenarios
def scenario_leave_and_rejoin() -> None:
    net, peers = make_net(3)
    coord, others = roles(net, peers)
    leaver = others[0]
    report_all(net, peers, entered=4, completed=3)
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    assert state(net, leaver) is RunState.NEGOTIATING
    net.call(leaver, lambda m, now: m.report_step(now, RUN, entered=4))
    net.deliver()
    new = conf(net, coord)
    assert not new.has_member(leaver) and len(new) == 2
    left_at = new.departed_incarnation(leaver)
    assert left_at is not None
    assert new.activation_step == 4 + CFG.default_margin_steps  # no step time known yet
    removed = of_type(net.take(leaver), RemovedFromRun)
    assert [(r.reason, r.activation_step) for r in removed] == [("left", new.activation_step)]
    assert state(net, leaver) is RunState.REMOVED
    # A leaver still trains the steps before its removal, and not after.
    leaver_machine = net.machines[leaver]
    assert leaver_machine.config_for_step(RUN, new.activation_step - 1) is not None
    net.call(leaver, lambda m, now: m.report_step(now, RUN, entered=new.activation_step - 1))
    assert leaver_machine.config_for_step(RUN, new.activation_step) is None
    # It may come back as a newcomer, with a higher incarnation than it left with.
    net.call(leaver, lambda m, now: m.request_join(now, RUN, coord, incarnation=1, throughput=1.0))
    net.deliver()
    assert state(net, leaver) is RunState.STABLE
    again = conf(net, coord)
    assert again.has_member(leaver) and again.incarnation_of(leaver) == left_at + 1
    assert [type(e) for e in net.take(leaver)] == [RunInfo, ConfigurationCommitted, Admitted]


def scenario_join_refused_then_admitted() -> None:
    net, peers = make_net(2, extra=2)
    member, newcomer, outsider = peers[0], peers[2], peers[3]
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, outsider, incarnation=1, throughput=2.0))
    net.deliver()
    refused = of_type(net.take(newcomer), JoinRefused)
    assert [(r.sponsor, r.reason) for r in refused] == [(outsider, "not_member")]
    assert state(net, newcomer) is RunState.JOINING
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, member, incarnation=1, throughput=2.0))
    net.deliver()
    admitted = of_type(net.take(newcomer), Admitted)
    assert len(admitted) == 1 and admitted[0].configuration.has_member(newcomer)
    assert conf(net, member).digest == conf(net, newcomer).digest
    assert conf(net, member).throughputs[conf(net, member).index_of(newcomer)] == 2.0


def scenario_gated_member_learns_late() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    leaver, late = others[0], others[1]
    report_all(net, peers, entered=5, completed=4)
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    net.deliver(drop=drop_to(late, Commit))
    gate = 5 + CFG.default_margin_steps
    assert state(net, late) is RunState.GATED
    assert of_type(net.take(late), GateRaised) == [GateRaised(run=RUN, step=gate)]
    m = net.machines[late]
    assert m.config_for_step(RUN, gate) is None and m.config_for_step(RUN, gate - 1) is not None
    with pytest.raises(LocalProtocolError, match="gated"):
        m.report_step(net.now, RUN, entered=gate)
    net.call(late, lambda m, now: m.report_step(now, RUN, entered=gate - 1))
    net.call(late, lambda m, now: m.set_throughput(now, RUN, 5.0))  # an op while gated
    assert state(net, late) is RunState.GATED
    net.advance(1.0)  # SYNC from a ring neighbour, or its own takeover, brings the decision
    events = net.take(late)
    assert of_type(events, GateReleased)
    assert conf(net, late).digest == conf(net, coord).digest
    assert not conf(net, late).has_member(leaver)
    assert conf(net, coord).throughputs[conf(net, coord).index_of(late)] == 5.0  # then its op commits


def scenario_commit_without_accept() -> None:
    # Announcements go to the coordinator only, so members learn operations from ACCEPT/COMMIT.
    config = NegotiationConfig.local().__class__(**{**_fields(CFG), "announce_fanout": 1})
    net, peers = make_net(8, config=config)  # 5 of 8 accept: a quorum (of 7 it would take 5 of 7)
    coord, others = roles(net, peers)
    quiet, busy, leaver = others[0], others[1], others[2]
    net.call(busy, lambda m, now: m.set_throughput(now, RUN, 3.0))
    assert state(net, busy) is RunState.NEGOTIATING
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    # A quorum accepts; `quiet` (nothing pending), `busy` and `leaver` (their ops pending) never
    # see an ACCEPT: they learn both decisions from COMMIT alone.
    net.deliver(drop=lambda s, r, m: r in (quiet, busy, leaver) and isinstance(m, Accept))
    assert [r.reason for r in of_type(net.take(leaver), RemovedFromRun)] == ["left"]
    for p in (quiet, busy):
        assert state(net, p) is RunState.STABLE
        assert conf(net, p).digest == conf(net, coord).digest
    final = conf(net, coord)
    assert final.throughputs[final.index_of(busy)] == 3.0 and not final.has_member(leaver)


def _fields(config: NegotiationConfig) -> dict[str, object]:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


def scenario_failure_mid_step_redoes_the_step() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    victim = others[0]
    report_all(net, peers, entered=7, completed=6)  # everybody stuck in step 7 waiting for the victim
    net.crashed.add(victim)
    for p in peers:
        if p != victim:
            net.call(p, lambda m, now: m.observe_member(now, victim, MemberState.FAILED, 0))
    net.deliver()
    new = conf(net, coord)
    assert not new.has_member(victim) and new.activation_step == 7  # urgent: redo step 7 without it
    for p in peers:
        if p != victim:
            assert net.machines[p].config_for_step(RUN, 7) == new
    committed = [e for e in net.take(coord) if isinstance(e, OperationCommitted)]
    assert [(e.kind, e.subject, e.activation_step) for e in committed if e.applied] == [(OpKind.FAIL, victim, 7)]


def scenario_takeover_after_coordinator_crash() -> None:
    net, peers = make_net(4)
    coord, others = roles(net, peers)
    leaver = others[0]
    report_all(net, peers, entered=2, completed=1)
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    # The coordinator's ACCEPT reaches everyone, then it dies before it hears back.
    net.deliver(drop=lambda s, r, m: isinstance(m, Accepted))
    for p in others:
        assert state(net, p) is RunState.GATED
    net.crashed.add(coord)
    for p in others:
        net.call(p, lambda m, now: m.observe_member(now, coord, MemberState.FAILED, 0))
    net.advance(2.0)
    survivors = [p for p in others if p != leaver]
    digests = {conf(net, p).digest for p in survivors}
    assert len(digests) == 1
    final = conf(net, survivors[0])
    assert not final.has_member(leaver) and not final.has_member(coord)
    # The accepted LEAVE value was finished, not replaced: its activation step is the original one.
    leave_events = [e for e in net.take(survivors[0]) if isinstance(e, OperationCommitted) and e.kind is OpKind.LEAVE]
    assert [e.activation_step for e in leave_events] == [2 + CFG.default_margin_steps]


def scenario_false_failure_removes_a_live_member() -> None:
    net, peers = make_net(6)  # four remain: a quorum of six (of five, four are needed)
    coord, others = roles(net, peers)
    quiet, busy = others[0], others[1]
    net.call(busy, lambda m, now: m.set_throughput(now, RUN, 9.0))
    net.deliver(drop=lambda s, r, m: s == busy)  # its announcement is lost: it stays NEGOTIATING
    for victim in (quiet, busy):
        for p in peers:
            if p not in (quiet, busy):
                net.call(p, lambda m, now, v=victim: m.observe_member(now, v, MemberState.FAILED, 3))
    # Nobody trained yet, so the proposer waits one phase timeout for progress reports.
    net.advance(0.5, drop=lambda s, r, m: (r in (quiet, busy) and isinstance(m, Accept)) or s in (quiet, busy))
    for victim in (quiet, busy):
        assert state(net, victim) is RunState.REMOVED
        assert [r.reason for r in of_type(net.take(victim), RemovedFromRun)] == ["failed"]
    assert len(conf(net, coord)) == 4


def scenario_duelling_proposers() -> None:
    net, peers = make_net(3)
    coord, (b, c) = roles(net, peers)
    net.crashed.add(coord)
    net.call(b, lambda m, now: m.leave(now, RUN))
    # c proposes (phase 1) but every PROMISE is lost at first: it retries with a higher ballot.
    net.deliver(drop=lambda s, r, m: isinstance(m, Promise))
    # Both keep proposing with ever higher ballots, each pre-empting the other's phase 1.
    net.advance(1.0, drop=lambda s, r, m: isinstance(m, Promise))
    assert net.machines[c].statistics().proposals >= 2 and net.machines[b].statistics().proposals >= 1
    net.advance(2.0)
    assert conf(net, c).digest == conf(net, b).digest or state(net, b) is RunState.REMOVED
    final = conf(net, c)
    assert not final.has_member(b)


def _lagging_coordinator_proposes(*, others_entered: int) -> tuple[ManualNet, list[PeerID], PeerID, list[PeerID]]:
    """A run of three whose coordinator, at step 10 (completed 9), proposes a throughput change fast
    (S = 10 + margin = 12) while the others are at ``others_entered`` (completed the step before);
    the instance is decided, and its configuration carries the change."""
    net, peers = make_net(3)
    coord, others = roles(net, peers)
    for p in others:
        net.call(p, lambda m, now: m.report_step(now, RUN, entered=others_entered, completed=others_entered - 1))
    net.call(coord, lambda m, now: m.report_step(now, RUN, entered=10, completed=9))
    net.call(coord, lambda m, now: m.set_throughput(now, RUN, 4.0))
    net.deliver()
    final = conf(net, coord)
    assert final.throughputs[final.index_of(coord)] == 4.0
    return net, peers, coord, others


def scenario_refusals_raise_the_activation_step() -> None:
    # The coordinator lags (diloco-like): the others completed step 20, and its fast proposal
    # reaches members already past S.
    net, peers, coord, others = _lagging_coordinator_proposes(others_entered=21)
    assert conf(net, coord).activation_step == 21 + CFG.default_margin_steps  # raised past what the others completed
    for p in peers:
        assert not of_type(net.take(p), ResyncNeeded)
    assert net.machines[others[1]].statistics().refused_past >= 1


def scenario_members_inside_the_step_refuse_an_ordinary_value_activating_at_it() -> None:
    # The others are inside step 12 (their round of it may already deliver results to a member
    # outside the accepting quorum, who completes 12 under the old configuration: star run 5). The
    # coordinator's fast proposal (S = 12) reaches them there: they refuse it rather than gate a
    # step they are in, and S comes out past it.
    net, _, coord, others = _lagging_coordinator_proposes(others_entered=12)
    assert conf(net, coord).activation_step == 12 + CFG.default_margin_steps
    for p in others:
        assert net.machines[p].statistics().refused_past >= 1
        assert net.machines[p].config_for_step(RUN, 12) is not None  # never gated inside step 12


def scenario_proposer_preempted_in_phase_two() -> None:
    net, peers = make_net(3)
    coord, (b, _) = roles(net, peers)
    report_all(net, peers, entered=1, completed=0)  # a coordinator with progress of its own goes fast
    net.call(b, lambda m, now: m.set_throughput(now, RUN, 6.0))
    # The coordinator's (fast, round 0) ACCEPTs are lost: it waits in phase 2 while another member
    # holding the operation proposes with a higher ballot, which makes it stand back.
    net.deliver(drop=lambda s, r, m: isinstance(m, Accept) and s == coord)
    assert net.machines[coord].run_status(RUN).proposer is ProposerPhase.ACCEPTING
    net.advance(1.0)
    final = conf(net, coord)
    assert final.throughputs[final.index_of(b)] == 6.0
    assert {conf(net, p).digest for p in peers} == {final.digest}


SCENARIOS = [
    scenario_leave_and_rejoin,
    scenario_join_refused_then_admitted,
    scenario_gated_member_learns_late,
    scenario_commit_without_accept,
    scenario_failure_mid_step_redoes_the_step,
    scenario_takeover_after_coordinator_crash,
    scenario_false_failure_removes_a_live_member,
    scenario_duelling_proposers,
    scenario_refusals_raise_the_activation_step,
    scenario_members_inside_the_step_refuse_an_ordinary_value_activating_at_it,
    scenario_proposer_preempted_in_phase_two,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_scenario(scenario: Callable[[], None]) -> None:
    scenario()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[set[object], set[object]]]:
    runs: set[object] = set()
    proposers: set[object] = set()

    def run_transition(current: RunState | None, event: RunEvent) -> RunState:
        new = transition(current, event)
        runs.add((current, event))
        return new

    def proposer(current: ProposerPhase, event: ProposerEvent) -> ProposerPhase:
        new = proposer_transition(current, event)
        proposers.add((current, event))
        return new

    for module in (machine_module, core_module, proposer_module, learning_module, joins_module):
        if hasattr(module, "transition"):
            monkeypatch.setattr(module, "transition", run_transition)
        if hasattr(module, "proposer_transition"):
            monkeypatch.setattr(module, "proposer_transition", proposer)
    yield runs, proposers


def test_every_transition_of_both_tables_is_taken_by_the_machine(recorded: tuple[set[object], set[object]]) -> None:
    runs, proposers = recorded
    for scenario in SCENARIOS:
        scenario()
    assert set(TRANSITIONS) - runs == set()
    assert set(PROPOSER_TRANSITIONS) - proposers == set()


# ================================================================================== illegal local calls
def test_illegal_events_raise_local_protocol_error() -> None:
    for (current, event), _ in TRANSITIONS.items():
        assert transition(current, event) is TRANSITIONS[(current, event)]
    with pytest.raises(LocalProtocolError):
        transition(None, RunEvent.COMMIT)
    with pytest.raises(LocalProtocolError):
        transition(RunState.REMOVED, RunEvent.ACCEPT)
    with pytest.raises(LocalProtocolError):
        proposer_transition(ProposerPhase.IDLE, ProposerEvent.DECIDED)

    net, peers = make_net(2, extra=1)
    member, outsider = peers[0], peers[2]
    m = net.machines[member]
    with pytest.raises(LocalProtocolError):
        m.create_run(net.now, RUN, params=PARAMS)  # exists already
    with pytest.raises(LocalProtocolError):
        m.request_join(net.now, RUN, peers[1], incarnation=1, throughput=1.0)  # already a member
    o = net.machines[outsider]
    with pytest.raises(LocalProtocolError):
        o.leave(net.now, RUN)
    with pytest.raises(LocalProtocolError):
        o.report_step(net.now, RUN, entered=0)
    with pytest.raises(LocalProtocolError):
        o.set_throughput(net.now, RUN, 1.0)
    with pytest.raises(LocalProtocolError):
        o.run_status(RUN)
    o.request_join(net.now, RUN, member, incarnation=1, throughput=1.0)
    with pytest.raises(LocalProtocolError):
        o.report_step(net.now, RUN, entered=0)  # still joining
    with pytest.raises(LocalProtocolError):
        m.report_step(net.now, RUN, completed=-1)
    assert o.config_for_step(RUN, 0) is None


def test_status_and_statistics_describe_the_run() -> None:
    net, peers = make_net(3)
    status = net.machines[peers[1]].run_status(RUN)
    assert status.state is RunState.STABLE and status.epoch == 2 and len(status.members) == 3
    assert status.config_digest == conf(net, peers[1]).digest.hex() and status.pending == ()
    stats = net.machines[peers[0]].statistics()
    assert stats.commits + net.machines[peers[1]].statistics().commits >= 2 and stats.rejected == 0
    assert net.machines[peers[0]].runs() == (RUN,)


def test_large_runs_disseminate_through_relays_and_survive_a_dead_relay() -> None:
    config = dataclasses.replace(CFG, relay_threshold=2)
    net, peers = make_net(7, config=config)
    coord, others = roles(net, peers)
    report_all(net, peers, entered=3, completed=2)
    leaver = others[0]
    net.call(leaver, lambda m, now: m.leave(now, RUN))
    net.deliver()
    relayed = [(s, m) for s, _, m in net.delivered if isinstance(m, Accept | Commit) and m.relay_to]
    forwarded = [(s, m) for s, _, m in net.delivered if isinstance(m, Accept) and s != m.ballot.proposer]
    assert relayed and forwarded  # the coordinator sent few copies; members passed them on
    assert all(len(m.relay_to) <= 2 for _, m in relayed)
    final = conf(net, coord)
    assert not final.has_member(leaver)
    assert {conf(net, p).digest for p in peers if p != leaver} == {final.digest}
    # A relay that died: its group misses the COMMIT at first, and catches up through SYNC.
    coord, others = roles(net, [p for p in peers if p != leaver])
    net.call(others[0], lambda m, now: m.set_throughput(now, RUN, 7.0))
    dead = next(s for s, m in relayed if s != coord)
    net.crashed.add(dead)
    net.advance(2.0)
    final = conf(net, coord)
    assert final.throughputs[final.index_of(others[0])] == 7.0
    alive = [p for p in peers if p not in (leaver, dead)]
    assert {conf(net, p).digest for p in alive} == {final.digest}
