"""Upload rate limiting: a token bucket shared by every connection of a host.

Used two ways: by operators who must not saturate a site's uplink (``max_upload_bytes_per_s``),
and by benchmarks and tests that emulate heterogeneous links on one machine (each source process
capped at a different rate). The bucket is refilled from the injected clock, never a wall clock.
"""

from __future__ import annotations

import anyio

from chaosp2p.clock import Clock


class TokenBucket:
    """Allows ``rate_bytes_per_s`` on average with bursts of up to ``burst_bytes``."""

    def __init__(self, rate_bytes_per_s: float, *, burst_bytes: float, clock: Clock) -> None:
        if rate_bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate_bytes_per_s
        self.burst = burst_bytes
        self._clock = clock
        self._tokens = burst_bytes
        self._updated = clock.now()
        self._lock = anyio.Lock()

    def _refill(self) -> None:
        now = self._clock.now()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now

    async def acquire(self, count: int) -> None:
        """Wait until ``count`` bytes may be sent (FIFO among waiters; any size is accepted)."""
        async with self._lock:
            self._refill()
            self._tokens -= count
            if self._tokens < 0:
                # Going into debt and sleeping it off lets a record larger than the burst through
                # while keeping the long-run average exact.
                await anyio.sleep(-self._tokens / self.rate)
                self._refill()
