"""Training: collaborations, averaging rounds over the encrypted transport, batch balancing.

Names are resolved lazily (PEP 562) so that importing :mod:`chaosp2p.training` costs nothing until a
name is used, and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaosp2p.protocols.averaging.messages import RoundPhase, RoundTag
    from chaosp2p.protocols.averaging.plan import ReducePlan, Shard, plan_shards
    from chaosp2p.training.averager import Averager, AveragerConfig, Exclusion, RoundStats
    from chaosp2p.training.blocking import Collaboration
    from chaosp2p.training.collaboration import AsyncCollaboration, StepStatistics, TrainingError
    from chaosp2p.training.config import CollaborationConfig

_LAZY = {
    "AsyncCollaboration": "chaosp2p.training.collaboration",
    "StepStatistics": "chaosp2p.training.collaboration",
    "TrainingError": "chaosp2p.training.collaboration",
    "Collaboration": "chaosp2p.training.blocking",
    "CollaborationConfig": "chaosp2p.training.config",
    "Averager": "chaosp2p.training.averager",
    "AveragerConfig": "chaosp2p.training.averager",
    "Exclusion": "chaosp2p.training.averager",
    "RoundStats": "chaosp2p.training.averager",
    "RoundPhase": "chaosp2p.protocols.averaging.messages",
    "RoundTag": "chaosp2p.protocols.averaging.messages",
    "ReducePlan": "chaosp2p.protocols.averaging.plan",
    "Shard": "chaosp2p.protocols.averaging.plan",
    "plan_shards": "chaosp2p.protocols.averaging.plan",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AsyncCollaboration",
    "Averager",
    "AveragerConfig",
    "Collaboration",
    "CollaborationConfig",
    "Exclusion",
    "ReducePlan",
    "RoundPhase",
    "RoundStats",
    "RoundTag",
    "Shard",
    "StepStatistics",
    "TrainingError",
    "plan_shards",
]
