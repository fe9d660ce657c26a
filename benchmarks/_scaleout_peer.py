"""One peer of ``benchmarks/scaleout.py``: ``benchmarks/_elastic_peer.py`` with a state sized like a
big model but a small averaged part.

    python benchmarks/_scaleout_peer.py --train-mb 2 --state-mb 70.5 [every _elastic_peer.py flag]

Sixteen processes averaging ResNet-50's gradients on two cores would measure the CPU, not the
scale-out. So the members average a small MLP (``--train-mb``: its parameters plus Adam's two
moments) and the rest of ``--state-mb`` is a persistent model buffer of synthetic float32 (never
averaged, never trained): part of ``model.state_dict()``, so every snapshot a newcomer loads and
every checkpoint the restart baseline saves and loads carries it. The founder fills the buffer from
a fixed seed; every other process starts with zeros, so a newcomer holds the founder's bytes only if
its state load delivered them. Each step record with a parameter digest, and each process's first
step record, also carries ``buffer_digest`` (xxh3-128 of the buffer) so the harness can check every
join bit for bit.

With ``CHAOSP2P_TRACEMALLOC=DIR`` in the environment the process traces its allocations and writes,
every 60 s, the 25 call sites whose memory grew most since the end of its warm-up
(``CHAOSP2P_TRACEMALLOC_WARMUP_S``, default 180 s: imports and the first joins are done) to
``DIR/<pid>.txt``, for finding what a soak's RSS growth is made of.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import _elastic_peer as peer
import numpy as np
import torch
import xxhash

BUFFER_SEED = 2505
_state: dict[str, Any] = {"buffer": None, "first": True}


def _split_arguments() -> tuple[float, bool]:
    """Take ``--train-mb`` out of ``sys.argv`` (the rest is _elastic_peer.py's); whether we found a run."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--train-mb", type=float, default=2.0)
    known, rest = parser.parse_known_args(sys.argv[1:])
    sys.argv[1:] = rest
    founder = "--join" not in rest and "--restart-from" not in rest
    return known.train_mb, founder


def _trace_growth(folder: Path, warmup_s: float) -> None:
    """Every 60 s, the call sites that grew most since the warm-up (a daemon thread)."""
    tracemalloc.start(12)
    # Imports and the tracer's own source-line cache are not what a soak is looking for.
    ignored = [
        tracemalloc.Filter(False, "<frozen importlib._bootstrap*>", all_frames=True),
        tracemalloc.Filter(False, "*linecache.py", all_frames=True),
    ]
    time.sleep(warmup_s)
    first = tracemalloc.take_snapshot().filter_traces(ignored)
    out = folder / f"{os.getpid()}.txt"
    while True:
        time.sleep(60)
        now = tracemalloc.take_snapshot().filter_traces(ignored)
        lines = [f"# {time.strftime('%H:%M:%S')} traced {tracemalloc.get_traced_memory()[0] / 1e6:.1f} MB"]
        for diff in now.compare_to(first, "traceback")[:25]:
            lines.append(f"{diff.size_diff / 1e6:+.2f} MB {diff.count_diff:+d} blocks")
            lines += [f"    {frame}" for frame in diff.traceback.format()[-12:]]
        out.write_text("\n".join(lines) + "\n")


def main() -> int:
    folder = os.environ.get("CHAOSP2P_TRACEMALLOC")
    if folder:
        warmup_s = float(os.environ.get("CHAOSP2P_TRACEMALLOC_WARMUP_S", "180"))
        threading.Thread(target=_trace_growth, args=(Path(folder), warmup_s), daemon=True).start()
    train_mb, founder = _split_arguments()
    make_model, step_record = peer.make_model, peer.step_record

    def sized_model(state_mb: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model, optimizer = make_model(min(train_mb, state_mb))
        extra = int(max(0.0, state_mb - train_mb) * 1e6) // 4
        if founder:
            data = np.frombuffer(np.random.default_rng(BUFFER_SEED).bytes(extra * 4), dtype=np.float32)
            buffer = torch.from_numpy(data.copy())
        else:
            buffer = torch.zeros(extra, dtype=torch.float32)
        model.register_buffer("frozen_state", buffer, persistent=True)
        _state["buffer"] = buffer
        return model, optimizer

    def record(result: Any, loss: float, compute_s: float, digest: str | None) -> dict[str, Any]:
        out = step_record(result, loss, compute_s, digest)
        if digest is not None or _state["first"]:
            buffer = _state["buffer"]
            out["buffer_digest"] = (
                xxhash.xxh3_128_hexdigest(buffer.numpy().view(np.uint8)) if buffer is not None else None
            )
            _state["first"] = False
        return out

    peer.make_model = sized_model
    peer.step_record = record
    return peer.main()


if __name__ == "__main__":
    sys.exit(main())
