"""What a closed run's admission list costs (issue 20): bytes per configuration and CPU per epoch.

    python benchmarks/closed_runs.py [--members 1024] [--listed 1025] [--trials 200]
        [--json benchmarks/results/closed_runs.json]

A run of ``--members`` members, open (the baseline, measured in the same run) and closed with
``--listed`` admitted peers (``RunParams.admitted``). Per configuration: its encoded size (what a
RUN_INFO, an admitting COMMIT or a snapshot carries; an ordinary COMMIT carries only the value and
the digest), the thread CPU of ``next_configuration`` for one THROUGHPUT (every member computes it
per epoch, digest included) and of ``decode_configuration`` (a newcomer, a lagging member). p50 and
p99 over ``--trials``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import write_json

from chaosp2p.protocols.negotiation import OpKind, RunParams
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.operations import op_id, sign_operation
from chaosp2p.protocols.negotiation.run_configuration import Configuration, make_configuration
from chaosp2p.wire.identity import Identity


def _cpu(fn: Callable[[], object], trials: int) -> dict[str, float]:
    samples = []
    for _ in range(trials):
        start = time.thread_time_ns()
        fn()
        samples.append((time.thread_time_ns() - start) / 1e6)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[min(len(samples) - 1, int(0.99 * len(samples)))]}


def measure(identities: list[Identity], members: int, listed: int, trials: int) -> dict[str, Any]:
    """Size and CPU figures of a run of ``members`` admitting the first ``listed`` identities."""
    peers = sorted((i.peer_id for i in identities[:members]), key=lambda p: p.raw)
    admitted = tuple(sorted((i.peer_id for i in identities[:listed]), key=lambda p: p.raw))
    config = make_configuration(
        run="bench",
        epoch=1,
        activation_step=10,
        peers=peers,
        incarnations=[1] * members,
        throughputs=[1.0] * members,
        links=(),
        params=RunParams(global_batch=4 * members, admitted=admitted),
        seed=7,
    )
    origin = next(i for i in identities if i.peer_id == peers[0])
    op = sign_operation(
        origin,
        kind=OpKind.THROUGHPUT,
        run="bench",
        epoch=1,
        subject=origin.peer_id,
        incarnation=1,
        detected_at=1.0,
        throughput_samples_per_s=2.0,
    )
    batch = [(op_id(op), op)]
    raw = config.encode()

    def advance() -> Configuration:
        return next_configuration(config, batch, 20)[0]

    return {
        "listed": listed,
        "encoded_bytes": len(raw),
        "next_configuration": _cpu(advance, trials),
        "decode": _cpu(lambda: decode_configuration(raw, max_members=65536, max_links=32768), trials),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=1024)
    parser.add_argument("--listed", type=int, default=1025, help="admitted peers of the closed run")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    count = max(args.members, args.listed)
    identities = [Identity.from_seed(i.to_bytes(4, "big") * 8) for i in range(count)]
    rows = [measure(identities, args.members, listed, args.trials) for listed in (0, args.listed)]
    for row in rows:
        kind = "open" if row["listed"] == 0 else f"closed, {row['listed']} listed"
        nxt, dec = row["next_configuration"], row["decode"]
        print(
            f"{args.members} members, {kind}: {row['encoded_bytes']} B; next_configuration p50 "
            f"{nxt['p50_ms']:.3f} ms (p99 {nxt['p99_ms']:.3f}); "
            f"decode p50 {dec['p50_ms']:.2f} ms (p99 {dec['p99_ms']:.2f})"
        )
    open_, closed = rows
    print(
        f"closed / open: bytes {closed['encoded_bytes'] / open_['encoded_bytes']:.2f}x, next_configuration "
        f"{closed['next_configuration']['p50_ms'] / open_['next_configuration']['p50_ms']:.2f}x, decode "
        f"{closed['decode']['p50_ms'] / open_['decode']['p50_ms']:.2f}x"
    )
    write_json(args.json, {"members": args.members, "trials": args.trials, "rows": rows})


if __name__ == "__main__":
    main()
