"""First-hand link events (issue 19): the hysteresis of :class:`LinkWatch`, and when a LINK_DOWN makes
the run redo the stuck step (``protocols/negotiation.md`` section 3b). Pure functions, no machine."""

from __future__ import annotations

import random

import pytest

from chaosp2p.protocols.negotiation import NegotiationMachine
from chaosp2p.protocols.negotiation.config import NegotiationConfig
from chaosp2p.protocols.negotiation.configuration_change import check_operation
from chaosp2p.protocols.negotiation.link_watch import LinkWatch, LinkWatchConfig
from chaosp2p.protocols.negotiation.operations import Operation, OpKind, sign_operation
from chaosp2p.protocols.negotiation.paxos import activation_step, breaks_plan, link_down_supersedes
from chaosp2p.protocols.negotiation.run_configuration import Configuration, LinkEntry, RunParams, make_configuration
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.identity import Identity

IDS = sorted((Identity.from_seed(bytes([i + 1]) * 32) for i in range(4)), key=lambda i: i.peer_id.raw)
P = [i.peer_id for i in IDS]


def config_of(*, epoch: int = 3, step: int = 10, down: tuple[tuple[int, int], ...] = ()) -> Configuration:
    links = tuple(LinkEntry(a=P[a], b=P[b], up=False) for a, b in down)
    return make_configuration(
        run="r",
        epoch=epoch,
        activation_step=step,
        peers=P,
        incarnations=[1] * 4,
        throughputs=[1.0] * 4,
        links=links,
        params=RunParams(global_batch=8),
        seed=1,
    )


def link_op(signer: int, kind: OpKind, a: int, b: int) -> Operation:
    return sign_operation(
        IDS[signer], kind=kind, run="r", epoch=3, subject=P[a], other=P[b], incarnation=1, detected_at=1.0
    )


def step_of(ops: list[Operation], config: Configuration, previous: Configuration | None = None) -> int:
    return activation_step(
        config=config,
        settings=NegotiationConfig(),
        ops=ops,
        entered=[20, 20, 20],
        completed=[19, 19, 19],
        step_times=[0.1],
        previous=previous,
    )


# ---------------------------------------------------------------------------------- LinkWatch
def test_a_failed_link_is_declared_down_once_and_up_after_its_probes_held_for_the_base_time() -> None:
    watch = LinkWatch(LinkWatchConfig(base_up_s=2.0, max_up_s=16.0))
    assert watch.failed(P[1], 0.0) and watch.is_down(P[1])
    assert not watch.failed(P[1], 0.5)  # declared already
    assert watch.to_probe(1.0) == [P[1]]
    assert not watch.probed(P[1], 1.0, ok=True)
    assert not watch.probed(P[1], 2.5, ok=True)
    assert not watch.probed(P[1], 2.9, ok=False)  # a failed probe restarts the count
    assert not watch.probed(P[1], 3.0, ok=True)
    assert watch.probed(P[1], 5.0, ok=True) and not watch.is_down(P[1])
    assert watch.to_probe(5.0) == []


def test_each_flap_doubles_the_required_up_time_up_to_the_cap_and_a_quiet_link_is_forgiven() -> None:
    config = LinkWatchConfig(base_up_s=2.0, max_up_s=10.0, forget_flaps_after_s=100.0)
    watch = LinkWatch(config)
    now = 0.0
    required = []
    for _ in range(5):
        assert watch.failed(P[2], now)
        required.append(watch.required_up_s(P[2]))
        watch.probed(P[2], now, ok=True)
        now += watch.required_up_s(P[2])
        assert watch.probed(P[2], now, ok=True)
        now += 1.0  # up for a second, then it breaks again: a flap
    assert required == [2.0, 4.0, 8.0, 10.0, 10.0]
    watch.to_probe(now + 100.0)  # up for forget_flaps_after_s: forgotten
    assert watch.failed(P[2], now + 100.0) and watch.required_up_s(P[2]) == 2.0


def test_a_failed_or_departed_peer_is_forgotten_and_the_table_is_bounded() -> None:
    watch = LinkWatch(LinkWatchConfig(max_links=2))
    for peer in P[:3]:
        watch.failed(peer, 0.0)
    assert len(watch.to_probe(0.0)) == 2
    watch.forget(P[2])
    assert not watch.is_down(P[2])
    with pytest.raises(Exception, match="max_up_s"):
        LinkWatchConfig(base_up_s=5.0, max_up_s=1.0)


# ---------------------------------------------------------------------------------- the negotiation side
def test_only_an_endpoint_may_declare_a_link() -> None:
    config = config_of()
    assert check_operation(link_op(0, OpKind.LINK_DOWN, 0, 1), config) is None
    assert check_operation(link_op(1, OpKind.LINK_DOWN, 0, 1), config) is None
    assert check_operation(link_op(2, OpKind.LINK_DOWN, 0, 1), config) == "forged_origin"


def test_a_link_down_between_two_owners_redoes_the_stuck_step() -> None:
    config = config_of(step=10)
    down = [link_op(0, OpKind.LINK_DOWN, 0, 1)]
    assert breaks_plan(down, config)
    assert step_of(down, config) == 20  # max(completed) + 1, not max(entered) + margin
    up = [link_op(0, OpKind.LINK_UP, 0, 1)]
    assert step_of(up, config) > 20


def test_a_link_down_that_the_plan_does_not_need_waits_like_any_change() -> None:
    # 0~2 and 1~2 are down: 3 alone has the maximal degree and owns the whole buffer; 0, 1 and 2
    # only contribute to it, so the link 0~1 between two contributors carries nothing.
    config = config_of(down=((0, 2), (1, 2)))
    down = [link_op(0, OpKind.LINK_DOWN, 0, 1)]
    assert not breaks_plan(down, config)
    assert step_of(down, config) > 20
    again = [link_op(0, OpKind.LINK_DOWN, 0, 2)]  # already down: nothing breaks
    assert not breaks_plan(again, config)


def test_a_link_down_between_a_contributor_and_an_owner_redoes_the_stuck_step() -> None:
    # 0~1 is down, so 2 and 3 own the shards; 0 must send its part to 2 and get the result back.
    # (Found with three trainers behind NATs around one public peer: the newcomer was made an owner,
    # the others' LINK_DOWNs to it activated two steps after the step they were stuck in, and that
    # step never completed.)
    config = config_of(step=10, down=((0, 1),))
    down = [link_op(0, OpKind.LINK_DOWN, 0, 2)]
    assert breaks_plan(down, config)
    assert step_of(down, config) == 20


def test_a_link_down_supersedes_a_later_configuration_unless_that_one_brought_a_link_up() -> None:
    previous = config_of(epoch=2, step=5)
    pending = config_of(epoch=3, step=30)  # a change (not about links) agreed for step 30
    down = [link_op(2, OpKind.LINK_DOWN, 2, 3)]
    assert link_down_supersedes(down, pending, previous)
    assert step_of(down, pending, previous) == 20  # the stuck step, before the pending change
    # A flapper: C_e brought 0~1 up again (it was down in C_{e-1}); its LINK_DOWN waits for C_e.
    flapped_previous = config_of(epoch=2, step=5, down=((0, 1),))
    flap = [link_op(0, OpKind.LINK_DOWN, 0, 1)]
    assert not link_down_supersedes(flap, pending, flapped_previous)
    assert step_of(flap, pending, flapped_previous) == 30


# ------------------------------------------------------------------ LINK_UP from membership
def test_a_link_up_of_a_pair_never_reported_down_and_without_figures_raises_nothing() -> None:
    # Membership's overlay re-wiring reported a burst of links up; each raised a LINK_UP that changed
    # no plan but moved the run two epochs within one step (issue 19's STALL after a cut).
    net = ManualNet(
        NegotiationMachine(identity=i, config=NegotiationConfig.local(), rng=random.Random(k), now=0.0)
        for k, i in enumerate(IDS[:3])
    )
    a, b, c = P[:3]
    net.call(a, lambda m, now: m.create_run(now, "r", params=RunParams(global_batch=8)))
    for p in (b, c):
        net.call(p, lambda m, now: m.request_join(now, "r", a, incarnation=1, throughput=1.0))
        net.deliver()
    machine = net.machines[a]
    epoch = machine.configuration("r").epoch  # type: ignore[union-attr]
    assert machine.link_changed(net.now, a, b, up=True, rtt_s=0.001) == 0
    # A figure to record, or a pair the run holds down, is raised as before.
    assert machine.link_changed(net.now, a, b, up=True, bandwidth_bytes_per_s=5e6) == 1
    assert machine.link_changed(net.now, a, c, up=False) == 1
    net.advance(0.5)
    assert machine.configuration("r").epoch > epoch  # type: ignore[union-attr]
    assert machine.link_changed(net.now, a, c, up=True) == 1
