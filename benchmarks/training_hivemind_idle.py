"""An idle peer must not slow the others: hivemind's quickstart with a peer that finished its epochs.

    python benchmarks/training_hivemind_idle.py [--a-epochs 6] [--b-epochs 12] [--target-batch-size 5000]
                                                [--json out.json] [--hivemind-python /tmp/hm-venv/bin/python]

hivemind's quickstart semantics: a peer that finished its steps stays up and serves (here
``--linger``: it keeps its DHT and optimizer without calling ``step()``). Per backend -- the drop-in
(``import chaosp2p.hivemind as hivemind``) and hivemind 1.1.12 itself (``--real-hivemind``), the very
same script, ``examples/hivemind_quickstart.py`` -- peer A starts, B joins as soon as A is ready, A
stops training after epoch ``--a-epochs`` and lingers, B trains on to epoch ``--b-epochs``.

Measured on B, from A's "idle" record on: the length of each of B's epochs (median, and the longest,
which holds what the idle peer cost), and B's epochs while both trained (median), all in
seconds, for both backends from the same invocation, with the ratio drop-in / hivemind. On the
code before issue 19's step-aside, the drop-in's B waited forever in a two-peer run (nobody could
sign the idle peer out), and ~14 s per epoch with it as a third member's STALL target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import print_table, write_json
from training_hivemind import EXAMPLE, ROOT, Peer, wait_for


def launch(name: str, python: str, workdir: Path, flags: list[str], *, real: bool) -> Peer:
    command = [python, str(EXAMPLE), *flags]
    command += ["--ready-file", str(workdir / f"{name}.ready"), "--metrics-file", str(workdir / f"{name}.jsonl")]
    if real:
        command.append("--real-hivemind")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    log = (workdir / f"{name}.log").open("w")
    launched = time.time()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    log.close()
    return Peer(name, process, launched, workdir)


def epoch_lengths(records: list[dict[str, Any]], *, after: float, before: float = float("inf")) -> list[float]:
    """Lengths of the epochs that ended in (after, before), the first measured from ``after``."""
    ends = [float(r["time"]) for r in records if "step" in r and after < float(r["time"]) < before]
    return [b - a for a, b in zip([after, *ends], ends, strict=False)]


def run_backend(backend: str, python: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    workdir = root / backend
    workdir.mkdir(parents=True)
    real = backend == "hivemind"
    common = ["--target-batch-size", str(args.target_batch_size)]
    peers: list[Peer] = []
    try:
        a_flags = [*common, "--steps", str(args.a_epochs), "--linger", str(args.timeout)]
        a = launch("a", python, workdir, a_flags, real=real)
        peers.append(a)
        wait_for((workdir / "a.ready").exists, 180, f"{backend} peer A to start", peers)
        address = json.loads((workdir / "a.ready").read_text())["addrs"][0]
        b = launch("b", python, workdir, [*common, "--steps", str(args.b_epochs), "--join", address], real=real)
        peers.append(b)
        wait_for(lambda: b.process.poll() is not None, args.timeout, f"{backend} B to finish", peers)
    finally:
        for peer in peers:
            if peer.process.poll() is None:
                peer.process.kill()
                peer.process.wait()
    idle = [float(r["time"]) for r in a.records() if r.get("event") == "idle"]
    if not idle:
        raise SystemExit(f"{backend}: A never went idle; see {workdir}")
    started = [float(r["time"]) for r in b.records() if r.get("event") == "started"]
    after = epoch_lengths(b.records(), after=idle[0])
    together = epoch_lengths(b.records(), after=started[0], before=idle[0])[1:]  # the first holds B's join
    if len(after) < 2:
        raise SystemExit(f"{backend}: too few epochs of B after A went idle; raise --b-epochs")
    waits = [float(r["idle_s"]) for r in b.records() if "idle_s" in r and float(r["time"]) > idle[0]]
    return {
        "backend": backend,
        "b_wait_s_after_idle_max": max(waits) if waits else float("nan"),
        "b_epoch_s_after_idle_median": statistics.median(after),
        "b_epoch_s_after_idle_max": max(after),
        "b_epoch_s_after_idle": after,
        "b_epoch_s_together_median": statistics.median(together) if together else float("nan"),
        "workdir": str(workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a-epochs", type=int, default=6, help="A stops training after this epoch, then idles")
    parser.add_argument("--b-epochs", type=int, default=12, help="B stops after this epoch")
    parser.add_argument("--target-batch-size", type=int, default=5000)
    parser.add_argument("--hivemind-python", default="/tmp/hm-venv/bin/python")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--keep", help="run in this directory and keep the peers' logs and metrics")
    parser.add_argument("--backends", default="chaosp2p,hivemind", help="which backends to run")
    args = parser.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results = []
    pythons = {"chaosp2p": sys.executable, "hivemind": args.hivemind_python}
    with tempfile.TemporaryDirectory(prefix="chaosp2p-idle-") as tmp:
        for backend in args.backends.split(","):
            results.append(run_backend(backend, pythons[backend], args, Path(args.keep or tmp)))
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    if len(results) < 2:
        print(results)
        return
    ours, theirs = results
    rows = [
        [key, ours[key], theirs[key], ours[key] / theirs[key]]
        for key in (
            "b_epoch_s_after_idle_median",
            "b_epoch_s_after_idle_max",
            "b_epoch_s_together_median",
            "b_wait_s_after_idle_max",
        )
    ]
    print_table("B's epochs with an idle A (s)", ["", "chaosp2p", "hivemind 1.1.12", "ratio"], rows)
    print(f"load before {load_before}, after {load_after}")
    write_json(
        args.json,
        {
            "benchmark": "training_hivemind_idle",
            "args": vars(args),
            "load_before": load_before,
            "load_after": load_after,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
