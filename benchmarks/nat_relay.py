"""Relayed vs direct throughput for a peer behind NAT, in network namespaces (issue 21).

    python benchmarks/nat_relay.py [--mib 256] [--repeats 3] [--mbit N] [--json out.json]

Needs root, ip, tc and nft (``chaosp2p.cluster.sites``). Three hosts, each in its own namespace: a
receiver S and a relay R on public addresses, and a sender N behind a masquerading NAT. N dials S
directly (outbound through its NAT works) and also reaches S through a circuit at R
(``/chaos/relay/1``: the end-to-end encrypted connection runs inside the streams N-R and R-S). Each
repeat moves the same bytes over one stream of each, direct first; R's CPU time (user + system,
from ``/proc``) is read around the relayed transfers only: seconds of relay CPU per GB relayed.
``--mbit`` shapes every host's veth with ``tc tbf`` (both directions). Figures are medians over
repeats; the relayed rate is reported as a ratio to the direct one measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _common import median, print_table, write_json
from _namespaced import parser as namespaced_parser
from _namespaced import start_in, stop_all
from transport import CONFIG, chaos_bulk, cpu_seconds, make_sink

from chaosp2p.cluster.scenario import SiteKind, SiteSpec
from chaosp2p.cluster.sites import SiteNetwork
from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity

PORT = 4001


async def serve(listen: str, target: str | None) -> None:
    """A receiver (a ``sink`` stream handler), or with ``target`` a relay connected to it; prints
    its address and pid as one JSON line and serves forever."""
    async with open_host(Identity.generate(), CONFIG) as host:
        host.set_stream_handler("/chaos/sink/1", make_sink())
        addr = await host.listen(listen)
        if target is not None:
            await host.connect(target)  # a relay forwards only over connections it holds
        print(json.dumps({"addr": str(addr), "pid": os.getpid()}), flush=True)
        await anyio.sleep_forever()


async def client(info: dict[str, Any], total: int, repeats: int) -> dict[str, Any]:
    """N's side: direct and relayed transfers to S, R's CPU around the relayed ones."""
    rates: dict[str, list[float]] = {"direct": [], "relayed": []}
    relay_cpu_s = 0.0
    async with open_host(Identity.generate(), CONFIG) as host:
        direct = await host.connect(info["s"]["addr"])
        relay = await host.connect(info["r"]["addr"])
        relayed = await host.relay.connect_via(relay.remote_peer, direct.remote_peer)
        assert relayed.relayed
        await chaos_bulk(direct, 8 << 20, 1)  # warm up both paths
        await chaos_bulk(relayed, 8 << 20, 1)
        for _ in range(repeats):
            rates["direct"].append(await chaos_bulk(direct, total, 1))
            before = cpu_seconds(info["r"]["pid"])
            rates["relayed"].append(await chaos_bulk(relayed, total, 1))
            relay_cpu_s += cpu_seconds(info["r"]["pid"]) - before
        observed = [str(a) for a in host.observed.all()]
    return {
        "bytes_per_s": {k: median(v) for k, v in rates.items()},
        "runs": rates,
        "relay_cpu_s_per_gb": relay_cpu_s / (total * repeats / 1e9),
        "n_observed_at": observed,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the namespaces, start S and R, run N's transfers, remove everything."""
    bandwidth = None if args.mbit is None else args.mbit * 1e6 / 8
    sites = [
        SiteSpec(name="dc", kind=SiteKind.PUBLIC, bandwidth_bytes_per_s=bandwidth),
        SiteSpec(name="home", kind=SiteKind.NAT, bandwidth_bytes_per_s=bandwidth),
    ]
    processes: list[subprocess.Popen[str]] = []
    with SiteNetwork.create(sites, [("s", "dc"), ("r", "dc"), ("n", "home")]) as net:
        try:
            s_proc, s_info = start_in(net, "s", __file__, "--serve", f"/ip4/{net.address('s')}/tcp/{PORT}")
            processes.append(s_proc)
            r_proc, r_info = start_in(
                net, "r", __file__, "--serve", f"/ip4/{net.address('r')}/tcp/{PORT}", "--target", s_info["addr"]
            )
            processes.append(r_proc)
            info = json.dumps({"s": s_info, "r": r_info})
            total = str(int(args.mib * (1 << 20)))
            command = net.wrap("n", [sys.executable, str(Path(__file__).resolve()), "--client", info, total])
            out = subprocess.run([*command, str(args.repeats)], capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"the client failed: {out.stderr[-2000:]}")
            result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
            result["n_public_address"] = net.hosts["n"].public_address
        finally:
            stop_all(processes)
    return result


def parser() -> argparse.ArgumentParser:
    """The benchmark's arguments; ``--serve``/``--target`` (S or R) and ``--client`` are its children's roles."""
    found = namespaced_parser(__doc__, {"--target": None, "--client": 3})
    found.add_argument("--mib", type=float, default=256.0, help="bytes per transfer, in MiB")
    found.add_argument("--repeats", type=int, default=3)
    found.add_argument("--mbit", type=float, default=None, help="tc tbf on every host's veth (Mbit/s)")
    return found


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.serve is not None:
        anyio.run(serve, args.serve, args.target, backend="trio")
        return
    if args.client is not None:
        info, total, repeats = args.client
        print(json.dumps(anyio.run(client, json.loads(info), int(total), int(repeats), backend="trio")))
        return
    started = time.perf_counter()
    result = run(args)
    direct, relayed = result["bytes_per_s"]["direct"], result["bytes_per_s"]["relayed"]
    print_table(
        f"N behind NAT -> S, {args.mib:g} MiB x {args.repeats}"
        + (f", {args.mbit:g} Mbit/s veths" if args.mbit else ""),
        ["path", "MB/s (median)", "vs direct"],
        [
            ["direct", f"{direct / 1e6:.0f}", "1.00x"],
            ["relayed by R", f"{relayed / 1e6:.0f}", f"{relayed / direct:.2f}x"],
        ],
    )
    print(f"relay CPU: {result['relay_cpu_s_per_gb']:.2f} s per GB relayed; N seen at {result['n_observed_at']}")
    write_json(
        args.json,
        {
            "benchmark": "nat_relay",
            "mib": args.mib,
            "repeats": args.repeats,
            "mbit": args.mbit,
            "wall_s": round(time.perf_counter() - started, 1),
            **result,
            "relayed_vs_direct": relayed / direct,
        },
    )


if __name__ == "__main__":
    main()
