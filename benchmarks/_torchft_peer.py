"""One peer of ``benchmarks/vs_torchft.py`` without chaosp2p: a torchft replica or a plain DDP rank.

Trains ``_elastic_model.py``'s MLP on its synthetic data with its stand-in compute, like
``_elastic_peer.py`` does through chaosp2p, so the two sides differ only in what moves the gradients.

* ``--mode torchft`` (needs torchft 0.2.0: run it with that interpreter): one replica group of one
  process. It starts its own ``TCPStore``, a torchft ``Manager`` that reaches the Lighthouse at
  ``--lighthouse`` and a reconfigurable ``ProcessGroupGloo``. Each step: ``start_quorum`` (async,
  overlapping the forward pass as torchft recommends), forward/backward, one flat gradient
  all-reduce (``Manager.allreduce``, the average over the participants), ``should_commit``, then the
  Adam step. A replica that joins late heals: torchft sends it the model + Adam state over its HTTP
  checkpoint transport. Timeouts: ``--timeout-s`` (collectives, should_commit, checkpoint transfer),
  ``--quorum-timeout-s``, ``--connect-timeout-s``; the Lighthouse's own are the harness's.
* ``--mode ddp``: ``--world`` fixed ranks with ``torch.distributed`` (gloo over TCP), the same flat
  gradient all-reduce, no fault tolerance: the floor both systems are measured against.

Every replica computes on ``--batch / --ref-members`` samples per step whatever the number of
participants (torchft's data-parallel model: each replica group brings its own batch). The metrics
file gets a ``started`` record (``time`` before torch is imported, ``model_built``), then one JSON
line per committed step: ``step``, ``members`` (participants), ``time`` (wall clock),
``compute_s``, ``round_s`` (all-reduce + commit), and ``uncommitted`` events for the steps torchft
threw away.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

STARTED = time.time()  # before torch is imported, as _elastic_peer.py records it

import torch  # noqa: E402
from _elastic_model import compute, global_batch, make_model  # noqa: E402


class Metrics:
    """One JSON object per line, flushed at once (the harness reads the file while we run)."""

    def __init__(self, path: Path | None) -> None:
        self.file: IO[str] | None = path.open("a") if path is not None else None

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()


def flat_gradient(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]


def set_gradient(model: torch.nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for p in model.parameters():
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))  # type: ignore[union-attr]
        offset += p.numel()


def local_batch(step: int, index: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's ``batch / ref_members`` samples of step ``step``'s global batch."""
    size = max(1, args.batch // args.ref_members)
    x, y = global_batch(step, size * args.ref_members)
    start = (index % args.ref_members) * size
    return x[start : start + size], y[start : start + size]


def run_torchft(args: argparse.Namespace, metrics: Metrics) -> int:
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo

    model, optimizer = make_model(args.state_mb)
    metrics.write({"event": "started", "time": STARTED, "model_built": time.time()})
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout_s)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        timeout=timedelta(seconds=args.timeout_s),
        quorum_timeout=timedelta(seconds=args.quorum_timeout_s),
        connect_timeout=timedelta(seconds=args.connect_timeout_s),
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"replica_{args.index}",
        hostname="127.0.0.1",
    )
    if args.ready_file is not None:
        args.ready_file.write_text(json.dumps({"replica": args.index}))
    last = -1
    while manager.current_step() < args.steps:
        manager.start_quorum()
        optimizer.zero_grad()
        step = manager.current_step()
        x, y = local_batch(step, args.index, args)
        loss, compute_s = compute(model, x, y, args)
        began = time.perf_counter()
        flat = flat_gradient(model)
        manager.allreduce(flat).wait()
        set_gradient(model, flat)
        if manager.should_commit():
            optimizer.step()
            metrics.write(
                {
                    "step": manager.current_step(),
                    "members": manager.num_participants(),
                    "loss": round(loss, 6),
                    "compute_s": round(compute_s, 6),
                    "round_s": round(time.perf_counter() - began, 6),
                    "time": time.time(),
                }
            )
        else:
            metrics.write({"event": "uncommitted", "step": step, "time": time.time(), "last": last})
        last = step
    manager.shutdown(wait=False)
    return 0


def run_ddp(args: argparse.Namespace, metrics: Metrics) -> int:
    import torch.distributed as dist

    model, optimizer = make_model(args.state_mb)
    metrics.write({"event": "started", "time": STARTED, "model_built": time.time()})
    dist.init_process_group("gloo", init_method=args.gloo_init, rank=args.index, world_size=args.world)
    if args.ready_file is not None:
        args.ready_file.write_text(json.dumps({"replica": args.index}))
    for step in range(args.steps):
        optimizer.zero_grad()
        x, y = local_batch(step, args.index, args)
        loss, compute_s = compute(model, x, y, args)
        began = time.perf_counter()
        flat = flat_gradient(model)
        dist.all_reduce(flat)
        flat /= args.world
        set_gradient(model, flat)
        optimizer.step()
        record = {"step": step + 1, "members": args.world, "loss": round(loss, 6), "compute_s": round(compute_s, 6)}
        metrics.write({**record, "round_s": round(time.perf_counter() - began, 6), "time": time.time()})
    dist.destroy_process_group()
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("torchft", "ddp"), default="torchft")
    parser.add_argument("--index", type=int, default=0, help="replica number (torchft) or rank (ddp)")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--state-mb", type=float, default=50.0, help="parameters + Adam's two moments, MB")
    parser.add_argument("--batch", type=int, default=24, help="global batch at --ref-members replicas")
    parser.add_argument("--compute-s", type=float, default=0.3, help="stand-in compute per step at an equal share")
    parser.add_argument("--slowdown", type=float, default=1.0, help="this peer computes this many times slower")
    parser.add_argument("--ref-members", type=int, default=3, help="each replica computes on batch/this samples")
    parser.add_argument("--lighthouse", default="", help="torchft: the Lighthouse's address, http://HOST:PORT")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="torchft Manager timeout (its default 60)")
    parser.add_argument("--quorum-timeout-s", type=float, default=60.0, help="torchft quorum timeout (default 60)")
    parser.add_argument("--connect-timeout-s", type=float, default=60.0, help="torchft connect timeout (default 60)")
    parser.add_argument("--gloo-init", default="", help="ddp: torch.distributed init_method")
    parser.add_argument("--world", type=int, default=1, help="ddp: ranks")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--metrics-file", type=Path)
    return parser


def main() -> int:
    torch.set_num_threads(1)  # several peers share this machine's cores
    args = parser().parse_args()
    metrics = Metrics(args.metrics_file)
    return run_torchft(args, metrics) if args.mode == "torchft" else run_ddp(args, metrics)


if __name__ == "__main__":
    sys.exit(main())
