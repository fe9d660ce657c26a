"""An idle member steps aside itself (issue 19; chaosp2p/training/stepping_aside.py), on a fake port.

The trainer's idle time and the watcher's looks run on the port's stepped clock: the watcher sleeps
on it between looks (``TrainingPort.sleep``), an advance wakes it for one look, and
``clock.settled()`` returns once it took that look and sleeps again -- no real-time pause stands in
for "the watcher has looked". A member steps aside only while others' contributions wait for it (the
averager holds early ones) and its trainer has been idle past max(floor, 4 x its median gap): it
announces a LEAVE, serves the rounds with weight 0 until the run commits it -- keeping their
updates, not applying them -- and at its next step() either rejoins (removed) or replays the kept
updates (the LEAVE did not take effect).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.errors import RoundAborted  # noqa: E402
from chaosp2p.training.activity import Activity  # noqa: E402
from tests.unit.fake_port import RUN, AverageCall, Rig, configuration, identities, rig  # noqa: E402

pytestmark = pytest.mark.anyio

NUMEL = 8


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _params(model: Any) -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel().copy() for p in model.parameters()])


def _fill(value: float) -> Callable[[np.ndarray, AverageCall], None]:
    def fill(buffer: np.ndarray, _call: AverageCall) -> None:
        buffer.fill(value)

    return fill


async def _two_members_stepping(r: Rig) -> Any:
    """Founded, then a member joins from step 0; three steps, one virtual second of compute each."""
    await r.collab.start(found=True)
    other = identities(1, base=70)[0].peer_id
    r.gates.install(configuration([r.port.peer_id, other], epoch=1, activation_step=0, global_batch=8))
    r.averager.then(_fill(1.0), _fill(1.0), _fill(1.0))
    for _ in range(3):
        r.port.clock.advance(1.0)
        await r.collab.step(4)
    return other


POLL_S = 0.25
"""The watcher's period, in the port's virtual seconds (exact in binary: ticks land on its deadlines)."""


def _rig(**config: Any) -> Rig:
    return rig(*_model(), step_aside_idle_min_s=2.0, step_aside_poll_s=POLL_S, **config)


@asynccontextmanager
async def _watched_pair(**config: Any) -> AsyncIterator[Rig]:
    """Two members three steps in, the collaboration's watcher running in a task group of the test."""
    r = _rig(**config)
    async with anyio.create_task_group() as tg:
        r.port.task_group = tg
        await _two_members_stepping(r)
        yield r
        tg.cancel_scope.cancel()  # the watcher runs until the peer's task group ends


async def test_an_idle_member_that_holds_the_others_steps_aside_and_rejoins_at_its_next_step() -> None:
    async with _watched_pair(join_timeout_s=0.2) as r:
        assert r.port.spawned == [f"chaosp2p idle watcher of run {RUN!r}"]
        before = _params(r.collab.model)
        # The other member's contribution waits here; the bound is max(2 s, 4 x 1 s median gap).
        r.averager.early.add(RUN)
        await r.port.clock.tick(3.0)  # idle 3 s of the 4 s bound: the watcher looks, and stays
        assert r.gates.announced == []
        # Idle past the bound, but nobody waits for this member: it stays.
        r.averager.early.clear()
        await r.port.clock.tick(7.0)
        assert r.gates.announced == []
        r.gates.leave_takes_effect_at = 4  # the run commits the LEAVE at step 4
        r.averager.then(_fill(5.0))  # the round it serves meanwhile
        r.averager.early.add(RUN)
        await r.port.clock.tick(POLL_S)  # its next look: it steps aside and serves until removed
        assert r.collab.step_index == 4 and r.gates.announced == [RUN]
        served = r.averager.calls[-1]
        assert served.tag.step == 3 and served.weight == 0.0
        np.testing.assert_array_equal(served.contribution, np.zeros(NUMEL, dtype=np.float32))
        np.testing.assert_array_equal(_params(r.collab.model), before)  # the update is kept, not applied
        events = r.collab.take_events()
        assert [e["event"] for e in events] == ["stepped_aside"]
        assert events[0]["step"] == 3 and events[0]["bound_s"] == 4.0
        # Stepped aside once: the watcher does not announce again while it waits for the trainer.
        await r.port.clock.tick(POLL_S)
        assert r.gates.announced == [RUN]
        # Its next step(): removed from step 4, so it rejoins as a newcomer (no peer to join from on
        # the fake: the join times out) -- not a round under the old configuration.
        r.gates.forgotten_removals.clear()
        calls = len(r.averager.calls)
        with pytest.raises(TimeoutError):
            await r.collab.step(4)
        assert r.gates.forgotten_removals == [RUN] and len(r.averager.calls) == calls


async def test_a_member_whose_leave_did_not_take_effect_replays_the_kept_updates() -> None:
    # Serving ended on an error before the run committed the LEAVE: still a member, it applies the
    # updates of the rounds it served (as the others did) before its own next round.
    async with _watched_pair(max_round_attempts=1) as r:
        before = _params(r.collab.model)
        r.averager.early.add(RUN)
        r.averager.then(_fill(5.0), RoundAborted("the other member is gone"))
        await r.port.clock.tick(5.0)  # the watcher steps aside; its serving ends on the aborted round
        assert len(r.averager.calls) == 5
        assert r.collab.step_index == 4 and r.gates.announced == [RUN]
        np.testing.assert_array_equal(_params(r.collab.model), before)
        r.averager.early.clear()
        r.averager.then(_fill(0.0))
        stats = await r.collab.step(4)
        assert stats.step == 4
        # SGD(lr=0.1) on the kept update (5.0 everywhere), then on this step's average (0.0).
        np.testing.assert_allclose(_params(r.collab.model), before - 0.1 * 5.0, rtol=1e-6)


async def test_a_member_inside_step_or_noting_activity_is_not_idle() -> None:
    async with _watched_pair() as r:
        r.averager.early.add(RUN)
        for _ in range(8):  # a drop-in's inner steps: activity without step(), 8 s past the 4 s bound
            r.port.clock.advance(1.0)
            r.collab.note_activity()
            await r.port.clock.settled()  # the watcher looked after each
        assert r.gates.announced == []

        async def slow_round(_buffer: np.ndarray, _call: AverageCall) -> None:
            await r.port.clock.tick(30.0)  # a long round: the watcher looks while the trainer is in step()

        r.averager.then(slow_round)
        await r.collab.step(4)
        assert r.gates.announced == []


async def test_leave_stops_the_watcher_and_a_disabled_watcher_is_never_spawned() -> None:
    async with _watched_pair() as r:
        await r.port.clock.settled()  # the watcher sleeps between looks
        assert r.port.clock.sleeping() == 1
        with anyio.fail_after(2):
            await r.collab.leave(timeout_s=0.1)
        assert r.collab._idle_stopped is not None and r.collab._idle_stopped.is_set()
        assert r.port.clock.sleeping() == 0
    off = rig(*_model(), step_aside=False)
    await off.collab.start(found=True)
    assert off.port.spawned == []


def test_the_bound_is_the_floor_or_a_multiple_of_the_trainers_own_median_gap() -> None:
    activity = Activity()
    assert activity.idle_for(0.0) is None and activity.bound_s(min_s=2.0, gap_mult=4.0) == 2.0
    for start in (0.0, 1.5, 3.0):  # 1 s in step(), then 0.5 s of compute before the next
        activity.begin(start)
        assert activity.idle_for(start + 0.5) is None  # inside step()
        activity.end(start + 1.0)
    assert activity.idle_for(5.0) == 1.0
    assert activity.bound_s(min_s=1.0, gap_mult=4.0) == 2.0  # 4 x the 0.5 s gaps
    assert activity.bound_s(min_s=3.0, gap_mult=4.0) == 3.0


async def test_a_diverged_member_of_two_leaves_and_serves_with_weight_0_before_it_rejoins() -> None:
    # An urgent change activated at step 1, which this member had completed: its state is wrong
    # from there. It used to rejoin at once and hold the other member's redone round for good (in a
    # run of two nobody else removes it); now it leaves, serves steps 1 and 2 with weight 0 until
    # the LEAVE takes effect at step 3, and then rejoins.
    r = _rig(join_timeout_s=0.2)
    await _two_members_stepping(r)
    r.gates.forgotten_removals.clear()
    r.gates.resync[RUN] = 1
    r.gates.leave_takes_effect_at = 3
    r.averager.then(_fill(5.0), _fill(5.0))
    served_from = len(r.averager.calls)
    with pytest.raises(TimeoutError):  # no peer to join from on the fake: the join times out
        await r.collab.step(4)
    assert r.gates.announced == [RUN]
    served = r.averager.calls[served_from:]
    assert [call.tag.step for call in served] == [1, 2] and all(call.weight == 0.0 for call in served)
    assert r.gates.forgotten_removals == [RUN]
    assert not r.collab._passive  # aside ended with the serving: the rejoin is a newcomer's, not a leaver's


async def test_after_a_resync_rejoin_the_step_under_way_contributes_nothing() -> None:
    # The gradient the member brought into step() was computed on the state the resync replaced,
    # and the weight-0 serving zeroed it: with its full weight it would pull the average to zero.
    r = _rig(join_timeout_s=0.2)
    await _two_members_stepping(r)
    r.gates.resync[RUN] = 1
    r.gates.leave_takes_effect_at = 3
    r.averager.then(_fill(5.0), _fill(5.0), _fill(5.0))

    async def rejoined(why: str) -> None:  # the fake has no peer to join from: rejoin at step 3
        r.gates.forget_removal(RUN)
        r.collab.step_index = 3

    r.collab._rejoin = rejoined  # type: ignore[method-assign]
    served_from = len(r.averager.calls)
    await r.collab.step(4)
    calls = r.averager.calls[served_from:]
    assert [(call.tag.step, call.weight) for call in calls] == [(1, 0.0), (2, 0.0), (3, 0.0)]
    assert r.collab.step_index == 4
