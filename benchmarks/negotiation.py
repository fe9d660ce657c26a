"""Negotiation benchmark: CPU per operation at one acceptor and at the proposer, and simulated
decision latency.

    python benchmarks/negotiation.py [--parts local,sim,real] [--sizes 8,64,256,1024] [--trials 20]
        [--latency-sizes 8,64,256,1024] [--latency-trials 5] [--real-sizes 4,8,16,32]
        [--real-repeats 3] [--json out.json] [--quick]

(a) Local handling. For each operation kind and run size n, a formed run of n members (one
    configuration) handles one operation end to end, with real machines for the three peers
    involved -- the origin that raises it, the epoch's coordinator that proposes it (fast path),
    and one acceptor -- and the other members' ACCEPTED replies synthesised. Every machine call is
    timed in thread CPU time (``time.thread_time_ns``): the origin raising and announcing it; the
    proposer receiving the announcement (validation, signature check, proposal, ACCEPT to n - 1
    members); the proposer receiving each ACCEPTED; the ACCEPTED that completes the quorum (decision:
    C_{e+1}, COMMIT to n - 1 members); the acceptor receiving ACCEPT (validation, signature check,
    gate) and COMMIT (checks, C_{e+1}, digest). Fresh machines per trial, so every signature is
    verified once where a real peer would verify it. Percentiles are over trials. Python's garbage
    collector runs with its default settings, so a collection that falls into a call counts in
    that call's time; the JOIN's newcomer (another process) is dropped once it has sent its JOIN,
    and each size and kind starts after one full collection (a peer that has been running).

(b) Decision latency, simulated (virtual time, exact for a seed, no CPU cost modelled): n members
    with one-way link latencies between 0.5 and 50 ms (RTT 1-100 ms; each peer sits at a random
    point on a line, latency grows with distance), every member's training at the same step.
    FAIL: a member crashes and every running member's membership reports it at once; JOIN: a
    newcomer asks a random member; LEAVE: a member leaves. Latency = from detection (the
    operation's detected_at) until the last running member has committed it.

(b) Decision latency, real processes (``--parts real``): N ``_negotiation_peer.py`` processes on
    127.0.0.1 (negotiation and transport on the ``local`` profile; failure detection on lan timers
    unless ``--local-membership``), stepping a stand-in training loop in lockstep on the shared
    monotonic clock, one step per ``--pace`` s (``--free-steps``: each on its own). The run's links
    change only through the explicit API (the overlay's own link changes are not turned into
    operations, see the worker's ``--overlay-link-ops``). Per round: a newcomer joins, a member's
    link goes down and up (SIGUSR1/SIGUSR2), a member leaves (SIGTERM), another newcomer joins, a
    member is SIGKILLed. Latency = from the operation's detected_at (the earliest detecting process's
    CLOCK_MONOTONIC, one timeline on one machine) until the last live member of the configuration it
    produced logged the commit; the time from the trigger to detection (process start + RUN_INFO for
    a join, the failure detector for a kill) is reported separately. Also measured per size: each
    process's idle CPU (3 s with nothing negotiated), and the CPU all processes together spend per
    decision (``--cpu-toggles`` link down/up pairs, minus the idle rate). ``--trace-dir`` keeps the
    logs plus a per-message hop trace of every process and prints each decision's milestones.

Sizes, commands and the figures of the last runs: docs/benchmarks.md#negotiation, benchmarks/results/.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _common import percentile, print_table, write_json

from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import NegotiationConfig, NegotiationMachine, OpKind, RunParams
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.messages import Accept, Accepted, Commit, JoinRequest, OpsAnnounce, codec
from chaosp2p.protocols.negotiation.operations import PROTOCOL, op_id

try:  # certificates (issue 20); the same script measures the code before them (``--baseline``)
    from chaosp2p.protocols.negotiation.certificates import statement
    from chaosp2p.protocols.negotiation.configuration_change import FAIL_SIGNERS

    CERTIFIED = True
except ImportError:  # pragma: no cover - only when run against an older checkout
    CERTIFIED = False
    FAIL_SIGNERS = 1

    def statement(run: str, epoch: int, ballot: Any, digest: bytes) -> bytes:
        return b""


try:  # justified ballots (issue 20): signed promises; absent from the code before them
    from chaosp2p.protocols.negotiation.justification import promise_statement

    JUSTIFIED = True
except ImportError:  # pragma: no cover - only when run against an older checkout
    JUSTIFIED = False
from chaosp2p.protocols.negotiation.messages import Promise
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.protocols.negotiation.run_configuration import make_configuration, quorum
from chaosp2p.sim.negotiation import NegotiationSwarm, install_configuration
from chaosp2p.sim.network import LinkProfile
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

RUN = "bench"
KINDS = (OpKind.JOIN, OpKind.LEAVE, OpKind.FAIL, OpKind.LINK_UP, OpKind.LINK_DOWN, OpKind.THROUGHPUT)
STEP = 100


# ------------------------------------------------------------------------------------------ (a)
class LocalBench:
    """A formed run of ``n`` members; real machines are made on demand for the peers involved."""

    def __init__(self, n: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.settings = NegotiationConfig.lan()
        self.identities = {
            i.peer_id: i for i in (Identity.from_seed((seed << 40 | k + 1).to_bytes(32, "big")) for k in range(n + 64))
        }
        ids = list(self.identities)
        self.members = sorted(ids[:n], key=lambda p: p.raw)
        self.outsiders = ids[n:]
        self.config = make_configuration(
            run=RUN,
            epoch=1,
            activation_step=0,
            peers=self.members,
            incarnations=[0] * n,
            throughputs=[1.0] * n,
            links=(),
            params=RunParams(global_batch=max(4 * n, 1024)),
            seed=seed,
            since_steps=[0] * n,
        )
        self.now = 10.0
        # Measure from a steady state: what exists before the first trial (imported modules, this
        # simulated run) goes to the oldest GC generation, as in a peer that has been running for
        # a while. Otherwise the first young collections, which fall into measured calls, scan
        # thousands of import-time objects once. Collections caused by the trials are not touched.
        gc.collect()

    def machine(self, peer: PeerID) -> NegotiationMachine:
        machine = NegotiationMachine(
            identity=self.identities[peer], config=self.settings, rng=random.Random(self.rng.random()), now=self.now
        )
        if self.config.has_member(peer):
            install_configuration(machine, self.config, self.now)
            # Training is at a step every member takes part in (a formed, running run).
            step = max(STEP, self.config.activation_step, max(self.config.since_steps))
            machine.report_step(self.now, RUN, entered=step, completed=step - 1)
        return machine

    def trial(self, kind: OpKind) -> dict[str, Any]:
        config = self.config
        proposer_id = coordinator(config)
        assert proposer_id is not None
        others = [p for p in config.peers if p != proposer_id]
        self.rng.shuffle(others)
        origin_id, subject_id = others[0], others[2 % len(others)]
        proposer = self.machine(proposer_id)
        times: dict[str, Any] = {}
        self.now += 1.0

        def timed(name: str, call: Callable[[], object]) -> None:
            start = time.thread_time_ns()
            call()
            times[name] = (time.thread_time_ns() - start) / 1000.0

        if kind is OpKind.JOIN:
            newcomer_id = self.outsiders.pop()
            newcomer = self.machine(newcomer_id)
            newcomer.request_join(self.now, RUN, proposer_id, incarnation=1, throughput=1.0)
            request = _only(newcomer.take_outgoing(), proposer_id)
            proposer.receive(self.now, newcomer_id, PROTOCOL, request)
            reply = _only(proposer.take_outgoing(), newcomer_id)
            timed("origin", lambda: newcomer.receive(self.now, proposer_id, PROTOCOL, reply))
            join = _only(newcomer.take_outgoing(), proposer_id)
            assert isinstance(join, JoinRequest)
            # The newcomer is another process: drop it once it has sent its JOIN, or the ~1000
            # objects of the configuration it just decoded would be scanned by the garbage
            # collections that fall into the proposer's and acceptor's calls.
            del newcomer
            timed("proposer_op", lambda: proposer.receive(self.now, newcomer_id, PROTOCOL, join))
        else:
            origin = self.machine(origin_id)
            if kind is OpKind.LEAVE:
                timed("origin", lambda: origin.leave(self.now, RUN))
            elif kind is OpKind.FAIL:
                timed("origin", lambda: origin.observe_member(self.now, subject_id, MemberState.FAILED, 0))
                if FAIL_SIGNERS > 1 and hasattr(origin, "_failable"):
                    # A FAIL takes effect with a second observer's FAIL (every survivor sees the
                    # failure): the proposer gets that one first, and proposes on the origin's.
                    second_id = next(p for p in others[1:] if p not in (subject_id, origin_id))
                    second = self.machine(second_id)
                    second.observe_member(self.now, subject_id, MemberState.FAILED, 0)
                    first = _only(second.take_outgoing(), proposer_id)
                    timed("proposer_op_first", lambda: proposer.receive(self.now, second_id, PROTOCOL, first))
            elif kind is OpKind.THROUGHPUT:
                rate = 1.0 if config.throughputs[config.index_of(origin_id)] > 2.0 else 3.0
                timed("origin", lambda: origin.set_throughput(self.now, RUN, rate))
            else:
                up = kind is OpKind.LINK_UP
                # A partner whose agreed link is not already in the state we report.
                other = next(p for p in others[1:] if (link := config.link(origin_id, p)) is None or link.up is not up)
                timed(
                    "origin",
                    lambda: origin.link_changed(
                        self.now, origin_id, other, up=up, bandwidth_bytes_per_s=1e9, rtt_s=0.001
                    ),
                )
            announce = _only(origin.take_outgoing(), proposer_id)
            assert isinstance(announce, OpsAnnounce)
            timed("proposer_op", lambda: proposer.receive(self.now, origin_id, PROTOCOL, announce))
        sent = proposer.take_outgoing()
        # The acceptor measured is one the proposer sent the ACCEPT to: in a large run that is a
        # relay, which also forwards it to its group (the busiest acceptor role).
        accepts = [o for o in sent if isinstance(o.message, Accept)]
        assert accepts, "the proposer did not take the fast path"
        named = {op.subject for op in accepts[0].message.value.ops}  # type: ignore[attr-defined]
        chosen = next(o for o in accepts if o.to not in named and o.to != origin_id)
        accept, acceptor_id = chosen.message, chosen.to
        assert isinstance(accept, Accept)
        acceptor = self.machine(acceptor_id)
        times["relayed_to"] = len(accept.relay_to)
        times["accepts_sent"] = sum(1 for o in sent if isinstance(o.message, Accept))
        timed("acceptor_accept", lambda: acceptor.receive(self.now, proposer_id, PROTOCOL, accept))
        reply = _only(acceptor.take_outgoing(), proposer_id)
        assert isinstance(reply, Accepted), reply
        voters = [acceptor_id, *[p for p in others if p not in (acceptor_id, subject_id)][: quorum(config) - 2]]
        replies: list[float] = []
        body = _acceptance(accept, proposer.configuration(RUN), accept.value) if CERTIFIED else b""
        for voter in voters:
            message = reply if voter == acceptor_id else dataclasses.replace(reply)
            if CERTIFIED and voter != acceptor_id:
                # Each member signs its own acceptance (signed here, outside the measured call).
                message = dataclasses.replace(reply, signature=self.identities[voter].sign(body))
            start = time.thread_time_ns()
            proposer.receive(self.now, voter, PROTOCOL, message)
            replies.append((time.thread_time_ns() - start) / 1000.0)
        times["proposer_decide"] = replies.pop()  # the reply that completed the quorum
        times["proposer_accepted"] = replies
        out = proposer.take_outgoing()
        commit = next(o.message for o in out if o.to == acceptor_id and isinstance(o.message, Commit))
        assert isinstance(commit, Commit)
        times["commit_bytes"] = len(codec.encode(commit.relayed(())))
        times["certificate_bytes"] = len(codec.encode(commit.relayed(()))) - len(
            codec.encode(Commit(run=commit.run, epoch=commit.epoch, value=commit.value, digest=commit.digest))
        )
        timed("acceptor_commit", lambda: acceptor.receive(self.now, proposer_id, PROTOCOL, commit))
        new = proposer.configuration(RUN)
        assert new is not None and new.epoch == config.epoch + 1
        assert acceptor.configuration(RUN) == new
        # Every trial starts from the same formed run (fresh machines), so removals do not shrink it.
        return times

    def phase1_trial(self) -> dict[str, Any]:
        """A proposer that is not the coordinator (a takeover, or any proposal after round 0):
        PREPARE, a quorum of PROMISEs (signed, each verified, with justified ballots), ACCEPT
        carrying them; one acceptor handles that ACCEPT (it checks every promise)."""
        config = self.config
        coord = coordinator(config)
        members = [p for p in config.peers if p != coord]
        self.rng.shuffle(members)
        proposer_id, acceptor_id = members[0], members[1]
        proposer = self.machine(proposer_id)
        self.now += 1.0
        proposer.set_throughput(self.now, RUN, 3.0)
        proposer.take_outgoing()
        rec = proposer._runs[RUN]  # type: ignore[attr-defined]
        proposer._start_proposal(self.now, rec, fast=False)  # type: ignore[attr-defined]
        prepare = next(o.message for o in proposer.take_outgoing())
        ballot, epoch = prepare.ballot, prepare.epoch  # type: ignore[attr-defined]
        promisers = [p for p in members if p != proposer_id][: quorum(config) - 1]
        times: list[float] = []
        step = max(STEP, config.activation_step) - 1
        for peer in promisers:
            extra: dict[str, Any] = {}
            if JUSTIFIED:  # each promiser signs its own (outside the measured call)
                body = promise_statement(RUN, epoch, ballot, None, b"", step)
                extra["signature"] = self.identities[peer].sign(body)
            promise = Promise(run=RUN, epoch=epoch, ballot=ballot, entered=step + 1, completed=step, **extra)
            start = time.thread_time_ns()
            proposer.receive(self.now, peer, PROTOCOL, promise)
            times.append((time.thread_time_ns() - start) / 1000.0)
        accept = next(o.message for o in proposer.take_outgoing() if isinstance(o.message, Accept))
        acceptor = self.machine(acceptor_id)
        start = time.thread_time_ns()
        acceptor.receive(self.now, proposer_id, PROTOCOL, accept)
        accept_us = (time.thread_time_ns() - start) / 1000.0
        reply = _only(acceptor.take_outgoing(), proposer_id)
        assert isinstance(reply, Accepted), reply
        return {
            "promise": times[:-1],
            "phase1_done": times[-1],
            "acceptor_accept": accept_us,
            "accept_bytes": len(codec.encode(accept.relayed(()))),
        }


def phase1_handling(sizes: list[int], trials: int, seed: int) -> list[dict[str, Any]]:
    """``LocalBench.phase1_trial`` at each size: CPU per PROMISE at the proposer, of the PROMISE
    that completes the quorum (value choice, ACCEPT to n - 1 members), and of the justified ACCEPT
    at an acceptor; the ACCEPT's bytes."""
    rows = []
    for n in sizes:
        bench = LocalBench(n, seed)
        samples = [bench.phase1_trial() for _ in range(trials)]
        promises = [v for s in samples for v in s["promise"]]

        def stat(values: list[float]) -> dict[str, float]:
            return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}

        rows.append(
            {
                "members": n,
                "trials": trials,
                "proposer_promise_us": stat(promises),
                "proposer_phase1_done_us": stat([s["phase1_done"] for s in samples]),
                "acceptor_accept_us": stat([s["acceptor_accept"] for s in samples]),
                "accept_bytes": statistics.median(s["accept_bytes"] for s in samples),
            }
        )
        print(f"  phase1 n={n}: done", flush=True)
    return rows


def _acceptance(accept: Any, config: Any, value: Any) -> bytes:
    """The acceptance statement a member signs for ``accept`` (C_{e+1} from the proposer's C_e)."""
    ids = [op_id(op) for op in value.ops]
    new, _ = next_configuration(config, zip(ids, value.ops, strict=True), value.activation_step)
    return statement(accept.run, accept.epoch, accept.ballot, new.digest)


def _only(outgoing: list[Any], to: PeerID) -> Message:
    for out in outgoing:
        if out.to == to:
            message: Message = out.message
            return message
    raise AssertionError(f"nothing was sent to {to.short()}")


def local_handling(sizes: list[int], trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        for kind in KINDS:
            bench = LocalBench(n, seed)
            samples = [bench.trial(kind) for _ in range(trials)]

            def stat(key: str, samples: list[dict[str, Any]] = samples) -> dict[str, float]:
                values = [s[key] for s in samples]
                return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}

            accepted = [v for s in samples for v in s["proposer_accepted"]]
            acceptor_total = [s["acceptor_accept"] + s["acceptor_commit"] for s in samples]
            rows.append(
                {
                    "members": n,
                    "kind": kind.name,
                    "trials": trials,
                    "origin_us": stat("origin"),
                    "proposer_op_us": stat("proposer_op"),
                    "proposer_op_first_us": stat("proposer_op_first") if "proposer_op_first" in samples[0] else None,
                    "commit_bytes": statistics.median(s["commit_bytes"] for s in samples),
                    "certificate_bytes": statistics.median(s["certificate_bytes"] for s in samples),
                    "proposer_accepted_us": {
                        "p50": percentile(accepted, 0.5) if accepted else 0.0,
                        "p99": percentile(accepted, 0.99) if accepted else 0.0,
                    },
                    "proposer_decide_us": stat("proposer_decide"),
                    "acceptor_accept_us": stat("acceptor_accept"),
                    "acceptor_commit_us": stat("acceptor_commit"),
                    "acceptor_total_us": {
                        "p50": percentile(acceptor_total, 0.5),
                        "p99": percentile(acceptor_total, 0.99),
                    },
                    "max_call_us": max(
                        max(
                            s["origin"],
                            s["proposer_op"],
                            s["proposer_decide"],
                            s["acceptor_accept"],
                            s["acceptor_commit"],
                        )
                        for s in samples
                    ),
                }
            )
            print(f"  local n={n} {kind.name}: done", flush=True)
    return rows


# ------------------------------------------------------------------------------------------ (b)
def _line_latency(seed: int) -> Callable[[PeerID, PeerID], LinkProfile]:
    """One-way latency 0.5-50 ms by distance on a line; profiles cached per 0.5 ms bucket."""
    cache: dict[int, LinkProfile] = {}
    where: dict[bytes, float] = {}

    def position(peer: PeerID) -> float:
        x = where.get(peer.raw)
        if x is None:
            x = random.Random(hash((seed, peer.raw))).random()
            where[peer.raw] = x
        return x

    def link(a: PeerID, b: PeerID) -> LinkProfile:
        bucket = int(abs(position(a) - position(b)) * 99)
        profile = cache.get(bucket)
        if profile is None:
            profile = LinkProfile(latency_s=0.0005 + bucket * 0.0005)
            cache[bucket] = profile
        return profile

    return link


def decision_latency(sizes: list[int], trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        results: dict[str, list[float]] = {"FAIL": [], "JOIN": [], "LEAVE": []}
        for trial in range(trials):
            swarm = NegotiationSwarm(
                config=NegotiationConfig.lan(),
                seed=seed * 1000 + trial,
                run=RUN,
                params=RunParams(global_batch=max(4 * n, 1024)),
                link_fn=_line_latency(seed + trial),
                detect_delay_s=(0.0, 0.0),
                check_invariants=False,
            )
            swarm.preform(n, train=False)
            for p in swarm.running():
                swarm.call(p, lambda m, now: m.report_step(now, RUN, entered=STEP, completed=STEP - 1))
            swarm.run_for(1.0)
            for kind, act in (
                ("FAIL", lambda s: s.crash(s.random.choice(s.members()))),
                ("JOIN", lambda s: s.spawn(sponsor=s.random.choice(s.members()))),
                ("LEAVE", lambda s: s.leave(s.random.choice(s.members()))),
            ):
                start = swarm.net.now
                act(swarm)
                swarm.run_for(3.0)
                latencies = swarm.decision_latencies(OpKind[kind], since=start)
                if latencies:
                    results[kind].append(latencies[0])
        for kind, values in results.items():
            rows.append(
                {
                    "members": n,
                    "kind": kind,
                    "trials": len(values),
                    "p50_ms": 1000 * statistics.median(values) if values else float("nan"),
                    "p99_ms": 1000 * percentile(values, 0.99) if values else float("nan"),
                    "max_ms": 1000 * max(values) if values else float("nan"),
                }
            )
        print(f"  latency n={n}: done", flush=True)
    return rows


# ------------------------------------------------------------------------------------------ (b) real
PEER_SCRIPT = Path(__file__).with_name("_negotiation_peer.py")


@dataclasses.dataclass
class RealPeer:
    """One ``_negotiation_peer.py`` process."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    ready: Path
    peer_id: str = ""
    addr: str = ""
    gone: bool = False
    """Killed, or asked to leave: no longer expected to commit anything."""

    _offset: int = 0
    _cache: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        """The log's records so far (read incrementally: the harness shares the peers' 2 cores)."""
        if self.log.exists():
            with self.log.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1  # a line being written waits for the next poll
            for line in chunk[:end].splitlines():
                self._cache.append(json.loads(line))
            self._offset += end
        return self._cache

    def cpu_s(self) -> float:
        """utime + stime of the process so far (0 once it is gone)."""
        return process_cpu_s(self.process.pid)


TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds a live process used so far (0.0 once it is gone): the scheduler's nanosecond
    run time of each of its threads (``/proc/PID/task/*/schedstat``), else utime + stime in ticks."""
    try:
        total = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
        if total:
            return total / 1e9
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


class RealSwarm:
    """Peers on 127.0.0.1, each a process; triggers operations and times their decisions."""

    def __init__(
        self,
        root: Path,
        *,
        pace_s: float,
        lan_membership: bool,
        rng: random.Random,
        trace: bool = False,
        worker_args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.worker_args = worker_args
        self.clock_base = time.monotonic()
        """Lockstep peers (``--clock-base``) step on slots counted from here."""
        self.trace = trace
        self.pace_s = pace_s
        self.lan_membership = lan_membership
        self.rng = rng
        self.peers: list[RealPeer] = []

    def start(self, *, found: bool = False, timeout_s: float = 90.0) -> RealPeer:
        name = f"p{len(self.peers)}"
        log, ready = self.root / f"{name}.jsonl", self.root / f"{name}.ready"
        command = [sys.executable, str(PEER_SCRIPT), "--ready-file", str(ready), "--log-file", str(log)]
        command += ["--pace", str(self.pace_s)]
        if self.lan_membership:
            command.append("--lan-membership")
        if self.trace:
            command += ["--trace", str(self.root / f"{name}.trace")]
        command += self.worker_args
        if "--free-steps" in command:
            command.remove("--free-steps")
        else:
            command += ["--clock-base", repr(self.clock_base)]
        if found:
            command.append("--found")
        else:
            sponsor = self.rng.choice(self.live())
            command += ["--join", sponsor.addr]
        with (self.root / f"{name}.stderr").open("wb") as err:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
        peer = RealPeer(name=name, process=process, log=log, ready=ready)
        self.peers.append(peer)
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / f"{name}.stderr").read_text(errors="replace")[-3000:]
                raise SystemExit(f"peer {name} did not start/join:\n{tail}")
            time.sleep(0.02)
        info = json.loads(ready.read_text())
        peer.peer_id, peer.addr = info["peer_id"], info["addrs"][0]
        return peer

    def live(self) -> list[RealPeer]:
        return [p for p in self.peers if not p.gone and p.process.poll() is None]

    def stop_all(self) -> None:
        for peer in self.peers:
            if peer.process.poll() is None:
                peer.process.kill()
        for peer in self.peers:
            peer.process.wait()

    def measure(self, kind: str, subject: str, since: float, timeout_s: float = 30.0) -> dict[str, Any] | None:
        """Wait until an applied ``kind`` operation naming ``subject``, detected after ``since``
        (monotonic), was committed by every live member of the configuration it produced."""
        deadline = time.monotonic() + timeout_s
        cpu_before = {p.name: p.cpu_s() for p in self.live()}
        while time.monotonic() < deadline:
            time.sleep(0.1)  # the figures come from the peers' logs, not from when this poll sees them
            logs = {p.peer_id: p.records() for p in self.peers if p.peer_id}
            ops = [
                r
                for records in logs.values()
                for r in records
                if r.get("event") == "op"
                and r["kind"] == kind
                and subject in (r["subject"], r["other"])
                and r["detected_at"] >= since - 0.001
            ]
            applied = [r for r in ops if r["applied"]]
            if not applied:
                continue
            epoch = applied[0]["epoch"]
            committed: dict[str, float] = {}
            members: list[str] = []
            for peer_id, records in logs.items():
                for r in records:
                    if r.get("event") == "config" and r["epoch"] == epoch:
                        committed[peer_id] = r["committed_at"]
                        members = r["members"]
            alive = {p.peer_id for p in self.live()}
            waiting = [m for m in members if m in alive and m not in committed]
            if waiting or not members:
                continue
            detected = min(r["detected_at"] for r in ops if r["epoch"] == epoch)
            proposed = applied[0]["proposed_at"]
            times = [committed[m] for m in members if m in alive]
            last = max((m for m in members if m in alive), key=lambda m: committed[m])
            cpu_after = {p.name: p.cpu_s() for p in self.live()}
            return {
                "kind": kind,
                "members": len(members),
                "detected_at": detected,
                "last_commit_at": max(times),
                "cpu_s_in_window": sum(cpu_after[k] - cpu_before[k] for k in cpu_after if k in cpu_before),
                "window_s": time.monotonic() - since,
                "epoch": epoch,
                "trigger_to_detect_ms": 1e3 * (detected - since),
                "detect_to_propose_ms": 1e3 * (proposed - detected),
                "decision_ms": 1e3 * (max(times) - detected),
                "first_commit_ms": 1e3 * (min(times) - detected),
                "load_1m": os.getloadavg()[0],
                "last_committer_is_subject": last == subject,
                "last_committer_is_origin": last == applied[0]["origin"],
                "batch": sorted(
                    {r["kind"] for rs in logs.values() for r in rs if r.get("event") == "op" and r["epoch"] == epoch}
                ),
            }
        return None


def idle_cpu(swarm: RealSwarm, seconds: float) -> dict[str, float]:
    """CPU per live process while nothing is negotiated (heartbeats, DHT, the stand-in step loop)."""
    live = swarm.live()
    before = {p.name: p.cpu_s() for p in live}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    used = sorted((p.cpu_s() - before[p.name]) / elapsed for p in live if p.process.poll() is None)
    return {
        "seconds": elapsed,
        "processes": len(used),
        "per_process_p50_cpu_ms_per_s": 1e3 * statistics.median(used),
        "per_process_max_cpu_ms_per_s": 1e3 * max(used),
        "total_cores_busy": sum(used),
    }


def cpu_per_decision(swarm: RealSwarm, rng: random.Random, idle_cores: float, *, toggles: int) -> dict[str, Any]:
    """CPU all processes together spend on one decision: ``toggles`` link down/up pairs, each
    awaited, total CPU minus the idle rate over the same time, per decision."""
    if toggles <= 0:
        return {"cpu_ms_per_decision": float("nan"), "cpu_decisions": 0}
    live = swarm.live()
    before = {p.name: p.cpu_s() for p in live}
    started = time.monotonic()
    decided = 0
    target = live[0]
    for i in range(2 * toggles):
        if i % 2 == 0:
            target = rng.choice(live)  # down, then up again on the same member's link
        since = time.monotonic()
        target.process.send_signal(signal.SIGUSR2 if i % 2 else signal.SIGUSR1)
        if swarm.measure("LINK_UP" if i % 2 else "LINK_DOWN", target.peer_id, since) is not None:
            decided += 1
    elapsed = time.monotonic() - started
    used = sum(p.cpu_s() - before[p.name] for p in live if p.process.poll() is None)
    return {
        "cpu_decisions": decided,
        "cpu_ms_per_decision": 1e3 * (used - idle_cores * elapsed) / max(decided, 1),
        "cpu_window_s": elapsed,
    }


def hop_breakdown(trace_dir: Path, sample: dict[str, Any]) -> dict[str, Any]:
    """Milestones of one measured decision from the peers' ``--trace`` logs, ms after detection.

    For each (record, message type): the first and the last time any peer did it between detection
    and the last commit (``queue``: the machine asked for it to be sent; ``sent``: the connection
    wrote it; ``arrive``: the reader got it, before decoding; ``in``: the machine received it), and
    the CPU every process spent in that window (from the records' process-CPU stamps).
    """
    start, end = sample["detected_at"] - 0.002, sample["last_commit_at"] + 0.002
    epoch = sample["epoch"]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    count: dict[str, int] = {}
    cpu = 0.0
    for path in trace_dir.glob("*.trace"):
        inside = []
        for line in path.read_text().splitlines():
            what, kind, _peer, msg_epoch, at, cpu_s = json.loads(line)
            if start <= at <= end and (msg_epoch is None or msg_epoch in (epoch, epoch - 1)):
                inside.append((at, cpu_s))
                key = f"{what} {kind}"
                first[key] = min(first.get(key, at), at)
                last[key] = max(last.get(key, at), at)
                count[key] = count.get(key, 0) + 1
        if len(inside) > 1:
            cpu += inside[-1][1] - inside[0][1]
    detected = sample["detected_at"]
    return {
        "milestones_ms": {
            k: [round(1e3 * (first[k] - detected), 2), round(1e3 * (last[k] - detected), 2), count[k]]
            for k in sorted(first, key=first.__getitem__)
        },
        "cpu_ms_between_first_and_last_message": round(1e3 * cpu, 2),
    }


def peer_idle(sizes: list[int], seed: int, *, lan_membership: bool) -> list[dict[str, Any]]:
    """Idle CPU of the peers alone: the same swarms, but steps 1000 s long, so no stand-in step
    runs in the measured window (``real`` measures idle CPU with 20 steps per second)."""
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="chaosp2p-negotiation-idle-") as tmp:
            swarm = RealSwarm(Path(tmp), pace_s=1000.0, lan_membership=lan_membership, rng=random.Random(seed))
            try:
                swarm.start(found=True)
                for _ in range(n - 1):
                    swarm.start()
                time.sleep(4.0)  # as in ``real``: the overlay's links settle first
                row = {"size": n, **idle_cpu(swarm, 3.0), "load_1m": os.getloadavg()[0]}
                print(f"  peer idle n={n}: {row}", flush=True)
                rows.append(row)
            finally:
                swarm.stop_all()
    return rows


def real_latency(
    sizes: list[int],
    repeats: int,
    seed: int,
    *,
    pace_s: float,
    lan_membership: bool,
    trace_dir: Path | None = None,
    cpu_toggles: int = 5,
    worker_args: tuple[str, ...] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Decision latency with real processes (see ``_negotiation_peer.py``); rows and raw samples."""
    rows: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    rng = random.Random(seed)
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="chaosp2p-negotiation-") as tmp:
            root = Path(tmp) if trace_dir is None else trace_dir / f"n{n}"
            root.mkdir(parents=True, exist_ok=True)
            swarm = RealSwarm(
                root,
                pace_s=pace_s,
                lan_membership=lan_membership,
                rng=rng,
                trace=trace_dir is not None,
                worker_args=worker_args,
            )
            found: list[dict[str, Any]] = []
            try:
                swarm.start(found=True)
                for _ in range(n - 1):
                    swarm.start()
                time.sleep(4.0)  # let the links the overlay found settle into LINK_UP operations first
                idle = idle_cpu(swarm, 3.0)
                idle["size"] = n
                print(f"  real n={n}: idle {idle}", flush=True)
                idle.update(cpu_per_decision(swarm, rng, idle["total_cores_busy"], toggles=cpu_toggles))
                print(f"  real n={n}: CPU per link decision {idle['cpu_ms_per_decision']:.1f} ms", flush=True)

                def record(
                    result: dict[str, Any] | None,
                    kind: str,
                    n: int = n,
                    found: list[dict[str, Any]] = found,
                    root: Path = root,
                ) -> None:
                    if result is None:
                        print(f"  real n={n} {kind}: no decision within the timeout", flush=True)
                        found.append({"kind": kind, "missing": True, "size": n})
                        return
                    result["size"] = n
                    found.append(result)
                    time.sleep(0.5)  # let the last trace records reach their files
                    if trace_dir is not None:
                        result["hops"] = hop_breakdown(root, result)
                        print(f"  real n={n} {kind}: {result['decision_ms']:.1f} ms {result['hops']}", flush=True)

                for _ in range(repeats):
                    since = time.monotonic()
                    newcomer = swarm.start()
                    record(swarm.measure("JOIN", newcomer.peer_id, since), "JOIN")
                    target = rng.choice(swarm.live())
                    since = time.monotonic()
                    target.process.send_signal(signal.SIGUSR1)
                    record(swarm.measure("LINK_DOWN", target.peer_id, since), "LINK_DOWN")
                    since = time.monotonic()
                    target.process.send_signal(signal.SIGUSR2)
                    record(swarm.measure("LINK_UP", target.peer_id, since), "LINK_UP")
                    leaver = rng.choice(swarm.live()[1:])
                    since = time.monotonic()
                    leaver.gone = True
                    leaver.process.send_signal(signal.SIGTERM)
                    record(swarm.measure("LEAVE", leaver.peer_id, since), "LEAVE")
                    since = time.monotonic()
                    newcomer = swarm.start()
                    record(swarm.measure("JOIN", newcomer.peer_id, since), "JOIN")
                    victim = rng.choice(swarm.live()[1:])
                    since = time.monotonic()
                    victim.gone = True
                    victim.process.kill()
                    record(swarm.measure("FAIL", victim.peer_id, since), "FAIL")
            finally:
                swarm.stop_all()
            samples.extend(found)
            samples.append({"kind": "IDLE", **idle})
            for kind in ("JOIN", "LEAVE", "FAIL", "LINK_DOWN", "LINK_UP"):
                got = [r for r in found if r["kind"] == kind and not r.get("missing")]
                values = [r["decision_ms"] for r in got]
                rows.append(
                    {
                        "processes": n,
                        "kind": kind,
                        "trials": len(values),
                        "missing": sum(1 for r in found if r["kind"] == kind and r.get("missing")),
                        "p50_ms": statistics.median(values) if values else float("nan"),
                        "p99_ms": percentile(values, 0.99) if values else float("nan"),
                        "max_ms": max(values) if values else float("nan"),
                        "trigger_to_detect_p50_ms": statistics.median([r["trigger_to_detect_ms"] for r in got])
                        if got
                        else float("nan"),
                    }
                )
            print(f"  real n={n}: done ({os.getloadavg()[0]:.1f} load)", flush=True)
    return rows, samples


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--parts",
        default="local,sim",
        help="any of local, phase1, sim, real, idle (comma-separated; phase1: a proposal after round 0, "
        "with signed promises; idle: the peers' idle CPU without stand-in steps)",
    )
    parser.add_argument("--sizes", default="8,64,256,1024")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--latency-sizes", default="8,64,256,1024")
    parser.add_argument("--latency-trials", type=int, default=5)
    parser.add_argument("--real-sizes", default="4,8,16,32", help="processes per swarm for --parts real")
    parser.add_argument("--real-repeats", type=int, default=3, help="rounds of join/link/leave/join/kill per size")
    parser.add_argument("--pace", type=float, default=0.05, help="seconds per stand-in training step (real)")
    parser.add_argument(
        "--local-membership",
        action="store_true",
        help="real peers keep the local profile's 0.5 s failure detector (default: lan timers; with 16+ "
        "processes on 2 shared cores local's 50 ms probe deadlines fail live members)",
    )
    parser.add_argument(
        "--trace-dir", type=Path, default=None, help="keep the peers' logs here, with a per-message hop trace"
    )
    parser.add_argument(
        "--cpu-toggles", type=int, default=5, help="link down/up pairs timed for CPU per decision (real)"
    )
    parser.add_argument(
        "--free-steps",
        action="store_true",
        help="real peers step on their own (sleep --pace each) instead of in lockstep on the shared clock",
    )
    parser.add_argument(
        "--proposer-backoff-s",
        type=float,
        default=None,
        help="real peers' NegotiationConfig.proposer_backoff_s (default: the local profile's)",
    )
    parser.add_argument(
        "--sched-batch", action="store_true", help="peers run under SCHED_BATCH (no wakeup preemption; real)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes and few trials (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.trials, args.latency_sizes, args.latency_trials = "8,64", 5, "8,64", 2
        args.real_sizes, args.real_repeats = "4", 1
    parts = {p for p in args.parts.split(",") if p}
    sizes = [int(s) for s in args.sizes.split(",") if s]
    latency_sizes = [int(s) for s in args.latency_sizes.split(",") if s]
    real_sizes = [int(s) for s in args.real_sizes.split(",") if s]
    out: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load_before": os.getloadavg(),
    }

    if "local" in parts:
        local = local_handling(sizes, args.trials, args.seed)
        out["local_handling"] = local
        print_table(
            "(a) CPU per call handling one operation, microseconds (p50 / p99 over trials; thread CPU time)",
            [
                "n",
                "op",
                "origin",
                "proposer: op in",
                "proposer: ACCEPTED",
                "proposer: decide",
                "acceptor: ACCEPT",
                "acceptor: COMMIT",
                "acceptor total",
                "max call",
                "COMMIT bytes",
                "of it certificate",
            ],
            [
                [
                    r["members"],
                    r["kind"],
                    _pp(r["origin_us"]),
                    _pp(r["proposer_op_us"]),
                    _pp(r["proposer_accepted_us"]),
                    _pp(r["proposer_decide_us"]),
                    _pp(r["acceptor_accept_us"]),
                    _pp(r["acceptor_commit_us"]),
                    _pp(r["acceptor_total_us"]),
                    f"{r['max_call_us']:.0f}",
                    f"{r['commit_bytes']:.0f}",
                    f"{r['certificate_bytes']:.0f}",
                ]
                for r in local
            ],
        )
    if "phase1" in parts:
        phase1 = phase1_handling(sizes, args.trials, args.seed)
        out["phase1_handling"] = phase1
        print_table(
            "(a') A proposal after round 0: CPU per call, microseconds (p50 / p99; thread CPU time)",
            ["n", "proposer: PROMISE", "proposer: quorum -> ACCEPT", "acceptor: ACCEPT", "ACCEPT bytes"],
            [
                [
                    r["members"],
                    _pp(r["proposer_promise_us"]),
                    _pp(r["proposer_phase1_done_us"]),
                    _pp(r["acceptor_accept_us"]),
                    f"{r['accept_bytes']:.0f}",
                ]
                for r in phase1
            ],
        )
    if "sim" in parts:
        latency = decision_latency(latency_sizes, args.latency_trials, args.seed)
        out["decision_latency"] = latency
        print_table(
            "(b) Decision latency, simulated: detection -> last running member committed (RTT 1-100 ms), ms",
            ["n", "op", "trials", "p50", "p99", "max"],
            [[r["members"], r["kind"], r["trials"], r["p50_ms"], r["p99_ms"], r["max_ms"]] for r in latency],
        )
    if "idle" in parts:
        out["peer_idle"] = peer_idle(real_sizes, args.seed, lan_membership=not args.local_membership)
    if "real" in parts:
        rows, samples = real_latency(
            real_sizes,
            args.real_repeats,
            args.seed,
            pace_s=args.pace,
            lan_membership=not args.local_membership,
            trace_dir=args.trace_dir,
            cpu_toggles=args.cpu_toggles,
            worker_args=(("--sched-batch",) if args.sched_batch else ())
            + (("--free-steps",) if args.free_steps else ())
            + (() if args.proposer_backoff_s is None else ("--proposer-backoff-s", str(args.proposer_backoff_s))),
        )
        out["real_latency"] = rows
        out["real_samples"] = samples
        print_table(
            "(b) Decision latency, real processes on 127.0.0.1: detection -> last live member committed, ms",
            ["processes", "op", "trials", "missing", "p50", "p99", "max", "trigger->detected p50"],
            [
                [
                    r["processes"],
                    r["kind"],
                    r["trials"],
                    r["missing"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r["max_ms"],
                    r["trigger_to_detect_p50_ms"],
                ]
                for r in rows
            ],
        )
    out["load_after"] = os.getloadavg()
    write_json(args.json, out)


def _pp(stat: dict[str, float]) -> str:
    return f"{stat['p50']:.0f} / {stat['p99']:.0f}"


if __name__ == "__main__":
    main()
