"""The plans the optimal planner is compared against, scored under the same model.

* :func:`plan_single_source` -- everything from the one source that would finish it first (what a
  hivemind-style ``load_state_from_peers`` does with its best donor);
* :func:`plan_equal_split` -- one equal slice per source, ignoring speed;
* :func:`plan_proportional_split` -- one slice per source, sized by its rate, ignoring latency and
  overhead;
* :func:`plan_chaos_default` -- the public Chaos code's rule: cut the state into equal pieces and
  give each next piece to the source with the least accumulated ``bytes/bandwidth`` so far.

Each returns a :class:`ShardPlan` whose makespan is :func:`predict_makespan` of its assignments, so
numbers are directly comparable with :func:`plan_shards`.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

from chaosp2p.scheduling.model import (
    MAX_SHARDS_LIMIT,
    Assignment,
    ShardPlan,
    Source,
    check_downlink,
    check_overhead,
    check_positive_int,
    check_sources,
    check_total,
    downlink_bound,
    effective_rates,
)
from chaosp2p.scheduling.planner import DEFAULT_MAX_SHARDS, DEFAULT_MIN_SHARD_BYTES, shard_count_chain


def _checked(
    total_bytes: int, sources: Sequence[Source], overhead: float, cap: float | None
) -> tuple[int, float, float | None, list[float]]:
    total = check_total(total_bytes)
    check_sources(sources, needed=total > 0)
    overhead = check_overhead(overhead)
    cap = check_downlink(cap)
    return total, overhead, cap, effective_rates(sources, cap)


def _scored(assignments: list[Assignment], sources: Sequence[Source], overhead: float, cap: float | None) -> ShardPlan:
    """Wrap assignments into a plan scored by the byte-exact model (each entry is one shard)."""
    shards: dict[Hashable, int] = {}
    nbytes: dict[Hashable, int] = {}
    for peer, _offset, length in assignments:
        shards[peer] = shards.get(peer, 0) + 1
        nbytes[peer] = nbytes.get(peer, 0) + length
    by_id = {s.peer_id: s for s in sources}
    finish: dict[Hashable, float] = {}
    for peer, count in shards.items():
        source = by_id[peer]
        rate = source.bytes_per_s if cap is None else min(source.bytes_per_s, cap)
        finish[peer] = source.latency_s + count * overhead + nbytes[peer] / rate
    latest = max(finish.values(), default=0.0)
    bound = downlink_bound(sum(nbytes.values()), sources, cap)
    return ShardPlan(
        shard_count=len(assignments),
        makespan_s=max(latest, bound),
        assignments=tuple(assignments),
        sources_makespan_s=latest,
        downlink_bound_s=bound,
        finish_s=finish,
        shards_per_source=shards,
        bytes_per_source=nbytes,
    )


def _slices(total: int, weights: Sequence[float], sources: Sequence[Source]) -> list[Assignment]:
    """One contiguous slice per source with length proportional to its weight (empty ones dropped)."""
    whole = sum(weights)
    out: list[Assignment] = []
    start = 0
    running = 0.0
    for index, (source, weight) in enumerate(zip(sources, weights, strict=True)):
        running += weight
        end = total if index == len(sources) - 1 else min(total, max(start, int(total * (running / whole))))
        if end > start:
            out.append((source.peer_id, start, end - start))
        start = end
    return out


def plan_single_source(
    total_bytes: int,
    sources: Sequence[Source],
    *,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
) -> ShardPlan:
    """All bytes, as one shard, from the source with the earliest finish ``l + h + S/rate``."""
    total, overhead, cap, rates = _checked(total_bytes, sources, per_shard_overhead_s, downlink_bytes_per_s)
    if total == 0:
        return _scored([], sources, overhead, cap)
    best = min(range(len(sources)), key=lambda i: (sources[i].latency_s + overhead + total / rates[i], i))
    return _scored([(sources[best].peer_id, 0, total)], sources, overhead, cap)


def plan_equal_split(
    total_bytes: int,
    sources: Sequence[Source],
    *,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
) -> ShardPlan:
    """One equal contiguous slice per source."""
    total, overhead, cap, _rates = _checked(total_bytes, sources, per_shard_overhead_s, downlink_bytes_per_s)
    n = len(sources)
    out: list[Assignment] = []
    for j, source in enumerate(sources):
        lo, hi = j * total // n, (j + 1) * total // n
        if hi > lo:
            out.append((source.peer_id, lo, hi - lo))
    return _scored(out, sources, overhead, cap)


def plan_proportional_split(
    total_bytes: int,
    sources: Sequence[Source],
    *,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
) -> ShardPlan:
    """One contiguous slice per source, sized in proportion to its (capped) rate."""
    total, overhead, cap, rates = _checked(total_bytes, sources, per_shard_overhead_s, downlink_bytes_per_s)
    if total == 0:
        return _scored([], sources, overhead, cap)
    return _scored(_slices(total, rates, sources), sources, overhead, cap)


def plan_chaos_default(
    total_bytes: int,
    sources: Sequence[Source],
    *,
    shard_count: int | None = None,
    max_shards: int = DEFAULT_MAX_SHARDS,
    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
) -> ShardPlan:
    """Equal pieces, each to the source with the least accumulated ``bytes/rate`` (lower index on ties).

    ``shard_count`` defaults to the largest count of :func:`shard_count_chain` (the finest pieces the
    optimal planner may use). Latency and per-shard overhead are ignored by the rule but not by the
    score.
    """
    total, overhead, cap, rates = _checked(total_bytes, sources, per_shard_overhead_s, downlink_bytes_per_s)
    if total == 0:
        return _scored([], sources, overhead, cap)
    if shard_count is None:
        limit = check_positive_int(max_shards, "max_shards", limit=MAX_SHARDS_LIMIT)
        pieces = shard_count_chain(
            total, max_shards=limit, min_shard_bytes=check_positive_int(min_shard_bytes, "min_shard_bytes")
        )[-1]
    else:
        pieces = min(total, check_positive_int(shard_count, "shard_count", limit=MAX_SHARDS_LIMIT))
    heap = [(0.0, i) for i in range(len(sources))]
    sent = [0] * len(sources)
    out: list[Assignment] = []
    for j in range(pieces):
        lo, hi = j * total // pieces, (j + 1) * total // pieces
        _load, i = heap[0]
        sent[i] += hi - lo
        heapq.heapreplace(heap, (sent[i] / rates[i], i))
        out.append((sources[i].peer_id, lo, hi - lo))
    return _scored(out, sources, overhead, cap)
