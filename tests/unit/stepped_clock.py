"""A virtual clock that tasks can sleep on, stepped by the test (the fake port's clock).

A background task that waits between looks (a collaboration's idle watcher) sleeps on the peer's
clock through ``TrainingPort.sleep``. On :class:`SteppedClock` that sleep ends only when the test
advances the clock past its deadline, and :meth:`SteppedClock.settled` returns once every task the
advance woke sleeps again -- that is, has taken its look. So a test proves "nothing happened" by a
look that was taken, not by a real-time pause long enough on a quiet machine.
"""

from __future__ import annotations

import anyio

from chaosp2p.clock import VirtualClock

SETTLE_BOUND_S = 5.0
"""Longest :meth:`SteppedClock.settled` waits before the test fails (no test hangs)."""


class SteppedClock(VirtualClock):
    """A :class:`~chaosp2p.clock.VirtualClock` whose :meth:`sleep` ends when the test advances it."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self._sleepers: list[tuple[float, anyio.Event, int]] = []  # deadline, its wake-up, the task
        self._awake: set[int] = set()  # tasks an advance woke that have not slept again yet
        self._changed = anyio.Event()

    def advance(self, seconds: float) -> None:
        """Move time forward and wake the sleepers whose deadline it reached."""
        super().advance(seconds)
        self._wake()

    def set(self, when: float) -> None:
        """Jump to ``when`` and wake the sleepers whose deadline it reached."""
        super().set(when)
        self._wake()

    async def sleep(self, seconds: float) -> None:
        """Return once the clock stands ``seconds`` later than now (the test advances it)."""
        deadline = self.now() + seconds
        task = anyio.get_current_task().id
        self._awake.discard(task)  # this task has taken its look
        while self.now() < deadline:
            woken = anyio.Event()
            entry = (deadline, woken, task)
            self._sleepers.append(entry)
            self._notify()
            try:
                await woken.wait()
            finally:
                if entry in self._sleepers:  # cancelled while asleep
                    self._sleepers.remove(entry)
                    self._notify()

    def sleeping(self) -> int:
        """How many tasks sleep on this clock now."""
        return len(self._sleepers)

    async def settled(self) -> None:
        """Return once a task sleeps on this clock and every task an advance woke sleeps again.

        Call it after :meth:`advance`: when it returns, the tasks that were due have run up to their
        next sleep (an idle watcher has taken its look, and acted on it).
        """
        with anyio.fail_after(SETTLE_BOUND_S):
            while self._awake or not self._sleepers:
                changed = self._changed
                await changed.wait()

    async def tick(self, seconds: float) -> None:
        """:meth:`advance` by ``seconds``, then :meth:`settled`."""
        self.advance(seconds)
        await self.settled()

    def _wake(self) -> None:
        due = [entry for entry in self._sleepers if entry[0] <= self.now()]
        for entry in due:
            self._sleepers.remove(entry)
            entry[1].set()
            self._awake.add(entry[2])

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
