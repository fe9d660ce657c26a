"""Injected time.

Protocol machines never read a clock: the runtime passes ``now`` in. The runtime itself reads time
through a :class:`Clock` so that tests and simulations can substitute virtual time. All deadlines use
monotonic seconds; wall time appears only in logs and in ``status`` output.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of monotonic time in seconds."""

    def now(self) -> float:
        """Return the current monotonic time in seconds."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic`."""

    def now(self) -> float:
        """Return :func:`time.monotonic`."""
        return time.monotonic()


class VirtualClock:
    """A clock that only moves when told to, for simulations and unit tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        """Return the virtual time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (never backward)."""
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go backward")
        self._now += seconds

    def set(self, when: float) -> None:
        """Jump to ``when``, which must not be in the past."""
        if when < self._now:
            raise ValueError("a monotonic clock cannot go backward")
        self._now = when
