"""Upload rate limiting (a token bucket shared by every connection of a host) and per-link shaping.

Used two ways: by operators who must not saturate a site's uplink (``max_upload_bytes_per_s``),
and by benchmarks and tests that emulate heterogeneous links on one machine (each source process
capped at a different rate). The bucket is refilled from the injected clock, never a wall clock.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from chaosp2p.clock import Clock
from chaosp2p.errors import ConfigError

log = logging.getLogger("chaosp2p.transport")


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


# ---------------------------------------------------------------------------------------------------
# Per-link shaping for the cluster harness.
#
# The harness (``chaosp2p cluster``) emulates a network of slow, lossy and failing links between
# processes on one machine, without root: it writes a JSON rules file and starts each peer with
# ``CHAOSP2P_LINK_RULES`` naming it. Without that variable no LinkShaper exists and the transport
# runs exactly as before (one ``is None`` test per record). The file is re-read when it changes, so
# the harness cuts and restores links by rewriting it.
#
# Model (one direction; the harness writes the same rule on both ends of a link):
# * bandwidth: a token bucket per remote peer, paced before a record is sealed;
# * delay: every record leaves ``delay_ms`` after it was written, in order (a delay line per
#   connection), so a stream's throughput is bounded by its flow-control window per round trip,
#   as TCP's is;
# * loss: chaosp2p runs over TCP, where a lost segment is retransmitted, not lost. A record is
#   "lost" with probability ``loss`` and then pays a retransmission timeout (Linux' 200 ms minimum
#   RTO, or two one-way delays if larger) -- and, the line being FIFO, so does everything behind it:
#   head-of-line blocking, as TCP does it;
# * cut: the delay line holds every record (nothing leaves, nothing is dropped: a restored link
#   delivers what was held, as TCP would after retransmissions) and dials to / handshakes from the
#   peer fail, so heartbeats go unanswered and the link is detected down; a cut longer than the
#   transport's ``dead_connection_timeout_s`` closes the connection, as a real one would.

LINK_RULES_ENV = "CHAOSP2P_LINK_RULES"
"""Environment variable naming the JSON link-rules file (set only by the cluster harness)."""

MIN_RETRANSMIT_S = 0.2
"""A "lost" record's extra delay: Linux' minimum TCP retransmission timeout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkRule:
    """How the link to one remote peer behaves, in the sending direction."""

    bandwidth_bytes_per_s: float | None = None
    """Sending rate cap towards this peer (``None``: unlimited)."""
    delay_s: float = 0.0
    """One-way delay added to every record."""
    loss: float = 0.0
    """Fraction of records that pay a retransmission timeout (TCP turns loss into delay)."""
    cut: bool = False
    """Blackhole: nothing is delivered and no connection to the peer can be made."""

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s is not None and not (
            math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0
        ):
            raise ConfigError("bandwidth_bytes_per_s must be > 0 (or unset for no limit)")
        if not (math.isfinite(self.delay_s) and 0 <= self.delay_s <= 60):
            raise ConfigError("delay_s must be within [0, 60]")
        if not (0 <= self.loss < 1):
            raise ConfigError("loss must be within [0, 1)")

    @property
    def neutral(self) -> bool:
        """True if the rule changes nothing."""
        return self.bandwidth_bytes_per_s is None and self.delay_s == 0 and self.loss == 0 and not self.cut

    @property
    def retransmit_s(self) -> float:
        """Extra delay of a lost record."""
        return max(MIN_RETRANSMIT_S, 2 * self.delay_s)

    def to_json(self) -> dict[str, Any]:
        """The rule as the rules file spells it."""
        return {
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "delay_ms": self.delay_s * 1e3,
            "loss": self.loss,
            "cut": self.cut,
        }

    @classmethod
    def from_json(cls, data: Any) -> LinkRule:
        """Parse one rule of the rules file (:class:`ConfigError` if malformed)."""
        if not isinstance(data, dict):
            raise ConfigError("a link rule must be an object")
        unknown = set(data) - {"bandwidth_bytes_per_s", "delay_ms", "loss", "cut"}
        if unknown:
            raise ConfigError(f"unknown link rule keys: {sorted(unknown)}")
        try:
            bandwidth = data.get("bandwidth_bytes_per_s")
            return cls(
                bandwidth_bytes_per_s=None if bandwidth is None else float(bandwidth),
                delay_s=float(data.get("delay_ms", 0.0)) / 1e3,
                loss=float(data.get("loss", 0.0)),
                cut=bool(data.get("cut", False)),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"bad link rule {data!r}: {exc}") from None


def write_link_rules(path: Path, rules: Mapping[str, LinkRule], *, seed: int = 0) -> None:
    """Atomically write a rules file: ``{"seed": n, "peers": {peer_id: rule}}`` (the harness's side)."""
    document = {"seed": seed, "peers": {peer: rule.to_json() for peer, rule in sorted(rules.items())}}
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=1))
    os.replace(temporary, path)


def read_link_rules(path: Path) -> tuple[dict[str, LinkRule], int]:
    """Parse a rules file into ``({peer_id: rule}, seed)`` (:class:`ConfigError` if malformed)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read link rules {path}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("peers", {}), dict):
        raise ConfigError(f"{path}: expected {{'seed': int, 'peers': {{peer_id: rule}}}}")
    seed = document.get("seed", 0)
    if not isinstance(seed, int):
        raise ConfigError(f"{path}: seed must be an integer")
    return {str(peer): LinkRule.from_json(rule) for peer, rule in document.get("peers", {}).items()}, seed


class LinkShaper:
    """Per-remote-peer link rules of one host; see the model above. Created only by the harness."""

    def __init__(
        self,
        rules: Mapping[str, LinkRule] | None = None,
        *,
        clock: Clock,
        seed: int = 0,
        path: Path | None = None,
    ) -> None:
        self._clock = clock
        self._path = path
        self._stamp: int | None = None
        self._rules: dict[str, LinkRule] = dict(rules or {})
        self._buckets: dict[str, TokenBucket] = {}
        self._random = random.Random(seed)
        self._seeded = path is None
        self.lost_records = 0
        """Records that paid a retransmission timeout."""

    @classmethod
    def from_environment(cls, clock: Clock) -> LinkShaper | None:
        """The shaper the harness asked for through ``CHAOSP2P_LINK_RULES``, or ``None`` (the default)."""
        name = os.environ.get(LINK_RULES_ENV)
        if not name:
            return None
        shaper = cls(clock=clock, path=Path(name))
        shaper.reload()
        return shaper

    def rule(self, peer: object) -> LinkRule | None:
        """The rule for the link to ``peer`` (a PeerID or its text), if any."""
        return self._rules.get(str(peer))

    def set_rules(self, rules: Mapping[str, LinkRule]) -> None:
        """Replace every rule (buckets of changed rates start afresh)."""
        for peer, bucket in list(self._buckets.items()):
            rule = rules.get(peer)
            if rule is None or rule.bandwidth_bytes_per_s != bucket.rate:
                del self._buckets[peer]
        self._rules = dict(rules)

    def reload(self) -> bool:
        """Re-read the rules file if it changed; True if the rules were replaced.

        A malformed file (the harness never writes one) is logged and the old rules stay.
        """
        if self._path is None:
            return False
        try:
            stamp = self._path.stat().st_mtime_ns
        except OSError:
            return False
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            rules, seed = read_link_rules(self._path)
        except ConfigError as exc:
            log.warning("ignoring link rules: %s", exc)
            return False
        if not self._seeded:  # the harness gives each peer its own seed: loss is reproducible per run
            self._seeded = True
            self._random.seed(seed)
        self.set_rules(rules)
        return True

    async def watch(self, interval_s: float = 0.1) -> None:
        """Re-read the rules file whenever it changes (runs in the host's task group)."""
        while True:
            await anyio.sleep(interval_s)
            self.reload()

    def is_cut(self, peer: object) -> bool:
        """True if the link to ``peer`` is cut."""
        rule = self._rules.get(str(peer))
        return rule is not None and rule.cut

    async def pace(self, peer: object, count: int) -> None:
        """Wait until ``count`` bytes may go to ``peer`` under its bandwidth cap."""
        key = str(peer)
        rule = self._rules.get(key)
        if rule is None or rule.bandwidth_bytes_per_s is None:
            return
        bucket = self._buckets.get(key)
        if bucket is None:
            rate = rule.bandwidth_bytes_per_s
            bucket = self._buckets[key] = TokenBucket(rate, burst_bytes=max(16384.0, rate / 20), clock=self._clock)
        await bucket.acquire(count)

    def delay_for(self, peer: object) -> float | None:
        """Seconds a record written now to ``peer`` is held (``None``: the link is not delayed).

        A cut link answers 0: the record goes into the delay line, which holds it while cut.
        """
        rule = self._rules.get(str(peer))
        if rule is None or (rule.delay_s == 0 and rule.loss == 0 and not rule.cut):
            return None
        delay = rule.delay_s
        if rule.loss and self._random.random() < rule.loss:
            self.lost_records += 1
            delay += rule.retransmit_s
        return delay
