"""Training: collaborations, averaging rounds over the encrypted transport, batch balancing.

A collaboration talks to its peer only through the :class:`TrainingPort`; the blocking
``Collaboration`` for plain scripts lives beside ``Peer`` in :mod:`chaosp2p.api`.

Names are resolved lazily (PEP 562) so that importing :mod:`chaosp2p.training` costs nothing until a
name is used, and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chaosp2p._moved import moved_name

if TYPE_CHECKING:
    from chaosp2p.errors import TrainingError
    from chaosp2p.protocols.averaging.messages import RoundPhase, RoundTag
    from chaosp2p.protocols.averaging.plan import ReducePlan, Shard, plan_shards
    from chaosp2p.training.averager import Averager, AveragerConfig, Exclusion, RoundStats
    from chaosp2p.training.collab_core import StepStatistics
    from chaosp2p.training.collaboration import AsyncCollaboration
    from chaosp2p.training.config import CollaborationConfig
    from chaosp2p.training.port import RunGates, TrainingPort

_LAZY = {
    "AsyncCollaboration": "chaosp2p.training.collaboration",
    "StepStatistics": "chaosp2p.training.collab_core",
    "TrainingError": "chaosp2p.errors",
    "TrainingPort": "chaosp2p.training.port",
    "RunGates": "chaosp2p.training.port",
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
        return moved_name(__name__, name)
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AsyncCollaboration",
    "Averager",
    "AveragerConfig",
    "CollaborationConfig",
    "Exclusion",
    "ReducePlan",
    "RoundPhase",
    "RoundStats",
    "RoundTag",
    "RunGates",
    "Shard",
    "StepStatistics",
    "TrainingError",
    "TrainingPort",
    "plan_shards",
]
