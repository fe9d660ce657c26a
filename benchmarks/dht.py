"""DHT benchmark: store/get latency, hop counts and success under churn.

Simulated part (runs now): swarms of 16, 64, 256 and 1024 DHTMachines on SimNetwork, with
loopback-like links (0.5 ms one way) and WAN-like links (20-80 ms one way: 20 ms + uniform 0-60 ms
jitter per message, since SimNetwork has no cheap per-pair latency table for 1024 peers). Latencies
are *virtual* time from ``start_*`` to ``DHTOperationDone`` -- protocol round trips only, no CPU or
kernel time -- so they are deterministic for a seed. Success under churn replaces 10 % of the peers
(crash + join) while reading.

Real-process part: a clearly marked hook below, to be filled in once the runtime runs the DHT
machine over TCP. Until then ``--real`` reports it as not run; nothing is faked.

    python benchmarks/dht.py [--sizes 16,64,256,1024] [--ops 100] [--seed 1] [--json out.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from chaosp2p.dht import DHTConfig, GetResult, StoreResult
from chaosp2p.dht.simcluster import DHTSimCluster, run_churn_scenario
from chaosp2p.sim.network import LinkProfile
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True)
class LinkCase:
    name: str
    link: LinkProfile
    config: DHTConfig
    description: str


LINKS = (
    LinkCase("loopback", LinkProfile(latency_s=0.0005), DHTConfig.local(), "0.5 ms one way"),
    LinkCase("wan", LinkProfile(latency_s=0.020, jitter_s=0.060), DHTConfig.wan(), "20-80 ms one way"),
)


@dataclass(frozen=True)
class Row:
    links: str
    peers: int
    op: str
    count: int
    success: float
    p50_ms: float
    p95_ms: float
    mean_hops: float
    max_hops: int
    msgs_per_op: float
    build_wall_s: float


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run_batched(
    cluster: DHTSimCluster, starts: list[tuple[PeerID, Callable[[float], int]]], batch: int
) -> list[Any]:
    """Start operations ``batch`` at a time and wait for each batch."""
    results: list[Any] = []
    for index in range(0, len(starts), batch):
        ops = [(peer, cluster.call(peer, action)) for peer, action in starts[index : index + batch]]
        results.extend(cluster.wait_all(ops, timeout_s=120.0))
    return results


def summarize(case: LinkCase, peers: int, op: str, results: list[Any], build_s: float) -> Row:
    done = [r for r in results if r is not None and r.ok]
    latencies = [r.stats.duration_s * 1000 for r in done]
    hops = [r.stats.hops for r in done]
    messages = [r.stats.messages for r in results if r is not None]
    return Row(
        links=case.name,
        peers=peers,
        op=op,
        count=len(results),
        success=len(done) / len(results) if results else 0.0,
        p50_ms=percentile(latencies, 0.5),
        p95_ms=percentile(latencies, 0.95),
        mean_hops=statistics.fmean(hops) if hops else float("nan"),
        max_hops=max(hops, default=0),
        msgs_per_op=statistics.fmean(messages) if messages else float("nan"),
        build_wall_s=build_s,
    )


def bench_size(case: LinkCase, peers: int, ops: int, seed: int) -> list[Row]:
    rng = random.Random(seed)
    cluster = DHTSimCluster(seed=seed, config=case.config, link=case.link)
    started = time.perf_counter()
    cluster.build(peers, refresh=False, settle_s=10.0)
    build_s = time.perf_counter() - started
    alive = cluster.alive()
    keys = [b"bench/%d" % i for i in range(ops)]
    value = bytes(1024)

    def store_action(peer: PeerID, key: bytes) -> Callable[[float], int]:
        machine = cluster.machines[peer]
        return lambda now: machine.start_store(now, key, value)

    def get_action(peer: PeerID, key: bytes) -> Callable[[float], int]:
        machine = cluster.machines[peer]
        return lambda now: machine.start_get(now, key)

    writers = [rng.choice(alive) for _ in keys]
    stores = run_batched(cluster, [(p, store_action(p, k)) for p, k in zip(writers, keys, strict=True)], batch=10)
    assert all(r is None or isinstance(r, StoreResult) for r in stores)
    # Read from peers that do not hold the record themselves, so every get crosses the network.
    get_starts = []
    for key in keys:
        readers = [p for p in alive if cluster.machines[p].held_record(cluster.sim.now, key) is None]
        reader = rng.choice(readers or alive)
        get_starts.append((reader, get_action(reader, key)))
    gets = run_batched(cluster, get_starts, batch=10)
    assert all(r is None or isinstance(r, GetResult) for r in gets)
    return [
        summarize(case, peers, "store", stores, build_s),
        summarize(case, peers, "get", gets, build_s),
    ]


def bench_churn(sizes: Sequence[int], seed: int) -> list[dict[str, Any]]:
    out = []
    config = replace(DHTConfig.local(), republish_interval_s=20.0, refresh_interval_s=600.0)
    for size in sizes:
        started = time.perf_counter()
        report = run_churn_scenario(seed=seed, size=size, churn_fraction=0.10, stored=100, duration_s=60.0,
                                    config=config)
        row = asdict(report)
        row["success_rate"] = report.success_rate
        row["wall_s"] = time.perf_counter() - started
        out.append(row)
    return out


# =====================================================================================================
# REAL PROCESSES -- hook for the runtime (TODO(lead)).
#
# Fill this in once chaosp2p.runtime drives DHTMachine over TCP: start N `chaosp2p peer` processes on
# 127.0.0.1 (bootstrapping from the first), store and get the same keys as bench_size() through the
# public API (peer.dht.store / peer.dht.get), and report wall-clock p50/p95 latency, hops (from the
# DHTOperationDone results) and success, in the same Row shape with links="real-loopback". Until then
# this returns None and the report says so; no numbers are invented.
# =====================================================================================================
def bench_real_processes(sizes: Sequence[int], ops: int, seed: int) -> list[Row] | None:
    """Real-process DHT benchmark; not implemented yet (see the block comment above)."""
    return None


def print_table(rows: list[Row]) -> None:
    header = f"{'links':<9} {'peers':>5} {'op':<6} {'n':>4} {'ok %':>6} {'p50 ms':>8} {'p95 ms':>8} " \
             f"{'hops':>5} {'max':>4} {'msgs/op':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.links:<9} {r.peers:>5} {r.op:<6} {r.count:>4} {100 * r.success:>6.1f} {r.p50_ms:>8.2f} "
              f"{r.p95_ms:>8.2f} {r.mean_hops:>5.2f} {r.max_hops:>4} {r.msgs_per_op:>8.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated swarm sizes")
    parser.add_argument("--ops", type=int, default=100, help="stores and gets per size and link profile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--churn-sizes", default="256,1024", help="sizes for the churn run ('' to skip)")
    parser.add_argument("--quick", action="store_true", help="sizes 16,64,256, 30 ops, churn at 256 only")
    parser.add_argument("--real", action="store_true", help="also run the real-process tier (not available yet)")
    parser.add_argument("--json", type=Path, help="write all results to this file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    churn_sizes = [int(s) for s in args.churn_sizes.split(",") if s]
    ops = args.ops
    if args.quick:
        sizes, ops, churn_sizes = [s for s in sizes if s <= 256], min(ops, 30), [s for s in churn_sizes if s <= 256]

    started = time.perf_counter()
    rows: list[Row] = []
    for case in LINKS:
        for size in sizes:
            rows.extend(bench_size(case, size, ops, args.seed))
    print(f"DHT, simulated (virtual time; links: {'; '.join(f'{c.name} = {c.description}' for c in LINKS)})")
    print_table(rows)
    if any(size <= DHTConfig().k for size in sizes):
        print(f"(swarms of at most k = {DHTConfig().k} peers store every record on every peer: their gets are local)")

    churn = bench_churn(churn_sizes, args.seed)
    if churn:
        print("\nGet success under 10 % churn (crash + join during 60 s of reads, 100 keys, loopback links)")
        print(f"{'peers':>5} {'gets':>5} {'ok %':>6} {'wrong':>5} {'hops':>5} {'messages':>9} {'wall s':>7}")
        for c in churn:
            print(f"{c['peers']:>5} {c['gets']:>5} {100 * c['success_rate']:>6.2f} {c['wrong_values']:>5} "
                  f"{c['mean_hops']:>5.2f} {c['messages']:>9} {c['wall_s']:>7.1f}")

    real: list[Row] | None = None
    if args.real:
        real = bench_real_processes(sizes, ops, args.seed)
        if real is None:
            print("\nreal processes: not run -- the runtime hook in benchmarks/dht.py is not implemented yet")
        else:
            print("\nDHT, real processes")
            print_table(real)
    print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")

    if args.json:
        payload = {
            "benchmark": "dht",
            "seed": args.seed,
            "ops": ops,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "links": {c.name: c.description for c in LINKS},
            "simulated": [asdict(r) for r in rows],
            "churn": churn,
            "real_processes": None if real is None else [asdict(r) for r in real],
            "real_processes_status": "not implemented (runtime hook pending)" if real is None else "ok",
        }
        args.json.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
