"""The DHT machine's timers as data: an IntEnum of kinds and a table of when each fires next.

Theory of operation
-------------------
The machine never reads a clock: the driver asks ``next_deadline()`` and calls
``handle_timeout(now)`` when it is reached. Six kinds of timer exist (:class:`DHTTimer`):

* REQUESTS -- the deadline of each request in flight (a heap: one entry per request, many at once);
* SWEEP, REFRESH, REPUBLISH -- the periodic expiry sweep, bucket refresh and republishing, always
  armed from construction;
* BOOTSTRAP_RETRY -- the end of the backoff after a failed bootstrap attempt;
* BOOTSTRAP_WAIT -- how long a bootstrap attempt stays open for the dials the driver was asked for.

``handle_timeout`` runs the due ones in the order of :class:`DHTTimer` and reads each deadline only
when its turn comes, because a handler may arm or cancel a later one (a request that times out can
end a bootstrap attempt, which cancels BOOTSTRAP_WAIT and arms BOOTSTRAP_RETRY). A request settled
before its deadline leaves its heap entry behind; :meth:`TimerTable.at` drops such entries when
they reach the top, so they cost nothing until then.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Container


class DHTTimer(enum.IntEnum):
    """The machine's timers, in the order ``handle_timeout`` runs those due at the same call."""

    REQUESTS = 1
    SWEEP = 2
    REFRESH = 3
    REPUBLISH = 4
    BOOTSTRAP_RETRY = 5
    BOOTSTRAP_WAIT = 6


class TimerTable:
    """When each :class:`DHTTimer` fires next; request deadlines are kept per request id."""

    __slots__ = ("_at", "_live", "_requests")

    def __init__(self, live_requests: Container[int]) -> None:
        """``live_requests`` answers whether a request id still waits (its deadline still counts)."""
        self._at: dict[DHTTimer, float] = {}
        self._live = live_requests
        self._requests: list[tuple[float, int]] = []

    def at(self, timer: DHTTimer) -> float | None:
        """When ``timer`` fires next (for REQUESTS: the earliest live request), or None if unarmed."""
        if timer is DHTTimer.REQUESTS:
            requests = self._requests
            while requests and requests[0][1] not in self._live:
                heapq.heappop(requests)
            return requests[0][0] if requests else None
        return self._at.get(timer)

    def arm(self, timer: DHTTimer, at: float) -> None:
        """Fire ``timer`` at ``at`` (replacing its previous deadline)."""
        if timer is DHTTimer.REQUESTS:
            raise ValueError("request deadlines are armed per request (add_request)")
        self._at[timer] = at

    def cancel(self, timer: DHTTimer) -> None:
        """Disarm ``timer`` (no-op if it is not armed)."""
        self._at.pop(timer, None)

    def add_request(self, at: float, request_id: int) -> None:
        """Request ``request_id`` times out at ``at``."""
        heapq.heappush(self._requests, (at, request_id))

    def pop_due_request(self, now: float) -> int | None:
        """Remove and return a request id whose deadline is at or before ``now`` (maybe settled)."""
        requests = self._requests
        if requests and requests[0][0] <= now:
            return heapq.heappop(requests)[1]
        return None

    def earliest(self) -> float | None:
        """The earliest deadline of any timer, or None."""
        best = self.at(DHTTimer.REQUESTS)
        for at in self._at.values():
            if best is None or at < best:
                best = at
        return best
