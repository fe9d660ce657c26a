"""The benchmark state, generated identically by every process (numpy only, so the hivemind
baseline's interpreter can import it without chaosp2p installed)."""

from __future__ import annotations

import numpy as np


def model_and_adam_state(total_bytes: int, seed: int) -> dict[str, np.ndarray]:
    """Weights, Adam exp_avg and exp_avg_sq (a third each) plus a step counter, from ``seed``."""
    rng = np.random.default_rng(seed)
    third = (total_bytes // 3) // 4096 * 4096  # whole rows of 1024 float32
    state = {}
    for name in ("model.weight", "optimizer.exp_avg", "optimizer.exp_avg_sq"):
        state[name] = np.frombuffer(rng.bytes(third), dtype=np.float32).reshape(-1, 1024)
    state["optimizer.step"] = np.array(1000, dtype=np.int64)
    return state
