"""Which members' contributions keep failing this peer's checks (the evidence behind an EVICT).

A member that sends averages of the wrong shape or dtype, NaN/Inf, or another architecture's
parameters is excluded from each round by the owners of the shards it touched; that protects the
model but not the run's time (every round pays for the exclusion). :class:`InvalidStreaks` counts,
per member, the consecutive rounds in which this peer -- as the owner of a shard, first-hand, never
from what another owner reported -- found its contribution invalid. At ``limit`` the collaboration
signs an EVICT; negotiation removes the member only once a quorum of members signed one
(``protocols/negotiation.md`` section 3), so one member's word, true or false, evicts nobody.
"""

from __future__ import annotations

from collections.abc import Iterable

from chaosp2p.wire.identity import PeerID


class InvalidStreaks:
    """Per member, the number of consecutive rounds whose contribution failed this owner's checks."""

    __slots__ = ("_counts", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """Streak at which a member is reported (0: never)."""
        self._counts: dict[PeerID, int] = {}

    def observe(self, participants: Iterable[PeerID], invalid: Iterable[PeerID]) -> list[PeerID]:
        """Record one completed round; return the members whose streak reached the limit.

        ``participants``: the round's members (a member not among them this round, e.g. one that
        left the configuration, is forgotten); ``invalid``: those whose contribution this peer
        found invalid itself. A valid contribution ends a streak.
        """
        if not self.limit:
            return []
        bad = set(invalid)
        counts: dict[PeerID, int] = {}
        for peer in participants:
            if peer in bad:
                counts[peer] = self._counts.get(peer, 0) + 1
        self._counts = counts
        return sorted((p for p, n in counts.items() if n >= self.limit), key=lambda p: p.raw)

    def streak(self, peer: PeerID) -> int:
        """Consecutive invalid rounds of ``peer`` so far."""
        return self._counts.get(peer, 0)


__all__ = ["InvalidStreaks"]
