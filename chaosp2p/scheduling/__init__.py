"""Shard planning for multi-neighbor state transfer: an exact greedy, its baselines, no I/O.

>>> from chaosp2p.scheduling import Source, plan_shards
>>> plan = plan_shards(1 << 30, [Source("A", 1e8, 0.01), Source("B", 5e7, 0.02)])
>>> plan.shard_count, round(plan.makespan_s, 3)
(1024, 7.172)

The model and the optimality proofs are in ``protocols/scheduling.md``; the exact MILP the greedy
is checked against lives in :mod:`chaosp2p.scheduling.reference` (needs scipy, tests/bench only).
"""

from __future__ import annotations

from chaosp2p.scheduling.baselines import (
    plan_chaos_default,
    plan_equal_split,
    plan_proportional_split,
    plan_single_source,
)
from chaosp2p.scheduling.model import Assignment, ShardPlan, Source, downlink_bound, predict_makespan
from chaosp2p.scheduling.planner import (
    DEFAULT_MAX_SHARDS,
    DEFAULT_MIN_SHARD_BYTES,
    plan_shards,
    replan,
    shard_count_chain,
)

__all__ = [
    "DEFAULT_MAX_SHARDS",
    "DEFAULT_MIN_SHARD_BYTES",
    "Assignment",
    "ShardPlan",
    "Source",
    "downlink_bound",
    "plan_chaos_default",
    "plan_equal_split",
    "plan_proportional_split",
    "plan_shards",
    "plan_single_source",
    "predict_makespan",
    "replan",
    "shard_count_chain",
]
