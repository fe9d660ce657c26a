"""Scheduler benchmark: greedy plan time vs an exact MILP, and makespan vs the baselines.

Three tables, all measured side by side in one run (ratios are what to read; absolute times move
with the machine's load):

1. **greedy vs MILP** -- plan time of :func:`plan_shards` (median of repeats) and of the HiGHS
   reference (:mod:`chaosp2p.scheduling.reference`, one slot-indexed MILP per shard count of the
   chain, solved once) on the same instances, for 8/64/256 sources and S = 1 GiB / 100 GiB, with the
   chain capped at ``--milp-max-shards`` (default 256; the MILP grows with the shard count). Both
   makespans are printed and must agree to 1e-9.
2. **greedy plan time at full size** -- the default chain (up to 4096 shards), 256 sources, with
   and without per-shard overhead, exact, 4 MiB chunk-aligned and rebalanced; target under 5 ms.
3. **makespan vs baselines** -- predicted makespan of single-source, equal-split,
   bandwidth-proportional and the Chaos default rule, as a ratio to the exact equal-shard optimum
   (median and worst over random draws), and the same ratio for 4 MiB chunk-aligned and
   byte-rebalanced plans (uneven slices, outside the equal-shard model, so they can go below 1).

Links are drawn as in the public Chaos experiments: 100 Mbit/s - 1 Gbit/s per source
(12.5-125 MB/s), start-up latency 1-100 ms.

    python benchmarks/scheduler.py [--draws 20] [--repeats 50] [--milp-max-shards 256] [--json out.json]
                                   [--markdown] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _common import median, percentile, print_table, write_json

from chaosp2p.scheduling import (
    ShardPlan,
    Source,
    plan_chaos_default,
    plan_equal_split,
    plan_proportional_split,
    plan_shards,
    plan_single_source,
    shard_count_chain,
)

GIB = 1 << 30
CHUNK = 4 << 20


def draw_sources(rng: random.Random, count: int) -> list[Source]:
    """Heterogeneous links: 100 Mbit/s - 1 Gbit/s, 1-100 ms start-up latency."""
    return [Source(f"peer-{i}", rng.uniform(12.5e6, 125e6), rng.uniform(0.001, 0.1)) for i in range(count)]


def time_call(call: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


def greedy_vs_milp(
    sizes: Sequence[int], totals: Sequence[int], repeats: int, max_shards: int, seed: int, limit_s: float
) -> list[dict[str, Any]]:
    from chaosp2p.scheduling.reference import solve_milp

    rows = []
    for overhead in (0.0, 0.002):
        for count in sizes:
            for total in totals:
                sources = draw_sources(random.Random(seed * 1000 + count), count)

                def greedy(total: int = total, sources: list[Source] = sources, h: float = overhead) -> ShardPlan:
                    return plan_shards(total, sources, max_shards=max_shards, min_shard_bytes=1, per_shard_overhead_s=h)

                plan = greedy()
                greedy_s = median(time_call(greedy, repeats))
                chain = shard_count_chain(total, max_shards=max_shards, min_shard_bytes=1)
                started = time.perf_counter()
                milp = solve_milp(total, sources, chain, per_shard_overhead_s=overhead, time_limit_s=limit_s)
                milp_s = time.perf_counter() - started
                rel = abs(plan.makespan_s - milp.makespan_s) / milp.makespan_s
                rows.append(
                    {
                        "sources": count,
                        "total_bytes": total,
                        "overhead_s": overhead,
                        "chain": f"1..{chain[-1]}",
                        "greedy_ms": greedy_s * 1e3,
                        "milp_ms": milp_s * 1e3,
                        "milp_highs_ms": milp.solve_s * 1e3,
                        "ratio": milp_s / greedy_s,
                        "greedy_makespan_s": plan.makespan_s,
                        "milp_makespan_s": milp.makespan_s,
                        "shards_greedy": plan.shard_count,
                        "shards_milp": milp.shard_count,
                        "relative_difference": rel,
                        "milp_proved_optimal": milp.optimal,
                    }
                )
                print(
                    f"  {count:4d} sources, {total / GIB:5.0f} GiB, h={overhead}: greedy {greedy_s * 1e3:.2f} ms,"
                    f" MILP {milp_s:.2f} s, diff {rel:.1e}, proved={milp.optimal}",
                    flush=True,
                )
    return rows


def full_size_plan_time(repeats: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    sources = draw_sources(random.Random(seed), 256)
    modes: dict[str, dict[str, Any]] = {"exact": {}, **VARIANTS}
    for total in (GIB, 100 * GIB):
        for overhead in (0.0, 0.002):
            for mode, extra in modes.items():
                plan = plan_shards(total, sources, per_shard_overhead_s=overhead, **extra)
                samples = time_call(
                    lambda t=total, h=overhead, e=extra: plan_shards(t, sources, per_shard_overhead_s=h, **e),
                    repeats,
                )
                rows.append(
                    {
                        "sources": 256,
                        "total_bytes": total,
                        "overhead_s": overhead,
                        "mode": mode,
                        "shards": plan.shard_count,
                        "median_ms": median(samples) * 1e3,
                        "p95_ms": percentile(samples, 0.95) * 1e3,
                        "makespan_s": plan.makespan_s,
                    }
                )
    return rows


BASELINES: dict[str, Callable[..., ShardPlan]] = {
    "single": plan_single_source,
    "equal": plan_equal_split,
    "proportional": plan_proportional_split,
    "chaos-default": plan_chaos_default,
}


VARIANTS: dict[str, dict[str, Any]] = {
    "aligned-4MiB": {"align_bytes": CHUNK},
    "rebalanced": {"rebalance": True},
}


def baselines(sizes: Sequence[int], totals: Sequence[int], draws: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for overhead in (0.0, 0.002):
        for count in sizes:
            for total in totals:
                ratios: dict[str, list[float]] = {name: [] for name in [*BASELINES, *VARIANTS]}
                optimal: list[float] = []
                fluid: list[float] = []
                for draw in range(draws):
                    sources = draw_sources(random.Random(f"{seed}-{count}-{total}-{draw}"), count)
                    best = plan_shards(total, sources, per_shard_overhead_s=overhead)
                    optimal.append(best.makespan_s)
                    fluid.append(total / sum(s.bytes_per_s for s in sources))
                    for name, make in BASELINES.items():
                        other = make(total, sources, per_shard_overhead_s=overhead)
                        ratios[name].append(other.makespan_s / best.makespan_s)
                    for name, extra in VARIANTS.items():
                        variant = plan_shards(total, sources, per_shard_overhead_s=overhead, **extra)
                        ratios[name].append(variant.makespan_s / best.makespan_s)
                row: dict[str, Any] = {
                    "sources": count,
                    "total_bytes": total,
                    "overhead_s": overhead,
                    "optimal_makespan_s": statistics.median(optimal),
                    "lower_bound_s": statistics.median(fluid),
                }
                for name, values in ratios.items():
                    row[f"{name}_median"] = statistics.median(values)
                    row[f"{name}_worst"] = max(values)
                    row[f"{name}_best"] = min(values)
                rows.append(row)
    return rows


def show(markdown: bool, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table, or a Markdown one to paste into the spec and the README."""
    if not markdown:
        print_table(title, columns, rows)
        return
    print(f"\n**{title}**\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20, help="random link draws per baseline row")
    parser.add_argument("--repeats", type=int, default=50, help="timed repeats of each greedy plan")
    parser.add_argument("--milp-max-shards", type=int, default=256)
    parser.add_argument("--milp-time-limit", type=float, default=300.0, help="seconds per shard count")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write all results here")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    sizes = [8, 64] if args.quick else [8, 64, 256]
    totals = [GIB, 100 * GIB]
    milp_shards = min(args.milp_max_shards, 32) if args.quick else args.milp_max_shards
    draws = 3 if args.quick else args.draws
    repeats = 5 if args.quick else args.repeats

    print("greedy vs MILP ...", flush=True)
    exact = greedy_vs_milp(sizes, totals, repeats, milp_shards, args.seed, args.milp_time_limit)
    show(
        args.markdown,
        f"Plan time, greedy vs exact MILP (HiGHS), chain 1..{milp_shards} shards",
        ["sources", "S", "h (ms)", "greedy ms", "MILP s", "MILP/greedy", "makespan s", "|diff| rel", "K g/M"],
        [
            [
                r["sources"],
                f"{r['total_bytes'] // GIB} GiB",
                r["overhead_s"] * 1e3,
                f"{r['greedy_ms']:.2f}",
                f"{r['milp_ms'] / 1e3:.2f}",
                f"{r['ratio']:.0f}x",
                f"{r['greedy_makespan_s']:.4f}",
                f"{r['relative_difference']:.0e}" + ("" if r["milp_proved_optimal"] else " (limit)"),
                f"{r['shards_greedy']}/{r['shards_milp']}",
            ]
            for r in exact
        ],
    )
    full = full_size_plan_time(repeats, args.seed)
    show(
        args.markdown,
        "Greedy plan time, 256 sources, default chain (up to 4096 shards)",
        ["S", "h (ms)", "mode", "shards", "median ms", "p95 ms", "makespan s"],
        [
            [
                f"{r['total_bytes'] // GIB} GiB",
                r["overhead_s"] * 1e3,
                r["mode"],
                r["shards"],
                f"{r['median_ms']:.2f}",
                f"{r['p95_ms']:.2f}",
                f"{r['makespan_s']:.3f}",
            ]
            for r in full
        ],
    )
    base_sizes = [2, 4, 8, 64] if args.quick else [2, 4, 8, 16, 64, 256]
    compared = baselines(base_sizes, totals, draws, args.seed)
    names = [*BASELINES, *VARIANTS]
    show(
        args.markdown,
        f"Predicted makespan relative to the optimal plan (median [worst] over {draws} link draws)",
        ["sources", "S", "h (ms)", "optimal s", "S/sum(b) s", *names],
        [
            [
                r["sources"],
                f"{r['total_bytes'] // GIB} GiB",
                r["overhead_s"] * 1e3,
                f"{r['optimal_makespan_s']:.3f}",
                f"{r['lower_bound_s']:.3f}",
                *(f"{r[f'{n}_median']:.3f} [{r[f'{n}_worst']:.3f}]" for n in names),
            ]
            for r in compared
        ],
    )
    write_json(
        args.json,
        {
            "benchmark": "scheduler",
            "args": vars(args),
            "greedy_vs_milp": exact,
            "full_size_plan_time": full,
            "baselines": compared,
        },
    )


if __name__ == "__main__":
    main()
