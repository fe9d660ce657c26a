"""``chaosp2p demo``: a local swarm trains one model together through a join, a leave and a crash.

Everything runs on 127.0.0.1 with the built-in ``local`` profile. Peers are real processes running
the digits task (:mod:`chaosp2p.trainers.digits`: an MLP on scikit-learn's bundled digits); the
demo narrates what they report -- nothing is staged:

1. three peers start; one founds the run, two join it (each downloads the members' model + Adam
   state in parallel, replays the steps it missed and is admitted at an agreed step);
2. a fourth peer joins mid-run;
3. one member leaves gracefully (SIGTERM), another is killed (SIGKILL): the survivors agree on the
   new configurations with no coordinator and go on training;
4. the timeline of the run's operations with each one's detection, decision and activation step;
   the survivors' parameters are compared bit for bit and their accuracy with one process trained
   on the same samples.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chaosp2p.errors import ChaosError

STEPS = 1_000_000
"""Peers train until the demo stops them (SIGTERM = a graceful leave)."""
STEPS_AFTER_CRASH = 150
BATCH = 64
PACE_S = 0.02
READY_TIMEOUT_S = 180.0
PHASE_TIMEOUT_S = 300.0


class DemoPeer:
    """One digits peer process and what it wrote so far."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], workdir: Path) -> None:
        self.name = name
        self.process = process
        self.metrics = workdir / f"{name}.jsonl"
        self.log = workdir / f"{name}.log"
        self.peer_id = ""
        self.addr = ""

    def records(self) -> list[dict[str, Any]]:
        """Every JSON line the peer wrote."""
        if not self.metrics.exists():
            return []
        lines = self.metrics.read_text().splitlines()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line being written
        return out

    def last_step(self) -> dict[str, Any] | None:
        steps = [r for r in self.records() if "members" in r and "event" not in r]
        return steps[-1] if steps else None


@contextmanager
def peer_processes(workdir: Path) -> Iterator[dict[str, DemoPeer]]:
    """Start peers on demand (see ``start``); stop whatever still runs at the end."""
    peers: dict[str, DemoPeer] = {}
    try:
        yield peers
    finally:
        for peer in peers.values():
            if peer.process.poll() is None:
                peer.process.send_signal(signal.SIGTERM)
        for peer in peers.values():
            try:
                peer.process.wait(10)
            except subprocess.TimeoutExpired:
                peer.process.kill()
                peer.process.wait()


def start(peers: dict[str, DemoPeer], name: str, workdir: Path, join: list[str]) -> DemoPeer:
    """Start one digits peer and wait until it listens."""
    ready = workdir / f"{name}.ready"
    command = [sys.executable, "-m", "chaosp2p.trainers.digits", "--steps", str(STEPS), "--batch", str(BATCH)]
    command += ["--profile", "local"]  # the demo is one machine; the CLI's default (lan) is for real hosts
    command += ["--pace", str(PACE_S), "--ready-file", str(ready), "--metrics-file", str(workdir / f"{name}.jsonl")]
    for addr in join:
        command += ["--join", addr]
    with (workdir / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    peer = DemoPeer(name, process, workdir)
    peers[name] = peer
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise ChaosError(f"demo peer {name} did not start:\n{log_tail(peer.log)}")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    peer.peer_id, peer.addr = info["peer_id"], info["addrs"][0]
    return peer


def log_tail(path: Path, lines: int = 15) -> str:
    """The end of a peer's log (the demo's directory is removed when it ends)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(condition: Any, what: str, peers: dict[str, DemoPeer]) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not condition():
        for peer in peers.values():
            code = peer.process.poll()
            if code not in (None, 0, -signal.SIGKILL, -signal.SIGTERM):
                raise ChaosError(f"peer {peer.name} exited with {code}:\n{log_tail(peer.log)}")
        if time.monotonic() > deadline:
            raise ChaosError(f"timed out waiting for {what}")
        time.sleep(0.05)


def members_now(peer: DemoPeer) -> int:
    last = peer.last_step()
    return int(last["members"]) if last else 0


def join_line(peer: DemoPeer) -> str:
    joined = next((r for r in peer.records() if r.get("event") == "joined"), None)
    if joined is None:
        return f"{peer.name} founded the run"
    sources = len(joined["bytes_by_source"])
    members = "1 member" if sources == 1 else f"{sources} members in parallel"
    return (
        f"{peer.name} loaded step {joined['snapshot_step']} ({joined['bytes'] / 1e6:.2f} MB) from {members} "
        f"in {joined['load_s'] * 1e3:.0f} ms, replayed {joined['replayed_steps']} steps, "
        f"admitted at step {joined['admitted_step']}"
    )


def timeline(founder: DemoPeer, names: dict[str, str], marks: dict[tuple[str, str], float]) -> Table:
    """The founder's committed operations; joins, leaves and failures timed from the demo's action."""
    table = Table(title="the run's operations, as the founder committed them", title_justify="left")
    for column in ("operation", "subject", "epoch", "detected after", "decided in", "applied at step"):
        table.add_column(column)
    rebalances = 0
    for record in founder.records():
        if record.get("event") != "operation":
            continue
        if record["kind"] == "throughput":
            rebalances += 1  # batch shares following measured speed: summarised below
            continue
        subject = names.get(record["subject"], record["subject"][:12])
        mark = marks.get((subject, record["kind"]))
        detected = "-" if mark is None else f"{(record['detected_at'] - mark) * 1e3:.0f} ms"
        table.add_row(
            record["kind"],
            subject,
            str(record["epoch"]),
            detected,
            f"{record['decision_ms']:.1f} ms",
            str(record["activation_step"]),
        )
    table.caption = f"plus {rebalances} throughput updates (batch shares following measured speed)"
    return table


def run_demo(console: Console) -> None:
    """Run the demo (about a minute)."""
    console.rule("[bold]chaosp2p demo: a local swarm trains together on 127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="chaosp2p-demo-") as tmp, peer_processes(Path(tmp)) as peers:
        workdir = Path(tmp)
        marks: dict[tuple[str, str], float] = {}  # (peer, operation kind) -> when the demo caused it
        console.rule("1. peer a founds the run; b and c join it")
        a = start(peers, "a", workdir, [])
        console.print(f"  a: {a.peer_id} on {a.addr}")
        for name in ("b", "c"):
            marks[(name, "join")] = time.monotonic()
            start(peers, name, workdir, [a.addr])
        wait_for(lambda: members_now(a) >= 3, "b and c to be admitted", peers)
        for name in ("a", "b", "c"):
            console.print("  " + join_line(peers[name]))

        console.rule("2. peer d joins while the others keep training")
        marks[("d", "join")] = time.monotonic()
        start(peers, "d", workdir, [a.addr])
        wait_for(lambda: members_now(a) >= 4, "d to be admitted", peers)
        console.print("  " + join_line(peers["d"]))

        console.rule("3. b leaves (SIGTERM); c is killed (SIGKILL)")
        marks[("b", "leave")] = time.monotonic()
        peers["b"].process.send_signal(signal.SIGTERM)
        wait_for(lambda: members_now(a) == 3, "the run to commit b's leave", peers)
        marks[("c", "fail")] = time.monotonic()
        peers["c"].process.send_signal(signal.SIGKILL)
        wait_for(lambda: members_now(a) == 2, "the survivors to remove c", peers)
        resumed = a.last_step()
        console.print(f"  a and d train on as 2 members (step {resumed['step'] if resumed else '?'})")

        crash_step = int(resumed["step"]) if resumed else 0
        wait_for(
            lambda: (
                min(int((p.last_step() or {"step": 0})["step"]) for p in (a, peers["d"]))
                >= crash_step + STEPS_AFTER_CRASH
            ),
            f"{STEPS_AFTER_CRASH} more steps",
            peers,
        )
        for name in ("a", "d"):
            peers[name].process.send_signal(signal.SIGTERM)  # both leave: the run ends
        wait_for(lambda: all(peers[n].process.poll() is not None for n in ("a", "d")), "a and d to stop", peers)

        console.rule("4. what happened")
        names = {peer.peer_id: name for name, peer in peers.items()}
        console.print(timeline(a, names, marks))
        console.print(
            "  detected after: from the demo's action (starting the process, SIGTERM, SIGKILL) until a peer\n"
            "  raised the operation; decided in: from its proposal until the founder committed it"
        )
        tables = [{r["step"]: r for r in peers[n].records() if "param_digest" in r and "step" in r} for n in ("a", "d")]
        common = sorted(set(tables[0]) & set(tables[1]))
        if not common:
            raise ChaosError("a and d share no step")
        last = common[-1]
        same = all(tables[0][step]["param_digest"] == tables[1][step]["param_digest"] for step in common)
        console.print(
            f"  a and d hold bit-identical parameters after each of their {len(common)} common steps "
            f"(up to step {last}): {'[green]yes[/]' if same else '[red]NO[/]'}"
        )
        finals = [next((r for r in reversed(peers[n].records()) if "accuracy" in r), None) for n in ("a", "d")]
        if all(finals):
            from chaosp2p.trainers.digits import train_one_process

            accuracy = sum(f["accuracy"] for f in finals if f) / 2
            baseline = train_one_process(last + 1, BATCH)
            console.print(
                f"  test accuracy {accuracy:.3f}; one process trained on the same {last + 1} global batches: "
                f"{baseline:.3f}"
            )
        if not same:
            raise ChaosError("the survivors' parameters differ")
    console.rule("[bold]done: every peer process was stopped")
