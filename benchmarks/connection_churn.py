"""Soak: connections close under a training run while every process stays alive; nobody may be failed.

    python benchmarks/connection_churn.py [--duration-s 180] [--peers 4] [--kill-every-s 0.5]
        [--restart-every-s 30] [--profile local|lan] [--seed 1] [--json PATH]

Issue 19 makes a connection that a member's host closes (EOF or reset, no goodbye) a reason to
check that member at once, and fails it without a suspicion when the check is conclusive (our new
dial fails and every relay answers NACK). This soak shows that the hint alone fails no live
member. ``--peers`` digits peers (``python -m chaosp2p.trainers.digits``, 127.0.0.1, ``local``
with ``lan`` failure detection unless ``--profile lan``) train as one run; meanwhile:

* every ``--kill-every-s`` (jittered, seeded) all TCP connections between two random members are
  destroyed with ``ss -K`` (needs root) in one of the two processes: that side sees ECONNABORTED,
  the other a reset -- to both, the connection closed without a goodbye while the remote process
  lives, so both check the other at once;
* every ``--restart-every-s`` a random member other than the founder leaves gracefully (SIGTERM:
  LEAVE, GOAWAY) and a new process joins in its place.

Counted: sockets destroyed, connection-loss hints acted on ("closed by its host" in the processes'
logs: membership logs at INFO here), FAIL operations committed (founder's metrics) -- each with how
its subject's process ended (still running: a false failure; exit code 1: it crashed, e.g. a
newcomer whose catch-up stream was among the destroyed connections, a known bug of issue 19) --
"member failed" lines in every process's log (membership's own verdicts), LEAVE operations, and
the founder's steps.
A FAIL or a membership failure here is a false one: no process died. Needs ``ss`` (iproute2).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from failover import ROOT, records, start, wait_for


def sockets_of(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of every established loopback TCP socket of process ``pid``."""
    out = subprocess.run(["ss", "-t", "-n", "-p", "-H", "state", "established"], capture_output=True, text=True)
    found = []
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) < 5 or f"pid={pid}," not in line:
            continue
        local, remote = fields[2], fields[3]
        if local.startswith("127.0.0.1:") and remote.startswith("127.0.0.1:"):
            found.append((int(local.rsplit(":", 1)[1]), int(remote.rsplit(":", 1)[1])))
    return found


def destroy(a: int, b: int) -> int:
    """Destroy, in process ``a`` only, every TCP socket it holds to process ``b`` (``ss -K``): ``a``
    sees ECONNABORTED, ``b`` a reset -- to both, the connection closed without a goodbye while the
    other process lives. Returns the number destroyed."""
    theirs = {local for local, _ in sockets_of(b)}
    destroyed = 0
    for local, remote in sockets_of(a):
        if remote not in theirs:
            continue
        filter_ = ["sport", "=", f":{local}", "and", "dport", "=", f":{remote}"]
        result = subprocess.run(["ss", "-K", "-t", "-n", "-H", *filter_], capture_output=True, text=True)
        destroyed += sum(1 for line in result.stdout.splitlines() if line.strip())
    return destroyed


# Digits peers with membership's log at INFO (the hints it acts on: "closed by its host").
LAUNCHER = (
    "-c",
    "import logging, runpy; logging.basicConfig(format='%(asctime)s %(levelname)s %(name)s: %(message)s'); "
    "logging.getLogger('chaosp2p.membership').setLevel(logging.INFO); "
    "runpy.run_module('chaosp2p.trainers.digits', run_name='__main__', alter_sys=True)",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--kill-every-s", type=float, default=0.5)
    parser.add_argument("--restart-every-s", type=float, default=30.0)
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--profile", choices=("local", "lan"), default="local")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path, help="keep the logs and metrics here (default: a temporary folder)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="chaosp2p-churn-") as tmp:
        workdir = Path(tmp) if args.workdir is None else args.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        processes: list[subprocess.Popen[bytes]] = []
        live: list[tuple[subprocess.Popen[bytes], dict[str, Any]]] = []
        started: list[tuple[subprocess.Popen[bytes], dict[str, Any]]] = []
        try:
            first, founder_metrics, founder = start("p0", workdir, [], args.pace, False, ROOT, args.profile, LAUNCHER)
            processes.append(first)
            live.append((first, founder))
            started.append((first, founder))
            bootstrap = founder["addrs"][0]
            for index in range(1, args.peers):
                process, _, info = start(
                    f"p{index}", workdir, [bootstrap], args.pace, False, ROOT, args.profile, LAUNCHER
                )
                processes.append(process)
                live.append((process, info))
                started.append((process, info))

            def steps() -> list[dict[str, Any]]:
                return [r for r in records(founder_metrics) if "param_digest" in r and "step" in r]

            wait_for(lambda: bool(steps()) and steps()[-1]["members"] == args.peers, "all members")
            first_step = steps()[-1]["step"]
            destroyed = attempts = restarts = 0
            began = time.monotonic()
            next_restart = began + args.restart_every_s
            spawned = args.peers
            while time.monotonic() - began < args.duration_s:
                time.sleep(rng.uniform(0.5, 1.5) * args.kill_every_s)
                (a, _), (b, _) = rng.sample(live, 2)
                destroyed += destroy(a.pid, b.pid)
                attempts += 1
                if time.monotonic() >= next_restart and len(live) > 2:
                    next_restart += args.restart_every_s
                    victim = rng.randrange(1, len(live))
                    process, _ = live.pop(victim)
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=60)
                    name = f"p{spawned}"
                    spawned += 1
                    process, _, info = start(
                        name, workdir, [bootstrap], args.pace, False, ROOT, args.profile, LAUNCHER
                    )
                    processes.append(process)
                    live.append((process, info))
                    started.append((process, info))
                    restarts += 1
            time.sleep(3.0)  # let a verdict on the last destroyed connections land
            operations = [r for r in records(founder_metrics) if r.get("event") == "operation"]
            kinds: dict[str, int] = {}
            for op in operations:
                kinds[op["kind"]] = kinds.get(op["kind"], 0) + 1
            failed_lines = hints = 0
            for log in workdir.glob("*.log"):
                lines = log.read_text(errors="replace").splitlines()
                failed_lines += sum("member failed" in line for line in lines)
                hints += sum("closed by its host" in line for line in lines)
            crashed = [p for p in processes if p.poll() not in (None, 0)]
            by_id = {info["peer_id"]: process for process, info in started}
            fails = [
                {
                    "subject": op["subject"],
                    "origin": op["origin"],
                    "epoch": op["epoch"],
                    # None: the subject still runs -- a false failure. Otherwise how it ended.
                    "subject_exit_code": by_id[op["subject"]].poll() if op["subject"] in by_id else "unknown",
                }
                for op in operations
                if op["kind"] == "fail"
            ]
            result = {
                "duration_s": args.duration_s,
                "peers": args.peers,
                "profile": args.profile,
                "destroy_attempts": attempts,
                "sockets_destroyed": destroyed,
                "graceful_restarts": restarts,
                "operations": kinds,
                "fail_operations": kinds.get("fail", 0),
                "false_fail_operations": sum(1 for f in fails if f["subject_exit_code"] is None),
                "member_failed_log_lines": failed_lines,
                "connection_loss_hints": hints,
                "founder_steps": steps()[-1]["step"] - first_step,
                "members_at_end": steps()[-1]["members"],
                "processes_exited_early": len(crashed),
                "exit_codes_of_those": [p.returncode for p in crashed],
                "fails": fails,
                "load_before": load_before,
                "load_after": os.getloadavg(),
            }
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
