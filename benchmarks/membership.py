"""Membership benchmark: failure detection time, heartbeat traffic and false suspicions.

    python benchmarks/membership.py [--peers 32] [--trials 3] [--seed 1] [--json out.json] [--quick]
        [--skip-real | --real-only] [--wan-real] [--real-trials 3] [--soak-s 60] [--quiet-s 10]
        [--baseline /path/to/other/checkout]

Simulated part (runs now): swarms of MembershipMachines on SimNetwork, per profile (local, lan,
wan), with links of 0.5 ms one way unless said otherwise.

* detection: kill -9 (crash: connections refused) and SIGSTOP (stall: connections stay open,
  messages queue) of one peer; time from the fault to each running peer's PeerFailed -- first
  observer, median observer, last observer. Each trial restarts/resumes the victim afterwards.
  Plus the acceptance scenario on `local`: 5 peers, one killed and one stopped at once.
* traffic: membership bytes per peer per second in steady state, from the msgpack encoding of every
  delivered message (PING/ACK heartbeats and probes, gossip, push-pull), and messages per second.
  These are *encoded* bytes, about a third of the wire traffic on `local` (each record adds a length
  prefix, mux and record headers and a 16-byte tag): the real-process part counts the wire.
* false suspicions: a steady swarm on lossy, jittery links; distinct suspicions (subject,
  incarnation) of peers that were running -- every one is false; each is also reported once by
  every observer that heard of it -- and PeerFailed events about running peers (false failures).

* heartbeat CPU: process CPU per heartbeat on the runtime's hot path, measured on one machine:
  a PING datagram in (the cheap pre-decode checks where the machine has them, decode, handle) and
  its ACK encoded; and CPU per delivered message of the steady simulated swarm (machines plus the
  simulator, the same simulator on both sides of a comparison).

All times are *virtual* seconds: protocol timing only (no CPU, no kernel), exact for a seed.

``--baseline TREE`` measures twice in one invocation: first this benchmark against the chaosp2p
of another checkout (``PYTHONPATH=TREE``, child peers started from there), then against this one,
with the same arguments, and prints each headline figure of both with their ratio. Run it from
this checkout; it reports the load average before and after each half.

Real-process part (runs by default; ``--skip-real`` leaves it out, ``--real-only`` runs only it):
real peer processes on 127.0.0.1 per profile (local, lan; wan with ``--wan-real``) -- wall-clock
detection of a kill -9 and a SIGSTOP, heartbeat bytes from the transport's own counters, and false
suspicions during a soak with both CPU cores loaded. What exactly is measured is described above
``real_process_measurements``; every figure comes from a measurement in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _common import print_table, write_json
from _processes import PeerProcess, ProcessGroup, poll, profile_argument

from chaosp2p import PeerConfig, open_peer
from chaosp2p.api.async_peer import AsyncPeer
from chaosp2p.errors import ChaosError, LocalProtocolError
from chaosp2p.protocols.membership import (
    PROTOCOL,
    LinkDown,
    MembershipConfig,
    MembershipMachine,
    MemberState,
    PeerAlive,
    PeerFailed,
    PeerJoined,
    PeerSuspected,
)
from chaosp2p.protocols.membership.messages import Ping, codec
from chaosp2p.runtime.node import request_status
from chaosp2p.sim.membership import MembershipSwarm, sim_addr
from chaosp2p.sim.network import LinkProfile
from chaosp2p.wire.identity import Identity, PeerID

PROFILES = {"local": MembershipConfig.local, "lan": MembershipConfig.lan, "wan": MembershipConfig.wan}
# Link used for the lossy runs of each profile: one-way latency and jitter typical of its setting.
LOSSY_LINKS = {
    "local": LinkProfile(latency_s=0.0002, jitter_s=0.002),
    "lan": LinkProfile(latency_s=0.0005, jitter_s=0.005),
    "wan": LinkProfile(latency_s=0.040, jitter_s=0.040),
}
LOSSES = (0.01, 0.05)


def formed(config: MembershipConfig, peers: int, seed: int, **kwargs: Any) -> MembershipSwarm:
    swarm = MembershipSwarm(config=config, seed=seed, **kwargs)
    swarm.grow(peers, spacing_s=config.probe_interval_s / 10)
    took = swarm.run_until(swarm.converged, timeout_s=100 * config.probe_interval_s, step_s=config.probe_interval_s)
    if took is None:
        raise RuntimeError("swarm did not converge")
    swarm.net.run_for(20 * config.probe_interval_s)  # warm up: links measured, infos spread
    return swarm


def all_failed(swarm: MembershipSwarm, observers: list[PeerID], victims: tuple[PeerID, ...]) -> bool:
    return all(swarm.peers[o].machine.state_of(v) is MemberState.FAILED for o in observers for v in victims)


def three(figures: dict[str, float]) -> str:
    return f"{figures['first_s']:.2f} / {figures['median_s']:.2f} / {figures['all_s']:.2f}"


def detection(swarm: MembershipSwarm, victim: PeerID, start: float) -> dict[str, float]:
    times = swarm.detection_times(victim, start)
    return {"first_s": times[0], "median_s": statistics.median(times), "all_s": times[-1]}


def detection_trials(config: MembershipConfig, peers: int, trials: int, seed: int) -> dict[str, Any]:
    swarm = formed(config, peers, seed)
    rng = random.Random(seed)
    timeout = 10 * config.suspicion_min_s(peers) * config.suspicion_max_timeout_mult
    out: dict[str, list[dict[str, float]]] = {"crash": [], "stall": []}
    for _ in range(trials):
        for fault in ("crash", "stall"):
            running = swarm.running()
            victim = rng.choice(running)
            observers = [p for p in running if p != victim]
            start = swarm.net.now
            (swarm.crash if fault == "crash" else swarm.stall)(victim)
            took = swarm.run_until(
                lambda v=victim, obs=observers: all_failed(swarm, obs, (v,)),
                timeout_s=timeout,
                step_s=config.probe_interval_s / 10,
            )
            if took is None:
                raise RuntimeError(f"{fault} of a peer was not detected within {timeout} s")
            out[fault].append(detection(swarm, victim, start))
            if fault == "crash":
                swarm.restart(victim, contact=rng.choice(observers))
            else:
                swarm.resume(victim)
            if swarm.run_until(swarm.converged, timeout_s=timeout, step_s=config.probe_interval_s) is None:
                raise RuntimeError("swarm did not reconverge after the victim came back")
            swarm.net.run_for(5 * config.probe_interval_s)
    return {fault: summarize(rows) for fault, rows in out.items()} | {"trials": out}


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    return {
        "first_s": statistics.median(r["first_s"] for r in rows),
        "median_s": statistics.median(r["median_s"] for r in rows),
        "all_s": max(r["all_s"] for r in rows),
    }


def acceptance_local(seed: int) -> dict[str, float]:
    """5 peers on `local`: kill -9 one and SIGSTOP another at once; when do the 3 others know?"""
    config = MembershipConfig.local()
    swarm = formed(config, 5, seed)
    killed, stopped = list(swarm.peers)[1:3]
    observers = [p for p in swarm.peers if p not in (killed, stopped)]
    start = swarm.net.now
    swarm.crash(killed)
    swarm.stall(stopped)
    took = swarm.run_until(
        lambda: all_failed(swarm, observers, (killed, stopped)),
        timeout_s=10.0,
        step_s=0.005,
    )
    swarm.restart(killed, contact=observers[0])
    swarm.resume(stopped)
    rejoin = swarm.run_until(swarm.converged, timeout_s=10.0, step_s=0.005)
    return {
        "both_failed_everywhere_s": float("nan") if took is None else took,
        "kill_all_s": detection(swarm, killed, start)["all_s"],
        "stop_all_s": detection(swarm, stopped, start)["all_s"],
        "rejoin_s": float("nan") if rejoin is None else rejoin,
    }


def traffic(config: MembershipConfig, peers: int, seed: int) -> dict[str, Any]:
    swarm = formed(config, peers, seed, record=True)
    window = max(30 * config.probe_interval_s, 2 * config.push_pull_period_s(peers))
    swarm.net.deliveries.clear()
    swarm.net.run_for(window)
    by_type: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for delivery in swarm.net.deliveries:
        name = type(delivery.message).__name__
        by_type[name] += len(codec.encode(delivery.message))
        counts[name] += 1
    total = sum(by_type.values())
    per = peers * window
    heartbeat = by_type.get("Ping", 0) + by_type.get("Ack", 0)
    return {
        "counted": "msgpack-encoded message bytes only (no frame length, mux header, record header or AEAD tag); "
        "real_process.*.traffic_and_soak.quiet.per_peer_per_s.bytes_sent is the traffic on the wire",
        "window_s": window,
        "bytes_per_peer_s": total / per,
        "ping_ack_bytes_per_peer_s": heartbeat / per,
        "messages_per_peer_s": sum(counts.values()) / per,
        "bytes_by_type": dict(by_type),
        "messages_by_type": dict(counts),
    }


def _machine(config: MembershipConfig, index: int) -> Any:
    """A MembershipMachine for peer ``index``, whichever constructor this chaosp2p has (``--baseline``)."""
    identity = Identity.from_seed(bytes([index + 1]) * 32)
    params = inspect.signature(MembershipMachine.__init__).parameters
    who = {"identity": identity} if "identity" in params else {"local_peer": identity.peer_id}
    return MembershipMachine(addrs=(sim_addr(index),), config=config, rng=random.Random(index), now=0.0, **who)


def heartbeat_cpu(config: MembershipConfig, rounds: int = 5000, blocks: int = 9) -> dict[str, float]:
    """CPU per heartbeat PING answered on the runtime's hot path: bytes in, ACK bytes out.

    Two machines that know each other; the responder gets PING datagrams from the other at the
    sender's allowed rate (so none is rate limited) and does what the runtime does with each:
    ``admit`` (where the machine has it), decode, handle, encode the ACK it queued. Reported: the
    median and the minimum over ``blocks`` blocks of ``rounds`` (the minimum is the least disturbed
    by other processes on a shared machine).
    """
    a, b = _machine(config, 0), _machine(config, 1)
    for x, y, index in ((a, b, 0), (b, a, 1)):  # y joins through x: x hears from y itself
        y.add_contact(0.0, x.local_peer, (sim_addr(index),))
        for out in y.take_outgoing():
            x.receive(0.0, y.local_peer, PROTOCOL, out.message)
        x.take_outgoing()
    admit = getattr(a, "admit", None)
    sender = b.local_peer
    step = 1.01 / config.rate_limit_msgs_per_s
    bodies = [codec.encode(Ping(seq=i)) for i in range(256)]
    max_bytes = 1 << 20
    now = 0.0
    answered = 0

    def run(count: int) -> None:
        nonlocal now, answered
        for i in range(count):
            now += step
            body = bodies[i & 255]
            if admit is not None:
                if admit(now, sender, body):
                    a.receive_admitted(now, sender, codec.decode(body, max_bytes=max_bytes))
            else:
                a.receive(now, sender, PROTOCOL, codec.decode(body, max_bytes=max_bytes))
            for out in a.take_outgoing():
                codec.encode(out.message)
                answered += 1
            a.take_events()

    run(2000)  # warm up: the first ACKs carry the responder's own news
    per_block = []
    for _ in range(blocks):
        started = time.process_time()
        run(rounds)
        per_block.append((time.process_time() - started) / rounds * 1e6)
    return {
        "us_per_heartbeat_median": statistics.median(per_block),
        "us_per_heartbeat_min": min(per_block),
        "answered_fraction": answered / (2000 + blocks * rounds),
    }


def machine_cpu(config: MembershipConfig, peers: int, seed: int) -> dict[str, float]:
    """Process CPU per delivered message in a steady simulated swarm (machines + simulator)."""
    swarm = formed(config, peers, seed)
    delivered = swarm.net.stats.delivered
    window = 60 * config.probe_interval_s
    started = time.process_time()
    swarm.net.run_for(window)
    cpu = time.process_time() - started
    messages = swarm.net.stats.delivered - delivered
    return {"us_per_message": cpu / messages * 1e6, "messages_per_peer_s": messages / peers / window}


def false_suspicions(profile: str, config: MembershipConfig, peers: int, loss: float, seed: int) -> dict[str, float]:
    link = dataclasses.replace(LOSSY_LINKS[profile], loss=loss)
    swarm = formed(config, peers, seed, default_link=link)
    start = swarm.net.now
    window = 120 * config.probe_interval_s
    swarm.net.run_for(window)
    suspected = failed = 0
    distinct: set[tuple[PeerID, int]] = set()
    for at, observer, event in swarm.net.events:
        if at < start or not isinstance(event, (PeerSuspected, PeerFailed)):
            continue
        if swarm.healthy_at(observer, at) and swarm.healthy_at(event.peer, at):
            if isinstance(event, PeerSuspected):
                suspected += 1
                distinct.add((event.peer, event.incarnation))
            else:
                failed += 1
    peer_hours = peers * window / 3600
    return {
        "loss": loss,
        "window_s": window,
        "false_suspicion_events": suspected,
        "false_suspicions": len(distinct),
        "false_failures": failed,
        "false_suspicions_per_peer_hour": len(distinct) / peer_hours,
        "converged_at_end": float(swarm.converged()),
    }


# ================================================================================================
# REAL-PROCESS MEASUREMENTS
#
# Everything below runs real peers on 127.0.0.1 and measures them; nothing is simulated or estimated.
# Per profile (local and lan; wan with --wan-real):
#
# 1. Detection. 5 `chaosp2p peer --profile P` processes plus one *observer* peer inside this process
#    (6 members). Each trial SIGKILLs one process, and separately SIGSTOPs one. Detection time =
#    PeerFailed.at of the victim at the observer minus the observer's clock read just before os.kill
#    (one process, one monotonic clock). Also recorded: the observer's first PeerSuspected and
#    LinkDown of the victim, and when every surviving process reports it failed (polled over the
#    status protocol every ~0.25 s, so that figure is an upper bound with that granularity). Then the
#    killed process restarts with the same identity (rejoin = Popen to the observer's PeerJoined,
#    process start-up included) or the stopped one gets SIGCONT (rejoin = SIGCONT to PeerJoined/
#    PeerAlive), and the swarm settles before the next trial.
# 2. Traffic and soak. 5 worker processes, each this file re-run as `--worker` (an open_peer with the
#    profile, i.e. what `chaosp2p peer` runs, plus counters it writes out on SIGUSR1). Quiet window:
#    per peer, bytes of transport records sent and received on all its connections (16-byte record
#    header + encrypted payload + 16-byte tag; every protocol on the connection -- membership, DHT
#    refresh, keepalives; TCP/IP headers and the Noise handshake excluded), and, separately, the
#    msgpack bytes of membership messages it encoded for sending, by message type (counted by
#    wrapping the membership codec's encode in the worker). Rates are per peer per second (sum over
#    the 5 workers / 5 / window). Soak: 2 busy-loop processes load both cores for --soak-s; every
#    worker reports its membership statistics (suspicions_raised, suspicions_refuted,
#    failures_declared, refutations, local_pauses, awareness) and its PeerSuspected/PeerFailed
#    events. No peer is faulted, so every suspicion and failure in the window is false.
# ================================================================================================
REAL_PROFILES = ("local", "lan")
READY_TIMEOUT_S = 60.0
DETECT_TIMEOUT_S = {"local": 30.0, "lan": 90.0, "wan": 400.0}
SETTLE_TIMEOUT_S = {"local": 60.0, "lan": 120.0, "wan": 600.0}
STATUS_POLL_S = 0.25
SCRIPT = Path(__file__).resolve()


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _die_with_parent() -> None:
    """Child processes get SIGKILL if this benchmark dies without cleaning up (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LoadedGroup(ProcessGroup):
    """Child processes that die with this benchmark, plus busy loops that load the CPU cores."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, READY_TIMEOUT_S)
        self.load: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], name: str) -> PeerProcess:
        return self.launch(args, f"{name}-{len(self.procs)}", preexec_fn=_die_with_parent)

    def start_load(self, count: int, seconds: float) -> None:
        """``count`` busy loops, each bounded to ``seconds`` even if nobody stops it."""
        code = f"import time\nend = time.monotonic() + {seconds!r}\nwhile time.monotonic() < end:\n    pass\n"
        for _ in range(count):
            self.load.append(subprocess.Popen([sys.executable, "-c", code], preexec_fn=_die_with_parent))

    def stop_load(self) -> None:
        for process in self.load:
            if process.poll() is None:
                process.kill()
            process.wait()
        self.load.clear()

    def stop_all(self) -> None:
        self.stop_load()
        super().stop_all()


def printed_error(line: str) -> bool:
    """A line of a process's stderr that reports an error: the CLI's ``error:`` lines and exceptions."""
    return line.startswith("error:") or "Error:" in line


def peer_config(profile_arg: str, bootstrap: str | None) -> PeerConfig:
    """The profile the processes run, for a peer in this process (listening on 127.0.0.1 only)."""
    changes: dict[str, Any] = {"listen": ("/ip4/127.0.0.1/tcp/0",), "bootstrap": (bootstrap,) if bootstrap else ()}
    if profile_arg.endswith(".toml"):
        return PeerConfig.from_toml(profile_arg, **changes)
    return PeerConfig.profile_named(profile_arg, **changes)


@contextlib.asynccontextmanager
async def observer_peer(config: PeerConfig, shutdown_errors: list[str]) -> AsyncIterator[AsyncPeer]:
    """``open_peer``, except that a shutdown race is recorded instead of losing the run.

    The race this was written for (the link-candidates loop calling the membership machine after
    ``leave()``) is fixed in the library; if "has left the membership" is ever recorded again, it is
    printed with the results as a regression. Only that error, and only after the block's work is
    done, is recorded instead of raised.
    """
    body_done = False
    try:
        async with open_peer(config) as peer:
            yield peer
            body_done = True
    except LocalProtocolError as exc:
        if not body_done or "has left the membership" not in str(exc):
            raise
        shutdown_errors.append(str(exc))


class EventLog:
    """Every event a peer publishes, in order, with a way to wait for a matching one."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._changed = anyio.Event()

    async def run(self, peer: AsyncPeer) -> None:
        async for event in peer.events():
            self.events.append(event)
            self._changed.set()
            self._changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[Any], bool], start: int, timeout_s: float) -> Any | None:
        """The first event at index >= ``start`` matching ``predicate``, or None after ``timeout_s``."""
        index = start
        with anyio.move_on_after(timeout_s):
            while True:
                changed = self._changed
                while index < len(self.events):
                    if predicate(self.events[index]):
                        return self.events[index]
                    index += 1
                await changed.wait()
        return None

    def first(self, kind: type, peer: str, start: int) -> Any | None:
        return next((e for e in self.events[start:] if isinstance(e, kind) and str(e.peer) == peer), None)


async def member_views(procs: list[PeerProcess]) -> dict[str, dict[str, str] | None]:
    """Each process's membership view {peer_id: state} over the status protocol (None: no answer)."""
    views: dict[str, dict[str, str] | None] = {}
    for proc in procs:
        try:
            report = await request_status(proc.addr, timeout_s=2.0)
            views[proc.peer_id] = {m.peer_id: m.state for m in report.members}
        except (ChaosError, TimeoutError, OSError):
            views[proc.peer_id] = None
    return views


async def wait_converged(observer: AsyncPeer, procs: list[PeerProcess], timeout_s: float) -> float:
    """Wait until the observer and every process see all members alive; returns the seconds it took."""
    started = time.monotonic()
    ids = {p.peer_id for p in procs} | {str(observer.peer_id)}
    with anyio.fail_after(timeout_s):
        while True:
            mine = {str(m.peer_id): m.state for m in observer.members()}
            if all(mine.get(i) is MemberState.ALIVE for i in ids):
                views = await member_views(procs)
                if all(v is not None and all(v.get(i) == "alive" for i in ids) for v in views.values()):
                    return time.monotonic() - started
            await anyio.sleep(STATUS_POLL_S)


async def wait_survivors_failed(procs: list[PeerProcess], victim: str, started: float, timeout_s: float) -> float:
    """Poll the surviving processes until all report ``victim`` failed; seconds since ``started``."""
    with anyio.move_on_after(timeout_s):
        while True:
            views = await member_views(procs)
            if all(v is not None and v.get(victim) == "failed" for v in views.values()):
                return time.monotonic() - started
            await anyio.sleep(STATUS_POLL_S)
    return float("nan")


async def detection_swarm(profile: str, root: Path, processes: int, trials: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    profile_arg = profile_argument(profile, root)
    group = LoadedGroup(root)
    out: dict[str, Any] = {"processes": processes, "observer": "in-process peer", "trials": []}
    keys = [root / f"peer{i}.key" for i in range(processes)]

    def start(i: int, bootstrap: str | None) -> PeerProcess:
        args = [sys.executable, "-m", "chaosp2p", "peer", "--listen", "/ip4/127.0.0.1/tcp/0", "--profile",
                profile_arg, "--identity", str(keys[i]), "--ready-file", "{ready}"]
        return group.start([*args, "--bootstrap", bootstrap] if bootstrap else args, f"peer{i}")

    shutdown_errors: list[str] = []
    try:
        first = start(0, None)
        await group.wait_ready([first])
        procs = [first, *(start(i, first.addr) for i in range(1, processes))]
        await group.wait_ready(procs)
        config = peer_config(profile_arg, first.addr)
        events = EventLog()
        async with observer_peer(config, shutdown_errors) as observer, anyio.create_task_group() as tg:
            tg.start_soon(events.run, observer)
            joined_at = observer.clock.now()
            out["converged_s"] = await wait_converged(observer, procs, SETTLE_TIMEOUT_S[profile])
            converged_at = observer.clock.now()
            progress(f"{profile}: {processes} processes + observer converged in {out['converged_s']:.1f} s")
            settle = 3 * config.membership.probe_interval_s
            await anyio.sleep(settle)
            victims: set[str] = set()
            for trial in range(trials):
                for fault in ("kill", "stop"):
                    index = rng.randrange(processes)
                    victim = procs[index]
                    victims.add(victim.peer_id)
                    survivors = [p for p in procs if p is not victim]
                    mark = len(events.events)
                    t0 = observer.clock.now()
                    victim.signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
                    if fault == "kill":
                        victim.process.wait()
                    failed = await events.wait_for(
                        lambda e, v=victim.peer_id: isinstance(e, PeerFailed) and str(e.peer) == v,
                        mark,
                        DETECT_TIMEOUT_S[profile],
                    )
                    row: dict[str, Any] = {"trial": trial, "fault": fault, "victim": victim.peer_id}
                    row["detect_s"] = float("nan") if failed is None else failed.at - t0
                    suspected = events.first(PeerSuspected, victim.peer_id, mark)
                    row["suspected_s"] = float("nan") if suspected is None else suspected.at - t0
                    link_down = events.first(LinkDown, victim.peer_id, mark)
                    row["link_down_s"] = float("nan") if link_down is None else link_down.at - t0
                    row["link_down_reason"] = None if link_down is None else link_down.reason
                    row["all_survivors_failed_s"] = await wait_survivors_failed(
                        survivors, victim.peer_id, t0, DETECT_TIMEOUT_S[profile]
                    )
                    mark = len(events.events)
                    t1 = observer.clock.now()
                    if fault == "kill":
                        procs[index] = victim = start(index, str(observer.addrs[0]))
                    else:
                        victim.signal(signal.SIGCONT)
                    back = await events.wait_for(  # same identity: the restarted process has the old id
                        lambda e, v=row["victim"]: isinstance(e, (PeerJoined, PeerAlive)) and str(e.peer) == v,
                        mark,
                        DETECT_TIMEOUT_S[profile],
                    )
                    row["rejoin_s"] = float("nan") if back is None else back.at - t1
                    await group.wait_ready([victim])
                    row["reconverged_s"] = await wait_converged(observer, procs, SETTLE_TIMEOUT_S[profile])
                    out["trials"].append(row)
                    progress(f"{profile}: trial {trial} {fault}: detected after {row['detect_s']:.2f} s, "
                             f"all survivors by {row['all_survivors_failed_s']:.2f} s, rejoin {row['rejoin_s']:.2f} s")
                    await anyio.sleep(settle)
            stats = observer.membership.machine.statistics()
            out["observer_statistics"] = dataclasses.asdict(stats)
            out["observer_false_failures"] = sorted(
                {str(e.peer) for e in events.events if isinstance(e, PeerFailed)} - victims
            )
            # When: while the swarm was still forming (before every member saw every other alive), or later.
            out["observer_false_failure_events"] = [
                {"peer": str(e.peer), "after_observer_start_s": e.at - joined_at,
                 "phase": "forming" if e.at < converged_at else "trials"}
                for e in events.events
                if isinstance(e, PeerFailed) and str(e.peer) not in victims
            ]
            out["observer_links"] = [
                {"peer": str(link.target), "up": link.up, "rtt_ms": None if link.rtt_s is None else link.rtt_s * 1e3,
                 "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s}
                for link in observer.membership.machine.links()
            ]
            tg.cancel_scope.cancel()
    finally:
        group.stop_all()
        out["process_exits"] = group.exit_summary(printed_error)
        out["observer_shutdown_errors"] = shutdown_errors
    for fault in ("kill", "stop"):
        rows = [r for r in out["trials"] if r["fault"] == fault]
        # Medians over the trials that saw the event (the observer has links to at most max_link_degree
        # peers, so LinkDown is often absent); a detection that never came is counted, not hidden.
        out[fault] = {
            key: median_of_seen([r[key] for r in rows])
            for key in ("detect_s", "suspected_s", "link_down_s", "all_survivors_failed_s", "rejoin_s")
        }
        out[fault]["max_detect_s"] = max((r["detect_s"] for r in rows), default=float("nan"))
        out[fault]["missed_detections"] = sum(math.isnan(r["detect_s"]) for r in rows)
        out[fault]["trials_with_link_down"] = sum(not math.isnan(r["link_down_s"]) for r in rows)
    return out


# ------------------------------------------------------------------------------- worker processes
async def worker_main(spec: dict[str, Any]) -> None:
    """Run one peer until SIGTERM; on every SIGUSR1 (and at SIGTERM) append a counters snapshot."""
    from chaosp2p.dht import DHT_CODEC
    from chaosp2p.protocols.membership import codec as membership_codec

    encoded: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # "protocol/Type" -> [messages, bytes]

    def counting(codec: Any, name: str) -> None:
        encode = codec.encode

        def wrapped(message: Any) -> bytes:
            body: bytes = encode(message)
            tally = encoded[f"{name}/{type(message).__name__}"]
            tally[0] += 1
            tally[1] += len(body)
            return body

        codec.encode = wrapped

    counting(membership_codec, "membership")
    counting(DHT_CODEC, "dht")
    closed = {"bytes_sent": 0, "bytes_received": 0, "records_sent": 0, "records_received": 0, "connections": 0}
    event_counts: dict[str, int] = defaultdict(int)
    verdicts: list[tuple[str, str, float]] = []
    snapshots: list[dict[str, Any]] = []
    stats_path = Path(spec["stats"])
    config = peer_config(spec["profile"], spec.get("bootstrap"))

    def on_connection(connection: Any, opened: bool) -> None:
        if not opened:
            s = connection.statistics()
            for key in ("bytes_sent", "bytes_received", "records_sent", "records_received"):
                closed[key] += getattr(s, key)
            closed["connections"] += 1

    async def count_events(peer: AsyncPeer) -> None:
        async for event in peer.events():
            name = type(event).__name__
            if isinstance(event, LinkDown):
                name = f"LinkDown/{event.reason}"
            event_counts[name] += 1
            if isinstance(event, (PeerSuspected, PeerFailed)) and len(verdicts) < 10000:
                verdicts.append((type(event).__name__, str(event.peer), event.at))

    def snapshot(peer: AsyncPeer, label: str) -> dict[str, Any]:
        totals = dict(closed)
        for connection in peer.host.connections():
            s = connection.statistics()
            for key in ("bytes_sent", "bytes_received", "records_sent", "records_received"):
                totals[key] += getattr(s, key)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "label": label,
            "t": time.monotonic(),
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "transport": totals,
            "open_connections": len(peer.host.connections()),
            "encoded": {k: list(v) for k, v in encoded.items()},
            "membership": dataclasses.asdict(peer.membership.machine.statistics()),
            "events": dict(event_counts),
            "verdicts": list(verdicts),
            "members": {str(m.peer_id): m.state.value for m in peer.members()},
            "links": [
                {"peer": str(link.target), "up": link.up, "rtt_ms": None if link.rtt_s is None else link.rtt_s * 1e3,
                 "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s}
                for link in peer.membership.machine.links()
            ],
        }

    def write(payload: Any, path: Path) -> None:
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(payload))
        partial.rename(path)

    with anyio.open_signal_receiver(signal.SIGUSR1, signal.SIGTERM, signal.SIGINT) as signals:
        async with open_peer(config) as peer, anyio.create_task_group() as tg:
            peer.host.on_connection_change(on_connection)
            tg.start_soon(count_events, peer)
            write({"peer_id": str(peer.peer_id), "addrs": [str(a) for a in peer.addrs]}, Path(spec["ready"]))
            async for signum in signals:
                snapshots.append(snapshot(peer, "usr1" if signum == signal.SIGUSR1 else "exit"))
                write(snapshots, stats_path)
                if signum != signal.SIGUSR1:
                    break
            tg.cancel_scope.cancel()


def read_snapshots(proc: PeerProcess) -> list[dict[str, Any]]:
    path = proc.workdir / "stats.json"
    return json.loads(path.read_text()) if path.exists() else []  # type: ignore[no-any-return]


async def snapshot_all(workers: list[PeerProcess]) -> list[dict[str, Any]]:
    """SIGUSR1 every worker and return each one's new snapshot (in worker order)."""
    counts = [len(read_snapshots(w)) for w in workers]
    for worker in workers:
        worker.signal(signal.SIGUSR1)
    with anyio.fail_after(30):
        await poll(lambda: all(len(read_snapshots(w)) > n for w, n in zip(workers, counts, strict=True)))
    return [read_snapshots(w)[n] for w, n in zip(workers, counts, strict=True)]


def window(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-peer rates and summed counters between two snapshots of every worker."""
    peers = len(before)
    spans = [b["t"] - a["t"] for a, b in zip(before, after, strict=True)]
    rate = {}
    for key in ("bytes_sent", "bytes_received", "records_sent", "records_received"):
        rate[key] = statistics.fmean(
            (b["transport"][key] - a["transport"][key]) / s for a, b, s in zip(before, after, spans, strict=True)
        )
    encoded: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for a, b, s in zip(before, after, spans, strict=True):
        for name, (count, size) in b["encoded"].items():
            c0, s0 = a["encoded"].get(name, (0, 0))
            encoded[name][0] += (count - c0) / s / peers
            encoded[name][1] += (size - s0) / s / peers
    counters = (
        "suspicions_raised", "suspicions_refuted", "failures_declared", "refutations", "local_pauses",
        "probes_failed", "late_acks", "messages_sent",
    )
    per_worker = [{k: b["membership"][k] - a["membership"][k] for k in counters} for a, b in zip(before, after,
                                                                                                strict=True)]
    events = ("PeerSuspected", "PeerFailed", "PeerAlive", "LinkDown/timeout", "LinkDown/unreachable")
    per_worker_events = [
        {k: b["events"].get(k, 0) - a["events"].get(k, 0) for k in events} for a, b in zip(before, after, strict=True)
    ]
    suspected = {
        (peer, round(at, 3)) for a, b in zip(before, after, strict=True)
        for kind, peer, at in b["verdicts"][len(a["verdicts"]):] if kind == "PeerSuspected"
    }
    return {
        "window_s": statistics.fmean(spans),
        "per_peer_per_s": rate,
        "membership_encoded_per_peer_per_s": {k: v for k, v in encoded.items() if k.startswith("membership/")},
        "dht_encoded_per_peer_per_s": {k: v for k, v in encoded.items() if k.startswith("dht/")},
        "membership_counters_sum": {k: sum(w[k] for w in per_worker) for k in counters},
        "membership_counters_per_worker": per_worker,
        "events_sum": {k: sum(w[k] for w in per_worker_events) for k in events},
        "distinct_peers_suspected": len({peer for peer, _ in suspected}),
        "cpu_per_peer": statistics.fmean(
            (b["cpu_s"] - a["cpu_s"]) / s for a, b, s in zip(before, after, spans, strict=True)
        ),
        "awareness_at_end": [b["membership"]["awareness"] for b in after],
        "views_at_end": [sorted(set(b["members"].values())) for b in after],
    }


async def soak_swarm(profile: str, root: Path, workers_n: int, quiet_s: float, soak_s: float) -> dict[str, Any]:
    profile_arg = profile_argument(profile, root)
    group = LoadedGroup(root)
    script = str(SCRIPT)

    def start(bootstrap: str | None) -> PeerProcess:
        index = len(group.procs)
        stats = root / f"worker-{index}" / "stats.json"
        spec = {"profile": profile_arg, "bootstrap": bootstrap, "ready": "{ready}", "stats": str(stats)}
        return group.start([sys.executable, script, "--worker", json.dumps(spec)], "worker")

    out: dict[str, Any] = {"workers": workers_n, "quiet_s": quiet_s, "soak_s": soak_s}
    try:
        first = start(None)
        await group.wait_ready([first])
        workers = [first, *(start(first.addr) for _ in range(workers_n - 1))]
        await group.wait_ready(workers)
        ids = {w.peer_id for w in workers}
        settle_timeout = SETTLE_TIMEOUT_S[profile]
        started = time.monotonic()
        with anyio.fail_after(settle_timeout):
            while True:  # everyone alive everywhere, and every link's bandwidth probe done (no bulk bytes later)
                reports = []
                for worker in workers:
                    with contextlib.suppress(ChaosError, TimeoutError, OSError):
                        reports.append(await request_status(worker.addr, timeout_s=2.0))
                if len(reports) == len(workers) and all(
                    {m.peer_id for m in r.members if m.state == "alive"} >= ids
                    and r.links and all(link.bandwidth_bytes_per_s is not None for link in r.links)
                    for r in reports
                ):
                    break
                await anyio.sleep(0.5)
        out["settled_s"] = time.monotonic() - started
        # RTTs when the swarm settled (before the quiet window): membership heartbeat RTT of every overlay
        # link, and the transport's own keepalive ping RTT of every connection, as the status reports them.
        out["link_rtt_ms"] = sorted(link.rtt_ms for r in reports for link in r.links if link.rtt_ms is not None)
        out["connection_rtt_ms"] = sorted(c.rtt_ms for r in reports for c in r.connections if c.rtt_ms is not None)
        await anyio.sleep(2.0)
        progress(f"{profile}: {workers_n} workers settled after {out['settled_s']:.1f} s; quiet window {quiet_s:.0f} s")
        a = await snapshot_all(workers)
        await anyio.sleep(quiet_s)
        b = await snapshot_all(workers)
        out["quiet"] = window(a, b)
        out["loadavg_before_soak"] = os.getloadavg()
        progress(f"{profile}: soak {soak_s:.0f} s with 2 busy loops")
        group.start_load(2, soak_s + 30.0)
        try:
            await anyio.sleep(soak_s)
            c = await snapshot_all(workers)
        finally:
            group.stop_load()
        out["soak"] = window(b, c)
        out["loadavg_end_of_soak"] = os.getloadavg()
    finally:
        group.stop_all()
        out["process_exits"] = group.exit_summary(printed_error)
    return out


def real_process_measurements(
    profiles: tuple[str, ...] = REAL_PROFILES,
    *,
    trials: int = 3,
    processes: int = 5,
    quiet_s: float = 10.0,
    soak_s: float = 60.0,
    seed: int = 1,
) -> dict[str, Any]:
    """Detection, traffic and soak figures from real processes (see the block comment above)."""
    results: dict[str, Any] = {
        "status": "measured", "processes": processes, "profiles": {}, "loadavg_at_start": os.getloadavg()
    }
    logging.getLogger("chaosp2p").setLevel(logging.ERROR)  # the observer's verdicts are counted, not printed
    for profile in profiles:
        config = PROFILES[profile]()
        window_s = max(quiet_s, 4 * config.probe_interval_s)
        entry: dict[str, Any] = {}
        results["profiles"][profile] = entry
        with tempfile.TemporaryDirectory(prefix=f"chaosp2p-membership-{profile}-") as tmp:
            root = Path(tmp)
            (root / "detect").mkdir()
            (root / "soak").mkdir()
            try:
                entry["detection"] = anyio.run(
                    detection_swarm, profile, root / "detect", processes, trials, seed, backend="trio"
                )
            except Exception as exc:  # keep the other measurements
                entry["detection_error"] = f"{type(exc).__name__}: {exc}"
                progress(f"{profile}: detection failed: {entry['detection_error']}")
            try:
                entry["traffic_and_soak"] = anyio.run(
                    soak_swarm, profile, root / "soak", processes, window_s, soak_s, backend="trio"
                )
            except Exception as exc:
                entry["soak_error"] = f"{type(exc).__name__}: {exc}"
                progress(f"{profile}: traffic/soak failed: {entry['soak_error']}")
    return results


def median_of_seen(values: list[float]) -> float:
    seen = [v for v in values if not math.isnan(v)]
    return statistics.median(seen) if seen else float("nan")


def phases(events: list[dict[str, Any]]) -> str:
    """'3 PeerFailed while forming, 1 during trials' from the observer's false failure events."""
    forming = sum(e["phase"] == "forming" for e in events)
    return f"{forming} PeerFailed while the swarm formed, {len(events) - forming} during the trials"


def rtt_range(values: list[float]) -> str:
    if not values:
        return "none measured"
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} (min / median / max)"


def plain_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A plain-text table (rich wraps wide tables to 80 columns when the output is not a terminal)."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    print()


def print_real(real: dict[str, Any]) -> None:
    rows = []
    for profile, entry in real["profiles"].items():
        d = entry.get("detection")
        if d is None:
            rows.append([profile, entry.get("detection_error", "not run"), "", "", "", ""])
            continue
        k, s = d["kill"], d["stop"]
        missed = k["missed_detections"] + s["missed_detections"]
        rows.append([
            profile + (f" ({missed} MISSED)" if missed else ""),
            f"{k['detect_s']:.2f} (max {k['max_detect_s']:.2f})",
            f"{k['all_survivors_failed_s']:.2f}",
            f"{s['detect_s']:.2f} (max {s['max_detect_s']:.2f})",
            f"{s['all_survivors_failed_s']:.2f}",
            f"{k['rejoin_s']:.2f} / {s['rejoin_s']:.2f}",
        ])
    trials = max((len(e["detection"]["trials"]) // 2 for e in real["profiles"].values() if "detection" in e), default=0)
    n = real["processes"]
    plain_table(
        f"REAL PROCESSES: detection, {n} `chaosp2p peer` processes + in-process observer, medians of {trials} trials"
        f" (wall s; observer = PeerFailed at the observer; survivors = all {n - 1} other processes report it failed,"
        " polled every ~0.25 s after the observer's verdict)",
        ["profile", "kill -9: observer", "kill -9: survivors", "SIGSTOP: observer", "SIGSTOP: survivors",
         "rejoin kill / stop"],
        rows,
    )
    rows = []
    for profile, entry in real["profiles"].items():
        t = entry.get("traffic_and_soak")
        if t is None:
            rows.append([profile, entry.get("soak_error", "not run"), "", "", "", "", "", ""])
            continue
        q, sk = t["quiet"], t["soak"]
        member_bytes = sum(v[1] for v in q["membership_encoded_per_peer_per_s"].values())
        heartbeat = sum(
            v[1] for name, v in q["membership_encoded_per_peer_per_s"].items()
            if name in ("membership/Ping", "membership/Ack")
        )
        member_msgs = sum(v[0] for v in q["membership_encoded_per_peer_per_s"].values())
        c = sk["membership_counters_sum"]
        rows.append([
            profile,
            f"{q['per_peer_per_s']['bytes_sent']:.0f} / {q['per_peer_per_s']['bytes_received']:.0f}",
            f"{member_bytes:.0f} ({heartbeat:.0f})",
            f"{member_msgs:.1f}",
            f"{100 * q['cpu_per_peer']:.1f} / {100 * sk['cpu_per_peer']:.1f}",
            f"{c['suspicions_raised']} / {c['suspicions_refuted']}",
            f"{c['failures_declared']} ({sk['distinct_peers_suspected']} peers)",
            f"{c['local_pauses']}",
        ])
    any_t = next((e["traffic_and_soak"] for e in real["profiles"].values() if "traffic_and_soak" in e), None)
    soak_s = any_t["soak_s"] if any_t else float("nan")
    notes = []
    for profile, entry in real["profiles"].items():
        t = entry.get("traffic_and_soak")
        d = entry.get("detection")
        if d is not None:
            k, s = d["kill"], d["stop"]
            notes.append(
                f"{profile}: observer first suspected the victim after {k['suspected_s']:.2f} s (kill -9) / "
                f"{s['suspected_s']:.2f} s (SIGSTOP), link down after {k['link_down_s']:.2f} / {s['link_down_s']:.2f} s"
                f" (medians; {k['trials_with_link_down']} / {s['trials_with_link_down']} trials had a link to the"
                f" victim); running peers the observer declared failed: {len(d['observer_false_failures'])}"
                f" ({phases(d['observer_false_failure_events'])}); SIGTERM exits {d['process_exits']['exit_codes']}"
            )
        if t is None:
            continue
        q, sk = t["quiet"], t["soak"]
        records = q["per_peer_per_s"]["records_sent"]
        member = sum(v[1] for v in q["membership_encoded_per_peer_per_s"].values())
        dht = sum(v[1] for v in q["dht_encoded_per_peer_per_s"].values())
        overhead = (q["per_peer_per_s"]["bytes_sent"] - member - dht) / records if records else float("nan")
        per_worker = [w["suspicions_raised"] for w in sk["membership_counters_per_worker"]]
        notes.append(
            f"{profile}: quiet {q['window_s']:.1f} s: {records:.1f} records/peer/s, DHT {dht:.0f} B/s, so "
            f"{overhead:.0f} B of framing + record header/tag per record; RTT at settle: heartbeat links "
            f"{rtt_range(t['link_rtt_ms'])} ms, transport pings {rtt_range(t['connection_rtt_ms'])} ms"
        )
        notes.append(
            f"{profile}: soak {sk['window_s']:.0f} s: suspicions raised per peer {per_worker}, PeerSuspected events "
            f"(all observers) {sk['events_sum']['PeerSuspected']}, PeerFailed {sk['events_sum']['PeerFailed']}, "
            f"heartbeat links down (timeout) {sk['events_sum']['LinkDown/timeout']}, late acks "
            f"{sk['membership_counters_sum']['late_acks']}, awareness at end {sk['awareness_at_end']}; "
            f"load average {t['loadavg_before_soak'][0]:.1f} -> {t['loadavg_end_of_soak'][0]:.1f}"
        )
    plain_table(
        f"REAL PROCESSES: {n} worker peer processes; quiet window (length in the notes) per peer per s;"
        f" soak {soak_s:.0f} s with both cores loaded by 2 busy loops, summed over the {n} peers"
        " (no peer was faulted: all are false)",
        ["profile", "wire B/s sent / recv", "membership encoded B/s (PING+ACK)", "membership msgs/s",
         "CPU % quiet / soak", "suspicions raised / refuted", "failures declared", "local pauses"],
        rows,
    )
    for note in notes:
        print(f"  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=32)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profiles", default="local,lan,wan")
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="16 peers, 1 trial, one loss rate")
    parser.add_argument("--skip-real", action="store_true", help="simulated part only")
    parser.add_argument("--real-only", action="store_true", help="real-process part only")
    parser.add_argument("--real-profiles", default=",".join(REAL_PROFILES), help="profiles for the real processes")
    parser.add_argument("--wan-real", action="store_true", help="also measure real processes on `wan` (~1 min/trial)")
    parser.add_argument("--real-trials", type=int, default=3, help="kill -9 and SIGSTOP trials per profile")
    parser.add_argument("--real-processes", type=int, default=5, help="peer processes per real swarm")
    parser.add_argument("--quiet-s", type=float, default=10.0, help="traffic window (at least 4 probe intervals)")
    parser.add_argument("--soak-s", type=float, default=60.0, help="CPU-loaded soak per profile (300 for the full run)")
    parser.add_argument("--baseline", default=None, help="measure this other checkout first, then compare")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:  # a soak peer started by real_process_measurements()
        anyio.run(worker_main, json.loads(args.worker), backend="trio")
        return
    baseline = run_baseline(args.baseline) if args.baseline else None
    peers, trials = (16, 1) if args.quick else (args.peers, args.trials)
    losses = LOSSES[:1] if args.quick else LOSSES
    started = time.perf_counter()
    results: dict[str, Any] = {"peers": peers, "trials": trials, "seed": args.seed, "profiles": {}}
    rows = []
    for profile in [] if args.real_only else args.profiles.split(","):
        config = PROFILES[profile]()
        detect = detection_trials(config, peers, trials, args.seed)
        bytes_ = traffic(config, peers, args.seed)
        lossy = [false_suspicions(profile, config, peers, loss, args.seed) for loss in losses]
        heartbeat = heartbeat_cpu(config)
        cpu = machine_cpu(config, peers, args.seed)
        results["profiles"][profile] = {
            "detection": detect, "traffic": bytes_, "lossy": lossy, "heartbeat_cpu": heartbeat, "machine_cpu": cpu
        }
        rows.append(
            [
                profile,
                three(detect["crash"]),
                three(detect["stall"]),
                f"{bytes_['bytes_per_peer_s']:.0f} ({bytes_['ping_ack_bytes_per_peer_s']:.0f})",
                f"{bytes_['messages_per_peer_s']:.1f}",
                " / ".join(f"{row['false_suspicions']} ({row['false_failures']})" for row in lossy),
                f"{heartbeat['us_per_heartbeat_min']:.1f}",
                f"{cpu['us_per_message']:.1f}",
            ]
        )
    acceptance = acceptance_local(args.seed) if "local" in args.profiles and not args.real_only else None
    results["acceptance_local_5_peers"] = acceptance
    real_profiles: tuple[str, ...] = ()
    if not args.skip_real:
        real_profiles = tuple(p for p in args.real_profiles.split(",") if p)
        real_profiles += ("wan",) if args.wan_real and "wan" not in real_profiles else ()
    results["real_process"] = (
        real_process_measurements(
            real_profiles,
            trials=args.real_trials,
            processes=args.real_processes,
            quiet_s=args.quiet_s,
            soak_s=args.soak_s,
            seed=args.seed,
        )
        if real_profiles
        else {"status": "not run (--skip-real)"}
    )
    results["wall_s"] = time.perf_counter() - started
    loss_label = " / ".join(f"{loss:.0%}" for loss in losses)
    if rows:
        print_table(
            f"membership, {peers} simulated peers, virtual s (seed {args.seed}); detection = first / median / last"
            f" observer; false = distinct suspicions (failures) in 120 probe intervals at loss {loss_label};"
            " bytes = msgpack-encoded messages, NOT wire bytes (no framing, record header or tag: the real-process"
            " table below counts the wire)",
            ["profile", "kill -9 detect (s)", "SIGSTOP detect (s)", "encoded B/peer/s (PING+ACK)", "msgs/peer/s",
             "false", "heartbeat CPU us (min)", "sim CPU us/msg"],
            rows,
        )
    if acceptance is not None:
        print_table(
            "acceptance scenario on `local`: 5 peers, kill -9 one and SIGSTOP one at once (virtual s)",
            ["both failed at all 3", "kill -9: last", "SIGSTOP: last", "rejoin"],
            [[f"{acceptance[k]:.3f}" for k in ("both_failed_everywhere_s", "kill_all_s", "stop_all_s", "rejoin_s")]],
        )
    if real_profiles:
        print_real(results["real_process"])
    else:
        print("REAL-PROCESS MEASUREMENTS: skipped (--skip-real).")
    print(f"wall time {results['wall_s']:.1f} s")
    results["loadavg_at_end"] = os.getloadavg()
    if baseline is not None:
        results["baseline"] = {"tree": args.baseline, **baseline}
        print_comparison(args.baseline, baseline, results)
    write_json(args.json, {"benchmark": "membership", **results})


# ------------------------------------------------------------------------------- --baseline
def run_baseline(tree: str) -> dict[str, Any]:
    """This benchmark, same arguments, against the chaosp2p of ``tree``: its JSON results.

    The child runs in ``tree`` (so the peer processes it starts with ``python -m chaosp2p`` import
    that checkout) with ``PYTHONPATH=tree``; this script itself is the same file on both sides.
    """
    argv = sys.argv[1:]
    for flag in ("--baseline", "--json"):
        while flag in argv:
            index = argv.index(flag)
            del argv[index : index + 2]
    with tempfile.TemporaryDirectory(prefix="chaosp2p-membership-baseline-") as tmp:
        out = Path(tmp) / "baseline.json"
        env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        progress(f"baseline: measuring {tree} first (load average {os.getloadavg()})")
        subprocess.run([sys.executable, str(SCRIPT), *argv, "--json", str(out)], cwd=tree, env=env, check=True)
        progress(f"baseline done; now this checkout (load average {os.getloadavg()})")
        return dict(json.loads(out.read_text()))


def _headlines(results: dict[str, Any]) -> dict[str, float]:
    """The figures a comparison reports, by name (missing ones left out)."""
    out: dict[str, float] = {}
    for profile, entry in results.get("profiles", {}).items():
        detect, traffic_ = entry["detection"], entry["traffic"]
        out[f"{profile}: kill -9 detected by all (s, virtual)"] = detect["crash"]["all_s"]
        out[f"{profile}: SIGSTOP detected by all (s, virtual)"] = detect["stall"]["all_s"]
        out[f"{profile}: membership bytes/peer/s (encoded)"] = traffic_["bytes_per_peer_s"]
        out[f"{profile}: PING+ACK bytes/peer/s (encoded)"] = traffic_["ping_ack_bytes_per_peer_s"]
        out[f"{profile}: messages/peer/s"] = traffic_["messages_per_peer_s"]
        for row in entry["lossy"]:
            out[f"{profile}: false suspicions at {row['loss']:.0%} loss"] = row["false_suspicions"]
            out[f"{profile}: false failures at {row['loss']:.0%} loss"] = row["false_failures"]
        if "heartbeat_cpu" in entry:
            out[f"{profile}: heartbeat CPU us (min of blocks)"] = entry["heartbeat_cpu"]["us_per_heartbeat_min"]
            out[f"{profile}: heartbeat CPU us (median)"] = entry["heartbeat_cpu"]["us_per_heartbeat_median"]
            out[f"{profile}: sim CPU us per message"] = entry["machine_cpu"]["us_per_message"]
    for profile, entry in results.get("real_process", {}).get("profiles", {}).items():
        detection = entry.get("detection", {})
        for fault in ("kill", "stop"):
            if fault in detection:
                out[f"real {profile}: {fault} detected (s, wall)"] = detection[fault]["detect_s"]
        soak = entry.get("traffic_and_soak", {})
        if "quiet" in soak:
            out[f"real {profile}: wire bytes sent/peer/s (quiet)"] = soak["quiet"]["per_peer_per_s"]["bytes_sent"]
            out[f"real {profile}: CPU per peer (quiet, fraction of a core)"] = soak["quiet"]["cpu_per_peer"]
        if "soak" in soak:
            out[f"real {profile}: CPU per peer (soak)"] = soak["soak"]["cpu_per_peer"]
            out[f"real {profile}: suspicions raised under CPU load"] = soak["soak"]["membership_counters_sum"][
                "suspicions_raised"
            ]
            out[f"real {profile}: failures declared under CPU load"] = soak["soak"]["membership_counters_sum"][
                "failures_declared"
            ]
    return out


def print_comparison(tree: str, baseline: dict[str, Any], results: dict[str, Any]) -> None:
    before, after = _headlines(baseline), _headlines(results)
    rows = []
    for name in [n for n in after if n in before]:
        a, b = before[name], after[name]
        ratio = f"{b / a:.3f}" if a and not math.isnan(a) and not math.isnan(b) else "-"
        rows.append([name, f"{a:.4g}", f"{b:.4g}", ratio])
    plain_table(
        f"this checkout vs {tree}, measured one after the other in this run (load average: baseline "
        f"{baseline.get('loadavg_at_end', '?')} at its end, this run {results.get('loadavg_at_end', '?')} at its end)",
        ["figure", "baseline", "this checkout", "ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
