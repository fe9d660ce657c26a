"""The trainer's activity, as a collaboration's idle watcher sees it (:mod:`~chaosp2p.training.stepping_aside`).

A trainer is active while inside ``step()`` and at each ``note_activity()``; between activities it
computes (or is idle). The watcher compares how long it has been idle with its own gaps between
activities, so a slow trainer is not taken for an idle one.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

GAP_WINDOW = 32
"""Gaps kept for the median (the latest ones)."""


class Activity:
    """When the trainer was last active, and its own gaps between activities.

    Times are passed in (the collaboration's clock). Thread-safe: the blocking facade notes activity
    from the trainer's thread while the watcher reads it on the event loop.
    """

    def __init__(self, window: int = GAP_WINDOW) -> None:
        self._lock = threading.Lock()
        self._gaps: deque[float] = deque(maxlen=window)
        self._last: float | None = None
        self._busy = 0

    def note(self, now: float) -> None:
        """An activity that takes no time (a drop-in's inner step, the end of ``start()``)."""
        with self._lock:
            self._gap(now)
            self._last = now

    def begin(self, now: float) -> None:
        """A ``step()`` begins: the trainer is busy until :meth:`end`."""
        with self._lock:
            self._gap(now)
            self._busy += 1
            self._last = now

    def end(self, now: float) -> None:
        """A ``step()`` ended."""
        with self._lock:
            self._busy = max(0, self._busy - 1)
            self._last = now

    def _gap(self, now: float) -> None:
        if not self._busy and self._last is not None:
            self._gaps.append(now - self._last)

    def idle_for(self, now: float) -> float | None:
        """How long the trainer has been idle (None while in ``step()`` or before any activity)."""
        with self._lock:
            return None if self._busy or self._last is None else now - self._last

    def bound_s(self, *, min_s: float, gap_mult: float) -> float:
        """How long the trainer may be idle while it holds others: the floor, or ``gap_mult`` median gaps."""
        with self._lock:
            gaps = list(self._gaps)
        return max(min_s, gap_mult * statistics.median(gaps)) if gaps else min_s
