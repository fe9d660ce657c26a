"""The data of the shard-planning model: sources, plans, argument checks and the makespan formula.

The model (``protocols/scheduling.md`` has it in full): ``M`` bytes are missing; source ``i`` starts
sending ``latency_s`` after now and then sends at ``rate_i = min(bytes_per_s, B)`` where ``B`` is the
newcomer's downlink cap (if any); every shard a source sends costs it ``per_shard_overhead_s`` more.
Source ``i`` finishes at ``l_i + n_i*h + bytes_i/rate_i`` (only sources that send anything count)
and the plan's makespan is the latest finish, but never less than the downlink's fluid bound ``D``:
the earliest time by which a receiver capped at ``B`` in total could have taken in ``M`` bytes from
these sources at all. ``D`` depends only on the instance, not on the plan, so optimising the
per-source term optimises the whole.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from chaosp2p.errors import ConfigError

Assignment = tuple[Hashable, int, int]
"""One shard (or the part of one that lies in a single missing range): ``(peer_id, offset, length)``."""

MAX_SHARDS_LIMIT = 1 << 24
"""Largest ``max_shards`` accepted: a plan materialises one tuple per shard."""


def _real(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number (got {value!r})")
    result = float(value)
    if not math.isfinite(result):
        raise ConfigError(f"{what} must be finite (got {value!r})")
    return result


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an int (got {value!r})")
    return int(value)


@dataclass(frozen=True, slots=True)
class Source:
    """A neighbor that holds the state and can send it to the newcomer.

    ``peer_id`` is any hashable label (the state-transfer layer uses ``str(PeerID)``);
    ``bytes_per_s`` the link's rate toward the newcomer (> 0); ``latency_s`` the time from now until
    its first byte can arrive (>= 0): connection set-up, or in a re-plan the rest of the shard it is
    still busy with.
    """

    peer_id: Hashable
    bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        try:
            hash(self.peer_id)
        except TypeError:
            raise ConfigError(f"Source.peer_id must be hashable (got {self.peer_id!r})") from None
        rate = _real(self.bytes_per_s, f"Source {self.peer_id!r}: bytes_per_s")
        if rate <= 0:
            raise ConfigError(f"Source {self.peer_id!r}: bytes_per_s must be > 0 (got {rate!r})")
        latency = _real(self.latency_s, f"Source {self.peer_id!r}: latency_s")
        if latency < 0:
            raise ConfigError(f"Source {self.peer_id!r}: latency_s must be >= 0 (got {latency!r})")
        object.__setattr__(self, "bytes_per_s", rate)
        object.__setattr__(self, "latency_s", latency)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardPlan:
    """Which source sends which bytes, and what the model predicts for it.

    ``assignments`` are ``(peer_id, offset, length)`` in offset order and cover the planned bytes
    exactly once; consecutive entries of one source form its contiguous block (a shard that spans
    two missing ranges in a re-plan appears once per range). Times are seconds from the start of
    the transfer, so a re-plan's ``makespan_s`` includes ``start_s``, the time already elapsed.
    """

    shard_count: int
    makespan_s: float
    assignments: tuple[Assignment, ...]
    sources_makespan_s: float = 0.0
    """Latest predicted source finish, before the downlink bound is applied."""
    downlink_bound_s: float = 0.0
    """The fluid bound ``D`` of the downlink cap (``start_s`` when there is no cap)."""
    start_s: float = 0.0
    align_bytes: int | None = None
    finish_s: Mapping[Hashable, float] = field(default_factory=dict)
    """Predicted finish time of every source that sends anything."""
    shards_per_source: Mapping[Hashable, int] = field(default_factory=dict)
    bytes_per_source: Mapping[Hashable, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        """Number of bytes the plan moves."""
        return sum(self.bytes_per_source.values())

    def ranges_by_source(self) -> dict[Hashable, list[tuple[int, int]]]:
        """Each source's ``(offset, length)`` ranges with adjacent shards merged."""
        out: dict[Hashable, list[tuple[int, int]]] = {}
        for peer, offset, length in self.assignments:
            ranges = out.setdefault(peer, [])
            if ranges and ranges[-1][0] + ranges[-1][1] == offset:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
            else:
                ranges.append((offset, length))
        return out


def check_sources(sources: Sequence[Source], *, needed: bool) -> None:
    """Reject non-:class:`Source` entries, duplicate peer ids and (if ``needed``) an empty list."""
    seen: set[Hashable] = set()
    for source in sources:
        if not isinstance(source, Source):
            raise ConfigError(f"sources must be Source objects (got {source!r})")
        if source.peer_id in seen:
            raise ConfigError(f"duplicate source peer_id {source.peer_id!r}")
        seen.add(source.peer_id)
    if needed and not sources:
        raise ConfigError("at least one source is needed to plan a non-empty transfer")


def check_total(total_bytes: object) -> int:
    """``total_bytes`` as an int >= 0."""
    total = _integer(total_bytes, "total_bytes")
    if total < 0:
        raise ConfigError(f"total_bytes must be >= 0 (got {total})")
    return total


def check_overhead(per_shard_overhead_s: object) -> float:
    """The per-shard overhead as a finite float >= 0."""
    overhead = _real(per_shard_overhead_s, "per_shard_overhead_s")
    if overhead < 0:
        raise ConfigError(f"per_shard_overhead_s must be >= 0 (got {overhead!r})")
    return overhead


def check_downlink(downlink_bytes_per_s: object) -> float | None:
    """The downlink cap as a finite float > 0, or None for no cap."""
    if downlink_bytes_per_s is None:
        return None
    cap = _real(downlink_bytes_per_s, "downlink_bytes_per_s")
    if cap <= 0:
        raise ConfigError(f"downlink_bytes_per_s must be > 0 or None (got {cap!r})")
    return cap


def check_start(start_s: object) -> float:
    """The elapsed time as a finite float >= 0."""
    start = _real(start_s, "elapsed_s")
    if start < 0:
        raise ConfigError(f"elapsed_s must be >= 0 (got {start!r})")
    return start


def check_positive_int(value: object, what: str, *, limit: int | None = None) -> int:
    """``value`` as an int >= 1 (and <= ``limit``)."""
    result = _integer(value, what)
    if result < 1:
        raise ConfigError(f"{what} must be >= 1 (got {result})")
    if limit is not None and result > limit:
        raise ConfigError(f"{what} must be <= {limit} (got {result})")
    return result


def effective_rates(sources: Sequence[Source], downlink_bytes_per_s: float | None) -> list[float]:
    """Each source's rate into the newcomer: its link rate, capped by the newcomer's downlink."""
    if downlink_bytes_per_s is None:
        return [s.bytes_per_s for s in sources]
    return [min(s.bytes_per_s, downlink_bytes_per_s) for s in sources]


def downlink_bound(total_bytes: int, sources: Sequence[Source], downlink_bytes_per_s: float | None) -> float:
    """The fluid bound ``D``: the earliest time a receiver capped at ``B`` can hold ``total_bytes``.

    No byte of source ``i`` arrives before ``l_i`` and the sources together deliver at most
    ``min(B, sum of the effective rates of the sources started by t)`` at time ``t``, whatever the
    plan; ``D`` is the first ``T`` at which the integral of that reaches ``total_bytes``. Without a
    cap it is 0 (the per-source finish times already dominate it).
    """
    if downlink_bytes_per_s is None or total_bytes == 0:
        return 0.0
    cap = downlink_bytes_per_s
    events = sorted((s.latency_s, min(s.bytes_per_s, cap)) for s in sources)
    delivered = 0.0
    rate = 0.0
    now = events[0][0]
    for latency, source_rate in events:
        if latency > now:
            gained = rate * (latency - now)
            if delivered + gained >= total_bytes:
                break  # done before this source even starts
            delivered += gained
            now = latency
        rate = min(cap, rate + source_rate)
    return now + (total_bytes - delivered) / rate


def predict_makespan(
    assignments: Iterable[Assignment],
    sources: Sequence[Source],
    *,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
    start_s: float = 0.0,
) -> float:
    """The model's makespan of any assignment list, counting each entry as one shard.

    This is the byte-exact form used to score baselines and to check plans in tests: source ``i``
    finishes at ``start + l_i + n_i*h + bytes_i/rate_i`` and the result is the latest finish, but
    at least ``start + D``. Unknown peer ids are a :class:`ConfigError`.
    """
    overhead = check_overhead(per_shard_overhead_s)
    cap = check_downlink(downlink_bytes_per_s)
    check_sources(sources, needed=False)
    by_id = {s.peer_id: s for s in sources}
    sent: dict[Hashable, list[int]] = {}
    total = 0
    for peer, _offset, length in assignments:
        if peer not in by_id:
            raise ConfigError(f"assignment names unknown source {peer!r}")
        counts = sent.setdefault(peer, [0, 0])
        counts[0] += 1
        counts[1] += length
        total += length
    finish = 0.0
    for peer, (shards, nbytes) in sent.items():
        source = by_id[peer]
        rate = source.bytes_per_s if cap is None else min(source.bytes_per_s, cap)
        finish = max(finish, source.latency_s + shards * overhead + nbytes / rate)
    return start_s + max(finish, downlink_bound(total, sources, cap))
