"""Per-sender token buckets, shared by every protocol machine that answers remote peers.

Every message a peer sends us costs tokens (one, or more for a request whose answer is large);
tokens refill at a configured rate up to a burst. A sender without tokens has its messages dropped
and counted, so a peer flooding heartbeats or gossip cannot make us do unbounded work. The table of
buckets is bounded: when it is full, buckets that have refilled completely (idle senders) are
forgotten first, and if none has, the least recently seen sender's bucket is.
"""

from __future__ import annotations

from chaosp2p.wire.identity import PeerID


class RateLimiter:
    """Token bucket per sender."""

    __slots__ = ("_buckets", "_burst", "_max_senders", "_rate")

    def __init__(self, *, rate_per_s: float, burst: float, max_senders: int) -> None:
        self._rate = rate_per_s
        self._burst = burst
        self._max_senders = max_senders
        # sender -> (tokens, last refill time); dict order = least recently seen first
        self._buckets: dict[bytes, tuple[float, float]] = {}

    def allow(self, sender: PeerID, now: float, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens of ``sender`` if it has them."""
        key = sender.raw  # bytes cache their hash; PeerID's dataclass hash does not
        entry = self._buckets.pop(key, None)
        if entry is None:
            tokens = self._burst
            if len(self._buckets) >= self._max_senders:
                self._evict(now)
        else:
            tokens, last = entry
            tokens = min(self._burst, tokens + (now - last) * self._rate) if now > last else tokens
        allowed = tokens >= cost
        if allowed:
            tokens -= cost
        self._buckets[key] = (tokens, now)
        return allowed

    def __len__(self) -> int:
        return len(self._buckets)

    def sweep(self, now: float) -> None:
        """Forget senders whose buckets are full again (they would start full anyway)."""
        full = [s for s, (tokens, last) in self._buckets.items() if tokens + (now - last) * self._rate >= self._burst]
        for sender in full:
            del self._buckets[sender]

    def _evict(self, now: float) -> None:
        self.sweep(now)
        while len(self._buckets) >= self._max_senders:
            del self._buckets[next(iter(self._buckets))]
