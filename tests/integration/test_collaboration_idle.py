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
        # The idle member does not step aside itself (as a peer of a version without it, or one
        # stopped outright): the two others sign it out (the two-member case is the test below).
        idle_collab = members[2].collab
        idle_collab.config = idle_collab.config.replace(step_aside=False)
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


async def test_an_idle_member_of_two_steps_aside_so_the_other_goes_on_and_rejoins_when_it_steps() -> None:
    # Two members: no second member can sign a STALL of the idle one (negotiation.md 3b), so it
    # steps aside itself (stepping_aside.py). It used to hold the other forever: the other's round
    # timed out, it signed a STALL that removed nobody, and retried, round after round.
    async with swarm(2) as peers:
        idle, busy = (TimedMember(p, i) for i, p in enumerate(peers))
        await idle.collab.start(found=True)

        async def join_and_train(member: Member, steps: int) -> None:
            await member.collab.start(found=False)
            await member.train_until(steps)

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(idle.train_until, 8)
                tg.start_soon(join_and_train, busy, 8)
            async with anyio.create_task_group() as tg:
                for member in (idle, busy):
                    tg.start_soon(member.train_until, 10)
        assert busy.members[9] == 2

        # The founder stops calling step(); its peer stays up. The other trains on alone.
        with anyio.fail_after(30):
            await busy.train_until(16)
        assert busy.members[15] == 1
        assert idle.peer.negotiation.removed_reason(RUN) == "left"
        assert [e["event"] for e in idle.collab.take_events() if e["event"] == "stepped_aside"] == ["stepped_aside"]
        print(f"the busy member's longest gap while the other was idle: {max(_gaps(busy, 9, 16)):.2f} s")

        # It steps again: it rejoins as a newcomer and trains on with identical parameters.
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for member in (idle, busy):
                    tg.start_soon(member.train_until, 24)
        rejoined = min(s for s in idle.digests if s >= 10)  # its first step after rejoining
        assert rejoined > 15
        _agree([idle, busy], range(rejoined, 24))
        assert busy.members[23] == 2


def _gaps(member: TimedMember, first: int, last: int) -> list[float]:
    """Seconds between the ends of consecutive steps ``first``..``last`` of ``member``."""
    return [member.ended[s + 1] - member.ended[s] for s in range(first, last - 1)]
