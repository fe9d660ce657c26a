"""Planning an all-reduce: which member owns which part of the flat buffer (pure, no I/O).

Theory of operation
-------------------
Every member of a round holds a flat float32 buffer of the same length. The buffer is cut into one
contiguous *shard* per member, in the order of the member list every member passes (the
collaboration passes the configuration's ring order restricted to the step's participants), sized
in proportion to each member's bandwidth estimate and aligned to ``align_elements`` (64 floats =
256 bytes: whole cache lines, and SIMD-friendly for the reduce). The averaging is a *butterfly*
(direct reduce-scatter, then all-gather):

1. reduce-scatter: every member sends its slice of shard *k* straight to shard *k*'s owner, which
   checks each contribution on its own (length, dtype, weight, finite values) and computes the
   weighted average of the valid ones, in a fixed order (sorted by peer id);
2. all-gather: each owner sends its averaged shard -- the same bytes to everyone -- to every member.

Why a butterfly rather than a ring: in a ring, what a member forwards is already a partial sum, so a
NaN or a wrong-length contribution shows up only downstream, mixed with the others, and cannot be
attributed to its sender or removed without redoing the round. In the butterfly every contribution
arrives *unmixed* at the owner that uses it, so each one is validated and, if bad, excluded on its
own -- with a log line naming the sender -- while the rest of the round goes on. Both move the same
volume: each member sends and receives ``(n-1)/n`` of the buffer in each phase (``2(n-1)/n`` in
all, the bandwidth-optimal amount), and a failure costs one round trip to detect instead of a walk
around the ring. The ring's advantage, only two open links per member, matters for thousands of
members on a WAN; the butterfly's ``n - 1`` links per member are fine for the tens of members a
training configuration has, and the configuration's measured bandwidth decides the shard sizes, so
a slow link owns (and therefore moves) less.

Bandwidth-proportional shards: with the butterfly an owner of ``s`` elements receives ``(n-1)s``
and sends ``(n-1)s``, besides the fixed ``L - s`` it contributes and gathers; giving fast members
larger shards balances the phase times. A member with bandwidth 0 owns an empty shard (an observer,
or a member that should not carry load); unknown bandwidth (``None``) counts as the mean of the
known values, i.e. equal when nothing is known.

Everything here is exact integer/rational arithmetic on the inputs, so every member computes the
identical plan from the identical (member list, bandwidths, length). ``protocols/averaging.md``
section 5 is the normative description, with a test vector.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID

DEFAULT_ALIGN_ELEMENTS = 64
"""Shard boundaries fall on multiples of this many elements (except the end of the buffer)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """The elements ``start .. stop`` of the flat buffer, averaged by ``owner``."""

    owner: PeerID
    start: int
    stop: int

    @property
    def size(self) -> int:
        """Number of elements in the shard (0 for a member that owns nothing)."""
        return self.stop - self.start


@dataclass(frozen=True, slots=True, kw_only=True)
class ReducePlan:
    """One shard per member, contiguous, in member order, covering ``0 .. length`` exactly."""

    length: int
    shards: tuple[Shard, ...]

    @property
    def members(self) -> tuple[PeerID, ...]:
        """The members in plan order."""
        return tuple(shard.owner for shard in self.shards)

    def shard_of(self, peer: PeerID) -> Shard:
        """The shard ``peer`` owns (``LookupError`` if it is not a member)."""
        for shard in self.shards:
            if shard.owner == peer:
                return shard
        raise LookupError(f"{peer} is not a member of this plan")


def plan_shards(
    members: Sequence[PeerID],
    length: int,
    bandwidth: Mapping[PeerID, float | None] | None = None,
    *,
    align_elements: int = DEFAULT_ALIGN_ELEMENTS,
) -> ReducePlan:
    """Partition ``length`` elements into one contiguous shard per member, by bandwidth.

    ``members`` gives the order (every member must pass the same order, e.g. sorted by peer id);
    ``bandwidth`` maps a member to its estimated bytes/s (missing or ``None``: unknown, counted as
    the mean of the known values; ``0``: owns nothing). Aligned blocks of ``align_elements`` are
    shared out by the largest-remainder method on exact rationals, ties going to the earlier member,
    so the result is deterministic and identical on every member.
    """
    if not members:
        raise ConfigError("an all-reduce needs at least one member")
    if len(set(members)) != len(members):
        raise ConfigError("the member list has duplicates")
    if length < 0:
        raise ConfigError(f"buffer length must be >= 0 (got {length})")
    if align_elements < 1:
        raise ConfigError(f"align_elements must be >= 1 (got {align_elements})")
    weights = _weights(members, bandwidth or {})
    blocks = -(-length // align_elements)
    counts = _largest_remainder(blocks, weights)
    shards = []
    cursor = 0
    for peer, count in zip(members, counts, strict=True):
        start = min(length, cursor * align_elements)
        cursor += count
        shards.append(Shard(owner=peer, start=start, stop=min(length, cursor * align_elements)))
    return ReducePlan(length=length, shards=tuple(shards))


def _weights(members: Sequence[PeerID], bandwidth: Mapping[PeerID, float | None]) -> list[Fraction]:
    known: list[Fraction] = []
    for peer in members:
        value = bandwidth.get(peer)
        if value is None:
            continue
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"bandwidth of {peer} must be a finite number >= 0 (got {value!r})")
        known.append(Fraction(value))
    default = sum(known, Fraction(0)) / len(known) if known else Fraction(1)
    if default == 0:  # every known estimate is 0: the unknown ones still carry the load equally
        default = Fraction(1)
    weights = []
    for peer in members:
        value = bandwidth.get(peer)
        weights.append(default if value is None else Fraction(value))
    if not any(weights):
        raise ConfigError("at least one member must have a bandwidth > 0 to own a shard")
    return weights


def _largest_remainder(total: int, weights: Sequence[Fraction]) -> list[int]:
    """``total`` units split in proportion to ``weights`` (exact; ties to the lower index)."""
    whole = sum(weights, Fraction(0))
    quotas = [total * w / whole for w in weights]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for index in order[:left]:
        counts[index] += 1
    return counts
