"""One peer of ``benchmarks/training_elastic.py``: an MLP whose state size is chosen, synthetic data,
and a sleep standing in for compute.

Two ways to run it:

* **chaosp2p member** (default): founds the run (no ``--join``) or joins it through
  :class:`chaosp2p.Collaboration`, like every example peer (the shared flags ``--join``,
  ``--steps``, ``--ready-file``, ``--metrics-file``, ``--profile``; SIGTERM is a graceful leave).
  Each step's global batch (``--batch`` samples) is drawn from a seed and the step number and split
  among the members by their agreed shares. After the real forward/backward pass the peer sleeps
  ``--compute-s * local_batch / (batch / --ref-members)`` seconds: a stand-in for a bigger model
  whose cost grows with the local batch (so straggler balancing has something to balance).
  ``--stop-file`` names a file that, once written, holds the step at which every member stops; the
  founder then saves model + Adam to ``--checkpoint`` (``torch.save``) and every member exits at once:
  the first half of a checkpoint-restart.
* **restarted process** (``--restart-from CKPT``): the second half. Loads the checkpoint from disk,
  meets the others with ``torch.distributed`` (gloo over TCP, unencrypted: ``--gloo-init``,
  ``--rank``, ``--world``) and trains ``--steps`` steps with gradients all-reduced weighted by samples.

The metrics file gets one JSON line per step (the shared keys plus ``time``, wall clock, and
``compute_s``) and event records: ``started``, ``admitted`` (newcomer), ``joined`` (how its
snapshot load went: sources, bytes, seconds), ``operation``, ``checkpoint_saved``, ``restarted``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.time()  # before torch is imported: a restarted process pays for that too

import torch  # noqa: E402
from _elastic_model import compute, global_batch, make_model  # noqa: E402

from chaosp2p.trainers.script import MetricsWriter, StopSignal, add_peer_arguments, write_ready_file  # noqa: E402

RUN = "elastic-mlp"


def stop_step(path: Path | None) -> int | None:
    """The step at which to stop, once the harness wrote it."""
    if path is None or not path.exists():
        return None
    text = path.read_text().strip()
    return int(text) if text else None


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    temporary = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, temporary)
    os.replace(temporary, path)


def step_record(result: Any, loss: float, compute_s: float, digest: str | None) -> dict[str, Any]:
    return {
        "step": result.step,
        "epoch": result.epoch,
        "config_digest": result.config_digest,
        "members": result.members,
        "loss": round(loss, 6),
        "samples": result.samples,
        "round_s": round(result.round_s, 6),
        "idle_s": round(result.idle_s, 6),
        "attempts": result.attempts,
        "bytes_sent": result.bytes_sent,
        "bytes_received": result.bytes_received,
        "compute_s": round(compute_s, 6),
        "param_digest": digest,
        "time": time.time(),
    }


def run_member(args: argparse.Namespace) -> int:
    """Found or join the run and train until ``--steps`` (or the stop file's step)."""
    from chaosp2p import Collaboration, CollaborationConfig, Peer, PeerConfig
    from chaosp2p.protocols.membership.config import MembershipConfig

    stop = StopSignal()
    model, optimizer = make_model(args.state_mb)
    metrics = MetricsWriter(args.metrics_file)
    metrics.write({"event": "started", "time": STARTED, "model_built": time.time()})
    # Several processes move the state on two shared cores: the local profile's sub-second failure
    # detection would declare a busy peer failed, so membership keeps LAN timings (as the
    # transformer example does) unless --fast-failure-detection asks for the profile's own.
    config = PeerConfig.profile_named(args.profile)
    if not args.fast_failure_detection:
        config = config.replace(membership=MembershipConfig.lan())
    if args.upload_cap_mbs > 0:  # stands in for each peer's own uplink (every upload: averaging and snapshots)
        config = config.replace(
            transport=dataclasses.replace(config.transport, max_upload_bytes_per_s=args.upload_cap_mbs * 1e6)
        )
    collab_config = CollaborationConfig.profile_named(config.profile).replace(
        global_batch=args.batch,
        balance=args.balance,
        rebalance_interval_steps=args.rebalance_steps,
        max_snapshot_sources=args.max_snapshot_sources,
        round_timeout_min_s=args.round_timeout_s,
    )
    with Peer(initial_peers=args.join, config=config, run=RUN) as peer:
        write_ready_file(args.ready_file, peer.peer_id, peer.addrs)
        collab = Collaboration(peer, run=RUN, model=model, optimizer=optimizer, config=collab_config)
        if args.join:
            metrics.write({"event": "admitted", "time": time.time(), "step": collab.start_step})
        for record in collab.take_events():
            metrics.write(record)
        while collab.step_index < args.steps and not stop.requested:
            last = stop_step(args.stop_file)
            if last is not None and collab.step_index >= last:
                break
            step = collab.step_index
            start, stop_at = collab.batch_slice()
            x, y = global_batch(step, collab.global_batch)
            optimizer.zero_grad()
            loss, compute_s = compute(model, x[start:stop_at], y[start:stop_at], args)
            result = collab.step(samples=stop_at - start)
            digest = collab.parameter_digest() if args.digest_every and step % args.digest_every == 0 else None
            metrics.write(step_record(result, loss, compute_s, digest))
            for record in collab.take_events():
                metrics.write(record)
        configuration = collab.configuration
        known = [link for link in configuration.links if link.up and link.bandwidth_bytes_per_s > 0]
        metrics.write(
            {
                "final_step": collab.step_index,
                "shares": {str(m.peer_id): m.batch_share for m in configuration.members},
                "links": len(configuration.links),
                "links_with_bandwidth": len(known),
            }
        )
        if args.stop_file is not None and not stop.requested:
            # Checkpoint-restart: everyone stops here; the founder writes the checkpoint, and
            # nobody waits for a graceful leave (the whole run restarts).
            if not args.join and args.checkpoint is not None:
                began = time.perf_counter()
                save_checkpoint(args.checkpoint, model, optimizer, collab.step_index)
                metrics.write({"event": "checkpoint_saved", "time": time.time(), "save_s": time.perf_counter() - began})
            metrics.close()
            os._exit(0)
        collab.leave()
    metrics.close()
    return 0


def run_restarted(args: argparse.Namespace) -> int:
    """The checkpoint-restart baseline after the restart: load from disk, gloo, ``--steps`` steps."""
    import torch.distributed as dist

    metrics = MetricsWriter(args.metrics_file)
    model, optimizer = make_model(args.state_mb)
    built = time.time()
    checkpoint = torch.load(args.restart_from, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    loaded = time.time()
    dist.init_process_group("gloo", init_method=args.gloo_init, rank=args.rank, world_size=args.world)
    dist.barrier()
    metrics.write({"event": "restarted", "time": STARTED, "model_built": built, "loaded": loaded, "met": time.time()})
    parameters = list(model.parameters())
    first = int(checkpoint["step"])
    for step in range(first, first + args.steps):
        shares = [args.batch // args.world + (1 if r < args.batch % args.world else 0) for r in range(args.world)]
        start = sum(shares[: args.rank])
        x, y = global_batch(step, args.batch)
        optimizer.zero_grad()
        mine = slice(start, start + shares[args.rank])
        loss, compute_s = compute(model, x[mine], y[mine], args)
        began = time.perf_counter()
        flat = torch.cat([p.grad.reshape(-1) for p in parameters]) * shares[args.rank]  # type: ignore[union-attr]
        dist.all_reduce(flat)
        flat /= args.batch
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))  # type: ignore[union-attr]
            offset += p.numel()
        optimizer.step()
        metrics.write(
            {
                "step": step,
                "members": args.world,
                "loss": round(loss, 6),
                "samples": shares[args.rank],
                "round_s": round(time.perf_counter() - began, 6),
                "compute_s": round(compute_s, 6),
                "time": time.time(),
            }
        )
    dist.destroy_process_group()
    metrics.close()
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.add_argument("--state-mb", type=float, default=100.0, help="parameters + Adam's two moments, MB")
    parser.add_argument("--batch", type=int, default=24, help="global batch: samples per step over all members")
    parser.add_argument("--compute-s", type=float, default=0.3, help="stand-in compute per step at an equal share")
    parser.add_argument("--slowdown", type=float, default=1.0, help="this peer computes this many times slower")
    parser.add_argument("--ref-members", type=int, default=3, help="--compute-s is for batch/this samples")
    parser.add_argument("--balance", action=argparse.BooleanOptionalAction, default=True, help="straggler balancing")
    parser.add_argument("--rebalance-steps", type=int, default=20, help="report throughput every this many steps")
    parser.add_argument("--max-snapshot-sources", type=int, default=0, help="newcomer: load from at most this many")
    parser.add_argument("--upload-cap-mbs", type=float, default=0.0, help="cap this peer's upload, MB/s (0: none)")
    parser.add_argument("--round-timeout-s", type=float, default=10.0, help="CollaborationConfig.round_timeout_min_s")
    parser.add_argument("--digest-every", type=int, default=10, help="param_digest every this many steps (0: never)")
    parser.add_argument("--stop-file", type=Path, help="holds the step at which every member stops")
    parser.add_argument("--checkpoint", type=Path, help="founder: save model + Adam here at the stop step")
    parser.add_argument("--restart-from", type=Path, help="restarted process: load this checkpoint, use gloo")
    parser.add_argument("--gloo-init", default="", help="restarted process: torch.distributed init_method")
    parser.add_argument(
        "--fast-failure-detection", action="store_true", help="the profile's own failure detector, not LAN timings"
    )
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    return parser


def main() -> int:
    torch.set_num_threads(1)  # several peers share this machine's cores
    args = parser().parse_args()
    return run_restarted(args) if args.restart_from is not None else run_member(args)


if __name__ == "__main__":
    sys.exit(main())
