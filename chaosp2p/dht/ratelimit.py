"""Per-sender token buckets that cap how fast one peer can make us work.

Each sender has a bucket of ``burst`` tokens refilled at ``rate_per_s``; a request costs one token
and is dropped (not answered) when the bucket is empty. Only the ``max_senders`` most recently
active senders are tracked, so the table cannot grow without bound; a forgotten sender starts
again with a full bucket, which costs at most one burst per eviction.
"""

from __future__ import annotations

from collections import OrderedDict

from chaosp2p.wire.identity import PeerID


class TokenBucketLimiter:
    """Admission control for incoming requests, keyed by the (authenticated) sender."""

    def __init__(self, *, rate_per_s: float, burst: int, max_senders: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = float(burst)
        self.max_senders = max_senders
        self._buckets: OrderedDict[PeerID, list[float]] = OrderedDict()

    def allow(self, now: float, sender: PeerID) -> bool:
        """Take one token from ``sender``'s bucket; False means "drop this request"."""
        bucket = self._buckets.get(sender)
        if bucket is None:
            if len(self._buckets) >= self.max_senders:
                self._buckets.popitem(last=False)
            bucket = [self.burst, now]
            self._buckets[sender] = bucket
        else:
            self._buckets.move_to_end(sender)
            elapsed = now - bucket[1]
            if elapsed > 0:
                bucket[0] = min(self.burst, bucket[0] + elapsed * self.rate_per_s)
                bucket[1] = now
        if bucket[0] >= 1.0:
            bucket[0] -= 1.0
            return True
        return False

    def __len__(self) -> int:
        return len(self._buckets)
