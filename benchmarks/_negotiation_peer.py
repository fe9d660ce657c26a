"""One peer of the real-process decision-latency benchmark (``benchmarks/negotiation.py --parts real``).

A small worker, not a training script: it opens a peer on 127.0.0.1 (the ``local`` profile), founds
the run (``--found``) or joins it through the negotiation service (``--join ADDR``: the sponsor is
the peer at ADDR), then runs a stand-in step loop -- before each step it asks the service for the
configuration governing it (waiting while a pending change gates it), reports the step entered,
sleeps ``--pace`` seconds and reports it completed -- so that activation steps, gates and urgent
values behave as they do under training, without any model or averaging. With ``--clock-base`` the
members step in lockstep on the machine's shared monotonic clock, as synchronous training does
(nobody runs steps ahead of the others; without it members drift apart by their scheduling delays,
and an urgent FAIL value's step is then often already completed by some, who refuse it).

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
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import IO, Any

import anyio

from chaosp2p.api.async_peer import open_peer
from chaosp2p.errors import RunRemoved
from chaosp2p.protocols.membership import LinkDown, LinkUp, MembershipConfig
from chaosp2p.protocols.negotiation import (
    Admitted,
    ConfigurationCommitted,
    OperationCommitted,
    RemovedFromRun,
    RunParams,
)
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

RUN = "bench-negotiation"
PROFILER: Any = None
PROTOCOL = "negotiation"


class Trace:
    """Per-message hop log (``--trace``): every negotiation message this peer queued, sent, received.

    Records are ``[what, message type, peer, epoch, monotonic time, process CPU s]`` kept in memory
    and written every half second (not per message: the log must not cost what it measures). A
    SIGKILLed peer loses its last half second, which is after the operations it takes part in.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[list[Any]] = []

    def add(self, what: str, kind: str, peer: object, epoch: int | None) -> None:
        self.records.append([what, kind, str(peer)[:12], epoch, time.monotonic(), time.process_time()])

    def flush(self) -> None:
        if self.records:
            with self.path.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.records)
            self.records.clear()

    def install(self, peer: Any) -> None:
        """Wrap the negotiation driver's input, queueing and the connection's send (this process only)."""
        from chaosp2p.protocols.negotiation import codec as negotiation_codec
        from chaosp2p.transport.connection import Connection
        from chaosp2p.wire.protocol_ids import ProtocolId

        driver = peer.negotiation.driver
        machine = driver.machine
        receive, enqueue, send_message = machine.receive, driver._enqueue, Connection.send_message
        handler = driver._handler_for(PROTOCOL)
        names = {t: c.__name__ for t, c in negotiation_codec._classes.items()}

        def traced_handler(connection: Any, body: bytes) -> None:
            self.add("arrive", names.get(body[1], str(body[1])) if len(body) > 1 else "?", connection.remote_peer, None)
            handler(connection, body)
            self.add(
                "handled", names.get(body[1], str(body[1])) if len(body) > 1 else "?", connection.remote_peer, None
            )

        def traced_receive(now: float, sender: Any, protocol: str, message: Any) -> Any:
            self.add("in", type(message).__name__, sender, getattr(message, "epoch", None))
            return receive(now, sender, protocol, message)

        def traced_enqueue(outgoing: Any, *rest: Any) -> None:
            message = outgoing.message
            self.add("queue", type(message).__name__, outgoing.to, getattr(message, "epoch", None))
            enqueue(outgoing, *rest)

        async def traced_send(connection: Any, protocol_name: str, body: bytes, majors: tuple[int, ...] = (1,)) -> None:
            await send_message(connection, protocol_name, body, majors)
            if protocol_name == PROTOCOL:
                kind = names.get(body[1], str(body[1])) if len(body) > 1 else "?"
                self.add("sent", kind, connection.remote_peer, None)

        send_nowait = Connection.try_send_message_nowait

        def traced_send_nowait(
            connection: Any, protocol_name: str, body: bytes, majors: tuple[int, ...] = (1,)
        ) -> bool:
            done = send_nowait(connection, protocol_name, body, majors)
            if done and protocol_name == PROTOCOL:
                kind = names.get(body[1], str(body[1])) if len(body) > 1 else "?"
                self.add("sent", kind, connection.remote_peer, None)
            return done

        if hasattr(Connection, "try_send_message_nowait"):
            Connection.try_send_message_nowait = traced_send_nowait  # type: ignore[method-assign]
        machine.receive = traced_receive
        driver._enqueue = traced_enqueue
        Connection.send_message = traced_send  # type: ignore[method-assign]
        peer.host.set_message_handler(ProtocolId(PROTOCOL, 1), traced_handler)


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
    if args.proposer_backoff_s is not None:
        config = config.replace(
            negotiation=dataclasses.replace(config.negotiation, proposer_backoff_s=args.proposer_backoff_s)
        )
    if not args.full_bandwidth_probes:
        # Nothing here uses bandwidth estimates: probe each new overlay link with the smallest
        # transfer that still counts as a sample (256 KB) instead of 4-8 MB, which cost 5-10 ms of
        # encryption per link on both ends while the overlay forms and replaces links.
        smallest = config.membership.bandwidth_min_sample_bytes
        config = config.replace(membership=dataclasses.replace(config.membership, bandwidth_probe_bytes=smallest))
    log = Log(args.log_file)
    trace = None if args.trace is None else Trace(args.trace)
    async with open_peer(config) as peer:
        if trace is not None:
            trace.install(peer)
        service = peer.negotiation
        if not args.overlay_link_ops:
            # The run's links change only through the explicit API (SIGUSR1/2): link changes the
            # overlay detects (link replacement, heartbeats late on a loaded host) would otherwise
            # make background operations that compete with the ones measured.
            observe = service.observe
            service.observe = lambda event: None if isinstance(event, LinkUp | LinkDown) else observe(event)  # type: ignore[method-assign]
        me = peer.peer_id
        events = peer.events()
        stop = anyio.Event()
        leaving = anyio.Event()
        admitted_step = 0

        names: dict[PeerID, str] = {}

        def name(peer: PeerID) -> str:
            """``str(peer)`` (base58), cached: every commit logs all members while others still commit."""
            text = names.get(peer)
            if text is None:
                text = names[peer] = str(peer)
            return text

        async def watch_events() -> None:
            async for event in events:
                if isinstance(event, OperationCommitted) and event.run == RUN:
                    log.write(
                        {
                            "event": "op",
                            "kind": event.kind.name,
                            "subject": name(event.subject),
                            "other": None if event.other is None else str(event.other),
                            "origin": name(event.origin),
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
                            "members": [name(p) for p in cfg.peers],
                            "activation_step": cfg.activation_step,
                            "committed_at": event.committed_at,
                        }
                    )
                elif isinstance(event, Admitted) and event.run == RUN:
                    log.write({"event": "admitted", "epoch": event.configuration.epoch, "at": peer.clock.now()})
                elif isinstance(event, RemovedFromRun) and event.run == RUN:
                    log.write({"event": "removed", "reason": event.reason, "at": peer.clock.now()})

        async def slot(step: int) -> None:
            """Lockstep (``--clock-base``): wait for the start of ``step``'s slot on the shared clock."""
            if args.clock_base is not None:
                delay = args.clock_base + step * args.pace - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)

        async def step_loop(first: int) -> None:
            step = first
            while True:
                try:
                    await slot(step)
                    await service.configuration_for_step(RUN, step)
                    resync = service.take_resync(RUN)
                    if resync is not None:
                        step = resync  # a commit voided steps we completed: redo from there
                        continue
                    service.report_step(RUN, entered=step)
                    if args.clock_base is None:
                        await anyio.sleep(args.pace)
                    else:
                        await slot(step + 1)
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

        async def flush_trace(trace: Trace) -> None:
            try:
                while True:
                    await anyio.sleep(0.5)
                    trace.flush()
            finally:
                trace.flush()

        async def dump_profile() -> None:
            while True:
                await anyio.sleep(1.0)
                PROFILER.dump_stats(f"{os.environ['CHAOSP2P_BENCH_PROFILE']}.{os.getpid()}")  # stops it
                PROFILER.enable()

        async with anyio.create_task_group() as tg:
            if PROFILER is not None:
                tg.start_soon(dump_profile)
            if trace is not None:
                tg.start_soon(flush_trace, trace)
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
    parser.add_argument(
        "--clock-base",
        type=float,
        default=None,
        help="lockstep: step k runs from BASE + k * pace to BASE + (k + 1) * pace on CLOCK_MONOTONIC (shared by "
        "every process on the machine), as in synchronous training where members cross step boundaries together; "
        "a late member catches up back to back (default: each member sleeps --pace per step on its own)",
    )
    parser.add_argument(
        "--overlay-link-ops",
        action="store_true",
        help="also turn the overlay's own link changes into LINK operations (default: explicit API only)",
    )
    parser.add_argument(
        "--full-bandwidth-probes", action="store_true", help="keep the profile's bandwidth-probe size (4-8 MB)"
    )
    parser.add_argument(
        "--proposer-backoff-s",
        type=float,
        default=None,
        help="NegotiationConfig.proposer_backoff_s (default: the local profile's 10 ms; with 16+ processes on 2 "
        "cores the coordinator's ACCEPT often arrives later, and backup proposers then duel with it)",
    )
    parser.add_argument("--trace", type=Path, default=None, help="write a per-message hop log here (JSON lines)")
    parser.add_argument(
        "--sched-batch",
        action="store_true",
        help="run under SCHED_BATCH: a peer woken by a message does not preempt the sender (loopback with "
        "more processes than cores)",
    )
    args = parser.parse_args(argv)
    if not args.found and not args.join:
        parser.error("--join is required unless --found")
    return args


if __name__ == "__main__":
    arguments = parse()
    if arguments.sched_batch:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    profile_path = os.environ.get("CHAOSP2P_BENCH_PROFILE")  # a cProfile dump per process (diagnosis)
    if profile_path:
        import cProfile

        PROFILER = cProfile.Profile(time.process_time)
        PROFILER.enable()
    try:
        anyio.run(main, arguments, backend="trio")
    except KeyboardInterrupt:
        sys.exit(130)
