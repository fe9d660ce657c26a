"""A bare peer for the cluster harness: ``python -m chaosp2p.cluster.agent`` (``run = "peer"``).

It is ``chaosp2p peer`` plus the example flags a harness drives (``--join``, ``--ready-file``,
``--metrics-file``, ``--profile``; SIGTERM = leave) and one addition: every event the peer publishes
(joins, suspicions, failures, leaves, link changes) is appended to the metrics file as a JSON line
``{"event": "peer_failed", "at": <monotonic s>, ...}`` -- and SIGTERM announces a leave to the
swarm before the peer closes (``chaosp2p peer`` just closes) -- so the harness can put a bare peer's view on
the same timeline as a training peer's. Like the digits example, the ``local`` profile detects
failures with lan timings: several processes on a machine's shared cores miss 50 ms probe deadlines.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import re
import signal
import sys
from pathlib import Path
from typing import IO, Any

import anyio

from chaosp2p.api.async_peer import open_peer
from chaosp2p.cli.common import PeerOptions, load_config
from chaosp2p.protocols.membership import MembershipConfig
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.trainers.script import add_peer_arguments, write_ready_file


def event_record(event: object) -> dict[str, Any]:
    """A published event as a JSON-ready record (``event`` is its type name in snake case)."""
    name = re.sub(r"(?<!^)(?=[A-Z])", "_", type(event).__name__).lower()
    record: dict[str, Any] = {"event": name}
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        for item in dataclasses.fields(event):
            record[item.name] = _plain(getattr(event, item.name))
    return record


def _plain(value: object) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def peer_config(profile: str, join: list[str], listen: list[str] | None = None) -> PeerConfig:
    """The profile, listening on ``listen`` (default: a free loopback port), bootstrapping from ``join``."""
    addrs = tuple(listen) if listen else ("/ip4/127.0.0.1/tcp/0",)
    config = load_config(PeerOptions(profile=profile, listen=addrs, bootstrap=tuple(join)))
    if profile == "local":
        config = config.replace(membership=MembershipConfig.lan())
    return config


async def run_agent(config: PeerConfig, ready_file: Path | None, metrics: IO[str] | None) -> None:
    """Run the peer until SIGTERM/SIGINT, logging its events."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_peer(config) as node, anyio.create_task_group() as tg:
            subscription = node.events()
            write_ready_file(ready_file, str(node.peer_id), [str(a) for a in node.addrs])

            async def log_events() -> None:
                async for event in subscription:
                    if metrics is not None:
                        metrics.write(json.dumps(event_record(event)) + "\n")
                        metrics.flush()

            tg.start_soon(log_events)
            async for _ in signals:
                break
            # SIGTERM is a graceful leave: the swarm hears LEAVE at once instead of detecting a failure.
            await node.membership.leave()
            tg.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    """Parse the example flags and run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    args = parser.parse_args(argv)
    config = peer_config(args.profile, args.join, args.listen)
    metrics = args.metrics_file.open("a") if args.metrics_file is not None else None
    try:
        anyio.run(run_agent, config, args.ready_file, metrics, backend="trio")
    finally:
        if metrics is not None:
            metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
