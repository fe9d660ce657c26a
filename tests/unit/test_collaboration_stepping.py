"""Stepping a collaboration against a fake port: rounds, their tags, failures, redoing, DiLoCo.

Every round goes to a fake averager that records what it was asked and plays a scripted outcome
(``tests/unit/fake_port.py``); configurations are built with the negotiation helpers and installed
in the fake gates by hand, so each test decides exactly which configuration governs which step.
The optimizer is plain SGD with lr 1, so a step moves the parameters by exactly the averaged
gradient.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.errors import (  # noqa: E402
    ContributionRefused,
    LocalProtocolError,
    RoundAborted,
    RoundMismatch,
    TrainingError,
)
from chaosp2p.protocols.averaging.messages import Exclusion, RoundPhase, RoundTag  # noqa: E402
from chaosp2p.protocols.collab.messages import PROTOCOL, FetchUpdate, UpdateHeader  # noqa: E402
from chaosp2p.protocols.negotiation import Configuration, ring_order  # noqa: E402
from chaosp2p.protocols.negotiation.run_configuration import (  # noqa: E402
    DepartedEntry,
    LinkEntry,
    make_configuration,
)
from chaosp2p.training.collab_core import StepStatistics  # noqa: E402
from chaosp2p.training.flat import FlatParameters  # noqa: E402
from tests.unit.fake_port import RUN, AverageCall, FakePort, Rig, configuration, identities, rig  # noqa: E402

pytestmark = pytest.mark.anyio
NUMEL = 8  # Linear(3, 2): a 2x3 weight and 2 biases


def _model(lr: float = 1.0) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def _rig(port: FakePort | None = None, *, lr: float = 1.0, **config: Any) -> Rig:
    model, optimizer = _model(lr)
    return rig(model, optimizer, port=port, **config)


def _flat(model: Any) -> FlatParameters:
    return FlatParameters(list(model.parameters()))


def _values(model: Any) -> np.ndarray:
    flat = _flat(model)
    return flat.gather_values(np.empty(flat.numel, dtype=np.float32))


def _grads(model: Any) -> np.ndarray:
    return _flat(model).gather_grads(np.empty(NUMEL, dtype=np.float32))


def _set_grads(model: Any, values: np.ndarray) -> None:
    _flat(model).scatter_grads(np.ascontiguousarray(values, dtype=np.float32))


def _fill(value: float) -> Any:
    def fill(buffer: np.ndarray, _call: AverageCall) -> None:
        buffer.fill(value)

    return fill


def _tags(r: Rig) -> list[tuple[int, int, int]]:
    """(epoch, step, attempt) of every round asked for."""
    return [(c.tag.epoch, c.tag.step, c.tag.attempt) for c in r.averager.calls]


async def _founded(port: FakePort | None = None, **config: Any) -> Rig:
    r = _rig(port, **config)
    await r.collab.start(found=True)
    return r


def _with_members(r: Rig, *others: Any, epoch: int = 1, activation_step: int = 0, **kwargs: Any) -> Configuration:
    """Install a configuration of this peer and ``others`` (PeerIDs)."""
    peers = [r.port.peer_id, *others]
    return r.gates.install(configuration(peers, epoch=epoch, activation_step=activation_step, **kwargs))


GRADIENT = np.arange(1, NUMEL + 1, dtype=np.float32) / 8


# ---------------------------------------------------------------------------------- one step
async def test_a_solo_step_averages_the_gradient_and_steps_the_optimizer_with_the_average() -> None:
    r = await _founded(wire_dtype="float16")
    genesis = r.collab.configuration
    model = r.collab.model
    _set_grads(model, GRADIENT)
    before = _values(model)

    def average(buffer: np.ndarray, _call: AverageCall) -> None:
        r.port.clock.advance(0.25)  # the round takes a quarter second of the peer's clock
        np.multiply(buffer, 0.5, out=buffer)  # what the members' average came to

    r.averager.then(average)
    stats = await r.collab.step(4)

    [call] = r.averager.calls
    assert call.tag == RoundTag(
        run=RUN, epoch=0, config_digest=genesis.digest, step=0, phase=RoundPhase.GRADIENTS, attempt=0
    )
    np.testing.assert_array_equal(call.contribution, GRADIENT)  # the gathered gradients
    assert call.weight == 4.0  # weighted by samples
    assert call.members == [r.port.peer_id]
    assert call.addrs == r.port.dial_addrs
    assert call.wire_dtype == "float16"
    assert call.timeout_s == 1.0  # round_timeout_min_s: no step time measured yet
    np.testing.assert_array_equal(_grads(model), GRADIENT * 0.5)  # .grad holds the average...
    np.testing.assert_allclose(_values(model), before - GRADIENT * 0.5, rtol=0, atol=1e-7)  # ...and SGD used it
    assert r.collab.step_index == 1
    assert r.gates.reported == [("entered", 0), ("completed", 0)]
    assert stats == StepStatistics(
        step=0,
        epoch=0,
        config_digest=genesis.digest.hex(),
        members=1,
        samples=4,
        round_s=0.5,  # the averager's own figure
        idle_s=0.25,  # the port's clock around the round
        attempts=1,
        bytes_sent=111,
        bytes_received=222,
        excluded=(),
    )
    assert r.collab.statistics() == stats
    assert r.collab.applied_update(0, genesis.digest) == (0, pytest.approx(GRADIENT * 0.5))
    assert r.collab.applied_update(0, b"\0" * 32) is None


async def test_consecutive_steps_advance_the_step_and_tag_each_round_with_it() -> None:
    r = await _founded()
    for _ in range(3):
        _set_grads(r.collab.model, GRADIENT)
        await r.collab.step(2)
    assert _tags(r) == [(0, 0, 0), (0, 1, 0), (0, 2, 0)]
    assert r.collab.step_index == 3
    assert r.gates.reported == [(kind, s) for s in range(3) for kind in ("entered", "completed")]


async def test_the_round_timeout_follows_the_measured_step_time() -> None:
    r = await _founded(round_timeout_min_s=1.0, round_timeout_step_mult=4.0)
    await r.collab.step(4)
    r.port.clock.advance(10.0)  # a 10 s iteration (compute + averaging)
    await r.collab.step(4)
    r.port.clock.advance(0.1)  # median of 10 and 0.1 is 5.05: still above the minimum
    await r.collab.step(4)
    assert [call.timeout_s for call in r.averager.calls] == [1.0, 40.0, pytest.approx(4 * 5.05)]


async def test_a_member_with_no_samples_contributes_with_weight_zero() -> None:
    r = await _founded()
    _set_grads(r.collab.model, GRADIENT)
    stats = await r.collab.step(0)
    assert r.averager.calls[0].weight == 0.0
    assert stats.samples == 0


# ---------------------------------------------------------------------------------- the run's view
def _three_members_with_a_ring_unlike_peer_order(epoch: int = 0) -> tuple[list[Any], Configuration]:
    ids = identities(3)
    p0, p1, p2 = (i.peer_id for i in ids)
    links = (
        LinkEntry(a=p0, b=p1, up=True, bandwidth_bytes_per_s=1e6),
        LinkEntry(a=p0, b=p2, up=True, bandwidth_bytes_per_s=1e10),
        LinkEntry(a=p1, b=p2, up=True, bandwidth_bytes_per_s=1e6),
    )
    config = configuration([p0, p1, p2], epoch=epoch, global_batch=12, throughputs=[1.0, 2.0, 3.0], links=links)
    assert list(ring_order(config)) != sorted(config.peers, key=lambda p: p.raw)  # the test needs them apart
    assert len({m.batch_share for m in config.members}) == 3  # and unequal shares
    return ids, config


def test_batch_slices_are_laid_out_in_ring_order_and_cover_the_global_batch_once() -> None:
    ids, config = _three_members_with_a_ring_unlike_peer_order()
    views = {}
    for identity in ids:
        r = _rig(FakePort(identity))
        r.gates.install(config)
        views[identity.peer_id] = r.collab
    ring = list(ring_order(config))
    start = 0
    for rank, peer in enumerate(ring):
        collab = views[peer]
        share = config.member(peer).batch_share  # type: ignore[union-attr]
        assert collab.batch_slice() == (start, start + share)
        assert collab.local_batch_size == share
        assert collab.rank == rank
        assert collab.world_size == 3
        assert collab.global_batch == 12
        start += share
    assert start == 12


def test_a_member_admitted_at_a_later_step_is_not_counted_before_it() -> None:
    a, b, late = identities(3)
    config = configuration([a.peer_id, b.peer_id, late.peer_id], global_batch=12, since_steps=[0, 0, 5])
    r = _rig(FakePort(a))
    r.gates.install(config)
    newcomer = _rig(FakePort(late))
    newcomer.gates.install(config)
    share = {m.peer_id: m.batch_share for m in config.members}
    assert r.collab.world_size == 2
    assert r.collab.global_batch == share[a.peer_id] + share[b.peer_id]
    with pytest.raises(LocalProtocolError, match="not a member"):
        newcomer.collab.batch_slice()
    r.collab.step_index = newcomer.collab.step_index = 5
    assert r.collab.world_size == 3
    assert r.collab.global_batch == 12
    assert newcomer.collab.batch_slice()[1] - newcomer.collab.batch_slice()[0] == share[late.peer_id]


async def test_while_a_change_gates_the_next_step_the_view_follows_the_newest_configuration() -> None:
    r = await _founded(global_batch=4)
    other = identities(1, base=60)[0].peer_id
    _with_members(r, other, epoch=1, activation_step=0, global_batch=10)
    r.gates.gate(RUN, 0)
    assert r.collab.world_size == 2
    assert r.collab.global_batch == 10


async def test_a_configuration_agreed_for_a_later_step_does_not_change_the_view_of_the_next() -> None:
    r = await _founded(global_batch=4)
    other = identities(1, base=60)[0].peer_id
    _with_members(r, other, epoch=1, activation_step=5, global_batch=10)
    assert (r.collab.world_size, r.collab.global_batch) == (1, 4)
    r.collab.step_index = 5
    assert (r.collab.world_size, r.collab.global_batch) == (2, 10)


async def test_a_round_of_several_members_goes_in_ring_order_with_the_agreed_bandwidths() -> None:
    ids, config = _three_members_with_a_ring_unlike_peer_order(epoch=1)
    r = _rig(FakePort(ids[1]))
    await r.collab.start(found=True)
    r.gates.install(config)  # governs from step 0 (a newer epoch than the genesis)
    _set_grads(r.collab.model, GRADIENT)
    stats = await r.collab.step(r.collab.local_batch_size)
    [call] = r.averager.calls
    assert call.members == list(ring_order(config))
    assert call.tag.config_digest == config.digest
    p0, p1, p2 = (i.peer_id for i in ids)
    assert call.bandwidth == {p0: (1e6 + 1e10) / 2, p1: 1e6, p2: (1e10 + 1e6) / 2}  # medians of agreed links
    assert call.weight == config.member(p1).batch_share  # type: ignore[union-attr]
    assert stats.members == 3


# ---------------------------------------------------------------------------------- failures and redoing
@pytest.mark.parametrize("failure", [RoundAborted, RoundMismatch])
async def test_a_failed_round_is_redone_under_the_configuration_agreed_next(failure: type[Exception]) -> None:
    r = await _founded()
    genesis = r.collab.configuration
    survivor_config: list[Configuration] = []

    def fail(buffer: np.ndarray, _call: AverageCall) -> None:
        # While the round fails the run agrees on a new configuration for this very step.
        survivor_config.append(_with_members(r, epoch=1, activation_step=0, global_batch=6))
        raise failure("a member vanished")

    r.averager.then(fail, _fill(3.0))
    _set_grads(r.collab.model, GRADIENT)
    stats = await r.collab.step(4)
    assert _tags(r) == [(0, 0, 0), (1, 0, 0)]  # a new configuration starts its own attempt count
    assert [c.tag.config_digest for c in r.averager.calls] == [genesis.digest, survivor_config[0].digest]
    np.testing.assert_array_equal(_grads(r.collab.model), np.full(NUMEL, 3.0, dtype=np.float32))
    assert (stats.epoch, stats.attempts, stats.config_digest) == (1, 2, survivor_config[0].digest.hex())
    assert r.gates.reported == [("entered", 0), ("entered", 0), ("completed", 0)]
    assert r.collab.step_index == 1


async def test_a_round_retried_under_the_same_configuration_is_a_new_attempt() -> None:
    r = await _founded(max_round_attempts=5)
    r.averager.then(RoundAborted("timeout"), RoundAborted("timeout"), _fill(2.0))
    stats = await r.collab.step(4)
    assert _tags(r) == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]
    assert stats.attempts == 3
    np.testing.assert_array_equal(_grads(r.collab.model), np.full(NUMEL, 2.0, dtype=np.float32))


async def test_max_round_attempts_exhausted_raises_and_nothing_is_applied() -> None:
    r = await _founded(max_round_attempts=2)
    before = _values(r.collab.model)
    r.averager.then(RoundAborted("timeout"), RoundAborted("timeout"), _fill(9.0))
    with pytest.raises(TrainingError, match="failed 2 times"):
        await r.collab.step(4)
    assert len(r.averager.calls) == 2
    assert r.collab.step_index == 0
    assert ("completed", 0) not in r.gates.reported
    np.testing.assert_array_equal(_values(r.collab.model), before)
    # Calling again retries the same step as a new round: a round that ran is final in the averager.
    await r.collab.step(4)
    assert _tags(r)[-1] == (0, 0, 2)
    assert r.collab.step_index == 1


async def test_a_refused_contribution_raises_without_retrying_or_applying() -> None:
    r = await _founded()
    before = _values(r.collab.model)
    r.averager.then(ContributionRefused("wrong length", by=frozenset()))
    with pytest.raises(TrainingError, match="refused this peer's contribution"):
        await r.collab.step(4)
    assert len(r.averager.calls) == 1
    assert r.collab.step_index == 0
    np.testing.assert_array_equal(_values(r.collab.model), before)


async def test_a_change_that_governs_the_step_after_the_round_completed_discards_the_result() -> None:
    r = await _founded()
    changed: list[Configuration] = []

    def complete_then_change(buffer: np.ndarray, _call: AverageCall) -> None:
        buffer.fill(100.0)  # completed under epoch 0...
        changed.append(_with_members(r, epoch=1, activation_step=0))  # ...but epoch 1 governs step 0 now

    r.averager.then(complete_then_change, _fill(7.0))
    stats = await r.collab.step(4)
    assert [(c.tag.epoch, c.tag.config_digest) for c in r.averager.calls] == [
        (0, r.gates.configurations[RUN][0].digest),
        (1, changed[0].digest),
    ]
    np.testing.assert_array_equal(_grads(r.collab.model), np.full(NUMEL, 7.0, dtype=np.float32))
    assert (stats.epoch, stats.attempts) == (1, 2)
    assert r.gates.reported == [("entered", 0), ("entered", 0), ("completed", 0)]


async def test_a_change_from_a_later_step_keeps_the_completed_round() -> None:
    r = await _founded()

    def complete_and_change_later(buffer: np.ndarray, _call: AverageCall) -> None:
        buffer.fill(100.0)
        _with_members(r, epoch=1, activation_step=1)

    r.averager.then(complete_and_change_later)
    stats = await r.collab.step(4)
    assert len(r.averager.calls) == 1
    assert (stats.epoch, stats.attempts) == (0, 1)
    np.testing.assert_array_equal(_grads(r.collab.model), np.full(NUMEL, 100.0, dtype=np.float32))
    await r.collab.step(4)
    assert r.averager.calls[1].tag.epoch == 1  # the next step runs under the change


async def test_a_gated_step_waits_for_the_change_and_runs_under_it() -> None:
    r = await _founded()
    r.gates.gate(RUN, 0)
    results: list[StepStatistics] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def step() -> None:
                results.append(await r.collab.step(4))

            tg.start_soon(step)
            await r.gates.someone_waits()
            assert r.averager.calls == []  # no round while the step is gated
            assert r.gates.reported == []
            change = _with_members(r, epoch=1, activation_step=0)
            r.gates.ungate(RUN)
    assert [c.tag.config_digest for c in r.averager.calls] == [change.digest]
    assert results[0].epoch == 1


# ---------------------------------------------------------------------------------- fetching a completed round
def _two_members(r: Rig) -> tuple[Any, Configuration]:
    other = identities(1, base=70)[0].peer_id
    return other, _with_members(r, other, epoch=1, activation_step=0, global_batch=8)


UPDATE = np.linspace(-1.0, 1.0, NUMEL, dtype=np.float32)


async def test_after_a_failed_round_with_no_change_the_others_result_is_fetched_not_redone() -> None:
    r = await _founded()
    other, config = _two_members(r)
    r.port.answer(other, UpdateHeader(step=0, epoch=1, config_digest=config.digest, numel=NUMEL), UPDATE.tobytes())
    r.averager.then(RoundAborted("our link broke after the others completed"))
    stats = await r.collab.step(4)
    assert len(r.averager.calls) == 1  # not redone
    assert r.port.dialled == [(other, PROTOCOL)]  # the other member only, never itself
    [stream] = r.port.opened
    assert stream.sent == [FetchUpdate(run=RUN, step=0, config_digest=config.digest)]
    np.testing.assert_array_equal(_grads(r.collab.model), UPDATE)
    assert (stats.attempts, stats.bytes_sent, stats.bytes_received) == (1, 0, UPDATE.nbytes)
    assert stats.round_s == stats.idle_s
    assert r.gates.reported == [("entered", 0), ("completed", 0)]
    assert r.collab.step_index == 1


async def test_the_result_is_fetched_from_a_member_over_an_up_link_before_the_other_end_of_a_cut() -> None:
    # Issue 19: an end of a cut link, whose round failed after the others completed the step, asked
    # its cut partner first (ring order): that try waited a round timeout, while the others waited
    # for it in the next step's round, and they STALLed it.
    r = await _founded()
    first, second = (i.peer_id for i in identities(2, base=90))
    me = r.port.peer_id
    governing = _with_members(r, first, second, epoch=1, activation_step=0, global_batch=12)
    cut, reachable = [p for p in ring_order(governing) if p != me]
    down = LinkEntry(a=min(me, cut, key=lambda p: p.raw), b=max(me, cut, key=lambda p: p.raw), up=False)
    header = UpdateHeader(step=0, epoch=1, config_digest=governing.digest, numel=NUMEL)
    r.port.answer(reachable, header, UPDATE.tobytes())

    def cut_then_abort(_buffer: np.ndarray, _call: AverageCall) -> None:
        # While the round ran: the others completed step 0, and the LINK_DOWN its failure raised
        # was agreed for step 1.
        r.gates.install(configuration([me, first, second], epoch=2, activation_step=1, global_batch=12, links=[down]))
        raise RoundAborted("no exchange with the other end of the cut")

    r.averager.then(cut_then_abort)
    stats = await r.collab.step(4)
    assert [peer for peer, _ in r.port.dialled] == [reachable]
    np.testing.assert_array_equal(_grads(r.collab.model), UPDATE)
    assert stats.attempts == 1


@pytest.mark.parametrize(
    "header, payload",
    [
        (dict(step=1), UPDATE),
        (dict(config_digest=b"\1" * 32), UPDATE),
        (dict(), np.full(NUMEL, np.nan, dtype=np.float32)),
    ],
    ids=["other-step", "other-configuration", "non-finite"],
)
async def test_a_fetched_result_that_does_not_fit_is_ignored_and_the_round_redone(
    header: dict[str, Any], payload: np.ndarray
) -> None:
    r = await _founded()
    other, config = _two_members(r)
    fields: dict[str, Any] = dict(step=0, epoch=1, config_digest=config.digest, numel=NUMEL) | header
    r.port.answer(other, UpdateHeader(**fields), payload.tobytes())
    r.averager.then(RoundAborted("timeout"), _fill(4.0))
    stats = await r.collab.step(4)
    assert _tags(r) == [(1, 0, 0), (1, 0, 1)]
    np.testing.assert_array_equal(_grads(r.collab.model), np.full(NUMEL, 4.0, dtype=np.float32))
    assert stats.attempts == 2


async def test_a_change_agreed_while_fetching_makes_the_step_redone_under_it() -> None:
    r = await _founded()
    other, config = _two_members(r)
    changed: list[Configuration] = []
    r.port.answer(
        other,
        lambda: changed.append(_with_members(r, other, epoch=2, activation_step=0, global_batch=9)),
        UpdateHeader(step=0, epoch=1, config_digest=config.digest, numel=NUMEL),
        UPDATE.tobytes(),
    )
    r.averager.then(RoundAborted("timeout"), _fill(6.0))
    stats = await r.collab.step(4)
    assert [c.tag.config_digest for c in r.averager.calls] == [config.digest, changed[0].digest]
    np.testing.assert_array_equal(_grads(r.collab.model), np.full(NUMEL, 6.0, dtype=np.float32))
    assert stats.epoch == 2


# ---------------------------------------------------------------------------------- removal, resync
async def test_a_member_the_run_evicted_does_not_rejoin_on_its_own() -> None:
    r = await _founded()
    r.gates.forgotten_removals.clear()  # starting forgets earlier memberships' removals
    r.gates.remove(RUN, "evicted", 0)
    with pytest.raises(TrainingError, match="evicted"):
        await r.collab.step(4)
    assert r.averager.calls == []
    assert r.gates.forgotten_removals == []


@pytest.mark.parametrize("how", ["removed", "resync"])
async def test_a_removed_or_diverged_member_rejoins_as_a_newcomer(how: str) -> None:
    r = await _founded(join_timeout_s=0.2)
    r.gates.forgotten_removals.clear()  # starting forgets earlier memberships' removals
    if how == "removed":
        r.gates.remove(RUN, "failed", 0)
    else:
        r.gates.resync[RUN] = 0
    with pytest.raises(TimeoutError):  # no peer to join from here: the join times out
        await r.collab.step(4)
    assert r.gates.forgotten_removals == [RUN]
    assert r.averager.calls == []


# ---------------------------------------------------------------------------------- balancing and eviction
async def test_measured_throughput_is_reported_every_rebalance_interval() -> None:
    r = await _founded(rebalance_interval_steps=1)
    _two_members(r)
    await r.collab.step(8)  # no compute measured before the first step
    r.port.clock.advance(2.0)  # the caller computed 8 samples in 2 s
    await r.collab.step(8)
    r.port.clock.advance(4.0)  # then 8 samples in 4 s
    await r.collab.step(8)
    assert r.gates.throughputs == [(RUN, 4.0), (RUN, pytest.approx(0.7 * 4.0 + 0.3 * 2.0))]


async def test_throughput_is_not_reported_without_balance_or_alone() -> None:
    unbalanced = await _founded(rebalance_interval_steps=1, balance=False)
    _two_members(unbalanced)
    alone = await _founded(rebalance_interval_steps=1)
    for r in (unbalanced, alone):
        await r.collab.step(8)
        r.port.clock.advance(2.0)
        await r.collab.step(8)
        assert r.gates.throughputs == []


async def test_a_member_invalid_in_consecutive_rounds_gets_an_eviction_signed() -> None:
    r = await _founded(evict_after_invalid_rounds=2)
    other, _ = _two_members(r)
    r.averager.then(*[lambda _b, _c: {"invalid": (other,)}] * 3)
    await r.collab.step(4)
    assert r.gates.evictions == []
    await r.collab.step(4)
    assert r.gates.evictions == [(RUN, other)]


async def test_a_valid_round_ends_an_invalid_streak() -> None:
    r = await _founded(evict_after_invalid_rounds=2)
    other, _ = _two_members(r)
    invalid = lambda _b, _c: {"invalid": (other,)}  # noqa: E731
    r.averager.then(invalid, _fill(1.0), invalid)
    for _ in range(3):
        await r.collab.step(4)
    assert r.gates.evictions == []


async def test_exclusions_are_reported_in_the_step_statistics() -> None:
    r = await _founded()
    other, _ = _two_members(r)
    exclusion = Exclusion(peer=other, reason="non-finite")
    r.averager.then(lambda _b, _c: {"excluded": (exclusion,)})
    stats = await r.collab.step(4)
    assert stats.excluded == (str(other),)


# ---------------------------------------------------------------------------------- DiLoCo
async def test_diloco_inner_steps_only_step_the_local_optimizer() -> None:
    r = await _founded(mode="diloco", local_steps=3, lr=0.1, outer_lr=0.5, outer_momentum=0.0)
    model = r.collab.model
    start = _values(model)
    _set_grads(model, GRADIENT)
    stats = await r.collab.step(2)
    assert r.averager.calls == []
    assert (stats.step, stats.attempts, stats.round_s, stats.samples) == (-1, 0, 0.0, 2)
    np.testing.assert_allclose(_values(model), start - 0.1 * GRADIENT, rtol=0, atol=1e-6)
    assert r.collab.step_index == 0
    assert r.gates.reported == []


async def test_diloco_outer_step_averages_the_pseudo_gradient_and_applies_the_outer_optimizer() -> None:
    r = await _founded(mode="diloco", local_steps=3, lr=0.1, outer_lr=0.5, outer_momentum=0.0)
    model = r.collab.model
    global_start = _values(model)
    for samples in (2, 3):
        _set_grads(model, GRADIENT)
        await r.collab.step(samples)
    _set_grads(model, GRADIENT)
    live: list[np.ndarray] = []
    r.averager.then(lambda _b, _c: live.append(_values(model)))  # the live model after 3 inner steps
    stats = await r.collab.step(4)

    [call] = r.averager.calls
    assert call.tag.phase == RoundPhase.OUTER
    assert call.tag.step == 0
    assert call.weight == 2 + 3 + 4  # every inner step's samples
    np.testing.assert_array_equal(call.contribution, global_start - live[0])  # pseudo-gradient
    # Outer SGD (lr 0.5, no momentum) on the average, then the live model restarts from the result.
    np.testing.assert_allclose(_values(model), global_start - 0.5 * (global_start - live[0]), rtol=0, atol=1e-6)
    assert stats.step == 0
    assert r.collab.step_index == 1
    assert r.gates.reported == [("entered", 0), ("completed", 0)]
    await r.collab.step(1)  # the count of inner steps starts over
    assert len(r.averager.calls) == 1


# ---------------------------------------------------------------------------------- trust (issue 20)
async def test_every_members_weight_is_bounded_by_its_share_in_the_configuration_and_ours_is_capped() -> None:
    """issue 20, finding 4: the averager is told each member's allowance from the agreed
    configuration (its batch share), and this member never states more than its own."""
    ids, config = _three_members_with_a_ring_unlike_peer_order(epoch=1)
    r = _rig(FakePort(ids[1]))
    await r.collab.start(found=True)
    r.gates.install(config)
    _set_grads(r.collab.model, GRADIENT)
    share = r.collab.local_batch_size
    await r.collab.step(share + 5)  # a caller overshooting its share (a drop-in's last call)
    [call] = r.averager.calls
    assert call.max_weights == {m.peer_id: float(m.batch_share) for m in config.members}
    assert call.weight == share


async def test_a_member_whose_removal_is_agreed_for_a_later_step_is_allowed_weight_zero() -> None:
    """issue 20, finding 4: a leaver still takes part until its leave takes effect, with weight 0;
    in DiLoCo the others may weigh share x local_steps."""
    ids = identities(3)
    p0, p1, p2 = (i.peer_id for i in ids)
    r = _rig(FakePort(ids[0]), mode="diloco", local_steps=2)
    await r.collab.start(found=True)
    current = r.gates.install(configuration([p0, p1, p2], epoch=1, global_batch=6, mode="diloco", local_steps=2))
    staying = sorted([p0, p1], key=lambda p: p.raw)
    r.gates.install(
        make_configuration(
            run=RUN,
            epoch=2,
            activation_step=5,
            peers=staying,
            incarnations=[1, 1],
            throughputs=[1.0, 1.0],
            links=(),
            params=current.params,
            seed=8,
            departed=[DepartedEntry(peer_id=p2, incarnation=1, epoch=2, activation_step=5)],
        )
    )
    for _ in range(2):
        _set_grads(r.collab.model, GRADIENT)
        await r.collab.step(2)
    [call] = r.averager.calls
    assert call.tag.epoch == 1
    assert call.max_weights == {p0: 4.0, p1: 4.0, p2: 0.0}
    assert call.weight == 4.0


async def test_the_collaboration_tells_the_averager_who_may_contribute_before_its_rounds() -> None:
    """issue 20, finding 5: early contributions are held only for the runs this peer trains and
    only from their members (the newest configuration's, the governing one's, a leaver's)."""
    ids = identities(4)
    p0, p1, p2, stranger = (i.peer_id for i in ids)
    r = _rig(FakePort(ids[0]))
    await r.collab.start(found=True)
    admits = r.averager.expected[RUN]
    assert admits(p0) and not admits(p1)
    r.gates.install(configuration([p0, p1], epoch=1))
    assert admits(p1) and not admits(p2) and not admits(stranger)
    r.gates.install(configuration([p0, p1, p2], epoch=2, activation_step=3))  # a newcomer from step 3
    assert admits(p2) and not admits(stranger)
    await r.collab.leave(timeout_s=0.1)
    assert RUN not in r.averager.expected


# ---------------------------------------------------------------------------------- first-hand link events
async def test_a_round_that_could_not_reach_one_peer_declares_that_link_down_at_once() -> None:
    r = await _founded(max_round_attempts=5)
    other = identities(1, base=70)[0].peer_id

    def cut(_buffer: np.ndarray, call: AverageCall) -> None:
        r.averager.unreachable_peers[call.tag] = frozenset({other})
        raise RoundAborted("timed out", missing=frozenset({other}), tag=call.tag)

    r.averager.then(cut, _fill(2.0))
    await r.collab.step(4)
    assert r.gates.link_failures == [(RUN, other)]  # before any retry: no settling delay


async def test_a_round_that_failed_for_nobody_in_particular_declares_nothing() -> None:
    r = await _founded(max_round_attempts=5)
    r.averager.then(RoundAborted("timeout"), _fill(2.0))
    await r.collab.step(4)
    assert r.gates.link_failures == []
