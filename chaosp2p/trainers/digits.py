"""The digits task: an MLP on scikit-learn's bundled digits, trained by the members of a run.

Used by ``examples/train_digits.py`` and ``chaosp2p demo``; runnable as a peer with
``python -m chaosp2p.trainers.digits [--join ADDR] [--steps N] ...`` (the shared example flags, see
:mod:`chaosp2p.trainers.script`). Each step's global batch is drawn from a seed and the step number
and split among the members by their batch shares in the agreed configuration; gradients are
averaged weighted by samples, so the swarm follows the trajectory of one process training on the
same batches (:func:`train_one_process` is that baseline). Besides one line per step, the metrics
file receives the run's committed operations (with their detection, proposal, commit and activation
times) and, on a newcomer, how its state download went.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from chaosp2p.api.blocking_peer import Peer
from chaosp2p.protocols.membership import MembershipConfig
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.trainers.script import MetricsWriter, StopSignal, add_peer_arguments, write_ready_file
from chaosp2p.training import CollaborationConfig

RUN = "digits-mlp"
DATA_SEED = 7


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits as float tensors: 1,500 training and 297 test samples (a fixed split)."""
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, test = order[:1500], order[1500:]
    return x[train], y[train], x[test], y[test]


def make_model(device: torch.device | str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The same initial weights in every process (a newcomer overwrites them with the swarm's anyway).

    The weights are drawn on the CPU and then moved, so they do not depend on ``device``.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=2e-3)


def global_batch_indices(step: int, size: int, n: int) -> np.ndarray:
    """The samples of step ``step``'s global batch (every member and the baseline agree)."""
    return np.random.default_rng([DATA_SEED, step]).choice(n, size=size, replace=False)


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of ``x`` classified as ``y``."""
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def train_one_process(steps: int, batch: int) -> float:
    """The baseline: the same model trained alone on the same global batches."""
    x, y, x_test, y_test = load_data()
    model, optimizer = make_model()
    for step in range(steps):
        idx = torch.from_numpy(global_batch_indices(step, batch, len(x)))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return accuracy(model, x_test, y_test)


def profile_config(name: str, *, fast_failure_detection: bool = False) -> PeerConfig:
    """A built-in profile by name, or a profile file.

    With ``local``, failures are detected with lan timings unless ``fast_failure_detection``:
    several training processes on one machine's shared cores miss ``local``'s 50 ms probe deadlines,
    and every false failure costs the run a removal and a rejoin. A killed process is failed in
    about 0.2 s either way (its kernel closes its connections: ``protocols/membership.md`` §4); the
    fast timers matter only when nothing closes (power loss, SIGSTOP, a partition).
    """
    if name in ("local", "lan", "wan"):
        config = PeerConfig.profile_named(name)
        if name == "local" and not fast_failure_detection:
            config = config.replace(membership=MembershipConfig.lan())
        return config
    return PeerConfig.from_toml(name)


def peer_config(args: argparse.Namespace) -> PeerConfig:
    """The peer's configuration from its command line: ``--profile``, with ``--listen`` replacing the
    profile's listen addresses (a host in its own network namespace needs no profile file for that)."""
    config = profile_config(args.profile, fast_failure_detection=args.fast_failure_detection)
    if args.identity is not None:
        config = config.replace(identity_path=str(args.identity))
    return config.replace(listen=tuple(args.listen)) if args.listen else config


def collaboration_config(args: argparse.Namespace, profile: str) -> CollaborationConfig:
    """The run's settings: the profile's, the global batch, and (a founder's) admission list."""
    config = CollaborationConfig.profile_named(profile).replace(global_batch=args.batch)
    if args.admit and args.join:
        raise SystemExit("--admit closes a run its founder creates; a peer that joins (--join) cannot use it")
    return config.replace(admitted_peers=tuple(args.admit)) if args.admit else config


def run_peer(args: argparse.Namespace) -> int:
    """One member: found or join the run, train until ``--steps``, leave."""
    stop = StopSignal()
    device = torch.device(args.device)
    x, y, x_test, y_test = (t.to(device) for t in load_data())
    model, optimizer = make_model(device)
    metrics = MetricsWriter(args.metrics_file)
    config = peer_config(args)
    from chaosp2p.api import Collaboration

    collab_config = collaboration_config(args, config.profile)
    with Peer(initial_peers=args.join, config=config, run=RUN) as peer:
        write_ready_file(args.ready_file, peer.peer_id, peer.addrs)
        print(f"peer {peer.peer_id} listening on {peer.addrs[0]}", flush=True)
        started = time.perf_counter()
        collab = Collaboration(peer, run=RUN, model=model, optimizer=optimizer, config=collab_config)
        if args.join:
            print(f"admitted at step {collab.start_step} after {time.perf_counter() - started:.2f} s", flush=True)
        for record in collab.take_events():
            metrics.write(record)
        while collab.step_index < args.steps and not stop.requested:
            step = collab.step_index
            start, stop_at = collab.batch_slice()
            idx = torch.from_numpy(global_batch_indices(step, collab.global_batch, len(x))[start:stop_at]).to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()  # type: ignore[no-untyped-call]
            result = collab.step(samples=len(idx))
            metrics.write(
                {
                    "step": result.step,
                    "epoch": result.epoch,
                    "config_digest": result.config_digest,
                    "members": result.members,
                    "loss": round(loss.item(), 6),
                    "samples": result.samples,
                    "round_s": round(result.round_s, 6),
                    "idle_s": round(result.idle_s, 6),
                    "attempts": result.attempts,
                    "param_digest": collab.parameter_digest(),
                    "time": time.time(),
                }
            )
            for record in collab.take_events():
                metrics.write(record)
            if step % 50 == 0:
                print(
                    f"step {step}: loss {loss.item():.3f}, {result.members} members, epoch {result.epoch}", flush=True
                )
            if args.pace > 0:
                time.sleep(args.pace)
        test_accuracy = accuracy(model, x_test, y_test)
        final = {"final_step": collab.step_index, "accuracy": test_accuracy, "param_digest": collab.parameter_digest()}
        metrics.write(final)
        print(f"finished at step {collab.step_index}: test accuracy {test_accuracy:.3f}", flush=True)
        if stop.requested:
            print(f"{stop.signal_name}: leaving the run", flush=True)
        collab.leave()
    metrics.close()
    return 0


def parser() -> argparse.ArgumentParser:
    """The peer's command line (the shared flags plus the task's own)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.add_argument("--batch", type=int, default=64, help="global batch (samples per step over all members)")
    parser.add_argument("--pace", type=float, default=0.02, help="sleep per step, standing in for a bigger model")
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the model trains (cpu, cuda, cuda:1): every member of a run should use the same kind,"
        " since CPU and GPU kernels may round differently",
    )
    parser.add_argument(
        "--fast-failure-detection",
        action="store_true",
        help="keep the local profile's 0.5 s failure detection (needs idle cores; lan timings otherwise)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one peer of the digits run."""
    torch.set_num_threads(1)  # several peers share this machine's cores
    return run_peer(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
