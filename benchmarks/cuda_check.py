"""The CUDA paths on a GPU machine: staging, a state pull into ``cuda`` tensors, training on ``cuda``.

    python benchmarks/cuda_check.py --json results.json [--state-mb 1024] [--steps 400]

One prepared run of a few minutes (a GPU is lent only now and then, for minutes). In order:

1. the CUDA tests (``tests/unit/test_cuda_paths.py``, plus the torch adapter's and flat buffers' tests,
   which take the page-locked allocator when a device is present);
2. staging: ``publish_torch`` of a model + Adam on the GPU (device -> page-locked host) and
   ``load_torch`` back into GPU tensors, and the flat gradient buffer's gather/scatter with
   asynchronous copies through page-locked memory against per-tensor blocking copies into pageable
   memory (what ``FlatParameters`` did before), in the same run;
3. a state pull into ``cuda`` tensors: a source process serves a model + Adam state built on its CPU,
   this process pulls it into a GPU model through ``Peer.load_state_from_peers``, and the loaded
   tensors must hash exactly as the source's;
4. training on ``cuda``: three ``chaosp2p.trainers.digits`` peers with ``--device cuda`` (one joins
   late, pulling the members' state into GPU tensors); every shared step must have one parameter
   digest.

Exits non-zero if any check fails. Timings are medians of ``--repeats`` on the machine it runs on,
with the card named in the output; nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash
from _common import median, write_json

ROOT = Path(__file__).resolve().parent.parent
RUN = "cuda-check"
DEVICE = "cuda"  # --device cpu dry-runs the script on a machine without a GPU


# ------------------------------------------------------------------------------------------ models
def big_model(total_mb: int, seed: int, device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Square linear layers holding about a third of ``total_mb`` (Adam's two moments the rest)."""
    torch.manual_seed(seed)
    width = 2048
    layers = max(1, round(total_mb * 2**20 / 3 / (4 * width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():  # one step with a seeded gradient, so Adam has state
        p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    optimizer.step()
    return model, optimizer


def state_digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """xxh3-128 over every tensor of the model and optimizer state, as ``flatten_torch`` stages it."""
    from chaosp2p.state.torch_adapter import META_NAME, flatten_torch

    flat = flatten_torch(model, optimizer)
    h = xxhash.xxh3_128()
    for name in sorted(flat.arrays):
        if name != META_NAME:
            h.update(name.encode())
            h.update(np.ascontiguousarray(flat.arrays[name]).view(np.uint8).tobytes())
    return h.hexdigest()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values())
    tensors += [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(function: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        function()
        sync()
        times.append(time.perf_counter() - started)
    return times


def load_from_store(store: Any, run: str, step: int) -> Any:
    """The snapshot (run, step) of ``store`` as the flat state a pull would commit."""
    from chaosp2p.state.manifest import FlatState, array_views

    lease = store.lease(run, step)
    arrays = array_views(lease.manifest, np.frombuffer(lease.data, dtype=np.uint8))
    return FlatState(arrays, {s.name: s.dtype for s in lease.manifest.buffers})


# ---------------------------------------------------------------------------------------- 1. tests
def run_tests() -> dict[str, Any]:
    tests = ["tests/unit/test_cuda_paths.py", "tests/unit/test_torch_adapter.py", "tests/unit/test_training_flat.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-rs", *tests],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-200:]
    return {"ok": done.returncode == 0, "summary": summary}


# -------------------------------------------------------------------------------------- 2. staging
def check_staging(total_mb: int, repeats: int) -> dict[str, Any]:
    from chaosp2p.state import SnapshotStore
    from chaosp2p.state.torch_adapter import load_torch

    model, optimizer = big_model(total_mb, seed=1, device=DEVICE)
    size = state_bytes(model, optimizer)
    expected = state_digest(model, optimizer)
    store = SnapshotStore()
    step = iter(range(1, 10**6))
    last = 0

    def publish() -> None:
        nonlocal last
        from chaosp2p.state.torch_adapter import publish_torch

        last = next(step)
        publish_torch(store, "run", last, model, optimizer)

    publish_s = timed(publish, repeats)
    target, target_optimizer = big_model(total_mb, seed=2, device=DEVICE)
    loaded = load_from_store(store, "run", last)
    load_s = timed(lambda: load_torch(loaded, target, target_optimizer), repeats)
    same = state_digest(target, target_optimizer) == expected
    return {
        "state_bytes": size,
        "publish_s": median(publish_s),
        "publish_gb_per_s": size / median(publish_s) / 1e9,
        "load_s": median(load_s),
        "load_gb_per_s": size / median(load_s) / 1e9,
        "loaded_bit_exact": same,
        "flat": check_flat(repeats),
    }


def check_flat(repeats: int) -> dict[str, Any]:
    """Gather and scatter of ~100 M gradients in 300 tensors: pinned + asynchronous vs per-tensor blocking."""
    from chaosp2p.training.flat import FlatParameters

    torch.manual_seed(3)
    model = torch.nn.Sequential(*[torch.nn.Linear(816, 816) for _ in range(150)]).to(DEVICE)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    flat = FlatParameters(list(model.parameters()))
    pinned = flat.host_array()
    pageable = np.zeros(flat.numel, dtype=np.float32)
    host = torch.from_numpy(pageable)

    def blocking_gather() -> None:  # FlatParameters before: pageable memory, one blocking copy per tensor
        for i, p in enumerate(flat.parameters):
            host[flat.offsets[i] : flat.offsets[i + 1]].view(p.shape).copy_(p.grad, non_blocking=False)

    def blocking_scatter() -> None:
        for i, p in enumerate(flat.parameters):
            p.grad.copy_(host[flat.offsets[i] : flat.offsets[i + 1]].view(p.shape))

    gather_new = timed(lambda: flat.gather_grads(pinned), repeats)
    gather_old = timed(blocking_gather, repeats)
    same = np.array_equal(pinned, pageable)
    scatter_new = timed(lambda: flat.scatter_grads(pinned), repeats)
    scatter_old = timed(blocking_scatter, repeats)
    return {
        "elements": flat.numel,
        "tensors": len(flat.parameters),
        "pinned": bool(torch.from_numpy(pinned).is_pinned()),
        "gather_s": {"pinned_async": median(gather_new), "pageable_blocking": median(gather_old)},
        "scatter_s": {"pinned_async": median(scatter_new), "pageable_blocking": median(scatter_old)},
        "gathered_equal": same,
    }


# ------------------------------------------------------------------------------------- 3. the pull
def serve_source(args: argparse.Namespace) -> None:
    """Role ``source``: build the state on this process's CPU, serve it, write a ready file."""
    import chaosp2p

    model, optimizer = big_model(args.state_mb, seed=1, device="cpu")
    with chaosp2p.Peer(run=RUN, config=chaosp2p.PeerConfig.local()) as peer:
        peer.publish_state(model, optimizer, step=100)
        ready = {"addrs": peer.addrs, "digest": state_digest(model, optimizer), "bytes": state_bytes(model, optimizer)}
        Path(args.ready_file).write_text(json.dumps(ready))
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        stop.wait()


def check_pull(total_mb: int, workdir: Path) -> dict[str, Any]:
    import chaosp2p

    ready = workdir / "source.json"
    source = subprocess.Popen(
        [sys.executable, __file__, "--role", "source", "--state-mb", str(total_mb), "--ready-file", str(ready)],
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 180
        while not ready.exists():
            if source.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the state source did not start")
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        model, optimizer = big_model(total_mb, seed=2, device=DEVICE)  # other values, same shapes
        with chaosp2p.Peer(initial_peers=info["addrs"][:1], run=RUN, config=chaosp2p.PeerConfig.local()) as peer:
            sync()
            started = time.perf_counter()
            step = peer.load_state_from_peers(model, optimizer, timeout=120)
            sync()
            seconds = time.perf_counter() - started
        on_gpu = all(t.device.type == DEVICE for t in model.state_dict().values())
        return {
            "state_bytes": info["bytes"],
            "step": step,
            "seconds": seconds,
            "gb_per_s": info["bytes"] / seconds / 1e9,
            "tensors_on_device": on_gpu,
            "bit_exact": state_digest(model, optimizer) == info["digest"],
            "note": "pull + load into cuda tensors, one source on the same machine (127.0.0.1), encrypted",
        }
    finally:
        source.send_signal(signal.SIGTERM)
        try:
            source.wait(30)
        except subprocess.TimeoutExpired:
            source.kill()


# ---------------------------------------------------------------------------------- 4. training
def check_training(steps: int, workdir: Path) -> dict[str, Any]:
    def peer(name: str, *extra: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "chaosp2p.trainers.digits", "--device", DEVICE, "--steps", str(steps)]
        command += ["--pace", "0.05"]  # the founder must not finish before the others are in
        command += ["--metrics-file", str(workdir / f"{name}.jsonl"), "--ready-file", str(workdir / f"{name}.ready")]
        log = (workdir / f"{name}.log").open("wb")
        return subprocess.Popen([*command, *extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def address(name: str) -> str:
        path = workdir / f"{name}.ready"
        deadline = time.monotonic() + 120
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start")
            time.sleep(0.1)
        return str(json.loads(path.read_text())["addrs"][0])

    def steps_done(name: str) -> int:
        path = workdir / f"{name}.jsonl"
        return sum(1 for line in path.read_text().splitlines() if '"step"' in line) if path.exists() else 0

    processes = [peer("founder")]
    founder = address("founder")
    processes.append(peer("member", "--join", founder))
    deadline = time.monotonic() + 120
    while (steps_done("founder") < steps // 3 or not steps_done("member")) and time.monotonic() < deadline:
        time.sleep(0.2)
    processes.append(peer("late", "--join", founder))
    codes: list[int | None] = []
    deadline = time.monotonic() + 240
    for process in processes:
        try:
            codes.append(process.wait(max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(None)
    digests: dict[int, set[str]] = defaultdict(set)
    seen: dict[str, list[int]] = {}
    for name in ("founder", "member", "late"):
        path = workdir / f"{name}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        stepped = [r for r in records if "param_digest" in r and "step" in r]
        seen[name] = [r["step"] for r in stepped]
        for r in stepped:
            digests[r["step"]].add(r["param_digest"])
    shared = [s for s, d in digests.items() if sum(s in seen[n] for n in seen) > 1]
    late_first = seen["late"][0] if seen["late"] else None
    return {
        "exit_codes": codes,
        "steps_per_peer": {n: len(s) for n, s in seen.items()},
        "late_first_step": late_first,
        "shared_steps": len(shared),
        "shared_steps_with_one_digest": sum(len(digests[s]) == 1 for s in shared),
        "all_equal": bool(shared) and all(len(digests[s]) == 1 for s in shared) and late_first is not None,
    }


# ------------------------------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--state-mb", type=int, default=1024, help="model + Adam state to stage and pull")
    parser.add_argument("--steps", type=int, default=400, help="steps of the digits training check")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu dry-runs every check without a GPU")
    parser.add_argument("--role", choices=["check", "source"], default="check", help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.role == "source":
        serve_source(args)
        return 0
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (try --device cpu for a dry run; the CPU paths are in the test suite)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
    }
    print(f"device: {results['device']}, torch {results['torch']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="cuda-check-") as tmp:
        workdir = Path(tmp)
        for name, check in (
            ("tests", run_tests),
            ("staging", lambda: check_staging(args.state_mb, args.repeats)),
            ("pull", lambda: check_pull(args.state_mb, workdir)),
            ("training", lambda: check_training(args.steps, workdir)),
        ):
            started = time.perf_counter()
            try:
                results[name] = check()
            except Exception as exc:  # one failed check must not hide the others' results
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            results[name]["wall_s"] = round(time.perf_counter() - started, 1)
            print(name, json.dumps(results[name], indent=1), flush=True)
            write_json(args.json, {"cuda_check": results})
        if "error" in results.get("training", {}) or not results["training"].get("all_equal"):
            for log in sorted(workdir.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text()[-2000:]}", flush=True)
    ok = (
        results["tests"].get("ok")
        and results["staging"].get("loaded_bit_exact")
        and results["staging"].get("flat", {}).get("gathered_equal")
        and results["pull"].get("bit_exact")
        and results["training"].get("all_equal")
    )
    print("CUDA CHECK", "PASSED" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
