"""Failure end to end: from ``kill -9`` of a member until training resumes at the survivors.

Starts N digits peers (``python -m chaosp2p.trainers.digits``, real processes on 127.0.0.1, the
``local`` profile), waits until all of them train as one run, SIGKILLs one member mid-run and reads
the survivors' metrics files:

* detection: kill -> the FAIL operation is raised (``detected_at`` of the committed operation);
* decision: raised -> committed at the founder;
* resume: kill -> the first step the survivors complete without the killed member.

Run: ``python benchmarks/failover.py [--peers 4] [--repeats 3] [--json PATH]``. Times are wall-clock
on a shared 2-core machine (every peer is a process competing for the same cores): report the
conditions with the figures.

``--against DIR`` runs the same trials, alternating, with the chaosp2p package of another checkout
(e.g. ``git archive main | tar -x -C /tmp/base``): both figures then come from one run, under the
same load. ``--profile lan`` runs the peers on the whole ``lan`` profile (``peers/lan.toml``,
listening on loopback) instead of ``local`` with ``lan`` failure-detection timers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def lan_on_loopback(workdir: Path, code: Path) -> Path:
    """``peers/lan.toml`` of the checkout ``code``, listening on 127.0.0.1 on a free port."""
    text = (code / "peers" / "lan.toml").read_text()
    path = workdir / "lan-loopback.toml"
    path.write_text(text.replace('listen = ["/ip4/0.0.0.0/tcp/4001"]', 'listen = ["/ip4/127.0.0.1/tcp/0"]'))
    return path


def start(
    name: str,
    workdir: Path,
    join: list[str],
    pace: float,
    fast: bool,
    code: Path,
    profile: str,
    launcher: tuple[str, ...] = ("-m", "chaosp2p.trainers.digits"),
) -> tuple[subprocess.Popen[bytes], Path, dict[str, Any]]:
    ready = workdir / f"{name}.ready"
    metrics = workdir / f"{name}.jsonl"
    command = [sys.executable, *launcher, "--steps", "1000000", "--batch", "64"]
    command += ["--pace", str(pace), "--ready-file", str(ready), "--metrics-file", str(metrics)]
    if profile != "local":
        command += ["--profile", str(lan_on_loopback(workdir, code)) if profile == "lan" else profile]
    for addr in join:
        command += ["--join", addr]
    if fast:
        command.append("--fast-failure-detection")
    env = {**os.environ, "PYTHONPATH": str(code)}
    with (workdir / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=code
        )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"peer {name} did not start; see {workdir / (name + '.log')}")
        time.sleep(0.05)
    return process, metrics, json.loads(ready.read_text())


def records(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def wait_for(condition: Any, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def one_trial(peers: int, pace: float, fast: bool, code: Path = ROOT, profile: str = "local") -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="chaosp2p-failover-") as tmp:
        workdir = Path(tmp)
        processes: list[subprocess.Popen[bytes]] = []
        try:
            first, first_metrics, info = start("p0", workdir, [], pace, fast, code, profile)
            processes.append(first)
            files = [first_metrics]
            victim_id = ""
            for index in range(1, peers):
                process, metrics, ready = start(f"p{index}", workdir, [info["addrs"][0]], pace, fast, code, profile)
                processes.append(process)
                files.append(metrics)
                victim_id = ready["peer_id"]

            def steps(path: Path) -> list[dict[str, Any]]:
                return [r for r in records(path) if "param_digest" in r and "step" in r]

            wait_for(lambda: all(s and s[-1]["members"] == peers for s in map(steps, files)), "all members")
            before = steps(files[0])[-1]["step"]
            wait_for(lambda: steps(files[0])[-1]["step"] >= before + 30, "30 steps with everyone")
            victim = processes[-1]
            killed_wall, killed_mono = time.time(), time.monotonic()
            victim.send_signal(signal.SIGKILL)
            survivors = files[:-1]

            def after(path: Path) -> list[dict[str, Any]]:
                # Steps completed after the kill without the victim (the run had fewer members
                # while it formed, too).
                return [r for r in steps(path) if r["time"] > killed_wall and r["members"] == peers - 1]

            def failure() -> dict[str, Any] | None:
                return next(
                    (
                        r
                        for r in records(files[0])
                        if r.get("event") == "operation"
                        and r["kind"] == "fail"
                        and r["subject"] == victim_id
                        and r["detected_at"] >= killed_mono
                    ),
                    None,
                )

            wait_for(lambda: all(after(f) for f in survivors), "survivors resume")
            resumed = max(min(r["time"] for r in after(f)) for f in survivors)
            # A peer writes a step's record before the events of that step: wait for the operation.
            wait_for(lambda: failure() is not None, "the founder's record of the failure", timeout_s=30)
            operation = failure()
            assert operation is not None
            before_kill = [r["time"] for r in steps(files[0]) if r["time"] < killed_wall]
            intervals = [b - a for a, b in zip(before_kill[-21:], before_kill[-20:], strict=False)]
            redo = after(files[0])[0]
            return {
                "detect_s": operation["detected_at"] - killed_mono,
                "decide_ms": operation["decision_ms"],
                "commit_s": operation["committed_at"] - killed_mono,
                "resume_s": resumed - killed_wall,
                "last_step_before_kill_s": killed_wall - before_kill[-1],
                "step_interval_s": statistics.median(intervals),
                "first_step_after_attempts": redo.get("attempts"),
                "first_step_after_round_s": redo.get("round_s"),
                "load_1m": os.getloadavg()[0],
            }
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
            for process in processes:
                process.wait()


STAGES = (
    ("detect_s", "kill -> failure detected (s)"),
    ("decide_ms", "failure proposed -> committed (ms)"),
    ("commit_s", "kill -> committed (s)"),
    ("resume_s", "kill -> survivors complete a step without it (s)"),
    ("step_interval_s", "step interval before the kill (s)"),
    ("load_1m", "load average (1 min) after the trial"),
)


def table(trials: list[dict[str, float]]) -> None:
    """Median, min and max of each stage, and every resume time."""
    print("| stage | median | min | max |")
    print("|---|---|---|---|")
    for key, label in STAGES:
        values = [t[key] for t in trials]
        print(f"| {label} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    print("resume (s), each trial:", ", ".join(f"{t['resume_s']:.3f}" for t in trials))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.02, help="seconds of stand-in compute per step")
    parser.add_argument(
        "--fast-failure-detection",
        action="store_true",
        help="the local profile's own failure detector (digits peers otherwise use lan timers on local)",
    )
    parser.add_argument("--profile", choices=("local", "lan"), default="local")
    parser.add_argument("--against", type=Path, help="another checkout to run the same trials with, alternating")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    codes = {"this": ROOT} if args.against is None else {"this": ROOT, "against": args.against.resolve()}
    trials: dict[str, list[dict[str, float]]] = {label: [] for label in codes}
    for _ in range(args.repeats):
        for label, code in codes.items():
            trials[label].append(one_trial(args.peers, args.pace, args.fast_failure_detection, code, args.profile))
    detector = args.profile if args.profile == "lan" else ("local" if args.fast_failure_detection else "lan")
    for label, code in codes.items():
        print(
            f"kill -9 of 1 of {args.peers} digits peers ({args.profile} profile, {detector} failure detector), "
            f"code {code}, medians of {args.repeats}:"
        )
        table(trials[label])
    if args.json:
        payload: dict[str, Any] = {
            "peers": args.peers,
            "pace_s": args.pace,
            "profile": args.profile,
            "failure_detector": detector,
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "trials": trials["this"],
        }
        if args.against is not None:
            payload["against"] = str(args.against)
            payload["trials_against"] = trials["against"]
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
