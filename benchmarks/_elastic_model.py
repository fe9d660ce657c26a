"""The model and data every training benchmark peer shares (``_elastic_peer.py``, ``_torchft_peer.py``).

Only numpy and torch: the torchft peer runs it in an interpreter without chaosp2p. An MLP whose
parameters plus Adam's two moments come to a chosen size, synthetic data from a seed and the step
number, and a sleep standing in for a bigger model's compute.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

DATA_SEED = 13
INPUT = 256
CLASSES = 16


def hidden_width(state_mb: float) -> int:
    """Width of the two hidden layers so that parameters + Adam's two moments come to ``state_mb`` MB."""
    params = state_mb * 1e6 / 12  # float32 parameter + two float32 moments
    linear = INPUT + CLASSES + 3  # width appears linearly: input/output layers and biases
    return max(8, int((-linear + math.sqrt(linear * linear + 4 * (params - CLASSES))) / 2))


def make_model(state_mb: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Identical initial weights everywhere (a newcomer overwrites them with the run's anyway)."""
    torch.manual_seed(0)
    width = hidden_width(state_mb)
    model = torch.nn.Sequential(
        torch.nn.Linear(INPUT, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, CLASSES),
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch: inputs and labels of a fixed random linear teacher."""
    teacher = np.random.default_rng(DATA_SEED).standard_normal((INPUT, CLASSES)).astype(np.float32)
    x = np.random.default_rng([DATA_SEED, step]).standard_normal((size, INPUT)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy((x @ teacher).argmax(axis=1))


def compute(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace) -> tuple[float, float]:
    """Forward + backward, then the stand-in sleep; returns (loss, seconds).

    With ``--slowdown F`` the whole of it takes F times as long: the stand-in sleep is F times
    longer, and the real forward/backward time is slept again F - 1 times.
    """
    began = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    real = time.perf_counter() - began
    equal_share = args.batch / args.ref_members
    time.sleep(args.slowdown * args.compute_s * len(x) / equal_share + (args.slowdown - 1) * real)
    return float(loss.item()), time.perf_counter() - began
