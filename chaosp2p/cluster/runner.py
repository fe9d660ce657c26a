"""Runs a scenario: peer processes on 127.0.0.1, the churn schedule, link shaping, the timeline.

Theory of operation
-------------------
:func:`run_scenario` is a plain blocking loop (a harness drives processes; it needs no event loop):

1. The first initial peer is started and, once its ready file appears, every other initial peer
   is started with ``--join`` to it. A peer that exits or is not listening within
   ``startup_timeout_s`` is a :class:`ClusterError` naming it and quoting its log; everything
   already started is stopped first.
2. Once all initial peers listen, the schedule's zero is recorded and the loop ticks every 50 ms:
   it tails the peers' metrics files into the timeline, notices ready files and exits, and applies
   due actions -- join (start a process joining through up to three running peers), leave
   (SIGTERM), kill (SIGKILL), stall (SIGSTOP, later SIGCONT), cut / restore (rewrite the two
   peers' link rules).
3. At ``duration_s`` every live peer is sent SIGCONT and SIGTERM (a graceful leave), given
   ``stop_timeout_s``, then killed. The same happens on Ctrl-C (SIGINT) or SIGTERM to the harness,
   and on any error, so no process outlives the harness.

Link shaping is off unless the scenario shapes or cuts a link. Then each peer is started with
``CHAOSP2P_LINK_RULES`` naming its own rules file (``DIR/peers/NAME.links.json``), which the harness
rewrites whenever a peer's id becomes known or a link is cut or restored; the peer's transport
re-reads it within 0.1 s (see :mod:`chaosp2p.transport.shaper`). Rules are keyed by PeerID, so a
link is shaped from the moment both ends are known to the harness (a peer's first second, while it
starts, is unshaped).

With ``[[site]]`` tables every peer runs in its own network namespace on its site
(:mod:`chaosp2p.cluster.sites`), listening on its namespace's address, port 4001; the namespaces are
removed after the peers are stopped, in the same ``finally``.

Peers run in their own sessions, so a Ctrl-C in the terminal reaches only the harness, which then
stops them in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from chaosp2p.cluster.netns import NetworkNamespace
from chaosp2p.cluster.scenario import Action, PeerSpec, Scenario, ScheduledEvent
from chaosp2p.cluster.sites import SiteNetwork
from chaosp2p.cluster.timeline import TIMELINE_NAME, TimelineWriter
from chaosp2p.errors import ChaosError, ConfigError
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules

TICK_S = 0.05
SITE_PORT = 4001
"""The port every peer on a ``[[site]]`` listens on (each has its own address)."""
LOG_TAIL_LINES = 15


class ClusterError(ChaosError):
    """The cluster could not run as the scenario says (a peer never started, ...)."""


class Interrupted(ChaosError):
    """The harness was interrupted (Ctrl-C or SIGTERM); every peer was stopped."""


@dataclass(slots=True)
class PeerProcess:
    """One peer of the run, from start to exit."""

    spec: PeerSpec
    ready_file: Path
    metrics_file: Path
    log_file: Path
    links_file: Path
    process: subprocess.Popen[bytes] | None = None
    started_t: float | None = None
    peer_id: str | None = None
    addrs: list[str] = field(default_factory=list)
    reaped: bool = False
    """Its exit was noticed and recorded."""
    state: str = "not started"
    """not started, starting, up, stalled, leaving, killed, exited."""

    @property
    def alive(self) -> bool:
        """The process exists and has not exited."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self) -> str:
        """The last lines of the peer's output."""
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(no output)"


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a finished run left behind."""

    out_dir: Path
    timeline: Path
    peers: dict[str, int | None]
    """Each peer's exit code (negative: killed by that signal; ``None``: never started)."""
    interrupted: bool = False


def run_scenario(
    scenario: Scenario,
    out_dir: Path | str,
    *,
    netns: bool = False,
    log: Callable[[str], None] | None = None,
    python: str = sys.executable,
) -> RunResult:
    """Run ``scenario`` to its end and return where its timeline is.

    Raises :class:`ClusterError` if a peer never starts, :class:`Interrupted` on Ctrl-C/SIGTERM;
    in every case every process is stopped first and the timeline written.
    """
    return ClusterRun(scenario, Path(out_dir), netns=netns, log=log, python=python).run()


class ClusterRun:
    """One run of a scenario (use :func:`run_scenario`)."""

    def __init__(
        self,
        scenario: Scenario,
        out_dir: Path,
        *,
        netns: bool = False,
        log: Callable[[str], None] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.scenario = scenario
        self.out_dir = out_dir
        self.python = python
        self._log = log or (lambda message: None)
        if netns and scenario.sites:
            raise ConfigError(f"{scenario.path}: --netns and [[site]] tables exclude each other (sites are namespaces)")
        peers_dir = out_dir / "peers"
        peers_dir.mkdir(parents=True, exist_ok=True)
        self.peers: dict[str, PeerProcess] = {}
        for spec in scenario.peers:
            for suffix in (".ready.json", ".metrics.jsonl", ".log", ".links.json"):
                (peers_dir / f"{spec.name}{suffix}").unlink(missing_ok=True)
            self.peers[spec.name] = PeerProcess(
                spec=spec,
                ready_file=peers_dir / f"{spec.name}.ready.json",
                metrics_file=peers_dir / f"{spec.name}.metrics.jsonl",
                log_file=peers_dir / f"{spec.name}.log",
                links_file=peers_dir / f"{spec.name}.links.json",
            )
        self.timeline = TimelineWriter(out_dir / TIMELINE_NAME)
        self._cut: set[frozenset[str]] = set()
        self._schedule_zero: float | None = None
        self._logs: list[IO[bytes]] = []
        # Made last: nothing after it in __init__ can fail and leave the namespaces behind.
        self._netns = NetworkNamespace.create(scenario) if netns else None
        self._sites: SiteNetwork | None = None
        if scenario.sites:
            try:
                hosts = [(spec.name, spec.site or "") for spec in scenario.peers]
                self._sites = SiteNetwork.create(scenario.sites, hosts)
            except BaseException:
                if self._netns is not None:
                    self._netns.close()
                raise

    # ------------------------------------------------------------------ the run
    def run(self) -> RunResult:
        """Start, run the schedule, stop; see the module docstring."""
        interrupted = False
        previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        self.timeline.harness(
            "scenario",
            path=self.scenario.path,
            duration_s=self.scenario.duration_s,
            peers=[p.name for p in self.scenario.peers],
            shaped=self.scenario.shaped,
            netns=self._netns is not None,
            sites={} if self._sites is None else {h.host: [h.site, h.address] for h in self._sites.hosts.values()},
        )
        try:
            with _signals_interrupt():
                self._start_initial()
                self._schedule_zero = self.timeline.now()
                self.timeline.harness("schedule", zero_t=round(self._schedule_zero, 6))
                self._log(f"all {len(self.scenario.initial_peers)} initial peers up; running the schedule")
                self._run_schedule()
        except Interrupted:
            interrupted = True
            self.timeline.harness("interrupted")
            self._log("interrupted: stopping every peer")
        finally:
            self._stop_all()
            timeline = self.timeline.close()
            for file in self._logs:
                file.close()
            if self._netns is not None:
                self._netns.close()
            if self._sites is not None:
                self._sites.close()
            for signum, handler in previous.items():
                if handler is not None:
                    try:
                        signal.signal(signum, handler)
                    except ValueError:  # not the main thread: nothing was changed
                        pass
        result = RunResult(
            out_dir=self.out_dir,
            timeline=timeline,
            peers={
                name: None if peer.process is None else peer.process.returncode for name, peer in self.peers.items()
            },
            interrupted=interrupted,
        )
        if interrupted:
            raise Interrupted("interrupted: every peer was stopped, the timeline written")
        return result

    def _start_initial(self) -> None:
        initial = self.scenario.initial_peers
        first = self.peers[initial[0].name]
        self._start(first, join=[])
        self._wait_ready([first])
        for spec in initial[1:]:
            self._start(self.peers[spec.name], join=first.addrs[:1])
        self._wait_ready([self.peers[spec.name] for spec in initial[1:]])

    def _wait_ready(self, peers: list[PeerProcess]) -> None:
        while any(p.state == "starting" for p in peers):
            self._tick()  # raises ClusterError for a peer that exits or is late
            time.sleep(TICK_S)

    def _run_schedule(self) -> None:
        assert self._schedule_zero is not None
        pending = self.scenario.schedule()
        end = self._schedule_zero + self.scenario.duration_s
        while True:
            now = self.timeline.now()
            while pending and self._schedule_zero + pending[0].at_s <= now:
                self._apply(pending.pop(0))
            self._tick()
            if now >= end:
                return
            time.sleep(TICK_S)

    def _tick(self) -> None:
        """Tail metrics, notice ready files and exits; a peer failing to start is an error."""
        self.timeline.poll()
        for peer in self.peers.values():
            if peer.process is None or peer.reaped:
                continue
            if peer.state == "starting" and peer.ready_file.exists():
                self._on_ready(peer)
            late = peer.started_t is not None and self.timeline.now() - peer.started_t > self.scenario.startup_timeout_s
            if peer.state == "starting" and late:
                raise ClusterError(
                    f"peer {peer.spec.name!r} (line {peer.spec.line}) was not listening within "
                    f"startup_timeout_s = {self.scenario.startup_timeout_s:g} s; its output:\n{peer.log_tail()}"
                )
            code = peer.process.poll()
            if code is None:
                continue
            was = peer.state
            peer.reaped = True
            if was != "killed":
                peer.state = "exited"
            self.timeline.harness("exited", peer=peer.spec.name, peer_id=peer.peer_id, returncode=code, was=was)
            if was == "starting":
                raise ClusterError(
                    f"peer {peer.spec.name!r} (line {peer.spec.line}) exited with code {code} before it was "
                    f"listening; its output:\n{peer.log_tail()}"
                )
            if was not in ("leaving", "killed"):
                self._log(f"peer {peer.spec.name} exited with code {code}")

    def _on_ready(self, peer: PeerProcess) -> None:
        try:
            ready = json.loads(peer.ready_file.read_text())
        except (OSError, ValueError):
            return  # written atomically, so only a foreign file could be unreadable: try again next tick
        peer.peer_id = str(ready["peer_id"])
        peer.addrs = [str(a) for a in ready["addrs"]]
        peer.state = "up"
        self.timeline.set_peer_id(peer.spec.name, peer.peer_id)
        assert peer.started_t is not None
        self.timeline.harness(
            "ready",
            peer=peer.spec.name,
            peer_id=peer.peer_id,
            addrs=peer.addrs,
            startup_s=round(self.timeline.now() - peer.started_t, 6),
        )
        self._log(f"peer {peer.spec.name} up: {peer.peer_id}")
        self._write_link_rules()

    # ------------------------------------------------------------------ processes
    def _command(self, peer: PeerProcess, join: list[str]) -> list[str]:
        module = "chaosp2p.cluster.agent" if peer.spec.is_bare else peer.spec.run
        command = [self.python, "-m", module, "--profile", self.scenario.profile]
        command += ["--ready-file", str(peer.ready_file), "--metrics-file", str(peer.metrics_file)]
        for addr in join:
            command += ["--join", addr]
        if self._sites is not None:
            command += ["--listen", f"/ip4/{self._sites.address(peer.spec.name)}/tcp/{SITE_PORT}"]
        return command + list(peer.spec.args)

    def _start(self, peer: PeerProcess, *, join: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.scenario.shaped:
            write_link_rules(peer.links_file, {}, seed=self._seed(peer))
            env[LINK_RULES_ENV] = str(peer.links_file)
        else:
            env.pop(LINK_RULES_ENV, None)
        command = self._command(peer, join)
        if self._netns is not None:
            command = self._netns.wrap(command)
        if self._sites is not None:
            command = self._sites.wrap(peer.spec.name, command)
        log_file = peer.log_file.open("ab")
        self._logs.append(log_file)
        peer.process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,
        )  # fmt: skip
        peer.state = "starting"
        peer.started_t = self.timeline.now()
        self.timeline.follow(peer.spec.name, peer.metrics_file)
        self.timeline.harness("started", peer=peer.spec.name, pid=peer.process.pid, run=peer.spec.run, join=join)

    def _signal(self, peer: PeerProcess, signum: signal.Signals) -> bool:
        if not peer.alive:
            return False
        assert peer.process is not None
        try:
            peer.process.send_signal(signum)
        except ProcessLookupError:
            return False
        return True

    # ------------------------------------------------------------------ actions
    def _apply(self, event: ScheduledEvent) -> None:
        assert self._schedule_zero is not None
        fields: dict[str, Any] = {
            "action": event.action.value,
            "scheduled_t": round(self._schedule_zero + event.at_s, 6),
            "line": event.line,
        }
        if event.peer is not None:
            peer = self.peers[event.peer]
            fields.update(peer=event.peer, peer_id=peer.peer_id)
            done = self._apply_to_peer(peer, event.action)
        else:
            assert event.link is not None
            a, b = (self.peers[name] for name in event.link)
            fields.update(link=list(event.link), peer_ids=[a.peer_id, b.peer_id])
            pair = frozenset(event.link)
            if event.action is Action.CUT:
                self._cut.add(pair)
            else:
                self._cut.discard(pair)
            self._write_link_rules()
            done = True
        if event.duration_s is not None:
            fields["duration_s"] = event.duration_s
        fields["applied"] = done
        self.timeline.harness("inject", **fields)
        self._log(f"t={event.at_s:g}s {event.action.value} {event.subject}" + ("" if done else " (peer not running)"))

    def _apply_to_peer(self, peer: PeerProcess, action: Action) -> bool:
        if action is Action.JOIN:
            running = [p for p in self.peers.values() if p.state == "up" and p.alive and p.addrs]
            if not running:
                return False
            self._start(peer, join=[p.addrs[0] for p in running[:3]])
            return True
        if action is Action.LEAVE:
            peer.state = "leaving"
            return self._signal(peer, signal.SIGTERM)
        if action is Action.KILL:
            done = self._signal(peer, signal.SIGKILL)
            peer.state = "killed"
            return done
        if action is Action.STALL:
            peer.state = "stalled"
            return self._signal(peer, signal.SIGSTOP)
        assert action is Action.CONTINUE
        if peer.state != "stalled":
            return False
        peer.state = "up"
        return self._signal(peer, signal.SIGCONT)

    def _write_link_rules(self) -> None:
        if not self.scenario.shaped:
            return
        known = [p for p in self.peers.values() if p.peer_id is not None]
        for peer in self.peers.values():
            if peer.process is None:
                continue
            rules: dict[str, LinkRule] = {}
            for other in known:
                if other is peer:
                    continue
                assert other.peer_id is not None
                link = self.scenario.link_between(peer.spec.name, other.spec.name)
                cut = frozenset((peer.spec.name, other.spec.name)) in self._cut
                if self._netns is not None and link == self.scenario.default_link:
                    link = type(link)()  # the default link is shaped by tc in the namespace
                rule = LinkRule(
                    bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, delay_s=link.delay_s, loss=link.loss, cut=cut
                )
                if not rule.neutral:
                    rules[other.peer_id] = rule
            write_link_rules(peer.links_file, rules, seed=self._seed(peer))

    def _seed(self, peer: PeerProcess) -> int:
        """Each peer's own seed for loss draws (read once, from its first rules file)."""
        return self.scenario.seed * 1000 + list(self.peers).index(peer.spec.name)

    # ------------------------------------------------------------------ stopping
    def _stop_all(self) -> None:
        """SIGCONT + SIGTERM every live peer, wait ``stop_timeout_s``, kill -9 the rest, reap all."""
        try:  # a second Ctrl-C (or a SIGTERM) must not abandon the peers halfway through stopping them
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except ValueError:
            pass
        live = [p for p in self.peers.values() if p.alive]
        for peer in live:
            self._signal(peer, signal.SIGCONT)
            if peer.state not in ("leaving", "killed"):
                peer.state = "leaving"
                self._signal(peer, signal.SIGTERM)
        if live:
            self.timeline.harness("stopping", peers=[p.spec.name for p in live])
            self._log(f"stopping {len(live)} peers")
        deadline = time.monotonic() + self.scenario.stop_timeout_s
        while any(p.alive for p in live) and time.monotonic() < deadline:
            self.timeline.poll()
            time.sleep(TICK_S)
        forced = []
        for peer in self.peers.values():
            if peer.alive:
                forced.append(peer.spec.name)
                self._signal(peer, signal.SIGKILL)
            if peer.process is not None:
                try:
                    peer.process.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot end
                    forced.append(peer.spec.name)
        if forced:
            self._log(f"killed after stop_timeout_s: {', '.join(forced)}")
        self.timeline.harness(
            "stopped",
            returncodes={n: None if p.process is None else p.process.returncode for n, p in self.peers.items()},
            forced=forced,
        )


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise :class:`Interrupted` in the harness's loop (main thread only)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: the caller handles interruption
        yield
        return
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
