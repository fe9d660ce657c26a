"""A commit that voids a completed step while the member waits for (or runs) its next step.

Star run 5 (``peers/nat-star.toml``): member a completed step 345 under epoch 7 while the others'
rounds of it were gated by a join (epoch 8) and a LINK_DOWN (epoch 9), both activated at 345 and
chosen by a quorum a was not in. a was then already inside ``step()`` for 346, waiting at the gate
(or in the round that epoch 9 superseded): the commit told it ``ResyncNeeded(345)``, but the
collaboration looked for a resync only on entering ``step()``, so it ran 346 under epoch 9 while
the others redid 345 under epoch 9 with it as a member. They failed that round 50 times ("a is
already at round s346") and exited. A resync is now looked for again each time the step's
configuration is fetched: the member announces its LEAVE, serves the resync step on with weight 0
until removed, and rejoins (``protocols/negotiation.md`` §3c).
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.protocols.negotiation import LinkEntry  # noqa: E402
from tests.unit.fake_port import RUN, AverageCall, Rig, configuration, identities, rig  # noqa: E402

pytestmark = pytest.mark.anyio


def _rig() -> Rig:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return rig(model, torch.optim.SGD(model.parameters(), lr=0.1), join_timeout_s=0.2, step_aside=False)


def _fill(buffer: np.ndarray, _call: AverageCall) -> None:
    buffer.fill(1.0)


async def _three_members_three_steps(r: Rig) -> list[Any]:
    """Founded; two members join from step 0; steps 0, 1 and 2 completed under epoch 1."""
    await r.collab.start(found=True)
    others = [i.peer_id for i in identities(2, base=90)]
    r.gates.install(configuration([r.port.peer_id, *others], epoch=1, activation_step=0, global_batch=12))
    r.averager.then(_fill, _fill, _fill)
    for _ in range(3):
        await r.collab.step(4)
    assert r.collab.step_index == 3
    return others


def _commits_voiding_step_2(r: Rig, others: list[Any]) -> None:
    """Two decisions back to back, chosen without us, both activated at step 2, which we completed:
    a newcomer's join (epoch 2), then a LINK_DOWN of its link to us (epoch 3). Each commit says
    resync (the service keeps the step); the last one governs the steps from 2 on."""
    me, newcomer = r.port.peer_id, identities(1, base=120)[0].peer_id
    peers = [me, *others, newcomer]
    r.gates.resync[RUN] = 2
    r.gates.install(configuration(peers, epoch=2, activation_step=2, global_batch=12, since_steps=[0, 0, 0, 2]))
    down = [LinkEntry(a=min(me, newcomer, key=lambda p: p.raw), b=max(me, newcomer, key=lambda p: p.raw), up=False)]
    r.gates.install(
        configuration(peers, epoch=3, activation_step=2, global_batch=12, since_steps=[0, 0, 0, 2], links=down)
    )
    r.gates.leave_takes_effect_at = 4  # our LEAVE, once announced, commits for step 4


def _assert_left_served_weight_0_and_rejoined(r: Rig, served_from: int) -> None:
    assert r.gates.announced == [RUN]
    served = [(c.tag.step, c.tag.epoch, c.weight) for c in r.averager.calls[served_from:]]
    # Step 2 again, under epoch 3, with this member in it (the others redo it), then step 3; never
    # step 3 with its weight (its state from step 2 on is wrong).
    assert served == [(2, 3, 0.0), (3, 3, 0.0)]
    assert r.gates.forgotten_removals == [RUN]  # and then it rejoins as a newcomer


async def test_a_resync_committed_while_the_next_step_waits_at_the_gate_leaves_before_stepping() -> None:
    r = _rig()
    others = await _three_members_three_steps(r)
    r.gates.forgotten_removals.clear()
    r.gates.gate(RUN, 3)  # a change is pending: step 3 waits for its decision
    served_from = len(r.averager.calls)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def step() -> None:
                with pytest.raises(TimeoutError):  # no peer to rejoin from on the fake: the join times out
                    await r.collab.step(4)

            tg.start_soon(step)
            await r.gates.someone_waits()  # inside step(), past its resync check, at the gate
            assert r.averager.calls[served_from:] == []
            _commits_voiding_step_2(r, others)
            r.gates.ungate(RUN)
    _assert_left_served_weight_0_and_rejoined(r, served_from)


async def test_a_resync_committed_while_the_next_steps_round_runs_leaves_before_redoing_it() -> None:
    r = _rig()
    others = await _three_members_three_steps(r)
    r.gates.forgotten_removals.clear()
    served_from = len(r.averager.calls)
    started = anyio.Event()

    async def hold(_buffer: np.ndarray, _call: AverageCall) -> None:
        started.set()
        await anyio.sleep(3600)  # the others are gated: the round waits until superseded

    r.averager.then(hold)  # type: ignore[arg-type]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def step() -> None:
                with pytest.raises(TimeoutError):
                    await r.collab.step(4)

            tg.start_soon(step)
            await started.wait()
            _commits_voiding_step_2(r, others)  # epoch 3 now governs step 3 too: the round is dropped
    assert (r.averager.calls[served_from].tag.step, r.averager.calls[served_from].tag.epoch) == (3, 1)
    _assert_left_served_weight_0_and_rejoined(r, served_from + 1)
