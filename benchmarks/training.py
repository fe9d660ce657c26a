"""Training benchmarks.

    python benchmarks/training.py [--parts a] [--mb 100] [--worlds 2,4,8] [--rounds 5]
        [--json out.json] [--hivemind-python PATH] [--wire float32]

(a) All-reduce (average) of a float32 buffer of --mb megabytes among N separate processes on
    127.0.0.1, in the same run: chaosp2p's butterfly over its encrypted transport, torch.distributed
    with gloo (TCP, unencrypted; init_method tcp://127.0.0.1:PORT), and hivemind 1.1.12's
    ``DecentralizedAverager.step`` (needs an interpreter with hivemind: --hivemind-python; its
    time includes matchmaking, at least ``min_matchmaking_time`` = 1 s, as its users see it).
    Per round, the time is the slowest process's (each starts after a barrier); the table shows the
    median over rounds (the first round of each is a warm-up and is dropped), and the ratio to
    gloo. Every average is checked on every process.

    Floor: the time the encrypted all-reduce cannot beat on this machine. Each process sends and
    receives 2(N-1)/N of the buffer (the bandwidth-optimal volume, as gloo does), so on top of
    gloo's own CPU per process it must AES-256-GCM encrypt and decrypt that much, at the rates
    measured in this run (1 MiB records, as the transport seals them). With N processes on C
    cores, floor = N * (gloo CPU per process + AEAD time per process) / min(N, C). The table also
    shows how busy the cores were: all processes' CPU time / (C * wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import median, print_table, write_json

RECORD_BYTES = 1 << 20
"""The transport's default record size (TransportConfig.max_record_bytes)."""

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def collect(processes: list[subprocess.Popen[bytes]], logs: list[Path], timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    reports = []
    try:
        for process, log in zip(processes, logs, strict=True):
            remaining = max(1.0, deadline - time.monotonic())
            out, _ = process.communicate(timeout=remaining)
            if process.returncode != 0:
                raise RuntimeError(f"worker failed ({process.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
            reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return reports


PIN_CPUS = False
"""--pin: rank r of every implementation runs on CPU r mod cores (taskset), its threads and children too."""


def spawn(args: list[str], log: Path, python: str = sys.executable, rank: int = 0) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    prefix = ["taskset", "-c", str(rank % (os.cpu_count() or 1))] if PIN_CPUS else []
    with log.open("wb") as err:
        return subprocess.Popen([*prefix, python, *args], stdout=subprocess.PIPE, stderr=err, env=env)


def per_round(reports: list[dict[str, Any]], key: str = "seconds") -> list[float]:
    """The slowest process's time in each round, warm-up dropped."""
    rounds = min(len(r[key]) for r in reports)
    return [max(r[key][i] for r in reports) for i in range(1, rounds)]


def total_per_round(values: list[list[float]]) -> list[float]:
    """The sum over processes in each round, warm-up dropped."""
    rounds = min(len(v) for v in values)
    return [sum(v[i] for v in values) for i in range(1, rounds)]


def calibrate_aead(megabytes: int = 64, repeats: int = 3) -> dict[str, float]:
    """AES-256-GCM encrypt and decrypt rates (bytes per CPU second) in 1 MiB records, best of ``repeats``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aead = AESGCM(AESGCM.generate_key(bit_length=256))
    plain = bytearray(os.urandom(RECORD_BYTES))
    sealed = bytearray(RECORD_BYTES + 16)
    opened = bytearray(RECORD_BYTES)
    header = bytes(16)
    nonce = bytes(12)
    aead.encrypt_into(nonce, plain, header, sealed)
    rates = {}
    for name in ("encrypt", "decrypt"):
        best = float("inf")
        for _ in range(repeats):
            started = time.process_time()
            for _ in range(megabytes):
                if name == "encrypt":
                    aead.encrypt_into(nonce, plain, header, sealed)
                else:
                    aead.decrypt_into(nonce, sealed, header, opened)
            best = min(best, time.process_time() - started)
        rates[f"{name}_bytes_per_s"] = megabytes * RECORD_BYTES / max(best, 1e-9)
    return rates


def floor_seconds(world: int, buffer_bytes: int, gloo_cpu_per_process_s: float, aead: dict[str, float]) -> float:
    """The encrypted all-reduce's floor on this machine (see the module docstring)."""
    moved = 2 * (world - 1) / world * buffer_bytes
    aead_s = moved / aead["encrypt_bytes_per_s"] + moved / aead["decrypt_bytes_per_s"]
    cores = os.cpu_count() or 1
    return world * (gloo_cpu_per_process_s + aead_s) / min(world, cores)


def run_chaosp2p(world: int, elements: int, rounds: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"chaosp2p-{world}-", dir=root))
    processes, logs = [], []
    for rank in range(world):
        log = workdir / f"worker-{rank}.log"
        command = [
            str(HERE / "_allreduce_worker.py"),
            "chaosp2p",
            *("--rank", str(rank), "--world", str(world), "--elements", str(elements)),
            *("--rounds", str(rounds), "--workdir", str(workdir), "--wire", args.wire, "--check"),
            *("--backend", args.backend),
        ]
        if args.down:
            command += ["--down", args.down]
        if args.trace:
            command.append("--trace")
        if args.record_mib:
            command += ["--record-mib", str(args.record_mib)]
        if args.profile_dir and rank == 0:
            command += ["--profile", str(Path(args.profile_dir) / f"chaosp2p-{world}-rank0.prof")]
        processes.append(spawn(command, log, rank=rank))
        logs.append(log)
    deadline = time.monotonic() + 120
    listing = []
    for rank in range(world):
        ready = workdir / f"ready-{rank}.json"
        while not ready.exists():
            if processes[rank].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chaosp2p worker {rank} did not start:\n{logs[rank].read_text()[-3000:]}")
            time.sleep(0.02)
        listing.append(json.loads(ready.read_text()))
    members = workdir / "members.json"
    members.with_suffix(".tmp").write_text(json.dumps(listing))
    members.with_suffix(".tmp").rename(members)
    deadline = time.monotonic() + 120 + rounds * 60
    for rank in range(world):
        while not (workdir / f"done-{rank}").exists():
            if processes[rank].poll() is not None or time.monotonic() > deadline:
                break  # collect() reports the failure
            time.sleep(0.05)
    (workdir / "exit").write_text("")
    reports = collect(processes, logs, timeout_s=60)
    phases = {
        key: median([max(r["stats"][i][key] for r in reports) for i in range(1, rounds)])
        for key in ("reduce_scatter_s", "all_gather_s", "reduce_s", "cpu_s")
    }
    in_place = sum(r["records_in_place"] for r in reports) / max(1, sum(r["records_received"] for r in reports))
    cpu_total = total_per_round([[s["cpu_s"] for s in r["stats"]] for r in reports])
    return {
        "seconds": per_round(reports),
        "phases": phases,
        "cpu_total_s": median(cpu_total),
        "records_decrypted_in_place": in_place,
    }


def run_gloo(world: int, elements: int, rounds: int, root: Path) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"gloo-{world}-", dir=root))
    port = free_port()
    processes, logs = [], []
    for rank in range(world):
        log = workdir / f"worker-{rank}.log"
        command = [
            str(HERE / "_allreduce_worker.py"),
            "gloo",
            *("--rank", str(rank), "--world", str(world), "--elements", str(elements)),
            *("--rounds", str(rounds), "--port", str(port), "--check"),
        ]
        processes.append(spawn(command, log, rank=rank))
        logs.append(log)
    reports = collect(processes, logs, timeout_s=120 + rounds * 60)
    return {
        "seconds": per_round(reports),
        "cpu_s": median(per_round(reports, "cpu_s")),
        "cpu_total_s": median(total_per_round([r["cpu_s"] for r in reports])),
    }


def run_hivemind(world: int, elements: int, rounds: int, python: str, root: Path) -> dict[str, Any]:
    probe = subprocess.run([python, "-c", "import hivemind"], capture_output=True)
    if probe.returncode != 0:
        return {"not_run": f"hivemind is not importable by {python}"}
    workdir = Path(tempfile.mkdtemp(prefix=f"hivemind-{world}-", dir=root))
    processes, logs = [], []
    for rank in range(world):
        log = workdir / f"worker-{rank}.log"
        command = [
            str(HERE / "_hivemind_allreduce.py"),
            *("--rank", str(rank), "--world", str(world), "--elements", str(elements)),
            *("--rounds", str(rounds), "--workdir", str(workdir)),
        ]
        processes.append(spawn(command, log, python=python, rank=rank))
        logs.append(log)
    try:
        reports = collect(processes, logs, timeout_s=180 + rounds * 120)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return {"not_run": f"hivemind failed: {str(exc)[-1500:]}"}
    if any(len(r["seconds"]) < 2 for r in reports):
        return {"not_run": f"hivemind rounds failed: {[r.get('failures') for r in reports]}"}
    return {"seconds": per_round(reports), "failures": [r["failures"] for r in reports]}


def part_a(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    elements = int(args.mb * 1e6) // 4
    aead = calibrate_aead()
    cores = os.cpu_count() or 1
    results: dict[str, Any] = {
        "elements": elements,
        "bytes": elements * 4,
        "wire": args.wire,
        "aead": aead,
        "cores": cores,
        "worlds": {},
    }
    rows = []
    for world in args.worlds:
        entry: dict[str, Any] = {}
        print(f"(a) {world} processes: gloo ...", file=sys.stderr, flush=True)
        entry["gloo"] = run_gloo(world, elements, args.rounds + 1, root)
        print(f"(a) {world} processes: chaosp2p ...", file=sys.stderr, flush=True)
        entry["chaosp2p"] = run_chaosp2p(world, elements, args.rounds + 1, args, root)
        if args.hivemind_python and world in args.hivemind_worlds:
            print(f"(a) {world} processes: hivemind ...", file=sys.stderr, flush=True)
            entry["hivemind"] = run_hivemind(world, elements, args.hivemind_rounds + 1, args.hivemind_python, root)
        gloo = median(entry["gloo"]["seconds"])
        ours = median(entry["chaosp2p"]["seconds"])
        # The floor assumes the float32 volume gloo moves; a 2-byte wire format has none.
        floor = None
        if args.wire == "float32":
            floor = entry["floor_s"] = floor_seconds(world, elements * 4, entry["gloo"]["cpu_total_s"] / world, aead)
        entry["cores_busy"] = entry["chaosp2p"]["cpu_total_s"] / (min(world, cores) * ours)
        results["worlds"][str(world)] = entry
        phases = entry["chaosp2p"]["phases"]
        hm = entry.get("hivemind", {})
        hm_s = median(hm["seconds"]) if "seconds" in hm else None
        rows.append(
            [
                world,
                gloo,
                ours,
                ours / gloo,
                phases["reduce_scatter_s"],
                phases["all_gather_s"],
                phases["reduce_s"],
                entry["gloo"]["cpu_total_s"] / world,
                entry["chaosp2p"]["cpu_total_s"] / world,
                f"{entry['cores_busy']:.0%}",
                "-" if floor is None else floor,
                "-" if floor is None else ours / floor,
                "-" if hm_s is None else hm_s,
                "-" if hm_s is None else hm_s / gloo,
                f"{2 * (world - 1) / world * elements * 4 / ours / 1e6:.0f}",
            ]
        )
    print_table(
        f"(a) all-reduce of {args.mb:g} MB float32 on 127.0.0.1, median of {args.rounds} rounds "
        f"(wire {args.wire}; chaosp2p encrypted, gloo not)",
        [
            "processes",
            "gloo s",
            "chaosp2p s",
            "chaosp2p / gloo",
            "reduce-scatter s",
            "all-gather s",
            "reduce math s",
            "gloo CPU s/proc",
            "chaosp2p CPU s/proc",
            "cores busy",
            "floor s",
            "chaosp2p / floor",
            "hivemind s",
            "hivemind / gloo",
            "chaosp2p bus MB/s",
        ],
        rows,
    )
    print(
        f"CPU s/proc: mean over processes per round. AES-256-GCM on one core here: encrypt "
        f"{aead['encrypt_bytes_per_s'] / 1e9:.2f} GB/s, decrypt {aead['decrypt_bytes_per_s'] / 1e9:.2f} GB/s; "
        f"floor = N * (gloo CPU/proc + AEAD of 2(N-1)/N of the buffer each way) / min(N, {cores} cores)",
        file=sys.stderr,
    )
    for world, entry in results["worlds"].items():
        if "not_run" in entry.get("hivemind", {}):
            print(f"hivemind ({world} processes) not run: {entry['hivemind']['not_run']}", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="a", help="which parts to run (only a so far)")
    parser.add_argument("--mb", type=float, default=100.0, help="buffer size in MB (1e6 bytes)")
    parser.add_argument("--worlds", default="2,4,8", help="process counts")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per implementation (plus a warm-up)")
    parser.add_argument("--wire", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"], help="chaosp2p workers' backend")
    parser.add_argument("--hivemind-python", default=None, help="interpreter that has hivemind 1.1.12")
    parser.add_argument("--hivemind-worlds", default="2,4,8", help="process counts for hivemind")
    parser.add_argument("--hivemind-rounds", type=int, default=3)
    parser.add_argument("--profile-dir", default=None, help="cProfile rank 0 of each chaosp2p run into this directory")
    parser.add_argument("--record-mib", type=int, default=0, help="chaosp2p transport record size in MiB (experiment)")
    parser.add_argument("--trace", action="store_true", help="chaosp2p workers log each step (see --keep)")
    parser.add_argument(
        "--down", default="", help="chaosp2p: plan on a link graph with these pairs down, e.g. 0-1,0-2 (issue 19)"
    )
    parser.add_argument("--keep", default=None, help="keep worker logs under this directory")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin rank r of every implementation to CPU r mod cores (otherwise the kernel places them)",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    global PIN_CPUS
    PIN_CPUS = args.pin
    args.worlds = [int(w) for w in args.worlds.split(",")]
    args.hivemind_worlds = [int(w) for w in args.hivemind_worlds.split(",")]
    report: dict[str, Any] = {"command": " ".join(sys.argv)}
    os.environ.setdefault("COLUMNS", "200")  # the tables are wide
    with tempfile.TemporaryDirectory(prefix="chaosp2p-bench-training-") as scratch:
        root = Path(args.keep) if args.keep else Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        if "a" in args.parts:
            report["a"] = part_a(args, root)
    write_json(args.json, report)


if __name__ == "__main__":
    main()
