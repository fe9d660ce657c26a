"""Train one MLP on scikit-learn's digits with every member of a swarm, through joins and failures.

Run the whole scenario on this machine (3 peers start, a 4th joins mid-run, one is killed with
SIGKILL; at the end the survivors' accuracy is compared with the same model trained in one
process on the same samples):

    python examples/train_digits.py --launch

Or run peers yourself. The first founds the run and prints its address; the others join it:

    python examples/train_digits.py --steps 400
    python examples/train_digits.py --steps 400 --join /ip4/127.0.0.1/tcp/PORT/p2p/12D3KooW...

Each step's global batch (``--batch`` samples, drawn from a seed and the step number) is split
among the members by their batch shares in the agreed configuration; gradients are averaged
weighted by samples, so the swarm follows the same trajectory as one process training on the same
batches. No data is downloaded: the digits ship with scikit-learn.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chaosp2p.trainers.digits import parser as peer_parser
from chaosp2p.trainers.digits import run_peer, train_one_process


def launch(args: argparse.Namespace) -> int:
    """3 peers, a 4th joins mid-run, one is killed; compare with one process on the same samples."""
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="chaosp2p-digits-"))
    workdir.mkdir(parents=True, exist_ok=True)
    script = str(Path(__file__).resolve())
    peers: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, join: list[str]) -> dict[str, Any]:
        ready = workdir / f"{name}.ready"
        command = [sys.executable, script, "--steps", str(args.steps), "--batch", str(args.batch)]
        command += ["--profile", args.profile]
        command += [
            "--pace",
            str(args.pace),
            "--ready-file",
            str(ready),
            "--metrics-file",
            str(workdir / f"{name}.jsonl"),
        ]
        for addr in join:
            command += ["--join", addr]
        with (workdir / f"{name}.log").open("w") as log:
            peers[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if peers[name].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"peer {name} did not start; see {workdir / (name + '.log')}")
            time.sleep(0.05)
        info: dict[str, Any] = json.loads(ready.read_text())
        print(f"started {name}: {info['peer_id']}", flush=True)
        return info

    def members_seen(name: str) -> int:
        path = workdir / f"{name}.jsonl"
        if not path.exists():
            return 0
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [line for line in lines if "members" in line]
        return int(steps[-1]["members"]) if steps else 0

    def wait_for(condition: Any, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}; logs in {workdir}")
            time.sleep(0.1)

    try:
        first = start("a", [])
        bootstrap = [first["addrs"][0]]
        start("b", bootstrap)
        start("c", bootstrap)
        wait_for(lambda: members_seen("a") >= 3, "b and c to be admitted")
        print("3 members training", flush=True)
        start("d", bootstrap)
        wait_for(lambda: members_seen("a") >= 4, "d to be admitted")
        print("d admitted: 4 members", flush=True)
        peers["c"].send_signal(signal.SIGKILL)
        print("killed c (SIGKILL)", flush=True)
        wait_for(lambda: members_seen("a") == 3, "the survivors to drop c")
        print("survivors agreed on 3 members", flush=True)
        for name in ("a", "b", "d"):
            peers[name].wait(timeout=600)
    finally:
        for process in peers.values():
            if process.poll() is None:
                process.terminate()
        for process in peers.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
    finals = {}
    for name in ("a", "b", "d"):
        lines = [json.loads(line) for line in (workdir / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        finals[name] = next(line for line in reversed(lines) if "accuracy" in line)
    digests = {final["param_digest"] for final in finals.values()}
    swarm_accuracy = float(np.mean([final["accuracy"] for final in finals.values()]))
    baseline = train_one_process(args.steps, args.batch)
    print(f"survivors hold identical parameters: {len(digests) == 1}")
    print(
        f"swarm accuracy {swarm_accuracy:.3f} vs one process on the same samples {baseline:.3f} "
        f"(difference {abs(swarm_accuracy - baseline) * 100:.1f} points)"
    )
    print(f"logs and metrics: {workdir}")
    ok = len(digests) == 1 and abs(swarm_accuracy - baseline) <= 0.02
    return 0 if ok else 1


def main() -> int:
    parser = peer_parser()
    parser.description = __doc__
    parser.add_argument("--launch", action="store_true", help="run the 3 + join + kill scenario on this machine")
    parser.add_argument("--workdir", help="where --launch keeps logs and metrics")
    args = parser.parse_args()
    if args.launch:
        if args.steps == 200:
            args.steps = 600
        return launch(args)
    return run_peer(args)


if __name__ == "__main__":
    torch.set_num_threads(1)  # several peers share this machine's cores
    sys.exit(main())
