"""Soak: minutes of churn while a run trains, with both cores loaded; checks what must not drift.

    python benchmarks/soak.py [--duration-s 600] [--members 4] [--interval-s 20] [--burners 1]
        [--state-mb 20] [--seed 3] [--json benchmarks/results/scaleout.json] [--workdir DIR]

``--members`` peers (``benchmarks/_scaleout_peer.py``: a small averaged MLP plus a frozen buffer,
``--state-mb`` in all) train with chaosp2p on 127.0.0.1; ``--burners`` processes spin on the CPU
so both cores stay busy. Every ``--interval-s`` (jittered, seeded) one event from a shuffled
schedule: a newcomer joins, a member leaves gracefully (SIGTERM), a member is killed (SIGKILL), or a
member is stalled (SIGSTOP for 3-6 s, then SIGCONT). The founder is never touched (it is the
bootstrap address and the reference the others are compared with); the run keeps between 2 and
``--members + 2`` processes. Only a join comes while two members or fewer train -- a newcomer still
joining is not counted (:func:`event_kinds`): a run of two survives no crash.

Checked, and stored under ``"soak"`` in ``--json``:

* no crash: every process exits 0 when asked to leave, the killed ones by SIGKILL, none by itself;
  the founder trained through the whole soak;
* no leaked process: after the shutdown nothing whose command line names the soak's folder runs;
* no leaked file descriptor and flat memory: the founder's open fds and RSS sampled every 5 s; the
  first and last minute's medians are compared;
* every join bit-exact: each newcomer's frozen buffer equals the founder's, and every process's
  parameter digest equals the founder's at every (step, configuration) both recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import training_elastic as te
from _common import machine

HERE = Path(__file__).resolve().parent
STALL_S = (3.0, 6.0)


def burner() -> subprocess.Popen[bytes]:
    """A process that keeps one core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def ancestors() -> set[int]:
    """This process and its parents (a wrapper such as ``flock ... --workdir DIR`` names the folder too)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    return found


def stragglers(marker: str) -> list[int]:
    """PIDs of running processes other than our ancestors whose command line contains ``marker``."""
    found = []
    mine = ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry))
    return found


def event_kinds(*, committed: int, processes: int, touchable: int, max_processes: int) -> list[str]:
    """The events the soak may cause next (none: wait for the joiners).

    ``committed``: members that train, the founder included -- a newcomer still joining is none (it
    holds no share of the run until admitted, and its admission may yet fail); ``processes``: peer
    processes running, joiners included; ``touchable``: those of them an event may hit (not the
    founder). A run of two survives no crash (nobody removes another alone, negotiation.md §3b), so
    at two committed members or fewer only a join may come: counting a joiner as a member let the
    soak kill a member of two. Joins stop at ``max_processes``.
    """
    joins = ["join"] if processes < max_processes else []
    if committed <= 2 or not touchable:
        return joins
    return [*joins, "leave", "kill", "stall"]


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    te.PEER = HERE / "_scaleout_peer.py"
    common = [
        "--state-mb",
        str(args.state_mb),
        "--train-mb",
        str(args.train_mb),
        "--batch",
        "48",
        "--compute-s",
        str(args.compute_s),
        "--ref-members",
        str(args.members),
        "--steps",
        "100000000",
        "--no-balance",
        "--digest-every",
        "1",
    ]
    events: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    burners = [burner() for _ in range(args.burners)]
    expected_exit: dict[str, int] = {}
    crashes: list[dict[str, Any]] = []
    report: dict[str, Any] = {"load_avg_start": os.getloadavg()}
    try:
        with te.Cluster(root, common) as cluster:
            members = te.start_members(cluster, args.members, lambda i: [])
            founder = members[0]
            founder_buffer = next(r["buffer_digest"] for r in founder.steps() if r.get("buffer_digest"))
            alive = list(members[1:])  # touchable members (not the founder)
            began = time.monotonic()
            next_event = began + args.interval_s
            joined = 0
            trained: set[str] = set()
            while time.monotonic() - began < args.duration_s:
                founder.check_alive()
                now = time.monotonic()
                samples.append(
                    {
                        "t": now - began,
                        "fds": fd_count(founder.process.pid),
                        "rss_mb": rss_mb(founder.process.pid),
                        "step": (founder.steps() or [{"step": -1}])[-1]["step"],
                        "load": os.getloadavg()[0],
                    }
                )
                for proc in list(alive):
                    if proc.process.poll() is not None and proc.name not in expected_exit:
                        # A crash: recorded (the exit code is checked at the end), the soak goes on.
                        crashes.append({"t": now - began, "name": proc.name, "code": proc.process.returncode})
                        print(f"[soak: {proc.name} exited by itself with {proc.process.returncode}]", flush=True)
                        alive.remove(proc)
                # A member once it trained (a joiner is none yet); read once per process, not every loop.
                trained.update(proc.name for proc in alive if proc.name not in trained and proc.steps())
                committed = 1 + sum(1 for proc in alive if proc.name in trained)
                choices = event_kinds(
                    committed=committed, processes=1 + len(alive), touchable=len(alive), max_processes=args.members + 2
                )
                if now >= next_event and now - began < args.duration_s - 40 and choices:
                    kind = rng.choice(choices)
                    record: dict[str, Any] = {
                        "t": now - began,
                        "kind": kind,
                        "members_before": committed,
                        "processes_before": 1 + len(alive),
                    }
                    if kind == "join":
                        joined += 1
                        newcomer = cluster.launch(f"j{joined}", ["--join", founder.addr])
                        record["name"] = newcomer.name
                        alive.append(newcomer)
                    else:
                        victim = rng.choice(alive)
                        record["name"] = victim.name
                        if kind == "leave":
                            expected_exit[victim.name] = 0
                            victim.process.send_signal(signal.SIGCONT)
                            victim.process.send_signal(signal.SIGTERM)
                            alive.remove(victim)
                        elif kind == "kill":
                            expected_exit[victim.name] = -signal.SIGKILL
                            victim.process.kill()
                            alive.remove(victim)
                        else:
                            stall = rng.uniform(*STALL_S)
                            record["stall_s"] = stall
                            victim.process.send_signal(signal.SIGSTOP)
                            time.sleep(stall)
                            victim.process.send_signal(signal.SIGCONT)
                    events.append(record)
                    print(
                        f"[soak {now - began:.0f} s: {kind} {record.get('name')}, load {os.getloadavg()[0]:.1f}]",
                        flush=True,
                    )
                    next_event = now + args.interval_s * rng.uniform(0.7, 1.3)
                time.sleep(2.0)
            report["soak_s"] = time.monotonic() - began
            report["load_avg_end_of_churn"] = os.getloadavg()
            # Let the newest newcomers finish joining before everything is compared and stopped.
            for proc in alive:
                if proc.process.poll() is None:
                    try:
                        te.wait_for(lambda p=proc: bool(p.steps()) or p.process.poll() is not None, f"{proc.name}", 120)
                    except TimeoutError:
                        report.setdefault("never_trained", []).append(proc.name)
            report["exact"] = exactness(cluster, founder, founder_buffer)
            # Everyone still running leaves gracefully; each must exit 0.
            for proc in [founder, *alive]:
                if proc.process.poll() is None:
                    expected_exit[proc.name] = 0
                    proc.process.send_signal(signal.SIGCONT)
                    proc.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 120
            for proc in cluster.procs:
                try:
                    proc.process.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.process.kill()
                    proc.process.wait()
            exits = {p.name: p.process.returncode for p in cluster.procs}
            report["exits"] = exits
            report["unexpected_exits"] = {
                name: code for name, code in exits.items() if code != expected_exit.get(name, 0)
            }
    finally:
        for process in burners:
            process.kill()
            process.wait()
    time.sleep(1.0)
    report["leaked_processes"] = stragglers(str(root))
    report["crashes"] = crashes
    report["events"] = events
    report["samples"] = samples
    report["drift"] = drift(samples)
    report["load_avg_end"] = os.getloadavg()
    return report


def exactness(cluster: te.Cluster, founder: te.Proc, founder_buffer: str) -> dict[str, Any]:
    reference = {(r["step"], r.get("config_digest")): r.get("param_digest") for r in founder.steps()}
    per_process = {}
    for proc in cluster.procs:
        if proc is founder:
            continue
        steps = proc.steps()
        buffers = [r["buffer_digest"] for r in steps if r.get("buffer_digest")]
        compared = mismatched = 0
        for r in steps:
            theirs = reference.get((r["step"], r.get("config_digest")))
            if r.get("param_digest") and theirs:
                compared += 1
                mismatched += r["param_digest"] != theirs
        per_process[proc.name] = {
            "trained_steps": len(steps),
            "buffer_exact": bool(buffers) and all(b == founder_buffer for b in buffers),
            "param_steps_compared": compared,
            "param_mismatches": mismatched,
        }
    joined = {n: v for n, v in per_process.items() if v["trained_steps"]}
    return {
        "per_process": per_process,
        "all_exact": all(v["buffer_exact"] and v["param_mismatches"] == 0 for v in joined.values()),
        "joins_checked": len(joined),
    }


def drift(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The founder's fds and RSS: medians of the first minute, of minutes 2-3 (after the first
    joins: the snapshot store holds up to two snapshots from then on) and of the last minute, and
    the least-squares slope over the second half."""
    if not samples:
        return {}
    end = samples[-1]["t"]
    first = [s for s in samples if s["t"] <= 60]
    settled = [s for s in samples if 120 <= s["t"] <= 180]
    last = [s for s in samples if s["t"] >= end - 60]
    half = [s for s in samples if s["t"] >= end / 2]

    def med(values: list[dict[str, Any]], key: str) -> float | None:
        got = [v[key] for v in values if v[key] is not None]
        return statistics.median(got) if got else None

    def slope_per_min(key: str) -> float | None:
        points = [(s["t"], s[key]) for s in half if s[key] is not None]
        if len(points) < 3:
            return None
        return 60 * statistics.linear_regression([t for t, _ in points], [v for _, v in points]).slope

    out: dict[str, Any] = {}
    for key in ("fds", "rss_mb"):
        out[key] = {
            "first_minute": med(first, key),
            "minutes_2_3": med(settled, key),
            "last_minute": med(last, key),
            "max": max((s[key] or 0) for s in samples),
            "slope_second_half_per_min": slope_per_min(key),
        }
    out["steps"] = samples[-1]["step"]
    out["median_load"] = statistics.median(s["load"] for s in samples)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--interval-s", type=float, default=20.0)
    parser.add_argument("--burners", type=int, default=1, help="busy-loop processes besides the peers")
    parser.add_argument("--state-mb", type=float, default=20.0)
    parser.add_argument("--train-mb", type=float, default=2.0)
    parser.add_argument("--compute-s", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "scaleout.json")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the Cluster kills its peers
    with tempfile.TemporaryDirectory(prefix="chaosp2p-soak-") as tmp:
        root = Path(tmp)
        if args.workdir is not None:
            args.workdir.mkdir(parents=True)
            root = args.workdir
        report = run(args, root)
    report["command"] = " ".join(["python", "benchmarks/soak.py", *sys.argv[1:]])
    report["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    exact = report["exact"]
    d = report["drift"]
    ok = (
        not report["unexpected_exits"]
        and not report["crashes"]
        and not report["leaked_processes"]
        and exact["all_exact"]
    )
    report["passed"] = ok
    print(
        f"soak {report['soak_s']:.0f} s, {len(report['events'])} events "
        f"({', '.join(sorted({e['kind'] for e in report['events']}))}), founder at step {d.get('steps')}, "
        f"median load {d.get('median_load', 0):.1f}\n"
        f"  unexpected exits: {report['unexpected_exits'] or 'none'}; "
        f"leaked processes: {report['leaked_processes'] or 'none'}\n"
        f"  founder fds first minute / minutes 2-3 / last minute: {d['fds']['first_minute']} / "
        f"{d['fds']['minutes_2_3']} / {d['fds']['last_minute']} (max {d['fds']['max']}); "
        f"RSS MB: {d['rss_mb']['first_minute']} / {d['rss_mb']['minutes_2_3']} / {d['rss_mb']['last_minute']} "
        f"(slope over the second half {d['rss_mb']['slope_second_half_per_min']} MB/min)\n"
        f"  joins checked bit-exact: {exact['joins_checked']}, all exact: {exact['all_exact']}\n"
        f"  PASSED: {ok}"
    )
    path = args.json
    whole = json.loads(path.read_text()) if path.exists() else {"benchmark": "scaleout"}
    whole["soak"] = report
    whole["machine"] = machine()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(whole, indent=1))


if __name__ == "__main__":
    main()
