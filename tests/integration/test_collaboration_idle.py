"""A member that stops calling step() costs the others one bounded wait, not one per round (issue 19).

Three in-process peers train; one of them stops stepping (an evaluation, a script that finished its
steps while its peer keeps serving). The other two wait one round timeout for it, both sign a STALL
of it (a single member's STALL removes nobody), the run removes it through the agreed operation,
and they go on as two -- every step averaged over the same participants on both. When the idle
member steps again it rejoins as a newcomer, pulls the state, and trains with identical parameters.
"""

from __future__ import annotations

import time

import anyio
import pytest

torch = pytest.importorskip("torch")

from ..conditions import eventually  # noqa: E402
from .test_collaboration import RUN, Member, _agree, swarm  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


class TimedMember(Member):
    """A member that notes when each of its steps ended (the gaps between them are the cost)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.ended: dict[int, float] = {}

    async def train_until(self, steps: int) -> None:
        while self.collab.step_index < steps:
            before = self.collab.step_index
            await super().train_until(before + 1)
            self.ended[self.collab.step_index - 1] = time.monotonic()


async def test_the_others_go_on_without_an_idle_member_and_it_trains_again_when_it_steps() -> None:
    async with swarm(3) as peers:
        members = [TimedMember(p, i) for i, p in enumerate(peers)]
        await members[0].collab.start(found=True)

        async def join_and_train(member: Member, steps: int) -> None:
            await member.collab.start(found=False)
            await member.train_until(steps)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(members[0].train_until, 12)
                for member in members[1:]:
                    tg.start_soon(join_and_train, member, 12)
            async with anyio.create_task_group() as tg:
                for member in members:  # all three established, whenever the two were admitted
                    tg.start_soon(member.train_until, 14)
        busy, idle = members[:2], members[2]
        assert all(len(m.collab.configuration.members) == 3 for m in members)

        # The idle member stops calling step(); its peer stays up (it serves, answers, gossips).
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for member in busy:
                    tg.start_soon(member.train_until, 24)
        for member in busy:
            config = member.collab.configuration
            assert [m.peer_id for m in config.members] == sorted(m.peer.peer_id for m in busy)
            assert member.members[23] == 2
        _agree(busy, range(14, 24))
        # Removed through the agreed operation: two STALLs, from the two members that waited on it.
        await eventually(lambda: idle.peer.negotiation.removed_reason(RUN) == "stalled", timeout_s=10)
        gaps = [
            b - a
            for a, b in zip(
                [busy[0].ended[s] for s in range(13, 23)], [busy[0].ended[s] for s in range(14, 24)], strict=True
            )
        ]
        print(f"longest gap between the busy members' steps while one was idle: {max(gaps):.2f} s")

        # It steps again: it rejoins as a newcomer and trains on with identical parameters.
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for member in members:
                    tg.start_soon(member.train_until, 40)
        rejoined = min(s for s in idle.digests if s >= 14)  # its first step after rejoining
        assert rejoined > 23
        _agree(members, range(rejoined, 40))
        assert members[0].members[39] == 3
