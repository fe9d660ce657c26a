"""Link estimates and the shard planner interface the pull machine plans with.

A :class:`SourceEstimate` is what the newcomer believes about one source's link before (or while)
it measures it; the :class:`ShardPlanner` turns believed rates into an assignment of byte ranges.
The default planner wraps the optimal scheduler in :mod:`chaosp2p.scheduling`; benchmarks plug in
baselines through the same interface.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceEstimate:
    """A candidate source with the link estimates the cluster monitor has for it.

    ``bytes_per_s=None`` means nothing is known yet: the pull starts the source on an even share
    and measures it (a newcomer that just joined knows nothing about its links).
    """

    peer: PeerID
    bytes_per_s: float | None = None
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.bytes_per_s is not None and not (math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise ConfigError(f"bytes_per_s must be positive and finite (got {self.bytes_per_s!r})")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"latency_s must be >= 0 and finite (got {self.latency_s!r})")


class ShardPlanner(Protocol):
    """Splits byte ranges over sources (the default wraps :mod:`chaosp2p.scheduling`)."""

    def plan(
        self,
        ranges: Sequence[tuple[int, int]],
        sources: Sequence[SourceEstimate],
        *,
        total_bytes: int,
        align_bytes: int,
    ) -> Sequence[tuple[PeerID, int, int]]:
        """Assign every byte of ``ranges`` to one source: ``(peer, offset, length)`` triples."""
        ...


class SchedulingPlanner:
    """:class:`ShardPlanner` backed by ``chaosp2p.scheduling.plan_shards`` / ``replan``."""

    def __init__(
        self,
        *,
        max_shards: int = 4096,
        per_shard_overhead_s: float = 0.0,
        downlink_bytes_per_s: float | None = None,
    ) -> None:
        self.max_shards = max_shards
        self.per_shard_overhead_s = per_shard_overhead_s
        self.downlink_bytes_per_s = downlink_bytes_per_s

    def plan(
        self,
        ranges: Sequence[tuple[int, int]],
        sources: Sequence[SourceEstimate],
        *,
        total_bytes: int,
        align_bytes: int,
    ) -> Sequence[tuple[PeerID, int, int]]:
        """Plan with the optimal scheduler; a whole snapshot uses ``plan_shards``, gaps ``replan``.

        Every estimate must carry a rate (the pull machine fills unknown ones in before planning).
        """
        from chaosp2p.scheduling import Source, plan_shards, replan

        sched = []
        for s in sources:
            if s.bytes_per_s is None:
                raise ConfigError(f"no rate estimate for {s.peer.short()}")
            sched.append(Source(peer_id=s.peer, bytes_per_s=s.bytes_per_s, latency_s=s.latency_s))
        if list(ranges) == [(0, total_bytes)]:
            result = plan_shards(
                total_bytes,
                sched,
                max_shards=self.max_shards,
                min_shard_bytes=align_bytes,
                per_shard_overhead_s=self.per_shard_overhead_s,
                downlink_bytes_per_s=self.downlink_bytes_per_s,
                align_bytes=align_bytes,
            )
        else:
            result = replan(
                list(ranges),
                sched,
                max_shards=self.max_shards,
                min_shard_bytes=align_bytes,
                per_shard_overhead_s=self.per_shard_overhead_s,
                downlink_bytes_per_s=self.downlink_bytes_per_s,
                align_bytes=align_bytes,
            )
        peers: dict[object, PeerID] = {s.peer: s.peer for s in sources}
        return [(peers[peer], int(offset), int(length)) for peer, offset, length in result.assignments]
