"""The upload token bucket, on a virtual clock (sleeping advances virtual time)."""

from __future__ import annotations

import anyio
import pytest

from chaosp2p.clock import VirtualClock
from chaosp2p.transport import shaper
from chaosp2p.transport.shaper import TokenBucket

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    virtual = VirtualClock()

    async def virtual_sleep(seconds: float) -> None:
        virtual.advance(seconds)
        await anyio.lowlevel.checkpoint()

    monkeypatch.setattr(shaper.anyio, "sleep", virtual_sleep)
    return virtual


async def test_long_run_rate_matches_the_limit(clock: VirtualClock) -> None:
    bucket = TokenBucket(1000.0, burst_bytes=100.0, clock=clock)
    for _ in range(50):
        await bucket.acquire(100)
    # 5000 bytes at 1000 B/s after a 100-byte burst: 4.9 s of virtual time.
    assert clock.now() == pytest.approx(4.9)


async def test_records_larger_than_the_burst_still_pass(clock: VirtualClock) -> None:
    bucket = TokenBucket(1000.0, burst_bytes=10.0, clock=clock)
    await bucket.acquire(1010)
    assert clock.now() == pytest.approx(1.0)


async def test_idle_time_refills_only_up_to_the_burst(clock: VirtualClock) -> None:
    bucket = TokenBucket(100.0, burst_bytes=50.0, clock=clock)
    clock.advance(100.0)
    await bucket.acquire(50)
    assert clock.now() == pytest.approx(100.0)
    await bucket.acquire(50)
    assert clock.now() == pytest.approx(100.5)


def test_invalid_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0, burst_bytes=1, clock=VirtualClock())
