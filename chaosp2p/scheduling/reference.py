"""An exact reference solver for the shard-planning model: MILPs solved by HiGHS (scipy).

Used only by tests and benchmarks to prove the greedy planner optimal; scipy is imported inside the
functions, so the core package never needs it. It shares no search logic with the planner: for
*every* shard count ``K`` of the chain it solves a slot-indexed MILP -- binary ``w_ij`` = "source ``i``
sends a ``j``-th shard", which would complete at ``c_ij = l_i + j*p_i`` with ``p_i = h + M/(K*rate_i)``::

    min T
    s.t. sum_ij w_ij = K                                  (all shards assigned)
         w_ij <= w_i,j-1            for j >= 2            (a source's shards are its first slots)
         T >= c_ij w_ij             for every slot        (makespan covers every used slot)

then keeps the least ``max(T, D)`` (ties: smaller ``K``). Slots exist for ``j <= u_i``, the most
shards source ``i`` could finish within ``T_1``, the makespan of a simple feasible plan (all shards
from the best single source, or a rate-proportional split, whichever is better); a plan better
than ``T_1`` never uses another slot, so nothing optimal is cut off.

Numerics, learned the hard way on HiGHS 1.12 (scipy 1.17):

* The compact model (integer ``x_i`` with a binary "used" ``y_i`` and ``T >= l_i y_i + p_i x_i``) was
  tried first, jointly over all ``K`` and per ``K``: on a few percent of random instances HiGHS
  reported a sub-optimal solution as proven optimal (a feasible better solution -- the greedy's,
  fixed in as bounds -- was accepted by the same model), with presolve on or off and with tightened
  tolerances. The slot model agreed with the greedy on every instance tried.
* The downlink bound ``D`` is applied after the solve, not as a bound on ``T``: a floor on ``T``
  creates near-ties that HiGHS's 1e-6 integrality tolerance resolves arbitrarily. Tightening that
  tolerance made HiGHS less reliable, not more, so it stays at its default; ``mip_rel_gap`` and
  ``mip_abs_gap`` are 0, and time is rescaled so ``T_1`` is 1e6 units.

The returned makespan re-evaluates the rounded integer solution with the planner's floating-point
formula, so the two are comparable to the last bits.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaosp2p.scheduling.kernel import FloatArray
from chaosp2p.scheduling.model import (
    Source,
    check_downlink,
    check_overhead,
    check_sources,
    check_total,
    downlink_bound,
    effective_rates,
)
from chaosp2p.scheduling.planner import shard_times

_SCALE = 1e6
_OPTIONS = {"mip_rel_gap": 0.0, "mip_abs_gap": 0.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class MilpSolution:
    """What the MILPs found: the best integer solution over the chain and how it got there."""

    makespan_s: float
    """Model makespan of the best rounded solution: ``max(sources_makespan_s, D)``."""
    sources_makespan_s: float
    """Least latest-source-finish over the chain (before the downlink bound)."""
    objective_s: float
    """HiGHS's objective for the chosen ``K``, unscaled (within solver tolerances of the latest finish)."""
    shard_count: int
    shards_per_source: dict[Hashable, int]
    optimal: bool
    """False when a time limit stopped HiGHS before it proved every ``K`` optimal."""
    solve_s: float
    """Wall time spent inside HiGHS, summed over the chain."""
    per_count_makespan_s: dict[int, float]
    """The least latest-source-finish found for each shard count."""


def solve_milp(
    total_bytes: int,
    sources: Sequence[Source],
    shard_counts: Sequence[int],
    *,
    per_shard_overhead_s: float = 0.0,
    downlink_bytes_per_s: float | None = None,
    time_limit_s: float | None = None,
    presolve: bool = True,
) -> MilpSolution:
    """Solve the model exactly over ``shard_counts`` (pass :func:`shard_count_chain` for the same chain).

    ``time_limit_s`` bounds each ``K``'s solve; a hit clears ``optimal``.
    """
    total = check_total(total_bytes)
    check_sources(sources, needed=True)
    overhead = check_overhead(per_shard_overhead_s)
    cap = check_downlink(downlink_bytes_per_s)
    chain = list(shard_counts)
    if total == 0 or not chain:
        raise ValueError("the MILP needs a non-empty transfer and at least one shard count")
    rates = np.asarray(effective_rates(sources, cap), dtype=np.float64)
    latencies = np.asarray([s.latency_s for s in sources], dtype=np.float64)
    bound = downlink_bound(total, sources, cap)

    best: tuple[float, int, FloatArray, float] | None = None
    per_count: dict[int, float] = {}
    optimal = True
    spent = 0.0
    for count in chain:
        steps = shard_times(total, count, rates, overhead)
        counts, objective, proved, elapsed = _solve_one(count, steps, latencies, time_limit_s, presolve)
        spent += elapsed
        optimal = optimal and proved
        used = counts > 0
        latest = float(np.max((latencies + counts * steps)[used]))
        per_count[count] = latest
        if best is None or latest < best[0] * (1 - 1e-12):
            best = (latest, count, counts, objective)
    assert best is not None
    latest, count, counts, objective = best
    return MilpSolution(
        makespan_s=max(latest, bound),
        sources_makespan_s=latest,
        objective_s=objective,
        shard_count=count,
        shards_per_source={s.peer_id: int(c) for s, c in zip(sources, counts.tolist(), strict=True) if c},
        optimal=optimal,
        solve_s=spent,
        per_count_makespan_s=per_count,
    )


def _solve_one(
    count: int,
    steps: FloatArray,
    latencies: FloatArray,
    time_limit_s: float | None,
    presolve: bool,
) -> tuple[FloatArray, float, bool, float]:
    """One ``K``: shard counts (as floats, integral), unscaled objective, proved optimal, seconds."""
    n = len(steps)
    feasible = min(_single_source_time(count, steps, latencies), _proportional_time(count, steps, latencies))
    limit = feasible * (1 + 1e-9)  # never cut off a solution that ties with the feasible bound
    caps = np.maximum(np.floor((limit - latencies) / steps), 0.0)
    # The division can round across an integer (badly so when a step is tiny next to a latency);
    # settle it on the slot values themselves.
    caps -= (latencies + caps * steps > limit) & (caps > 0)
    caps += latencies + (caps + 1) * steps <= limit
    caps = np.minimum(caps, float(count)).astype(np.int64)
    scale = _SCALE / feasible
    slots = [(i, j) for i in range(n) for j in range(1, int(caps[i]) + 1)]
    owners = np.asarray([i for i, _j in slots], dtype=np.int64)
    completions = np.asarray([latencies[i] + j * steps[i] for i, j in slots], dtype=np.float64)
    # Phase 1 finds the optimum up to HiGHS's integrality tolerance: a binary at 1 - 1e-6 shaves
    # 1e-6 of its completion off T, enough to pick a near-tie. Phase 2 measures completions from a
    # floor just below that optimum, so the same slack is worth 1e-6 of a sliver, not of T.
    chosen, objective, proved, elapsed = _slot_milp(count, slots, completions, 0.0, scale, time_limit_s, presolve)
    floor = objective * (1 - 1e-5)
    chosen, objective, proved_again, more = _slot_milp(count, slots, completions, floor, scale, time_limit_s, presolve)
    counts = np.bincount(owners, weights=chosen, minlength=n).astype(np.float64)
    if int(counts.sum()) != count:
        raise RuntimeError(f"MILP solution for K={count} assigns {int(counts.sum())} shards")
    return counts, objective, proved and proved_again, elapsed + more


def _slot_milp(
    count: int,
    slots: Sequence[tuple[int, int]],
    completions: FloatArray,
    floor: float,
    scale: float,
    time_limit_s: float | None,
    presolve: bool,
) -> tuple[FloatArray, float, bool, float]:
    """Solve ``min T: sum w = K, w_ij <= w_i,j-1, T >= floor + (c_ij - floor) w_ij, T >= floor``."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    m = len(slots)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []
    upper: list[float] = []

    def add_row(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        for col, val in entries:
            rows.append(len(lower))
            cols.append(col)
            vals.append(val)
        lower.append(lo)
        upper.append(hi)

    add_row([(col, 1.0) for col in range(m)], float(count), float(count))
    for col, (_i, j) in enumerate(slots):
        if j > 1:
            add_row([(col, 1.0), (col - 1, -1.0)], -np.inf, 0.0)
        excess = float(completions[col]) - floor
        if excess > 0:  # a slot finishing below the floor never binds
            add_row([(m, 1.0), (col, -excess * scale)], floor * scale, np.inf)
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(lower), m + 1)).tocsr()
    cost = np.zeros(m + 1)
    cost[m] = 1.0
    integrality = np.ones(m + 1)
    integrality[m] = 0
    var_lower = np.zeros(m + 1)
    var_lower[m] = floor * scale
    var_upper = np.ones(m + 1)
    var_upper[m] = np.inf
    options: dict[str, Any] = {"presolve": presolve, **_OPTIONS}
    if time_limit_s is not None:
        options["time_limit"] = time_limit_s
    started = time.perf_counter()
    with warnings.catch_warnings():
        # scipy warns that it hands mip_abs_gap to HiGHS verbatim; that is the point.
        warnings.filterwarnings("ignore", message="Unrecognized options detected", category=RuntimeWarning)
        result = milp(
            cost,
            constraints=LinearConstraint(matrix, lower, upper),
            integrality=integrality,
            bounds=Bounds(var_lower, var_upper),
            options=options,
        )
    elapsed = time.perf_counter() - started
    if result.x is None:
        raise RuntimeError(f"HiGHS found no solution for K={count}: {result.message}")
    chosen: FloatArray = np.rint(result.x[:m])
    return chosen, float(result.fun) / scale, bool(result.status == 0), elapsed


def _single_source_time(count: int, steps: FloatArray, latencies: FloatArray) -> float:
    """Makespan of sending all ``count`` shards from the one source that finishes first."""
    return float(np.min(latencies + count * steps))


def _proportional_time(count: int, steps: FloatArray, latencies: FloatArray) -> float:
    """Makespan of splitting ``count`` shards in proportion to ``1/step`` (largest remainders)."""
    share = count * (1.0 / steps) / float(np.sum(1.0 / steps))
    counts = np.floor(share)
    short = count - int(counts.sum())
    counts[np.argsort(counts - share, kind="stable")[:short]] += 1
    used = counts > 0
    return float(np.max((latencies + counts * steps)[used]))
