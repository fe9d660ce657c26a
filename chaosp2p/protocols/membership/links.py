"""Choosing the overlay links: a bounded set of neighbours picked by measured latency and bandwidth.

The cost of a link is the time to move one reference shard over it: ``rtt + reference_bytes /
bandwidth``. Unmeasured figures are replaced by the median of the measured ones, so an unknown
candidate ranks in the middle: it is tried when slots are free (which is how it gets measured)
but does not push out a link known to be good. Free slots are filled with the cheapest candidates;
when all slots are taken, at most one link per refresh is replaced, and only by a candidate
cheaper by a configured fraction, so links do not flap on measurement noise.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkMetrics:
    """What we measured towards one peer (None = not measured)."""

    rtt_s: float | None
    bandwidth_bytes_per_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkPlan:
    """Links to open and links to drop."""

    add: tuple[PeerID, ...]
    drop: tuple[PeerID, ...]


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values.sort()
    middle = len(values) // 2
    if len(values) % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


def link_costs(metrics: Mapping[PeerID, LinkMetrics], *, reference_bytes: int) -> dict[PeerID, float]:
    """Cost of every peer in ``metrics`` (unknown figures replaced by the medians)."""
    rtt_default = _median([m.rtt_s for m in metrics.values() if m.rtt_s is not None]) or 0.0
    bw_default = _median(
        [m.bandwidth_bytes_per_s for m in metrics.values() if m.bandwidth_bytes_per_s]  # 0 = unknown
    )
    costs: dict[PeerID, float] = {}
    for peer, m in metrics.items():
        cost = m.rtt_s if m.rtt_s is not None else rtt_default
        bandwidth = m.bandwidth_bytes_per_s or bw_default
        if bandwidth:
            cost += reference_bytes / bandwidth
        costs[peer] = cost
    return costs


def plan_links(
    current: Sequence[PeerID],
    candidates: Mapping[PeerID, LinkMetrics],
    *,
    degree: int,
    improvement: float,
    reference_bytes: int,
    rng: random.Random,
) -> LinkPlan:
    """Which links to add and drop so that at most ``degree`` good links remain.

    ``current`` are the links kept so far (the caller already removed dead ones); ``candidates``
    holds metrics for every eligible peer, current links included.
    """
    costs = link_costs(candidates, reference_bytes=reference_bytes)
    kept = [p for p in current if p in costs]
    others = [p for p in costs if p not in set(kept)]
    rng.shuffle(others)  # random tie-break among equal (e.g. unmeasured) costs
    others.sort(key=costs.__getitem__)
    drop = [p for p in current if p not in costs]
    if len(kept) > degree:
        kept.sort(key=costs.__getitem__)
        drop.extend(kept[degree:])
        kept = kept[:degree]
    add: list[PeerID] = []
    free = degree - len(kept)
    if free > 0:
        add = others[:free]
    elif kept and others:
        worst = max(kept, key=costs.__getitem__)
        best = others[0]
        if costs[best] < costs[worst] * (1.0 - improvement):
            add.append(best)
            drop.append(worst)
    return LinkPlan(add=tuple(add), drop=tuple(drop))
