"""Hole punching's success rate and time per pair of NAT kinds, in network namespaces (issue 21).

    python benchmarks/holepunch_nat.py [--tries 10] [--json benchmarks/results/holepunch_nat.json]

Needs root, ip, tc and nft (``chaosp2p.cluster.sites``). One relay R on a public address; sources
and targets on their own sites: two endpoint-independent NATs (``nat``), two symmetric NATs
(``symmetric-nat``) and a firewall that drops inbound connections (``firewall``). Per pair
(source kind ~ target kind: nat~nat, nat~symmetric-nat, symmetric-nat~symmetric-nat,
firewall~nat) a target process serves punches (``HolePunchService``) behind its site, connected to
R and to W (a second public peer on R's host: two observers of its source ports); the source
process then makes ``--tries`` attempts, each with a new identity and a new listen port (so a try
inherits no NAT mapping or connection from the one before): connect to R and W, open a relayed
connection to the target through R, and time :func:`~chaosp2p.transport.holepunch.punch` from the
call to its direct connection or its ``PeerUnreachable``. Reported: success rate, median time of
the successful punches and of the failed ones. A peer whose two observers saw its source ports
changed (a symmetric NAT) declines at once (``protocols/holepunch.md`` §3a); other failures wait
out ``connect_timeout_s``. Punch timing is the default (``HolePunchConfig()``, as a node's ``lan``
profile); ``--observers 1`` connects to R only, as before that section existed.
"""

from __future__ import annotations

import argparse
import json
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

from chaosp2p.cluster.scenario import SiteKind, SiteSpec
from chaosp2p.cluster.sites import SiteNetwork
from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.holepunch import HolePunchConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.holepunch import HolePunchService, punch
from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

CONFIG = TransportConfig(handshake_timeout_s=3.0, connect_timeout_s=1.5, request_timeout_s=5.0)
PUNCH = HolePunchConfig()
SITES = [
    SiteSpec(name="dc", kind=SiteKind.PUBLIC),
    SiteSpec(name="campus", kind=SiteKind.FIREWALL),
    SiteSpec(name="home", kind=SiteKind.NAT),
    SiteSpec(name="office", kind=SiteKind.NAT),
    SiteSpec(name="cafe", kind=SiteKind.SYMMETRIC_NAT),
    SiteSpec(name="hotel", kind=SiteKind.SYMMETRIC_NAT),
]
HOSTS = [("r", "dc"), ("f", "campus"), ("n1", "home"), ("n2", "office"), ("s1", "cafe"), ("s2", "hotel")]
PAIRS = [
    ("nat~nat", "n1", "n2"),
    ("nat~symmetric-nat", "n1", "s1"),
    ("symmetric-nat~symmetric-nat", "s1", "s2"),
    ("firewall~nat", "f", "n1"),
]


async def echo(connection: Connection, request: Any) -> Any:
    """Answers a request with itself (the sources' round trip over the relayed connection)."""
    return request


async def serve(listen: str, observers: list[str]) -> None:
    """R or W (``observers`` empty), or a target connected to them (R first): prints its address as
    one JSON line and serves (punches too) until killed."""
    async with open_host(Identity.generate(), CONFIG) as host:
        HolePunchService(host, PUNCH)
        host.set_request_handler("/chaos/echo/1", echo)
        addr = await host.listen(listen)
        for observer in observers:
            await host.connect(observer)  # each reports the target's observed address; circuits come through R
        print(json.dumps({"addr": str(addr)}), flush=True)
        await anyio.sleep_forever()


async def source(ip: str, relay_text: str, witness_text: str, target_text: str, tries: int) -> list[dict[str, Any]]:
    """``tries`` punches towards the target, each from a new host (connected to R, and to W unless
    ``witness_text`` is "-"): outcome and seconds of each."""
    target = Multiaddr.parse(target_text)
    assert target.peer_id is not None
    results: list[dict[str, Any]] = []
    for _ in range(tries):
        async with open_host(Identity.generate(), CONFIG) as host:
            await host.listen(f"/ip4/{ip}/tcp/0")
            relay = await host.connect(relay_text)
            if witness_text != "-":
                await host.connect(witness_text)
            relayed = await host.relay.connect_via(relay.remote_peer, target.peer_id)
            assert relayed.relayed
            started = time.perf_counter()
            try:
                direct = await punch(host, target.peer_id, PUNCH)
                outcome: dict[str, Any] = {"direct": not direct.relayed, "remote": direct.remote_address[0]}
                outcome["is_dialer"] = direct.is_dialer
            except PeerUnreachable as exc:
                outcome = {"direct": False, "error": str(exc)}
            outcome["s"] = time.perf_counter() - started
            # The relayed connection stays either way: one stream round trip over it.
            outcome["relayed_echo"] = await relayed.request("echo", "relayed") == "relayed"
            results.append(outcome)
    return results


def run(tries: int, observers: int) -> dict[str, Any]:
    """Build the namespaces, start R and W, then per pair a target and the source's tries; remove all."""
    pairs: dict[str, Any] = {}
    processes: list[subprocess.Popen[str]] = []
    with SiteNetwork.create(SITES, HOSTS) as net:
        try:
            relay_proc, relay = start_in(net, "r", __file__, "--serve", f"/ip4/{net.address('r')}/tcp/0")
            processes.append(relay_proc)
            witness_proc, witness = start_in(net, "r", __file__, "--serve", f"/ip4/{net.address('r')}/tcp/0")
            processes.append(witness_proc)
            connects = [relay["addr"], witness["addr"]][:observers]
            for name, source_host, target_host in PAIRS:
                target_proc, target = start_in(
                    net,
                    target_host,
                    __file__,
                    "--serve",
                    f"/ip4/{net.address(target_host)}/tcp/0",
                    *(arg for addr in connects for arg in ("--connect", addr)),
                )
                processes.append(target_proc)
                ip = net.address(source_host)
                command = net.wrap(source_host, [sys.executable, str(Path(__file__).resolve()), "--source", ip])
                out = subprocess.run(
                    [*command, relay["addr"], connects[1] if observers > 1 else "-", target["addr"], str(tries)],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"{name}: the source failed: {out.stderr[-2000:]}")
                attempts = json.loads(out.stdout.strip().splitlines()[-1])
                pairs[name] = _summary(attempts, net.hosts[target_host].public_address)
        finally:
            stop_all(processes)
    return pairs


def _summary(attempts: list[dict[str, Any]], target_public: str) -> dict[str, Any]:
    won = [a["s"] for a in attempts if a["direct"]]
    lost = [a["s"] for a in attempts if not a["direct"]]
    return {
        "tries": len(attempts),
        "direct": len(won),
        "success_rate": len(won) / len(attempts),
        "median_success_s": median(won) if won else None,
        "median_failure_s": median(lost) if lost else None,
        "direct_to_target_public_address": all(a.get("remote") == target_public for a in attempts if a["direct"]),
        "relayed_echo_ok": all(a["relayed_echo"] for a in attempts),
        "errors": sorted({a["error"].split(": ", 1)[-1] for a in attempts if "error" in a}),
        "attempts": attempts,
    }


def parser() -> argparse.ArgumentParser:
    """The arguments; ``--serve``/``--connect`` (R, W or a target) and ``--source`` are the children's roles."""
    found = namespaced_parser(__doc__, {"--source": 5})
    found.add_argument("--connect", action="append", default=[], help=argparse.SUPPRESS)
    found.add_argument("--tries", type=int, default=10, help="punches per pair of NAT kinds")
    found.add_argument("--observers", type=int, choices=(1, 2), default=2, help="public peers each end connects to")
    return found


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.serve is not None:
        anyio.run(serve, args.serve, args.connect, backend="trio")
        return
    if args.source is not None:
        ip, relay, witness, target, tries = args.source
        print(json.dumps(anyio.run(source, ip, relay, witness, target, int(tries), backend="trio")))
        return
    started = time.perf_counter()
    pairs = run(args.tries, args.observers)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.0f} ms"

    print_table(
        f"hole punching in namespaces, {args.tries} tries per pair (source ~ target), {args.observers} observer(s)",
        ["pair", "direct", "median success", "median failure", "failure reasons"],
        [
            [
                name,
                f"{p['direct']}/{p['tries']}",
                ms(p["median_success_s"]),
                ms(p["median_failure_s"]),
                "; ".join(p["errors"]) or "-",
            ]
            for name, p in pairs.items()
        ],
    )
    write_json(
        args.json,
        {
            "benchmark": "holepunch_nat",
            "tries": args.tries,
            "observers": args.observers,
            "punch_config": {
                "answer_timeout_s": PUNCH.answer_timeout_s,
                "connect_timeout_s": PUNCH.connect_timeout_s,
                "min_mapping_observers": PUNCH.min_mapping_observers,
            },
            "wall_s": round(time.perf_counter() - started, 1),
            "pairs": pairs,
        },
    )


if __name__ == "__main__":
    main()
