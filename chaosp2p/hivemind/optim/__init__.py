"""``hivemind.optim``: ``Optimizer`` (:mod:`chaosp2p.hivemind.optimizer`) and its views.

``GradScaler``, ``TrainingAverager`` and ``DecentralizedOptimizer`` are not provided.
"""

from __future__ import annotations

import importlib
from typing import Any

_NOT_PROVIDED = ("GradScaler", "TrainingAverager", "DecentralizedOptimizer", "PowerSGDGradientAverager")


def __getattr__(name: str) -> Any:
    # torch is imported with the optimizer, not with the package
    if name == "Optimizer":
        return importlib.import_module("chaosp2p.hivemind.optimizer").Optimizer
    if name in _NOT_PROVIDED:
        raise AttributeError(f"chaosp2p.hivemind does not provide hivemind.optim.{name}")
    raise AttributeError(f"module 'chaosp2p.hivemind.optim' has no attribute {name!r}")


__all__ = ["Optimizer"]
