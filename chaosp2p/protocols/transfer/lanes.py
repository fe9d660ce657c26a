"""A lane: one leased source's share of a pull -- its queue, its requests in flight, its measured rate.

Theory of operation
-------------------
The chunk scheduler (:mod:`.scheduler`) keeps one :class:`Lane` per leased source. A lane holds the
chunks planned on that source but not yet requested (its queue, contiguous runs in order), the
``GetChunks`` requests outstanding on it (:class:`Request`, in the order the source answers them)
and what it was measured to deliver (:class:`RateMeter`). Two rates come out of the meter: the
*delivered* rate (bytes over the time the lane had work), which plans and re-plans weigh lanes by,
and the *capacity* (how fast a payload streams once it flows), which pipelines and batches are
sized from -- sizing them from the delivered rate would shrink a pipeline that was once too
shallow, for ever. These are records: every decision about them is the scheduler's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from chaosp2p.wire.identity import PeerID

RATE_WINDOW = 8
"""Payloads a lane's rate is measured over (the most recent ones)."""
CAPACITY_SMOOTHING = 0.3
"""Weight of a new payload in a lane's capacity average (the first ones weigh more)."""


class RateMeter:
    """Delivered throughput of one lane: bytes over the time the lane had work, recent payloads first.

    The clock runs from the first header after an idle spell until the lane has nothing
    outstanding again, so the first round trip and the time the newcomer had asked nothing do not
    count (a pipeline kept too shallow must not shrink the rate it is sized from), while gaps
    between payloads of a busy lane do (they are what the lane really delivers). The rate is taken
    over the last :data:`RATE_WINDOW` payloads, leaving out the very first once there are more:
    its header is often late and a shaped link starts it with a burst.
    """

    __slots__ = ("_busy_s", "_bytes", "_last_done", "_marks", "_since", "capacity", "rate", "samples")

    def __init__(self) -> None:
        self.rate: float | None = None
        self.capacity: float | None = None
        """How fast payloads stream once they flow (each one's bytes over its own time, averaged):
        what the link can do if it is never left waiting -- the pipeline is sized from it."""
        self._last_done: float | None = None
        self.samples = 0
        self._busy_s = 0.0
        self._bytes = 0
        self._since: float | None = None
        self._marks: deque[tuple[float, int]] = deque(maxlen=RATE_WINDOW + 1)

    def header(self, now: float) -> None:
        """A payload starts arriving (starts the clock if the lane was idle)."""
        if self._since is None:
            self._since = now

    def completed(self, now: float, nbytes: int, *, still_busy: bool) -> None:
        """A payload of ``nbytes`` ended at ``now``; ``still_busy``: more requests are outstanding."""
        if self._since is None:
            self._since = now
        start = self._since if self._last_done is None else max(self._since, self._last_done)
        if now > start and nbytes > 0:
            sample = nbytes / (now - start)
            weight = max(CAPACITY_SMOOTHING, 1.0 / (self.samples + 1))
            self.capacity = sample if self.capacity is None else self.capacity + weight * (sample - self.capacity)
        self._last_done = now
        self._busy_s += max(0.0, now - self._since)
        self._bytes += nbytes
        self._since = now if still_busy else None
        self._marks.append((self._busy_s, self._bytes))
        self.samples += 1
        if len(self._marks) >= 2:
            busy0, bytes0 = self._marks[0]
            elapsed, delivered = self._busy_s - busy0, self._bytes - bytes0
        else:
            elapsed, delivered = self._busy_s, self._bytes
        if elapsed > 0 and delivered > 0:
            self.rate = delivered / elapsed


@dataclass(slots=True)
class Request:
    """One ``GetChunks`` in flight."""

    request_id: int
    peer: PeerID
    first_chunk: int
    count: int
    offset: int
    length: int
    sent_at: float
    header_at: float | None = None
    """When its header arrived (its payload is being received since)."""
    discard: bool = False
    """Its payload goes nowhere: it lost the race for its chunks (or was cancelled too late)."""
    cancelled: bool = False
    """It no longer covers its chunks (cancelled, or lost the race)."""
    twin: int | None = None
    """The other request for the same chunks (end game), while both are out."""

    @property
    def started(self) -> bool:
        """The header arrived: bytes are being received."""
        return self.header_at is not None

    @property
    def chunks(self) -> range:
        """The chunks it asks for."""
        return range(self.first_chunk, self.first_chunk + self.count)


@dataclass(slots=True)
class Lane:
    """One leased source's share of the pull."""

    peer: PeerID
    lease_id: int
    latency_s: float
    prior_rate: float | None
    queue: deque[int] = field(default_factory=deque)
    requests: dict[int, Request] = field(default_factory=dict)
    """Outstanding requests, in the order they were sent (= the order the source answers them)."""
    meter: RateMeter = field(default_factory=RateMeter)
    planned_rate: float | None = None
    """The rate the current plan assumed for this lane (``None``: not planned on a measurement)."""
    bytes_verified: int = 0
    last_activity: float = 0.0
    active: bool = True
    quarantine_until: float | None = None

    @property
    def rate(self) -> float | None:
        """The best rate known: measured, else the cluster monitor's estimate."""
        return self.meter.rate if self.meter.rate is not None else self.prior_rate

    @property
    def depth_rate(self) -> float | None:
        """The rate the pipeline and the batches are sized for: the most this lane was seen to do.

        Sizing it from the delivered rate would be a trap: a pipeline a little too shallow leaves
        the source waiting, which lowers the delivered rate, which makes the pipeline shallower.
        The cluster monitor's estimate counts only until the lane has measured itself: an estimate
        that is too high (e.g. one measured in the other direction of the link) would otherwise
        keep batches of seconds on a slow source for the whole pull -- a tail the end game cannot
        take back once the source has started sending it.
        """
        measured = [r for r in (self.meter.capacity, self.meter.rate) if r is not None]
        if measured:
            return max(measured)
        return self.prior_rate

    def outstanding(self) -> Iterator[Request]:
        """Requests still answered by the source (cancelled ones included)."""
        return iter(self.requests.values())

    def outstanding_bytes(self) -> int:
        """Bytes the source still has to send for this lane."""
        return sum(r.length for r in self.requests.values())

    def outstanding_chunks(self) -> int:
        """Chunks the source still has to send for this lane."""
        return sum(r.count for r in self.requests.values())
