"""Training benchmark (d): hivemind's quickstart on chaosp2p's drop-in against hivemind 1.1.12 itself.

    python benchmarks/training_hivemind.py [--epochs 5] [--target-batch-size 10000] [--json out.json]
                                           [--hivemind-python /tmp/hm-venv/bin/python]

Both sides run the very same script, ``examples/hivemind_quickstart.py`` (hivemind's quickstart, the
CNN on a local CIFAR-shaped set): once as is (``import chaosp2p.hivemind as hivemind``) and once with
``--real-hivemind`` under an interpreter that has hivemind 1.1.12 (``import hivemind``). The
quickstart's own settings are kept: batch 32 per step, ``use_local_updates=True``,
``matchmaking_time=3``, ``averaging_timeout=10``; ``target_batch_size`` is 10000 unless given.

Scenario, per backend: peer A starts and trains alone; as soon as it is ready, peer B starts with
``initial_peers=[A]``; both stop after epoch ``--epochs`` (hivemind and the drop-in count epochs the
same way: ``target_batch_size`` samples processed by all peers together). Measured:

* **time to the first averaged epoch**: from launching B's process (imports, data set, DHT start,
  state download included) until B's parameters were first averaged with A's. The drop-in reports
  an epoch's members in its statistics; hivemind only in its log ("Averaged parameters with N
  peers"), which the script turns into records.
* **where B's start-up goes**: seconds from B's launch to each phase marker in its log (drop-in:
  run found, joined, first averaged epoch; hivemind: state download started and done, first averaged
  epoch), and the length of A's epochs while it trained alone (a join waits for epoch boundaries).
* **samples per second**: both peers' samples per second added up, from the end of B's first
  averaged epoch to the end of the run (each peer's rate from its own per-epoch records).

Each figure is reported for both backends (medians over ``--repeats`` runs that alternate which
backend goes first) with the ratios, from the same invocation of this script. Nothing here is in CI.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hivemind_quickstart.py"


@dataclass
class Peer:
    """One quickstart process."""

    name: str
    process: subprocess.Popen[bytes]
    launched: float
    workdir: Path

    @property
    def metrics(self) -> Path:
        return self.workdir / f"{self.name}.jsonl"

    def records(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]


def launch(name: str, python: str, workdir: Path, args: argparse.Namespace, *, real: bool, join: str | None) -> Peer:
    command = [python, str(EXAMPLE), "--steps", str(args.epochs), "--target-batch-size", str(args.target_batch_size)]
    command += ["--ready-file", str(workdir / f"{name}.ready"), "--metrics-file", str(workdir / f"{name}.jsonl")]
    if real:
        command.append("--real-hivemind")
    if join:
        command += ["--join", join]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")  # the example's shared helpers
    log = (workdir / f"{name}.log").open("w")
    launched = time.time()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    log.close()
    return Peer(name, process, launched, workdir)


def wait_for(condition: Any, timeout_s: float, what: str, peers: list[Peer]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        for peer in peers:
            if peer.process.poll() not in (None, 0):
                raise SystemExit(f"{peer.name} exited with {peer.process.returncode}; see {peer.workdir}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}; see {peers[0].workdir}")
        time.sleep(0.1)


def first_averaged(peer: Peer) -> tuple[float, int] | None:
    """When ``peer`` first finished an epoch averaged with another peer, and that epoch's index."""
    last_epoch = -1
    for record in peer.records():
        if "step" in record:
            last_epoch = int(record["step"])
            if "config_digest" in record and record["members"] >= 2:  # the drop-in: members per epoch
                return float(record["time"]), last_epoch
        elif record.get("event") == "averaged" and record["peers"] >= 2:  # hivemind: its log line
            return float(record["time"]), last_epoch
    return None


def rate(peer: Peer, first_epoch: int) -> tuple[float, int]:
    """``peer``'s samples per second from the end of epoch ``first_epoch`` to its last epoch."""
    epochs = [r for r in peer.records() if "step" in r and r["step"] >= first_epoch]
    if len(epochs) < 2:
        return 0.0, len(epochs)
    samples = epochs[-1]["local_samples"] - epochs[0]["local_samples"]
    return samples / (epochs[-1]["time"] - epochs[0]["time"]), len(epochs)


def run_backend(backend: str, python: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    workdir = root / backend
    workdir.mkdir(parents=True)  # root is per repeat
    real = backend == "hivemind"
    peers: list[Peer] = []
    try:
        a = launch("a", python, workdir, args, real=real, join=None)
        peers.append(a)
        ready = workdir / "a.ready"
        wait_for(ready.exists, 180, f"{backend} peer A to start", peers)
        address = json.loads(ready.read_text())["addrs"][0]
        b = launch("b", python, workdir, args, real=real, join=address)
        peers.append(b)
        wait_for(lambda: all(p.process.poll() is not None for p in peers), args.timeout, f"{backend} to finish", peers)
    finally:
        for peer in peers:
            if peer.process.poll() is None:
                peer.process.kill()
                peer.process.wait()
    found = first_averaged(b)
    if found is None:
        raise SystemExit(f"{backend}: B never averaged with A; see {workdir}")
    averaged, first_epoch = found
    rate_a, epochs_a = rate(a, first_epoch)
    rate_b, epochs_b = rate(b, first_epoch)
    if min(epochs_a, epochs_b) < 2:
        raise SystemExit(f"{backend}: too few epochs after B's first averaged one to measure; raise --epochs")
    return {
        "backend": backend,
        "first_averaged_epoch_s": averaged - b.launched,
        "first_averaged_epoch": first_epoch,
        "samples_per_s": rate_a + rate_b,
        "samples_per_s_by_peer": [rate_a, rate_b],
        "epochs_measured": [epochs_a, epochs_b],
        "a_started_to_b_launch_s": b.launched - a.launched,
        "b_phases_s": phases(b, backend),
        "a_epoch_alone_s": epoch_seconds_alone(a, averaged),
        "workdir": str(workdir),
    }


# Log lines that mark B's phases (both sides log "Nov 27 19:32:51.372 [INFO] ..."), first occurrence each.
PHASE_MARKERS = {
    "chaosp2p": {
        "run_found_s": "Joining run",  # imports, DHT start, asking peers whether they train the run
        "joined_s": "Joined run",  # observe a sponsor, snapshot, parallel download, replay, admission
        "first_averaged_epoch_s": "Averaged parameters with 2 peers",  # B's share of that epoch
    },
    "hivemind": {
        "download_started_s": "Downloading parameters from peer",
        "download_done_s": "Finished downloading state",
        "first_averaged_epoch_s": "Averaged parameters with 2 peers",
    },
}


def phases(peer: Peer, backend: str) -> dict[str, float]:
    """Seconds from launching ``peer`` to each of its phase markers (where B's start-up time goes)."""
    found: dict[str, float] = {}
    log = peer.workdir / f"{peer.name}.log"
    year = time.localtime(peer.launched).tm_year
    for line in log.read_text(errors="replace").splitlines():
        for name, marker in PHASE_MARKERS[backend].items():
            if name in found or marker not in line:
                continue
            try:
                stamp = time.strptime(f"{year} {line[:15]}", "%Y %b %d %H:%M:%S")
                at = time.mktime(stamp) + float("0" + line[15:19])
            except ValueError:
                continue
            found[name] = at - peer.launched
    started = [r["time"] for r in peer.records() if r.get("event") == "started"]
    if started:
        found["script_started_s"] = float(started[0]) - peer.launched
    return found


def epoch_seconds_alone(peer: Peer, until: float) -> float:
    """Median length of ``peer``'s epochs that ended before ``until`` (A training alone)."""
    times = [float(r["time"]) for r in peer.records() if "step" in r and float(r["time"]) < until]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return median(gaps) if gaps else float("nan")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5, help="both peers stop after this epoch")
    parser.add_argument("--target-batch-size", type=int, default=10000, help="the quickstart's value by default")
    parser.add_argument("--repeats", type=int, default=1, help="runs per backend, alternating; medians reported")
    parser.add_argument(
        "--hivemind-python",
        default=os.environ.get("CHAOSP2P_HIVEMIND_PYTHON", "/tmp/hm-venv/bin/python"),
        help="an interpreter with hivemind (default: $CHAOSP2P_HIVEMIND_PYTHON)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="give up a backend after this many seconds")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="chaosp2p-bench-quickstart-"))
    pythons = {"chaosp2p": sys.executable, "hivemind": args.hivemind_python}
    runs: dict[str, list[dict[str, Any]]] = {"chaosp2p": [], "hivemind": []}
    for repeat in range(args.repeats):
        # Alternate which backend goes first: the machine's load drifts during a run.
        order = ["chaosp2p", "hivemind"] if repeat % 2 == 0 else ["hivemind", "chaosp2p"]
        for backend in order:
            result = run_backend(backend, pythons[backend], args, root / f"run{repeat}")
            result["load_average"] = os.getloadavg()
            runs[backend].append(result)
            print(f"{backend} run {repeat}: first averaged epoch {result['first_averaged_epoch_s']:.1f} s, "
                  f"{result['samples_per_s']:.0f} samples/s; B's phases {result['b_phases_s']}, "
                  f"A's epochs alone {result['a_epoch_alone_s']:.1f} s", flush=True)
    summary = {
        backend: {
            "first_averaged_epoch_s": median([r["first_averaged_epoch_s"] for r in results]),
            "samples_per_s": median([r["samples_per_s"] for r in results]),
        }
        for backend, results in runs.items()
    }
    ours, theirs = summary["chaosp2p"], summary["hivemind"]
    slower_start = theirs["first_averaged_epoch_s"] / ours["first_averaged_epoch_s"]
    faster = ours["samples_per_s"] / max(theirs["samples_per_s"], 1e-9)
    ratios = {
        "first_averaged_epoch_hivemind_over_chaosp2p": slower_start,
        "samples_per_s_chaosp2p_over_hivemind": faster,
    }
    print_table(
        f"hivemind quickstart, 2 peers, target_batch_size={args.target_batch_size}, {args.epochs} epochs, "
        f"median of {args.repeats}",
        ["backend", "B launch -> first averaged epoch (s)", "samples/s (both peers)"],
        [[name, r["first_averaged_epoch_s"], r["samples_per_s"]] for name, r in summary.items()],
    )
    print(f"time to the first averaged epoch, hivemind / chaosp2p: {slower_start:.2f}x")
    print(f"samples per second, chaosp2p / hivemind: {faster:.2f}x")
    print(f"logs and metrics: {root}")
    write_json(
        args.json,
        {"benchmark": "training (d): hivemind quickstart", "args": vars(args), "summary": summary, "runs": runs,
         "ratios": ratios},
    )


if __name__ == "__main__":
    main()
