"""Training benchmarks (b) and (c): a join while the members train, and a member slowed 2x.

    python benchmarks/training_elastic.py [--parts b,c] [--repeats 2] [--json out.json] [--workdir DIR]
        [--members 3] [--state-mb 50] [--batch 24] [--compute-s 0.3] [--upload-cap-mbs 0]
        [--balance-state-mb 10] [--balance-steps 30] [--slowdown 2]

``--upload-cap-mbs`` caps every peer's total upload (averaging included), standing in for each
peer's own uplink: on loopback without it, the host's CPU (encryption, hashing), not any link, limits
a download, so several sources cannot beat one. ``--workdir`` keeps the peers' logs and metrics.

Every peer is a separate process (``benchmarks/_elastic_peer.py``: an MLP whose parameters plus
Adam's two moments come to ``--state-mb`` MB, synthetic data, and a sleep of ``--compute-s`` per
step at an equal share of the global batch standing in for a bigger model; the sleep grows with
the local batch). All processes run on 127.0.0.1 over chaosp2p's encrypted transport, ``local``
profile with LAN membership timings. Figures are medians over ``--repeats``; ratios are computed
within each repeat (same run, same load) and their median is shown.

(b) A join. ``--members`` members train; then, in each repeat and in alternating order:

    chaosp2p        a newcomer joins while the members train: it pulls a snapshot from every
                    member in parallel, replays the steps after it and is admitted;
    single source   the same, but the newcomer loads the snapshot from one member only
                    (``CollaborationConfig.max_snapshot_sources=1``).

    Each newcomer trains a few steps and is SIGKILLed (``--newcomer-exit leave``: SIGTERM, a
    graceful leave); the members train on until they are steady again. Then, as the last trial of the repeat:

    checkpoint-restart  the newcomer "arrives" (the harness writes the stop step), every member
                    stops at that step, the founder saves model + Adam with ``torch.save``, all
                    processes exit, and members + newcomer restart as new processes that load the
                    checkpoint from disk and continue with ``torch.distributed`` (gloo, TCP,
                    unencrypted) -- the cheapest restart there is on one host.

    Measured: the members' lost wall time -- over the steps they complete between the newcomer's
    arrival and the step in which it first contributes, the sum of (step period - median period
    of the steady steps before), averaged over members (``lost_rounds``: the same in steady
    periods, i.e. averaging rounds lost); for checkpoint-restart: (first step after
    the restart - last step before the stop) - one steady period. The members' excess idle time is
    the same sum over ``idle_s`` (time in ``step()`` not computing) -- for chaosp2p joins only, the
    stopped members have none. The newcomer's time from its arrival (process launch; for
    checkpoint-restart, the stop request) until it completed its first step; "of it: joining" is the
    part after its process had imported torch and built its model (chaosp2p: peer start, snapshot,
    replay, admission, first step; checkpoint-restart: torch.load, gloo rendezvous, first step); and
    its snapshot load (seconds, bytes per source). The members' window for chaosp2p joins starts at
    that point too: before it the newcomer only competes for the host's cores.

(c) A member slowed ``--slowdown`` times (its whole compute, stand-in sleep and real forward/
    backward, takes that much longer). ``--members`` members train with straggler balancing on
    (``rebalance_interval_steps=5``) and, in a separate run of processes, off
    (``CollaborationConfig.balance=False``), alternating order per repeat. Over the steps after
    ``--balance-warmup`` steps with everyone, the median idle time per step of the members that are
    not slowed, the slowed member's, the step period and samples per second; and the final batch
    shares.

Nothing here is in CI. Conditions (cores, load averages, whether the configuration's links carried
measured bandwidths) are printed with the tables and stored in the JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import median, print_table, write_json

HERE = Path(__file__).resolve().parent
PEER = HERE / "_elastic_peer.py"
READY_TIMEOUT_S = 600.0
SLOW_TIMEOUT_S = 900.0  # a newcomer's start on a busy 2-core machine (imports, model, join)


# ---------------------------------------------------------------------------------------- processes
@dataclass
class Proc:
    """One peer process and its files."""

    name: str
    process: subprocess.Popen[bytes]
    workdir: Path
    launched: float
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> Path:
        return self.workdir / f"{self.name}.jsonl"

    @property
    def ready(self) -> Path:
        return self.workdir / f"{self.name}.ready"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def addr(self) -> str:
        return str(self.info["addrs"][0])

    def records(self) -> list[dict[str, Any]]:
        out = []
        if self.metrics.exists():
            for line in self.metrics.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a line being written
        return out

    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "step" in r and "time" in r and "event" not in r]

    def event(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.records() if r.get("event") == name), None)

    def final(self) -> dict[str, Any] | None:
        return next((r for r in self.records() if "final_step" in r), None)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{tail}")


class Cluster:
    """Starts peer processes in ``workdir``; every one of them is gone when the block ends."""

    def __init__(self, workdir: Path, common: list[str], python: str | None = None, script: Path | None = None) -> None:
        self.workdir = workdir
        self.common = common
        self.procs: list[Proc] = []
        self.python = python  # default: this interpreter
        self.script = script  # default: PEER, looked up at launch (other benchmarks replace it)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for proc in self.procs:
            if proc.process.poll() is None:
                proc.process.kill()
        for proc in self.procs:
            proc.process.wait()

    def launch(self, name: str, args: list[str], *, ready: bool = True) -> Proc:
        command = [self.python or sys.executable, str(self.script or PEER), *self.common, *args]
        proc = Proc(name, None, self.workdir, time.time())  # type: ignore[arg-type]
        if ready:
            command += ["--ready-file", str(proc.ready)]
        command += ["--metrics-file", str(proc.metrics)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with proc.log.open("wb") as log:
            proc.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self.procs.append(proc)
        return proc

    def wait_ready(self, procs: list[Proc]) -> None:
        def done() -> bool:
            for proc in procs:
                if not proc.info:
                    if proc.ready.exists():
                        proc.info = json.loads(proc.ready.read_text())  # written by rename: complete
                    else:
                        proc.check_alive()
            return all(p.info for p in procs)

        wait_for(done, "peers to listen", READY_TIMEOUT_S)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_members(cluster: Cluster, count: int, extra: Callable[[int], list[str]]) -> list[Proc]:
    """The founder, then the others joining it (launched together), all training with ``count`` members."""
    founder = cluster.launch("m0", extra(0))
    cluster.wait_ready([founder])
    others = [cluster.launch(f"m{i}", ["--join", founder.addr, *extra(i)]) for i in range(1, count)]
    cluster.wait_ready(others)
    members = [founder, *others]

    def everyone() -> bool:
        for proc in members:
            proc.check_alive()
        return all((s := p.steps()) and s[-1]["members"] == count for p in members)

    wait_for(everyone, f"{count} members training together", SLOW_TIMEOUT_S)
    return members


def wait_steady(members: list[Proc], count: int, steps: int) -> None:
    """Until every member completed ``steps`` steps in a row with ``count`` members."""

    def steady() -> bool:
        for proc in members:  # every member's liveness first: a crash must end the wait at once
            proc.check_alive()
        for proc in members:
            tail = proc.steps()[-steps:]
            if len(tail) < steps or any(r["members"] != count for r in tail):
                return False
        return True

    wait_for(steady, f"{steps} steady steps with {count} members", SLOW_TIMEOUT_S)


def periods(steps: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """Each step with the wall time since the previous step's completion."""
    return [(b, b["time"] - a["time"]) for a, b in itertools.pairwise(steps)]


def steady_before(proc: Proc, moment: float, count: int) -> tuple[float, float]:
    """Median period and median idle_s of the ``count`` steps a member completed before ``moment``."""
    before = [r for r in proc.steps() if r["time"] <= moment][-(count + 1) :]
    pairs = periods(before)
    return median([p for _, p in pairs]), median([r["idle_s"] for r, _ in pairs])


# ---------------------------------------------------------------------------------------- (b)
def join_trial(
    cluster: Cluster, members: list[Proc], args: argparse.Namespace, name: str, sources: int
) -> dict[str, Any]:
    """A newcomer joins while the members train; it leaves again after a few steps.

    The members' window starts when the newcomer has imported torch and built its model, i.e. when
    it starts its peer and begins to join: before that it only competes for this host's cores.
    """
    count = len(members)
    load_avg = os.getloadavg()[0]
    arrived = time.time()
    newcomer = cluster.launch(name, ["--join", members[0].addr, "--max-snapshot-sources", str(sources)])

    def contributed() -> bool:
        newcomer.check_alive()
        return bool(newcomer.steps())

    wait_for(contributed, f"{name} to contribute a step", SLOW_TIMEOUT_S)
    first = newcomer.steps()[0]
    wait_for(lambda: members[0].steps()[-1]["step"] >= first["step"] + args.after_steps, "steps after the join", 300)
    # By default the newcomer is SIGKILLed (the run removes it with a FAIL): before commit 975ad30 a
    # graceful leave right after admission crashed members here ("step N is gated at N" in
    # report_step); 4 of 4 graceful leaves were clean after it.
    newcomer.process.send_signal(signal.SIGTERM if args.newcomer_exit == "leave" else signal.SIGKILL)
    try:
        newcomer.process.wait(120)
    except subprocess.TimeoutExpired:
        newcomer.process.kill()
        newcomer.process.wait()
    started = newcomer.event("started") or {}
    joining = started.get("model_built", arrived)
    lost, idle, stall, window = [], [], [], 0
    for proc in members:
        period0, idle0 = steady_before(proc, arrived, args.steady_steps)
        # the steps completed after the newcomer began to join, up to the one it first took part in
        during = [(r, p) for r, p in periods(proc.steps()) if r["time"] > joining and r["step"] <= first["step"]]
        lost.append(sum(p - period0 for _, p in during))
        idle.append(sum(r["idle_s"] - idle0 for r, _ in during))
        stall.append(max((p - period0 for _, p in during), default=0.0))
        window = max(window, len(during))
    joined = newcomer.event("joined") or {}
    admitted = newcomer.event("admitted") or {}
    wait_steady(members, count, args.steady_steps)
    period = median([steady_before(p, arrived, args.steady_steps)[0] for p in members])
    return {
        "lost_s": sum(lost) / count,
        "lost_rounds": sum(lost) / count / period,
        "excess_idle_s": sum(idle) / count,
        "max_stall_s": max(stall),
        "window_steps": window,
        "steady_period_s": period,
        "to_contribute_s": first["time"] - arrived,
        "to_model_built_s": joining - arrived,
        "join_to_contribute_s": first["time"] - joining,
        "to_admitted_s": admitted.get("time", arrived) - arrived,
        "load_s": joined.get("load_s"),
        "sources": joined.get("sources"),
        "bytes": joined.get("bytes"),
        "bytes_by_source": sorted((joined.get("bytes_by_source") or {}).values(), reverse=True),
        "replayed_steps": joined.get("replayed_steps"),
        "first_step": first["step"],
        "load_avg": load_avg,
    }


def restart_trial(cluster: Cluster, members: list[Proc], args: argparse.Namespace) -> dict[str, Any]:
    """Everyone stops at a step, the founder saves, all restart (one more) and reload from disk."""
    count = len(members)
    load_avg = os.getloadavg()[0]
    stop_at = max(p.steps()[-1]["step"] for p in members) + 3
    temporary = args.stop_file.with_suffix(".tmp")
    temporary.write_text(str(stop_at))
    arrived = time.time()
    os.replace(temporary, args.stop_file)
    wait_for(lambda: all(p.process.poll() is not None for p in members), "the members to stop", 300)
    if not args.checkpoint.exists():
        raise RuntimeError(f"no checkpoint written; see {members[0].log}")
    restarted_at = time.time()
    gloo = f"tcp://127.0.0.1:{free_port()}"
    world = count + 1
    restarted = [
        cluster.launch(
            f"r{rank}-{int(restarted_at)}",
            [
                "--restart-from",
                str(args.checkpoint),
                "--gloo-init",
                gloo,
                "--rank",
                str(rank),
                "--world",
                str(world),
                "--steps",
                "3",
            ],
            ready=False,
        )
        for rank in range(world)
    ]

    def finished() -> bool:
        for proc in restarted:
            if proc.process.poll() not in (None, 0):
                proc.check_alive()
        return all(p.process.poll() == 0 for p in restarted)

    wait_for(finished, "the restarted processes", SLOW_TIMEOUT_S)
    last_before = [p.steps()[-1] for p in members]
    if any(r["step"] != stop_at - 1 for r in last_before):
        raise RuntimeError(f"members did not all stop after step {stop_at - 1}: {[r['step'] for r in last_before]}")
    stopped = sum(r["time"] for r in last_before) / count
    first_after = max(p.steps()[0]["time"] for p in restarted)
    period0 = median([steady_before(p, arrived, args.steady_steps)[0] for p in members])
    events = [p.event("restarted") or {} for p in restarted]
    saved = members[0].event("checkpoint_saved") or {}
    return {
        "lost_s": first_after - stopped - period0,
        "lost_rounds": (first_after - stopped - period0) / period0,
        "steady_period_s": period0,
        "to_contribute_s": first_after - arrived,
        "save_s": saved.get("save_s"),
        "stop_to_restart_s": restarted_at - stopped,
        "restart_to_model_built_s": max(e["model_built"] for e in events) - restarted_at,
        "restart_to_loaded_s": max(e["loaded"] for e in events) - restarted_at,
        "restart_to_met_s": max(e["met"] for e in events) - restarted_at,
        "restart_to_first_step_s": first_after - restarted_at,
        "join_to_contribute_s": first_after - max(e["model_built"] for e in events),
        "checkpoint_bytes": args.checkpoint.stat().st_size,
        "stop_step": stop_at,
        "load_avg": load_avg,
    }


def part_b(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    links: list[int] = []
    for repeat in range(args.repeats):
        workdir = root / f"b{repeat}"
        workdir.mkdir()
        args.stop_file, args.checkpoint = workdir / "stop-step", workdir / "checkpoint.pt"
        common = [
            "--state-mb",
            str(args.state_mb),
            "--batch",
            str(args.batch),
            "--compute-s",
            str(args.compute_s),
            "--ref-members",
            str(args.members),
            "--steps",
            "1000000",
            "--no-balance",
            "--upload-cap-mbs",
            str(args.upload_cap_mbs),
        ]
        began = time.monotonic()
        with Cluster(workdir, common) as cluster:
            stopping = ["--stop-file", str(args.stop_file), "--checkpoint", str(args.checkpoint)]
            members = start_members(cluster, args.members, lambda i, extra=stopping: extra)
            wait_steady(members, args.members, args.steady_steps)
            trial: dict[str, Any] = {"load_avg_start": os.getloadavg()}
            order = [("chaosp2p", 0), ("single", 1)]
            for kind, sources in order if repeat % 2 == 0 else order[::-1]:
                trial[kind] = join_trial(cluster, members, args, f"n-{kind}", sources)
                print(f"[b repeat {repeat + 1}: {kind} join done, load {os.getloadavg()[0]:.1f}]", flush=True)
            trial["restart"] = restart_trial(cluster, members, args)
            trial["load_avg_end"] = os.getloadavg()
            links += [(p.final() or {}).get("links_with_bandwidth", 0) for p in members]
        print(f"[b repeat {repeat + 1} done in {time.monotonic() - began:.0f} s]", flush=True)
        trials.append(trial)
    return {"trials": trials, "links_with_bandwidth": links}


# ---------------------------------------------------------------------------------------- (c)
def balance_run(args: argparse.Namespace, workdir: Path, balance: bool) -> dict[str, Any]:
    stop_file = workdir / "stop-step"
    common = [
        "--state-mb",
        str(args.balance_state_mb),
        "--batch",
        str(args.batch),
        "--compute-s",
        str(args.compute_s),
        "--ref-members",
        str(args.members),
        "--steps",
        "1000000",
        "--rebalance-steps",
        "5",
        "--balance" if balance else "--no-balance",
        "--stop-file",
        str(stop_file),
    ]
    slow = args.members - 1

    def extra(index: int) -> list[str]:
        return ["--slowdown", str(args.slowdown)] if index == slow else []

    with Cluster(workdir, common) as cluster:
        members = start_members(cluster, args.members, extra)
        began = min(p.steps()[-1]["step"] for p in members)
        wanted = began + args.balance_warmup + args.balance_steps
        wait_for(lambda: all(p.steps()[-1]["step"] >= wanted for p in members), "the measured steps", SLOW_TIMEOUT_S)
        stop_file.write_text(str(wanted + 2))
        wait_for(lambda: all(p.process.poll() is not None for p in members), "the members to stop", 300)
        per_member = []
        for index, proc in enumerate(members):
            window = [
                (r, p)
                for r, p in periods(proc.steps())
                if began + args.balance_warmup < r["step"] <= wanted and r["members"] == args.members
            ]
            final = proc.final() or {}
            per_member.append(
                {
                    "slowed": index == slow,
                    "idle_s": median([r["idle_s"] for r, _ in window]),
                    "period_s": median([p for _, p in window]),
                    "compute_s": median([r["compute_s"] for r, _ in window]),
                    "final_samples": window[-1][0]["samples"],
                    "steps": len(window),
                    "links_with_bandwidth": final.get("links_with_bandwidth"),
                }
            )
    others = [m for m in per_member if not m["slowed"]]
    slowed = next(m for m in per_member if m["slowed"])
    period = median([m["period_s"] for m in per_member])
    return {
        "others_idle_s": median([m["idle_s"] for m in others]),
        "slowed_idle_s": slowed["idle_s"],
        "period_s": period,
        "samples_per_s": args.batch / period,
        "shares": [m["final_samples"] for m in per_member],
        "members": per_member,
    }


def part_c(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    trials = []
    for repeat in range(args.repeats):
        trial: dict[str, Any] = {"load_avg_start": os.getloadavg()}
        began = time.monotonic()
        for balance in (True, False) if repeat % 2 == 0 else (False, True):
            workdir = root / f"c{repeat}-{'on' if balance else 'off'}"
            workdir.mkdir()
            trial["on" if balance else "off"] = balance_run(args, workdir, balance)
            print(f"[c repeat {repeat + 1}: balancing {'on' if balance else 'off'} done]", flush=True)
        trial["load_avg_end"] = os.getloadavg()
        print(f"[c repeat {repeat + 1} done in {time.monotonic() - began:.0f} s]", flush=True)
        trials.append(trial)
    return {"trials": trials}


# ---------------------------------------------------------------------------------------- output
def ratio_median(trials: list[dict[str, Any]], key: str, kind: str, base: str = "chaosp2p", floor: float = 0.05) -> str:
    """Median over repeats of trial[kind][key] / trial[base][key] (only where the base exceeds ``floor``)."""
    ratios = [t[kind][key] / t[base][key] for t in trials if t[base][key] > floor]
    return f"{median(ratios):.2f}x" if ratios else f"n/a ({base} <= {floor} s)"


def show_b(report: dict[str, Any], args: argparse.Namespace) -> None:
    trials = report["trials"]

    def m(kind: str, key: str) -> float:
        return median([t[kind][key] for t in trials])

    rows = []
    for kind, label in (
        ("chaosp2p", "chaosp2p join (all sources)"),
        ("single", "chaosp2p join, 1 source"),
        ("restart", "checkpoint-restart (gloo)"),
    ):
        join = kind != "restart"

        def vs(key: str, kind: str = kind) -> str:
            return "1" if kind == "chaosp2p" else ratio_median(trials, key, kind)

        rows.append(
            [
                label,
                m(kind, "lost_s"),
                m(kind, "lost_rounds"),
                vs("lost_s"),
                m(kind, "excess_idle_s") if join else "-",
                m(kind, "max_stall_s") if join else "-",
                m(kind, "to_contribute_s"),
                vs("to_contribute_s"),
                m(kind, "join_to_contribute_s"),
                vs("join_to_contribute_s"),
                m(kind, "load_s") if join else "-",
                vs("load_s") if join else "-",
                " / ".join(f"{b / 1e6:.0f}" for b in trials[-1][kind]["bytes_by_source"]) if join else "disk",
                m(kind, "load_avg"),
            ]
        )
    print_table(
        f"(b) join into {args.members} members, {args.state_mb:g} MB params+Adam, batch {args.batch}, "
        f"compute {args.compute_s:g} s/step; medians of {len(trials)}, ratios per repeat",
        [
            "scenario",
            "members' lost s",
            "in rounds",
            "vs",
            "members' excess idle s",
            "worst step +s",
            "newcomer: launch to 1st step s",
            "vs",
            "of it: joining s",
            "vs",
            "snapshot load s",
            "vs",
            "MB per source (last repeat)",
            "load avg",
        ],
        rows,
    )
    print_table(
        "(b) newcomer timeline, s after arrival (medians)",
        ["scenario", "model built", "admitted / state loaded", "first step", "steady step s", "replayed steps"],
        [
            [
                kind,
                m(kind, "to_model_built_s"),
                m(kind, "to_admitted_s"),
                m(kind, "to_contribute_s"),
                m(kind, "steady_period_s"),
                m(kind, "replayed_steps"),
            ]
            for kind in ("chaosp2p", "single")
        ]
        + [
            [
                "restart (s after the restart)",
                m("restart", "restart_to_model_built_s"),
                m("restart", "restart_to_loaded_s"),
                m("restart", "restart_to_first_step_s"),
                m("restart", "steady_period_s"),
                "-",
            ]
        ],
    )
    print(
        f"checkpoint-restart: save {m('restart', 'save_s'):.2f} s, last step -> restart launched "
        f"{m('restart', 'stop_to_restart_s'):.2f} s, launched -> gloo rendezvous "
        f"{m('restart', 'restart_to_met_s'):.2f} s"
    )


def show_c(report: dict[str, Any], args: argparse.Namespace) -> None:
    trials = report["trials"]

    def m(kind: str, key: str) -> float:
        return median([t[kind][key] for t in trials])

    rows = []
    for kind in ("on", "off"):
        ratio = "1" if kind == "on" else ratio_median(trials, "others_idle_s", "off", "on", 0.0)
        rows.append(
            [
                f"balancing {kind}",
                m(kind, "others_idle_s"),
                ratio,
                m(kind, "slowed_idle_s"),
                m(kind, "period_s"),
                m(kind, "samples_per_s"),
                " / ".join(str(s) for s in trials[-1][kind]["shares"]),
            ]
        )
    print_table(
        f"(c) 1 of {args.members} members slowed {args.slowdown:g}x, {args.balance_state_mb:g} MB, batch {args.batch}, "
        f"compute {args.compute_s:g} s/step; medians over {args.balance_steps} steps x {len(trials)} repeats",
        [
            "run",
            "others' idle s/step",
            "vs on",
            "slowed member's idle s/step",
            "step s",
            "samples/s",
            "final shares (last repeat; slowed last)",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="b,c", help="comma-separated: b, c")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--members", type=int, default=3, help="existing members")
    parser.add_argument("--state-mb", type=float, default=50.0, help="(b) parameters + Adam moments, MB")
    parser.add_argument("--batch", type=int, default=24, help="global batch (samples per step)")
    parser.add_argument("--compute-s", type=float, default=0.3, help="stand-in compute per step at an equal share")
    parser.add_argument("--steady-steps", type=int, default=8, help="(b) steady steps before each trial")
    parser.add_argument("--after-steps", type=int, default=3, help="(b) steps a newcomer trains before leaving")
    parser.add_argument("--upload-cap-mbs", type=float, default=0.0, help="(b) cap every peer's upload, MB/s")
    parser.add_argument(
        "--newcomer-exit", choices=("kill", "leave"), default="kill", help="(b) how a newcomer goes after its trial"
    )
    parser.add_argument("--balance-state-mb", type=float, default=10.0, help="(c) parameters + Adam moments, MB")
    parser.add_argument("--slowdown", type=float, default=2.0, help="(c) the slowed member's factor")
    parser.add_argument("--balance-warmup", type=int, default=15, help="(c) steps with everyone before measuring")
    parser.add_argument("--balance-steps", type=int, default=30, help="(c) steps measured")
    parser.add_argument("--json", default=None)
    parser.add_argument("--workdir", type=Path, help="keep the peers' logs and metrics here (default: a temporary dir)")
    args = parser.parse_args()
    os.environ.setdefault("COLUMNS", "220")  # rich: the tables are wide; do not wrap them at 80 columns
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    report: dict[str, Any] = {"load_avg_start": os.getloadavg(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="chaosp2p-elastic-") as tmp:
        root = Path(tmp)
        if args.workdir is not None:
            args.workdir.mkdir(parents=True)  # a fresh directory: trials make their own below it
            root = args.workdir
        if "b" in parts:
            report["b"] = part_b(args, root)
        if "c" in parts:
            report["c"] = part_c(args, root)
    report["load_avg_end"] = os.getloadavg()
    if "b" in report:
        show_b(report["b"], args)
    if "c" in report:
        show_c(report["c"], args)
    links = report.get("b", {}).get("links_with_bandwidth", []) + [
        m["links_with_bandwidth"] or 0
        for t in report.get("c", {}).get("trials", [])
        for k in ("on", "off")
        for m in t[k]["members"]
    ]
    cap_note = f"capped at {args.upload_cap_mbs:g} MB/s" if args.upload_cap_mbs > 0 else "not capped (loopback)"
    gloo_note = " (the restart baseline's gloo is unencrypted)" if "b" in report else ""
    print(
        f"conditions: {os.cpu_count()} cores shared with other work (load average {report['load_avg_start'][0]:.1f} "
        f"at start, {report['load_avg_end'][0]:.1f} at end); every process on 127.0.0.1, Noise-encrypted transport"
        f"{gloo_note}; (b) upload per peer {cap_note}; link bandwidths in the agreed configuration: "
        f"{'known on some members' if any(links) else 'unknown (equal shards)'}"
    )
    stored = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_json(args.json, {"benchmark": "training_elastic", "args": stored, **report})


if __name__ == "__main__":
    main()
