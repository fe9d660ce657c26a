"""One peer of the real-process decision-latency benchmark (``benchmarks/negotiation.py --parts real``).

A small worker, not a training script: it opens a peer on 127.0.0.1 (the ``local`` profile), founds
the run (``--found``) or joins it through the negotiation service (``--join ADDR``: the sponsor is
the peer at ADDR), then runs a stand-in step loop -- before each step it asks the service for the
configuration governing it (waiting while a pending change gates it), reports the step entered,
sleeps ``--pace`` seconds and reports it completed -- so that activation steps, gates and urgent
values behave as they do under training, without any model or averaging.

It logs JSON lines to ``--log-file``: ``ready``, every ``OperationCommitted`` (``op``) and
``ConfigurationCommitted`` (``config``) with the machine's timestamps, ``admitted``, ``removed``,
``link`` requests and ``exit``. Machine timestamps are the peer's monotonic clock
(``time.monotonic``, CLOCK_MONOTONIC: one timeline for every process on the machine); each line also
carries ``wall`` (time.time()) and ``mono`` (time.monotonic()) when it was written, so a reader can
convert.

Signals: SIGTERM = graceful leave (announce, keep stepping until the leave commits, exit);
SIGUSR1 / SIGUSR2 = explicit disconnect-link / connect-link between this peer and the member after
it in the configuration's PeerID order (``NegotiationService.link_changed``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

import anyio

from chaosp2p.api import open_peer
from chaosp2p.protocols.membership import MembershipConfig
from chaosp2p.protocols.negotiation import (
    Admitted,
    ConfigurationCommitted,
    OperationCommitted,
    RemovedFromRun,
    RunParams,
)
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.runtime.negotiation_service import RunRemoved
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

RUN = "bench-negotiation"


class Log:
    """JSON lines, flushed at once (the harness reads them while the peer runs)."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a")

    def write(self, record: dict[str, Any]) -> None:
        record["wall"] = time.time()
        record["mono"] = time.monotonic()
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


def sponsor_of(addr: str) -> PeerID:
    """The PeerID at the end of a ``/p2p/`` multiaddr."""
    peer = Multiaddr.parse(addr).peer_id
    if peer is None:
        raise SystemExit(f"--join {addr}: the address must end in /p2p/<peer id>")
    return peer


async def main(args: argparse.Namespace) -> None:
    config = PeerConfig.local(bootstrap=args.join)
    if args.lan_membership:
        config = config.replace(membership=MembershipConfig.lan())
    log = Log(args.log_file)
    async with open_peer(config) as peer:
        service = peer.negotiation
        me = peer.peer_id
        events = peer.events()
        stop = anyio.Event()
        leaving = anyio.Event()
        admitted_step = 0

        async def watch_events() -> None:
            async for event in events:
                if isinstance(event, OperationCommitted) and event.run == RUN:
                    log.write(
                        {
                            "event": "op",
                            "kind": event.kind.name,
                            "subject": str(event.subject),
                            "other": None if event.other is None else str(event.other),
                            "origin": str(event.origin),
                            "epoch": event.epoch,
                            "detected_at": event.detected_at,
                            "proposed_at": event.proposed_at,
                            "committed_at": event.committed_at,
                            "activation_step": event.activation_step,
                            "applied": event.applied,
                        }
                    )
                elif isinstance(event, ConfigurationCommitted) and event.run == RUN:
                    cfg = event.configuration
                    log.write(
                        {
                            "event": "config",
                            "epoch": cfg.epoch,
                            "members": [str(p) for p in cfg.peers],
                            "activation_step": cfg.activation_step,
                            "committed_at": event.committed_at,
                        }
                    )
                elif isinstance(event, Admitted) and event.run == RUN:
                    log.write({"event": "admitted", "epoch": event.configuration.epoch, "at": peer.clock.now()})
                elif isinstance(event, RemovedFromRun) and event.run == RUN:
                    log.write({"event": "removed", "reason": event.reason, "at": peer.clock.now()})

        async def step_loop(first: int) -> None:
            step = first
            while True:
                try:
                    await service.configuration_for_step(RUN, step)
                    resync = service.take_resync(RUN)
                    if resync is not None:
                        step = resync  # a commit voided steps we completed: redo from there
                        continue
                    service.report_step(RUN, entered=step)
                    await anyio.sleep(args.pace)
                    # A change accepted meanwhile may gate this very step: wait for its decision.
                    await service.configuration_for_step(RUN, step)
                    if service.take_resync(RUN) is not None:
                        continue
                    service.report_step(RUN, completed=step)
                except RunRemoved:
                    if leaving.is_set():
                        stop.set()
                        return
                    # Removed while alive (a false failure on a busy machine): rejoin as a newcomer,
                    # as the training layer does, so the swarm keeps its size.
                    step = await rejoin()
                    continue
                step += 1

        async def rejoin() -> int:
            last = service.configuration(RUN)
            others = [] if last is None else [p for p in last.peers if p != me]
            log.write({"event": "rejoining", "at": peer.clock.now()})
            while True:
                sponsor = others[0] if others else sponsor_of(args.join[0]) if args.join else None
                if sponsor is None:
                    raise SystemExit("removed from the run and nobody to rejoin through")
                service.forget_removal(RUN)
                incarnation = next((m.incarnation for m in peer.members() if m.peer_id == me), 0)
                try:
                    admission = await service.join(RUN, sponsor, incarnation=incarnation, throughput=1.0, timeout_s=30)
                except TimeoutError:
                    others = others[1:] + others[:1]
                    continue
                mine = admission.member(me)
                log.write({"event": "rejoined", "epoch": admission.epoch, "at": peer.clock.now()})
                return admission.activation_step if mine is None else mine.since_step

        async def signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2) as received:
                async for number in received:
                    if number == signal.SIGTERM:
                        leaving.set()
                        log.write({"event": "leave_requested", "at": peer.clock.now()})
                        if not service.announce_leave(RUN):
                            stop.set()
                        continue
                    current = service.configuration(RUN)
                    if current is None or len(current.peers) < 2:
                        continue
                    i = current.index_of(me)
                    other = current.peers[(i + 1) % len(current.peers)]
                    up = number == signal.SIGUSR2
                    log.write({"event": "link", "up": up, "other": str(other), "at": peer.clock.now()})
                    service.link_changed(me, other, up)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_events)
            tg.start_soon(signals)
            if args.found:
                service.create_run(RUN, RunParams(global_batch=1024))
            else:
                sponsor = sponsor_of(args.join[0])
                with anyio.fail_after(120):
                    await peer.wait_connected(1)
                    incarnation = next((m.incarnation for m in peer.members() if m.peer_id == me), 0)
                    admission = await service.join(RUN, sponsor, incarnation=incarnation, throughput=1.0, timeout_s=120)
                mine = admission.member(me)
                admitted_step = admission.activation_step if mine is None else mine.since_step
            log.write({"event": "ready", "peer_id": str(me), "pid": os.getpid()})
            ready = {"peer_id": str(me), "addrs": [str(a) for a in peer.addrs]}
            temporary = args.ready_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(ready))
            os.replace(temporary, args.ready_file)
            tg.start_soon(step_loop, admitted_step)
            await stop.wait()
            log.write({"event": "exit", "dropped_events": events.dropped})
            tg.cancel_scope.cancel()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--found", action="store_true", help="found the run (else --join is required)")
    parser.add_argument("--join", action="append", default=[], metavar="MULTIADDR")
    parser.add_argument("--pace", type=float, default=0.05, help="seconds per stand-in step")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--log-file", type=Path, required=True)
    parser.add_argument(
        "--lan-membership", action="store_true", help="lan failure-detection timers (fewer wake-ups per peer)"
    )
    args = parser.parse_args(argv)
    if not args.found and not args.join:
        parser.error("--join is required unless --found")
    return args


if __name__ == "__main__":
    arguments = parse()
    try:
        anyio.run(main, arguments, backend="trio")
    except KeyboardInterrupt:
        sys.exit(130)
