"""Saying why a round waits: whom, over which link, for how long (issue 19, "say why you wait").

A member in an averaging round waits for two things from the others: their *contributions* to the
shard it owns (each sent by the contributor over the link contributor -> this member), and the
owners' *results* for the shards it does not own (each sent by that owner over owner -> this
member). :func:`waiting_of` reads both off a :class:`~chaosp2p.training.round_state.RoundState`
(no I/O); :func:`log_waits` runs beside a round and logs what is still missing every
``interval_s`` seconds -- not on every change, so a stall costs one line per interval, not one per
poll; the status report (``waiting_for`` of each run in ``chaosp2p status --json``) shows the same
snapshot on request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio

from chaosp2p.clock import Clock
from chaosp2p.training.round_state import RoundState
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")


@dataclass(frozen=True, slots=True, kw_only=True)
class Waiting:
    """What one member's round of ``run`` still waits for."""

    run: str
    step: int
    attempt: int
    me: PeerID
    since: float
    """When the round started here (the member's clock)."""
    contributions_from: tuple[PeerID, ...]
    """Members whose contribution to this member's shard is not (completely) in, sorted."""
    results_from: tuple[PeerID, ...]
    """Owners whose averaged shard (or revision) this member has not received, sorted."""

    @property
    def peers(self) -> tuple[PeerID, ...]:
        """Everyone this member waits for, sorted."""
        return tuple(sorted(set(self.contributions_from) | set(self.results_from), key=lambda p: p.raw))

    @property
    def what(self) -> str:
        """``contributions``, ``results``, both (``contributions+results``) or ``nothing``."""
        named = (("contributions", self.contributions_from), ("results", self.results_from))
        parts = [name for name, peers in named if peers]
        return "+".join(parts) or "nothing"

    def links(self) -> tuple[str, ...]:
        """The links the missing bytes would come over, as ``sender~receiver`` (short ids)."""
        return tuple(f"{peer.short()}~{self.me.short()}" for peer in self.peers)

    def describe(self, now: float) -> str:
        """One log line's worth: how long, for what, from whom, over which links."""
        parts = []
        if self.contributions_from:
            parts.append("contributions from " + ", ".join(p.short() for p in self.contributions_from))
        if self.results_from:
            parts.append("results from " + ", ".join(p.short() for p in self.results_from))
        detail = "; ".join(parts) or "nothing (finishing)"
        return (
            f"run {self.run!r} step {self.step} (attempt {self.attempt}): waiting {now - self.since:.1f} s for "
            f"{detail} (links {', '.join(self.links()) or '-'})"
        )


def waiting_of(round_: RoundState) -> Waiting:
    """What ``round_`` still waits for, as of now."""
    contributions: frozenset[PeerID] = frozenset()
    if round_.shard_done_at is None and round_.failure is None:
        contributions = round_.undelivered()
    # An owner leaves ``awaiting`` once its result (or revision) is in; one that reported the round
    # aborted is waited for no more either.
    results = {owner for owner in round_.awaiting if owner not in round_.reported}
    return Waiting(
        run=round_.tag.run,
        step=round_.tag.step,
        attempt=round_.tag.attempt,
        me=round_.me,
        since=round_.started,
        contributions_from=tuple(sorted(contributions, key=lambda p: p.raw)),
        results_from=tuple(sorted(results - {round_.me}, key=lambda p: p.raw)),
    )


def silent_contributors(round_: RoundState) -> frozenset[PeerID]:
    """Members from which not even a contribution header reached this member's shard: they did
    not take part in the round at all (as opposed to a slow link, which delivers part of one).

    Nobody, if this member owns an empty shard: nobody contributes to it, and the owners' results
    it waits for are late whenever any contributor is, so its silence proves nothing about anyone
    (the two ends of a cut link own nothing and had signed STALLs of the owners: issue 19)."""
    if not round_.shard.size:
        return frozenset()
    return frozenset(peer for peer in round_.members if peer != round_.me and peer not in round_.inbound)


async def log_waits(round_: RoundState, clock: Clock, interval_s: float) -> None:
    """Log what ``round_`` waits for every ``interval_s`` seconds while it runs (run it beside the
    round and cancel it with the round)."""
    while True:
        await anyio.sleep(interval_s)
        waiting = waiting_of(round_)
        if waiting.peers:
            log.warning("%s", waiting.describe(clock.now()))
