"""The optimal shard planner: choose the shard count from a divisibility chain, then the assignment.

Theory of operation (the proofs are in ``protocols/scheduling.md``). For a fixed shard count ``K``
every source ``i`` takes ``p_i(K) = h + M/(K*rate_i)`` per shard after its latency ``l_i``: that is
``K`` identical jobs on uniformly related machines with ready times, solved exactly by
:func:`~chaosp2p.scheduling.kernel.assign_identical`. ``K`` ranges over the powers of two up to
``max_shards`` whose shards are at least ``min_shard_bytes`` long, so there are at most ~24 of them:

* with no per-shard overhead, refining every shard of a ``K`` plan into two gives a ``2K`` plan with
  the same finish times, so the optimum is non-increasing along the chain; the largest ``K`` is
  optimal and a binary search finds the smallest ``K`` that matches it (fewer, larger requests);
* with overhead ``h > 0`` the water-filling root ``T_c(K)`` is a lower bound for ``K``; candidates
  are solved in increasing ``T_c`` order until the bound exceeds the best makespan found.

Ties (within ``1e-12`` relative) go to the smaller ``K``. The downlink cap enters as the per-source
rate ``min(b_i, B)`` and the plan-independent fluid bound ``D``; ``D`` only raises the predicted
makespan, never changes which plan is optimal. Chunk-aligned plans (``align_bytes``) and re-balanced
ones (``rebalance``, one-byte units) keep the exact ``K``-shard counts, then spread whole units over
all sources with the same exact kernel (units as identical jobs, overheads folded into ready times)
and score the real, uneven shards.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from chaosp2p.scheduling.kernel import FloatArray, IntArray, assign_identical, relaxed_threshold
from chaosp2p.scheduling.layout import Segments
from chaosp2p.scheduling.model import (
    MAX_SHARDS_LIMIT,
    ShardPlan,
    Source,
    check_downlink,
    check_overhead,
    check_positive_int,
    check_sources,
    check_start,
    check_total,
    downlink_bound,
    effective_rates,
)

DEFAULT_MAX_SHARDS = 4096
DEFAULT_MIN_SHARD_BYTES = 64 * 1024
TIE_RELATIVE = 1e-12
"""Makespans this close (relative) count as equal; the smaller shard count then wins."""


def shard_count_chain(
    total_bytes: int, *, max_shards: int, min_shard_bytes: int, units: int | None = None
) -> list[int]:
    """The candidate shard counts: powers of two ``K <= max_shards`` with ``total/K >= min_shard``.

    ``K = 1`` is always a candidate for a non-empty transfer, even one smaller than
    ``min_shard_bytes``; ``units`` (chunk-aligned plans) caps ``K`` at the number of chunks.
    """
    if total_bytes <= 0:
        return []
    limit = min(max_shards, max(1, total_bytes // min_shard_bytes))
    if units is not None:
        limit = min(limit, units)
    return [1 << j for j in range(limit.bit_length())]


def shard_times(total_bytes: int, shard_count: int, rates: FloatArray, overhead_s: float) -> FloatArray:
    """``p_i(K) = h + M/(K*rate_i)``, the time source ``i`` spends per shard (one formula everywhere)."""
    result: FloatArray = overhead_s + total_bytes / (shard_count * rates)
    return result


@dataclass(frozen=True, slots=True)
class _Candidate:
    shard_count: int
    counts: IntArray  # shards per source, source order
    sources_makespan: float  # latest source finish under the model (relative to now)
    finish: FloatArray  # per-source finish (only meaningful where units/counts > 0)
    units: IntArray | None = None  # aligned plans: chunks per source


_Exact = Callable[[int], _Candidate]


def plan_shards(
    total_bytes: int,
    sources: Sequence[Source],
    *,
    max_shards: int = DEFAULT_MAX_SHARDS,
    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
    align_bytes: int | None = None,
    rebalance: bool = False,
) -> ShardPlan:
    """The makespan-optimal plan to fetch ``[0, total_bytes)`` from ``sources``.

    Optimal over every shard count in :func:`shard_count_chain` and every split of equal shards
    among the sources, under the model of ``protocols/scheduling.md``. With ``align_bytes`` shard
    boundaries fall on multiples of it (except the end) and the bytes are re-balanced across the
    chosen sources in whole chunks; ``rebalance=True`` does the same at byte granularity. Both are
    within one chunk (byte) time of the exact optimum and usually better, since slices may be
    uneven (see the spec). Invalid arguments raise :class:`~chaosp2p.errors.ConfigError`.
    """
    total = check_total(total_bytes)
    return _plan(
        [(0, total)],
        sources,
        max_shards,
        min_shard_bytes,
        per_shard_overhead_s,
        downlink_bytes_per_s,
        align_bytes,
        rebalance,
        0.0,
    )


def replan(
    missing: Sequence[tuple[int, int]],
    sources: Sequence[Source],
    *,
    elapsed_s: float = 0.0,
    max_shards: int = DEFAULT_MAX_SHARDS,
    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
    align_bytes: int | None = None,
    rebalance: bool = False,
) -> ShardPlan:
    """A fresh optimal plan for the still-missing ``(offset, length)`` ranges, mid-transfer.

    Call it when a source fails (leave it out of ``sources``), slows down (pass its new rate) or a
    new one appears. ``latency_s`` of each source is the time from now until it can start on new
    work; ``elapsed_s`` is added to every reported time so they stay relative to the transfer start.
    The ranges may be unsorted and non-contiguous but must not overlap; the assignments cover exactly
    them, splitting a shard where it crosses from one range to the next.
    """
    return _plan(
        missing,
        sources,
        max_shards,
        min_shard_bytes,
        per_shard_overhead_s,
        downlink_bytes_per_s,
        align_bytes,
        rebalance,
        elapsed_s,
    )


def _plan(
    ranges: Sequence[tuple[int, int]],
    sources: Sequence[Source],
    max_shards: int,
    min_shard_bytes: int,
    per_shard_overhead_s: float,
    downlink_bytes_per_s: float | None,
    align_bytes: int | None,
    rebalance: bool,
    elapsed_s: float,
) -> ShardPlan:
    max_shards = check_positive_int(max_shards, "max_shards", limit=MAX_SHARDS_LIMIT)
    min_shard_bytes = check_positive_int(min_shard_bytes, "min_shard_bytes")
    overhead = check_overhead(per_shard_overhead_s)
    cap = check_downlink(downlink_bytes_per_s)
    align = None if align_bytes is None else check_positive_int(align_bytes, "align_bytes")
    start = check_start(elapsed_s)
    # Re-balancing without alignment is the aligned machinery with one-byte units.
    granule = align if align is not None else (1 if rebalance else None)
    segments = Segments(ranges, granule)
    total = segments.total
    check_sources(sources, needed=total > 0)
    if total == 0:
        return ShardPlan(
            shard_count=0,
            makespan_s=start,
            assignments=(),
            sources_makespan_s=start,
            downlink_bound_s=start,
            start_s=start,
            align_bytes=align,
        )

    rates = np.asarray(effective_rates(sources, cap), dtype=np.float64)
    latencies = np.asarray([s.latency_s for s in sources], dtype=np.float64)
    order = np.argsort(latencies, kind="stable")
    bound = downlink_bound(total, sources, cap)
    chain = shard_count_chain(
        total,
        max_shards=max_shards,
        min_shard_bytes=min_shard_bytes,
        units=segments.units if granule is not None else None,
    )

    def exact(shard_count: int) -> _Candidate:
        step = shard_times(total, shard_count, rates, overhead)
        counts, makespan = assign_identical(latencies, step, shard_count, order)
        return _Candidate(shard_count, counts, makespan, latencies + counts * step)

    if granule is not None:
        best = _best([_aligned(exact(k), segments, latencies, rates, overhead) for k in chain])
    elif overhead == 0.0:
        best = _search_monotone(chain, exact)
    else:
        best = _search_bounded(chain, exact, total, rates, latencies, order, overhead)
    return _build(best, sources, segments, start, bound, align)


def _best(candidates: Sequence[_Candidate]) -> _Candidate:
    """Least makespan; within the tie tolerance, the fewest shards."""
    floor = min(c.sources_makespan for c in candidates)
    return min((c for c in candidates if c.sources_makespan <= floor * (1 + TIE_RELATIVE)), key=lambda c: c.shard_count)


def _search_monotone(chain: Sequence[int], exact: _Exact) -> _Candidate:
    """Without overhead the optimum never rises along the chain: binary-search its first minimum."""
    top = exact(chain[-1])
    target = top.sources_makespan * (1 + TIE_RELATIVE)
    lo, hi = 0, len(chain) - 1  # chain[hi] is known to reach the target
    best = top
    while lo < hi:
        mid = (lo + hi) // 2
        candidate = exact(chain[mid])
        if candidate.sources_makespan <= target:
            hi, best = mid, candidate
        else:
            lo = mid + 1
    return best


def _search_bounded(
    chain: Sequence[int],
    exact: _Exact,
    total: int,
    rates: FloatArray,
    latencies: FloatArray,
    order: IntArray,
    overhead: float,
) -> _Candidate:
    """Solve shard counts in order of their relaxation bound; stop once no bound can win or tie."""
    bounds = sorted((relaxed_threshold(latencies, shard_times(total, k, rates, overhead), k, order), k) for k in chain)
    solved: list[_Candidate] = []
    best = float("inf")
    for lower, k in bounds:
        # The relaxation is exact up to rounding; a hair of slack keeps near-ties in play.
        if lower > best * (1 + TIE_RELATIVE) + 1e-15:
            break
        candidate = exact(k)
        solved.append(candidate)
        best = min(best, candidate.sources_makespan)
    return _best(solved)


def _aligned(
    plan: _Candidate, segments: Segments, latencies: FloatArray, rates: FloatArray, overhead: float
) -> _Candidate:
    """Turn an exact ``K``-shard plan into a unit-granular one and score it on its real bytes.

    Units are identical jobs; source ``i`` is ready once its ``max(x_i, 1)`` shard overheads are
    paid. Sources the ``K``-plan left idle may take units too (as one shard), which the equal-shard
    model could not express; the kernel leaves them idle unless that helps.
    """
    granule = segments.align
    assert granule is not None
    counts = np.maximum(plan.counts, 1)
    units, _ = assign_identical(latencies + counts * overhead, granule / rates, segments.units)
    shards = np.minimum(counts, units)
    edges = np.zeros(len(units) + 1, dtype=np.int64)
    np.cumsum(units, out=edges[1:])
    nbytes = np.diff(segments.unit_bounds_to_virtual(edges))
    finish = latencies + shards * overhead + nbytes / rates
    makespan = float(np.max(finish[units > 0]))
    return _Candidate(plan.shard_count, shards, makespan, finish, units)


def _build(
    best: _Candidate,
    sources: Sequence[Source],
    segments: Segments,
    start: float,
    bound: float,
    align: int | None,
) -> ShardPlan:
    total = segments.total
    used = np.flatnonzero(best.counts > 0).tolist()
    counts = best.counts.tolist()
    owners: list[Hashable] = []
    for i in used:
        owners.extend([sources[i].peer_id] * counts[i])
    if best.units is None:
        k = best.shard_count
        if total * k < 1 << 62:
            bounds: list[int] = ((np.arange(k + 1, dtype=np.int64) * total) // k).tolist()
        else:
            bounds = [j * total // k for j in range(k + 1)]
        shard_edges = bounds
        block_edges = np.concatenate(([0], np.cumsum(best.counts[used]))).tolist()
        per_source_bytes = [bounds[b] - bounds[a] for a, b in itertools.pairwise(block_edges)]
    else:
        # Source i's u_i units (a contiguous block) are cut into n_i shards as equal as possible.
        n_arr = best.counts[used]
        u_arr = best.units[used]
        block_start = np.cumsum(u_arr) - u_arr
        shard_start = np.cumsum(n_arr) - n_arr
        index = np.arange(int(n_arr.sum()), dtype=np.int64) - np.repeat(shard_start, n_arr)
        unit_edges = np.empty(len(index) + 1, dtype=np.int64)
        unit_edges[:-1] = np.repeat(block_start, n_arr) + (index * np.repeat(u_arr, n_arr)) // np.repeat(n_arr, n_arr)
        unit_edges[-1] = int(u_arr.sum())
        shard_edges = segments.unit_bounds_to_virtual(unit_edges).tolist()
        per_source_bytes = []
        position = 0
        for i in used:
            per_source_bytes.append(shard_edges[position + counts[i]] - shard_edges[position])
            position += counts[i]
    assignments = segments.materialize(shard_edges, owners)
    finish = best.finish.tolist()
    labels = [sources[i].peer_id for i in used]
    sources_makespan = start + best.sources_makespan
    return ShardPlan(
        shard_count=len(owners),
        makespan_s=max(sources_makespan, start + bound),
        assignments=tuple(assignments),
        sources_makespan_s=sources_makespan,
        downlink_bound_s=start + bound,
        start_s=start,
        align_bytes=align,
        finish_s={label: start + finish[i] for label, i in zip(labels, used, strict=True)},
        shards_per_source={label: counts[i] for label, i in zip(labels, used, strict=True)},
        bytes_per_source=dict(zip(labels, per_source_bytes, strict=True)),
    )
