"""DiLoCo's outer loop: global parameters, pseudo-gradients and the outer optimizer.

Every member keeps a copy of the *global* parameters (identical on all members) next to the live
model it trains locally. After ``local_steps`` inner steps the pseudo-gradient is
``global - local``; its sample-weighted average over the members becomes the global parameters'
gradient for an outer SGD step with Nesterov momentum (the DiLoCo paper's outer optimizer), and the
live model restarts from the new global parameters. The global parameters and the outer optimizer
are what a newcomer downloads (each member's inner optimizer state is its own), wrapped as a small
module so the PyTorch state adapter can snapshot them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chaosp2p.training.flat import FlatParameters


class OuterState:
    """Global parameters + outer optimizer of one DiLoCo member."""

    def __init__(self, model: Any, *, lr: float, momentum: float) -> None:
        import torch

        trainable = [p for p in model.parameters() if p.requires_grad]
        self.module = torch.nn.ParameterList([torch.nn.Parameter(p.detach().clone()) for p in trainable])
        # momentum 0 with lr 1 is plain parameter averaging (hivemind's use_local_updates); torch
        # refuses Nesterov without momentum, so it is only asked for when there is momentum.
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=lr, momentum=momentum, nesterov=momentum > 0)
        self._flat = FlatParameters(list(self.module.parameters()))
        self._values = self._flat.host_array()

    def pseudo_gradient(self, live: FlatParameters, out: np.ndarray) -> None:
        """``out = global - live`` (flat float32)."""
        live.gather_values(out)
        self._flat.gather_values(self._values)
        np.subtract(self._values, out, out=out)

    def apply(self, averaged: np.ndarray, live: FlatParameters) -> None:
        """Outer step with the averaged pseudo-gradient, then restart the live model from it."""
        self._flat.scatter_grads(averaged)
        self.optimizer.step()
        self.copy_to_model(live)

    def copy_to_model(self, live: FlatParameters) -> None:
        """Overwrite the live model's parameters with the global ones."""
        self._flat.gather_values(self._values)
        live.scatter_values(self._values)
