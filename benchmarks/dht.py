"""DHT benchmark: store/get latency, hop counts and success under churn.

Simulated part (runs now): swarms of 16, 64, 256 and 1024 DHTMachines on SimNetwork, with
loopback-like links (0.5 ms one way) and WAN-like links (20-80 ms one way: 20 ms + uniform 0-60 ms
jitter per message, since SimNetwork has no cheap per-pair latency table for 1024 peers). Latencies
are *virtual* time from ``start_*`` to ``DHTOperationDone`` -- protocol round trips only, no CPU or
kernel time -- so they are deterministic for a seed. Success under churn replaces 10 % of the peers
(crash + join) while reading.

Real-process part (``--real``, or ``--real-only`` to skip the simulation): 16 (``--real-peers``,
e.g. 16,32) ``chaosp2p peer`` processes on 127.0.0.1 plus in-process client peers; wall-clock
store/get latency, hops and success, and get success while 10 % of the processes are SIGKILLed and
replaced. Every figure is measured in the run; see the REAL PROCESSES block comment below.

    python benchmarks/dht.py [--sizes 16,64,256,1024] [--ops 100] [--seed 1] [--json out.json] [--quick]
        [--real | --real-only] [--real-peers 16,32] [--real-profiles local,lan] [--real-ops 50] [--real-churn-s 20]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import anyio

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _processes import PeerProcess, ProcessGroup, poll, profile_argument

from chaosp2p import PeerConfig, open_peer
from chaosp2p.api.async_peer import AsyncPeer
from chaosp2p.dht import DHTConfig, GetResult, StoreResult
from chaosp2p.errors import ChaosError
from chaosp2p.protocols.membership import PeerAlive, PeerFailed, PeerSuspected
from chaosp2p.sim.dht import DHTSimCluster, run_churn_scenario
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
    profile: str = ""
    """Real-process rows: the chaosp2p profile the processes ran (simulated rows: see ``links``)."""


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
# REAL PROCESSES
#
# N `chaosp2p peer` processes on 127.0.0.1 (profile `local`; the first one is everybody's bootstrap
# peer), plus two peers inside this process: a *writer* that joins with the processes and stores the
# keys, and a *reader* that joins only after the stores, so it holds none of the records and every
# one of its gets crosses the network. Latency is wall clock (time.perf_counter) around the awaited
# public call (peer.dht.store / peer.dht.get_record): it includes this process's event loop and the
# scheduling of N+1 Python processes on a shared 2-core machine. Hops and messages are the lookup's
# own statistics (StoreResult.stats / GetResult.stats). A get succeeds only if it returns exactly the
# value stored. Churn: while the reader keeps getting the stored keys, 10 % of the processes are
# killed with SIGKILL one at a time, each followed at once by a fresh replacement process (new
# identity, empty store) that bootstraps through a surviving peer.
# =====================================================================================================
REAL_READY_TIMEOUT_S = 60.0
REAL_OP_TIMEOUT_S = 30.0
REAL_SETTLE_TIMEOUT_S = 30.0


class PeerGroup(ProcessGroup):
    """``chaosp2p peer`` processes of one swarm, all running one profile."""

    def __init__(self, root: Path, profile: str = "local") -> None:
        super().__init__(root, REAL_READY_TIMEOUT_S)
        self.profile = profile
        """A built-in profile name or a profile file (see :func:`profile_argument`)."""

    def spawn(self, bootstrap: Sequence[str] = ()) -> PeerProcess:
        args = [sys.executable, "-m", "chaosp2p", "peer", "--listen", "/ip4/127.0.0.1/tcp/0",
                "--profile", self.profile, "--ready-file", "{ready}"]
        for addr in bootstrap:
            args += ["--bootstrap", addr]
        return self.launch(args, f"peer{len(self.procs)}")


def client_config(profile_arg: str, bootstrap: str) -> PeerConfig:
    """The in-process clients run the same profile as the processes (and only listen on 127.0.0.1)."""
    changes: dict[str, Any] = {"listen": ("/ip4/127.0.0.1/tcp/0",), "bootstrap": (bootstrap,)}
    if profile_arg.endswith(".toml"):
        return PeerConfig.from_toml(profile_arg, **changes)
    return PeerConfig.profile_named(profile_arg, **changes)


def record_value(key: bytes) -> bytes:
    """1 KiB derived from the key, so a get can check it got exactly what was stored."""
    return hashlib.sha256(key).digest() * 32


@dataclass
class TimedOp:
    wall_s: float
    result: StoreResult | GetResult | None
    ok: bool


async def timed(call: Callable[[], Awaitable[StoreResult | GetResult]], expected: bytes | None) -> TimedOp:
    started = time.perf_counter()
    result: StoreResult | GetResult | None = None
    try:
        with anyio.fail_after(REAL_OP_TIMEOUT_S):
            result = await call()
    except (TimeoutError, ChaosError):
        pass
    wall = time.perf_counter() - started
    ok = result.value == expected if isinstance(result, GetResult) else result is not None and result.ok
    return TimedOp(wall, result, ok)


def real_row(profile: str, peers: int, op: str, ops: list[TimedOp], build_s: float) -> Row:
    done = [o for o in ops if o.ok and o.result is not None]
    latencies = [o.wall_s * 1000 for o in done]
    hops = [o.result.stats.hops for o in done if o.result is not None]
    messages = [o.result.stats.messages for o in ops if o.result is not None]
    return Row(
        links="real-loopback",
        peers=peers,
        op=op,
        count=len(ops),
        success=len(done) / len(ops) if ops else 0.0,
        p50_ms=percentile(latencies, 0.5),
        p95_ms=percentile(latencies, 0.95),
        mean_hops=statistics.fmean(hops) if hops else float("nan"),
        max_hops=max(hops, default=0),
        msgs_per_op=statistics.fmean(messages) if messages else float("nan"),
        build_wall_s=build_s,
        profile=profile,
    )


async def wait_routing(peer: AsyncPeer, want: int, timeout_s: float, stable_s: float = 3.0) -> int:
    """Wait until ``peer``'s routing table holds ``want`` entries, or stopped growing for ``stable_s``
    (k-buckets need not admit everybody), or ``timeout_s`` passed; return how many it holds."""
    best = (-1, time.monotonic())

    def settled() -> bool:
        nonlocal best
        size, now = len(peer.dht.machine.routing_table), time.monotonic()
        if size > best[0]:
            best = (size, now)
        return size >= want or (size > 0 and now - best[1] >= stable_s)

    with anyio.move_on_after(timeout_s):
        await poll(settled)
    return len(peer.dht.machine.routing_table)


@contextlib.asynccontextmanager
async def client_peer(config: PeerConfig, shutdown_errors: list[str]) -> AsyncIterator[AsyncPeer]:
    """``open_peer``, except that an error raised while the peer shuts down is recorded, not raised.

    Every measurement is finished by then. The two shutdown races this once caught (membership
    called after ``leave()``, ConnectionClosed escaping the goodbye) are fixed in the library; an
    error recorded here is printed with the results as a regression to look at. Errors while the
    block's work is still running are raised as usual.
    """
    body_done = False
    try:
        async with open_peer(config) as peer:
            yield peer
            body_done = True
    except Exception as exc:  # recorded and printed: the measurements are complete
        if not body_done:
            raise
        frames = traceback.extract_tb(exc.__traceback__)
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-4:])
        shutdown_errors.append(f"{type(exc).__name__}: {exc} (at {where})")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def record_membership(peer: AsyncPeer, out: list[tuple[str, str]]) -> None:
    """Collect (event name, subject peer id) for suspicions, failures and refutations seen by ``peer``."""
    async for event in peer.events():
        if isinstance(event, (PeerSuspected, PeerFailed, PeerAlive)):
            out.append((type(event).__name__, str(event.peer)))


def membership_summary(events: list[tuple[str, str]], killed: set[str]) -> dict[str, int]:
    """Counts of membership verdicts a client peer reached, split into killed and running subjects."""
    failed = {peer for name, peer in events if name == "PeerFailed"}
    suspected = {peer for name, peer in events if name == "PeerSuspected"}
    return {
        "suspicions": sum(name == "PeerSuspected" for name, _ in events),
        "failures": sum(name == "PeerFailed" for name, _ in events),
        "refuted": sum(name == "PeerAlive" for name, _ in events),
        "running_peers_suspected": len(suspected - killed),
        "running_peers_declared_failed": len(failed - killed),
        "killed_peers_declared_failed": len(failed & killed),
    }


async def real_swarm_run(
    group: PeerGroup, label: str, peers: int, ops: int, seed: int, churn_s: float, details: dict[str, Any]
) -> list[Row]:
    rng = random.Random(seed)
    started = time.perf_counter()
    first = group.spawn()
    await group.wait_ready([first])
    rest = [group.spawn([first.addr]) for _ in range(peers - 1)]
    await group.wait_ready(rest)
    procs = [first, *rest]
    details["processes_ready_s"] = time.perf_counter() - started
    writer_events: list[tuple[str, str]] = []
    reader_events: list[tuple[str, str]] = []
    shutdown_errors: list[str] = details.setdefault("client_shutdown_errors", [])
    writer_config = client_config(group.profile, first.addr)
    progress(f"{peers} processes listening after {details['processes_ready_s']:.1f} s")
    async with client_peer(writer_config, shutdown_errors) as writer, anyio.create_task_group() as watch:
        watch.start_soon(record_membership, writer, writer_events)
        # The writer should know the whole swarm before it measures anything (bounded wait).
        details["writer_routing_table"] = await wait_routing(writer, peers, REAL_SETTLE_TIMEOUT_S)
        build_s = time.perf_counter() - started
        details["build_wall_s"] = build_s
        keys = [b"bench/real/%d/%d" % (seed, i) for i in range(ops)]
        stores = []
        for key in keys:
            stores.append(await timed(lambda key=key: writer.dht.store(key, record_value(key)), None))
        details["store_accepted_median"] = statistics.median(
            [o.result.accepted for o in stores if isinstance(o.result, StoreResult)] or [float("nan")]
        )
        reader_bootstrap = rng.choice(procs[1:] or procs).addr
        reader_config = client_config(group.profile, reader_bootstrap)
        progress(f"stores done; writer routing table {details['writer_routing_table']}")
        async with client_peer(reader_config, shutdown_errors) as reader, anyio.create_task_group() as rw:
            rw.start_soon(record_membership, reader, reader_events)
            details["reader_routing_table"] = await wait_routing(reader, peers, REAL_SETTLE_TIMEOUT_S)
            details["reader_held_records_before_gets"] = sum(
                reader.dht.machine.held_record(reader.clock.now(), key) is not None for key in keys
            )
            gets = []
            for key in keys:
                gets.append(await timed(lambda key=key: reader.dht.get_record(key), record_value(key)))
            progress("gets done; churn window starts")
            churn = await real_churn(group, procs, reader, keys, rng, churn_s, details)
            progress("churn window done; shutting down")
            shares = [s for s in (p.cpu_share() for p in group.procs if p.process.poll() is None) if s is not None]
            details["process_cpu"] = {
                "mean_share": statistics.fmean(shares) if shares else float("nan"),
                "total_cores": sum(shares),
                "processes": len(shares),
                "loadavg": os.getloadavg(),
            }
            rw.cancel_scope.cancel()
        watch.cancel_scope.cancel()
    # Membership runs alongside the DHT in every peer: what did the two client peers conclude?
    killed = set(details["churn"]["killed_ids"])
    details["membership_seen_by_writer"] = membership_summary(writer_events, killed)
    details["membership_seen_by_reader"] = membership_summary(reader_events, killed)
    return [
        real_row(label, peers, "store", stores, build_s),
        real_row(label, peers, "get", gets, build_s),
        real_row(label, peers, "get-churn", churn, build_s),
    ]


async def real_churn(
    group: PeerGroup,
    procs: list[PeerProcess],
    reader: AsyncPeer,
    keys: list[bytes],
    rng: random.Random,
    churn_s: float,
    details: dict[str, Any],
) -> list[TimedOp]:
    """Get stored keys for ``churn_s`` while 10 % of the processes are SIGKILLed and replaced."""
    kills = max(1, round(0.10 * len(procs)))
    victims = rng.sample(procs, kills)
    survivors = [p for p in procs if p not in victims]
    results: list[TimedOp] = []
    log: list[dict[str, Any]] = []
    replacements: list[PeerProcess] = []
    t0 = time.perf_counter()

    async def churn() -> None:
        # Spread the kills over the first half of the window; each is replaced at once.
        gap = churn_s / 2 / kills
        for victim in victims:
            await anyio.sleep(gap)
            victim.kill9()
            replacement = group.spawn([rng.choice(survivors).addr])
            replacements.append(replacement)
            log.append({"t_s": time.perf_counter() - t0, "killed": victim.peer_id})
        await group.wait_ready(replacements)
        log.append({"t_s": time.perf_counter() - t0, "replacements_listening": len(replacements)})

    async with anyio.create_task_group() as tg:
        tg.start_soon(churn)
        index = 0
        while time.perf_counter() - t0 < churn_s:
            key = keys[index % len(keys)]
            results.append(await timed(lambda key=key: reader.dht.get_record(key), record_value(key)))
            index += 1
    details["churn"] = {
        "window_s": churn_s,
        "killed": kills,
        "of_processes": len(procs),
        "events": log,
        "killed_ids": [v.peer_id for v in victims],
        "wrong_values": sum(
            1
            for o in results
            if isinstance(o.result, GetResult) and o.result.value is not None and not o.ok
        ),
        "not_found": sum(1 for o in results if isinstance(o.result, GetResult) and o.result.value is None),
        "timed_out_or_error": sum(1 for o in results if o.result is None),
    }
    return results


def exit_codes(group: PeerGroup) -> dict[str, Any]:
    """How the processes that were shut down with SIGTERM (not the SIGKILLed ones) exited, and why."""
    return group.exit_summary(lambda line: line.startswith("error:"))


def bench_real_processes(
    real_peers: Sequence[int], ops: int, seed: int, churn_s: float = 20.0, profiles: Sequence[str] = ("local",)
) -> dict[str, Any]:
    """Run the real-process tier for each profile and swarm size; returns rows and the details behind them."""
    rows: list[Row] = []
    details: dict[str, Any] = {}
    # The client peers' membership verdicts are counted below; their warning lines would only clutter the table.
    logging.getLogger("chaosp2p").setLevel(logging.ERROR)
    for profile in profiles:
        for peers in real_peers:
            detail: dict[str, Any] = {"profile": profile, "processes": peers, "loadavg_before": os.getloadavg()}
            details[f"{profile}/{peers}"] = detail
            progress(f"real DHT: {peers} processes, profile {profile}")
            with tempfile.TemporaryDirectory(prefix="chaosp2p-dht-bench-") as tmp:
                group = PeerGroup(Path(tmp), profile_argument(profile, Path(tmp)))
                started = time.perf_counter()
                try:
                    rows.extend(
                        anyio.run(real_swarm_run, group, profile, peers, ops, seed, churn_s, detail, backend="trio")
                    )
                except Exception as exc:  # one swarm failing must not lose the others' figures
                    detail["error"] = f"{type(exc).__name__}: {exc}"
                    progress(f"real DHT {profile}/{peers} failed: {detail['error']}")
                finally:
                    group.stop_all()
                detail["processes_sigterm_exit_codes"] = exit_codes(group)
                detail["wall_s"] = time.perf_counter() - started
    return {"rows": rows, "details": details}


def print_table(rows: list[Row]) -> None:
    if any(r.profile for r in rows):
        rows = [replace(r, links=f"{r.links} {r.profile}") for r in rows]
    lw = max([9, *(len(r.links) for r in rows)])
    ow = max([6, *(len(r.op) for r in rows)])
    nw = max([4, *(len(str(r.count)) for r in rows)])
    header = f"{'links':<{lw}} {'peers':>5} {'op':<{ow}} {'n':>{nw}} {'ok %':>6} {'p50 ms':>8} {'p95 ms':>8} " \
             f"{'hops':>5} {'max':>4} {'msgs/op':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.links:<{lw}} {r.peers:>5} {r.op:<{ow}} {r.count:>{nw}} {100 * r.success:>6.1f} {r.p50_ms:>8.2f} "
              f"{r.p95_ms:>8.2f} {r.mean_hops:>5.2f} {r.max_hops:>4} {r.msgs_per_op:>8.1f}")


REFERENCE_TEXT = (
    "reference only, not rerun here (../shared/BENCHMARKS.md, same kind of machine): hivemind DHT store / get on "
    "loopback, steady state 12.7 ms / 6.6 ms; py-libp2p Kademlia put / get, 16-20 hosts 0.40-0.47 s / 0.37-0.60 s"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024", help="comma-separated swarm sizes")
    parser.add_argument("--ops", type=int, default=100, help="stores and gets per size and link profile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--churn-sizes", default="256,1024", help="sizes for the churn run ('' to skip)")
    parser.add_argument("--quick", action="store_true", help="sizes 16,64,256, 30 ops, churn at 256 only")
    parser.add_argument("--real", action="store_true", help="also run the real-process tier")
    parser.add_argument("--real-only", action="store_true", help="run only the real-process tier (implies --real)")
    parser.add_argument("--real-peers", default="16", help="comma-separated process counts for --real, e.g. 16,32")
    parser.add_argument("--real-ops", type=int, default=50, help="keys stored and read back per real swarm")
    parser.add_argument("--real-churn-s", type=float, default=20.0, help="length of the real churn window")
    parser.add_argument("--real-profiles", default="local",
                        help="comma-separated profiles the real processes run (local, lan, wan)")
    parser.add_argument("--json", type=Path, help="write all results to this file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    churn_sizes = [int(s) for s in args.churn_sizes.split(",") if s]
    real_peers = [int(s) for s in args.real_peers.split(",") if s]
    ops = args.ops
    if args.quick:
        sizes, ops, churn_sizes = [s for s in sizes if s <= 256], min(ops, 30), [s for s in churn_sizes if s <= 256]
    if args.real_only:
        args.real, sizes, churn_sizes = True, [], []

    started = time.perf_counter()
    rows: list[Row] = []
    for case in LINKS:
        for size in sizes:
            rows.extend(bench_size(case, size, ops, args.seed))
    if rows:
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

    real: dict[str, Any] | None = None
    if args.real:
        profiles = [p for p in args.real_profiles.split(",") if p]
        real = bench_real_processes(real_peers, args.real_ops, args.seed, args.real_churn_s, profiles)
        print(f"\nDHT, real processes (`chaosp2p peer --profile P` on 127.0.0.1; wall-clock ms; "
              f"{args.real_ops} keys of 1 KiB; get-churn = gets during {args.real_churn_s:.0f} s in which 10 % of "
              f"the processes are SIGKILLed and replaced)")
        print_table(real["rows"])
        for name, d in real["details"].items():
            if "churn" not in d:
                print(f"  {name}: did not finish ({d.get('error', 'see JSON')})")
                continue
            c = d["churn"]
            print(f"  {name}: processes ready after {d['processes_ready_s']:.1f} s, writer knew "
                  f"{d['writer_routing_table']} and reader {d['reader_routing_table']} peers; stores reached "
                  f"{d['store_accepted_median']:.0f} peers (median); reader held {d['reader_held_records_before_gets']}"
                  f" of the records before its gets; churn: {c['killed']} of {c['of_processes']} killed, "
                  f"{c['not_found']} not found, {c['wrong_values']} wrong, {c['timed_out_or_error']} timed out; "
                  f"run {d['wall_s']:.0f} s")
            cpu = d["process_cpu"]
            print(f"    peer processes used {100 * cpu['mean_share']:.1f} % of a core each on average over their "
                  f"lifetime ({cpu['total_cores']:.2f} cores for {cpu['processes']}); load average "
                  f"{cpu['loadavg'][0]:.1f} at the end of the churn window")
            print(f"    SIGTERM exits of the processes: {d['processes_sigterm_exit_codes']}; shutdown errors of the "
                  f"in-process clients: {len(d['client_shutdown_errors'])}")
            for error in d["client_shutdown_errors"]:
                print(f"      {error}")
            for who in ("writer", "reader"):
                m = d[f"membership_seen_by_{who}"]
                print(f"    membership at the in-process {who}: {m['suspicions']} suspicions, {m['failures']} failures"
                      f" ({m['running_peers_declared_failed']} running peers and {m['killed_peers_declared_failed']}"
                      f" killed ones declared failed), {m['refuted']} refuted")
        print(f"  {REFERENCE_TEXT}")
    print(f"\ntotal wall time {time.perf_counter() - started:.1f} s")

    if args.json:
        payload = {
            "benchmark": "dht",
            "seed": args.seed,
            "ops": ops,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "links": {c.name: c.description for c in LINKS},
            "simulated": [asdict(r) for r in rows],
            "churn": churn,
            "real_processes": None if real is None else [asdict(r) for r in real["rows"]],
            "real_processes_details": None if real is None else real["details"],
            "real_processes_status": "not run (pass --real)" if real is None else "ok",
            "reference_not_rerun": REFERENCE_TEXT if real is not None else None,
        }
        args.json.write_text(json.dumps(payload, indent=2, allow_nan=True) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
