"""A round whose step a new configuration now governs is dropped at once, not left to its timeout.

Issue 19 (a 30 s SIGSTOP): one member's round ended early on another owner's timeout notice, it
retried under the old configuration, and the STALL committed half a second later; its retry then
ran to its own timeout while the others, already in the new configuration's round, waited for it
(5.09 s instead of ~2.6 s). Its result could never have been used (the governing configuration
changed), so the collaboration drops it as soon as the change is committed and redoes the step.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.unit.fake_port import AverageCall, configuration, identities, rig  # noqa: E402

pytestmark = pytest.mark.anyio


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


async def test_a_round_is_dropped_once_a_new_configuration_governs_its_step_and_the_step_is_redone() -> None:
    r = rig(*_model(), max_round_attempts=5)
    await r.collab.start(found=True)
    r.averager.then(lambda b, c: b.fill(1.0), lambda b, c: b.fill(1.0))
    for _ in range(2):
        await r.collab.step(4)
    other, stopped = (i.peer_id for i in identities(2, base=240))
    r.gates.install(configuration([r.port.peer_id, other, stopped], epoch=1, activation_step=2))
    started = anyio.Event()

    async def hold(_buffer: np.ndarray, _call: AverageCall) -> None:
        started.set()
        await anyio.sleep(3600)  # waits for the stopped member until the round's timeout (never, here)

    def fill(buffer: np.ndarray, _call: AverageCall) -> None:
        buffer.fill(2.0)

    r.averager.then(hold, fill)  # type: ignore[arg-type]
    result: list[Any] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:

            async def step() -> None:
                result.append(await r.collab.step(4))

            tg.start_soon(step)
            await started.wait()
            # The STALL of ``stopped`` is committed: epoch 2 governs the step the round is in.
            r.gates.install(configuration([r.port.peer_id, other], epoch=2, activation_step=2))
    (stats,) = result
    assert stats.step == 2 and stats.attempts == 2 and stats.epoch == 2
    assert [c.tag.epoch for c in r.averager.calls[-2:]] == [1, 2]
