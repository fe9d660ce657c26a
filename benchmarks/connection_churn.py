"""Soak: connections close under a training run while every process stays alive; nobody may be failed.

    python benchmarks/connection_churn.py [--duration-s 180] [--peers 4] [--kill-every-s 0.5]
        [--restart-every-s 30] [--profile local|lan] [--seed 1] [--json PATH]

Issue 19 makes a connection that a member's host closes (EOF or reset, no goodbye) a reason to
check that member at once, and fails it without a suspicion when the check is conclusive (our new
dial fails and every relay answers NACK). This soak shows that the hint alone fails no live
member. ``--peers`` digits peers (``python -m chaosp2p.trainers.digits``, 127.0.0.1, ``local``
with ``lan`` failure detection unless ``--profile lan``) train as one run; meanwhile:

* every ``--kill-every-s`` (jittered, seeded) the TCP connections between two random members are
  destroyed with ``ss -K`` (needs root), from one side: that side sees ECONNABORTED, the other a
  reset -- to both, the connection closed without a goodbye while the remote process lives;
* every ``--restart-every-s`` a random member other than the founder leaves gracefully (SIGTERM:
  LEAVE, GOAWAY) and a new process joins in its place.

Counted: sockets destroyed, FAIL operations committed (founder's metrics), "member failed" lines in
every process's log (membership's own verdicts), LEAVE operations, and the steps the founder made.
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


def destroy(port_a: int, port_b: int, rng: random.Random) -> int:
    """Destroy the sockets of connections between the peers listening on ``port_a`` and ``port_b``,
    on one side only (chosen at random); the number destroyed."""
    # A connection between a and b has a's listening port at one end (b dialled a) or b's.
    if rng.random() < 0.5:
        port_a, port_b = port_b, port_a
    # The dialer's socket towards port_a: its source is an ephemeral port of b, so filter on the
    # destination; or the listener's socket at port_a: source port_a. One of the two, at random.
    expression = ["dport", "=", f":{port_a}"] if rng.random() < 0.5 else ["sport", "=", f":{port_a}"]
    result = subprocess.run(
        ["ss", "-K", "-t", "-n", "state", "established", *expression],
        capture_output=True,
        text=True,
        check=False,
    )
    rows = [line for line in result.stdout.splitlines()[1:] if line.strip()]
    return len(rows)


def port_of(info: dict[str, Any]) -> int:
    """The TCP port of a peer's first listen address."""
    parts = info["addrs"][0].split("/")
    return int(parts[parts.index("tcp") + 1])


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
    args = parser.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="chaosp2p-churn-") as tmp:
        workdir = Path(tmp)
        processes: list[subprocess.Popen[bytes]] = []
        live: list[tuple[subprocess.Popen[bytes], dict[str, Any]]] = []
        try:
            first, founder_metrics, founder = start("p0", workdir, [], args.pace, False, ROOT, args.profile)
            processes.append(first)
            live.append((first, founder))
            bootstrap = founder["addrs"][0]
            for index in range(1, args.peers):
                process, _, info = start(f"p{index}", workdir, [bootstrap], args.pace, False, ROOT, args.profile)
                processes.append(process)
                live.append((process, info))

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
                (_, a), (_, b) = rng.sample(live, 2)
                destroyed += destroy(port_of(a), port_of(b), rng)
                attempts += 1
                if time.monotonic() >= next_restart and len(live) > 2:
                    next_restart += args.restart_every_s
                    victim = rng.randrange(1, len(live))
                    process, _ = live.pop(victim)
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=60)
                    name = f"p{spawned}"
                    spawned += 1
                    process, _, info = start(name, workdir, [bootstrap], args.pace, False, ROOT, args.profile)
                    processes.append(process)
                    live.append((process, info))
                    restarts += 1
            time.sleep(3.0)  # let a verdict on the last destroyed connections land
            operations = [r for r in records(founder_metrics) if r.get("event") == "operation"]
            kinds: dict[str, int] = {}
            for op in operations:
                kinds[op["kind"]] = kinds.get(op["kind"], 0) + 1
            failed_lines = 0
            for log in workdir.glob("*.log"):
                failed_lines += sum("member failed" in line for line in log.read_text(errors="replace").splitlines())
            crashed = [p for p in processes if p.poll() not in (None, 0)]
            result = {
                "duration_s": args.duration_s,
                "peers": args.peers,
                "profile": args.profile,
                "destroy_attempts": attempts,
                "sockets_destroyed": destroyed,
                "graceful_restarts": restarts,
                "operations": kinds,
                "fail_operations": kinds.get("fail", 0),
                "member_failed_log_lines": failed_lines,
                "founder_steps": steps()[-1]["step"] - first_step,
                "members_at_end": steps()[-1]["members"],
                "processes_exited_early": len(crashed),
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
