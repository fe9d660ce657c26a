"""``hivemind.optim.state_averager``: ``LRSchedulerBase`` and a read-only view of the optimizer's state.

hivemind's ``TrainingStateAverager`` holds the optimizer, the scheduler and the parameters and
averages them with peers. Here a collaboration does that; ``optimizer.state_averager`` is a view
of the same objects. A standalone ``TrainingStateAverager`` (albert's monitor uses one to save
checkpoints) is not provided.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from chaosp2p.errors import ConfigError

LRSchedulerBase = torch.optim.lr_scheduler.LRScheduler
"""The base class of learning-rate schedulers (hivemind's alias of torch's)."""

SchedulerFactory = Callable[[torch.optim.Optimizer], LRSchedulerBase]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


class StateAveragerView:
    """``optimizer.state_averager``: the optimizer, scheduler, parameters and epoch, read-only."""

    def __init__(self, source: Any) -> None:
        self._source = source  # the drop-in's Optimizer (a type annotation would be an import cycle)

    @property
    def optimizer(self) -> Any:
        """The wrapped torch optimizer."""
        return self._source.opt

    @property
    def scheduler(self) -> Any:
        """The learning-rate scheduler (stepped once per epoch), or None."""
        return self._source.scheduler

    @property
    def main_parameters(self) -> tuple[torch.nn.Parameter, ...]:
        """The parameters being trained (the model's own: nothing is offloaded here)."""
        return tuple(p for group in self._source.opt.param_groups for p in group["params"])

    @property
    def local_epoch(self) -> int:
        """The run's current epoch."""
        return int(self._source.local_epoch)

    def is_alive(self) -> bool:
        """Whether the optimizer still takes part in its run."""
        return bool(self._source.is_alive())

    def load_state_from_peers(self, **kwargs: Any) -> None:
        """The optimizer's ``load_state_from_peers``."""
        self._source.load_state_from_peers(**kwargs)


class TrainingStateAverager:
    """Not provided on its own: a collaboration averages state (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            "chaosp2p.hivemind does not provide a standalone TrainingStateAverager: state is averaged and "
            "served by each hivemind.Optimizer's collaboration (a monitor can read optimizer.state_averager "
            "views only inside a trainer)"
        )


__all__ = ["LRSchedulerBase", "OptimizerFactory", "SchedulerFactory", "StateAveragerView", "TrainingStateAverager"]
