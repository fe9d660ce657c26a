"""The upload token bucket and the per-link rules, on a virtual clock (sleeping advances virtual time)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from chaosp2p.clock import VirtualClock
from chaosp2p.errors import ConfigError
from chaosp2p.transport import shaper
from chaosp2p.transport.shaper import (
    LINK_RULES_ENV,
    LinkRule,
    LinkShaper,
    TokenBucket,
    read_link_rules,
    write_link_rules,
)

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


# ------------------------------------------------------------------ per-link rules (cluster harness)


def test_no_environment_variable_means_no_link_shaper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LINK_RULES_ENV, raising=False)
    assert LinkShaper.from_environment(VirtualClock()) is None


def test_rules_file_round_trips_and_reloads_on_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "links.json"
    write_link_rules(path, {"A": LinkRule(delay_s=0.05, bandwidth_bytes_per_s=1e6)}, seed=3)
    assert read_link_rules(path) == ({"A": LinkRule(delay_s=0.05, bandwidth_bytes_per_s=1e6)}, 3)
    monkeypatch.setenv(LINK_RULES_ENV, str(path))
    shaper = LinkShaper.from_environment(VirtualClock())
    assert shaper is not None
    assert shaper.delay_for("A") == pytest.approx(0.05)
    assert shaper.delay_for("B") is None  # no rule: records go straight out
    assert not shaper.reload()  # unchanged file: nothing re-read
    write_link_rules(path, {"A": LinkRule(cut=True)})
    os.utime(path, ns=(1, 1))  # a distinct mtime even on coarse-grained file systems
    assert shaper.reload()
    assert shaper.is_cut("A")
    assert shaper.delay_for("A") == 0.0  # held by the delay line while cut, not skipped


def test_a_malformed_rules_file_keeps_the_old_rules(tmp_path: Path) -> None:
    path = tmp_path / "links.json"
    write_link_rules(path, {"A": LinkRule(delay_s=0.01)})
    shaper = LinkShaper(clock=VirtualClock(), path=path)
    assert shaper.reload()
    path.write_text('{"peers": {"A": {"delay_ms": -5}}}')
    os_stamp = path.stat().st_mtime_ns + 1
    os.utime(path, ns=(os_stamp, os_stamp))
    assert not shaper.reload()
    assert shaper.rule("A") == LinkRule(delay_s=0.01)


@pytest.mark.parametrize(
    "rule",
    [
        {"delay_ms": -1},
        {"delay_ms": 61_000},
        {"loss": 1.0},
        {"loss": -0.1},
        {"bandwidth_bytes_per_s": 0},
        {"bandwidth_bytes_per_s": float("inf")},
        {"delay_ms": "slow"},
        {"jitter_ms": 3},
    ],
)
def test_impossible_rules_are_refused(rule: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        LinkRule.from_json(rule)


def test_loss_is_modelled_as_a_retransmission_delay() -> None:
    shaper = LinkShaper({"A": LinkRule(delay_s=0.01, loss=0.25)}, clock=VirtualClock(), seed=1)
    delays = [shaper.delay_for("A") for _ in range(4000)]
    spiked = [d for d in delays if d is not None and d > 0.01]
    # Every lost record pays the 200 ms minimum RTO on top of the delay; about a quarter are lost.
    assert all(d == pytest.approx(0.21) for d in spiked)
    assert shaper.lost_records == len(spiked)
    assert 0.2 < len(spiked) / len(delays) < 0.3


def test_a_neutral_rule_costs_nothing() -> None:
    shaper = LinkShaper({"A": LinkRule()}, clock=VirtualClock())
    assert LinkRule().neutral
    assert shaper.delay_for("A") is None


async def test_bandwidth_is_paced_per_peer(clock: VirtualClock) -> None:
    shaper = LinkShaper(
        {"A": LinkRule(bandwidth_bytes_per_s=100_000.0), "B": LinkRule(bandwidth_bytes_per_s=1e9)}, clock=clock
    )
    for _ in range(10):
        await shaper.pace("A", 16384 + 5000)  # burst is 16 KiB: the rest is paid at 100 kB/s
    assert clock.now() == pytest.approx((10 * (16384 + 5000) - 16384) / 100_000.0)
    before = clock.now()
    await shaper.pace("B", 1000)
    await shaper.pace("C", 10**9)  # no rule: not paced
    assert clock.now() == before
