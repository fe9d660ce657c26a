"""Book-keeping of one averaging round on one member (no I/O; the averager drives it).

A :class:`RoundState` records what the round has seen -- contribution streams accepted or refused,
answers from owners, exclusions, failures -- and decides the small questions on the spot (is this
contribution acceptable to this owner? which owners must send a revised shard?). The averager's
tasks move the bytes and consult it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import anyio
import numpy as np

from chaosp2p.protocols.averaging.messages import Contribution, Result, ResultStatus, RoundTag, WireDtype
from chaosp2p.protocols.averaging.plan import ReducePlan
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")

FailureKind = Literal["aborted", "mismatch"]


class Beacon:
    """Wakes every task waiting for "something changed"; waiters re-check their condition."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        """Wake the current waiters."""
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        """Wait for the next :meth:`notify`."""
        await self._event.wait()


class Inbound:
    """A contribution stream at its owner: header read, waiting for or used by a round."""

    def __init__(self, peer: PeerID, stream: Stream, header: Contribution) -> None:
        self.peer = peer
        self.stream = stream
        self.header = header
        self.assigned = anyio.Event()
        """Set once a round took the stream (or a refusal was decided)."""
        self.done = anyio.Event()
        """Set once the round is done with the stream (the handler may return)."""
        self.reply: Result | None = None
        """An immediate answer (a refusal) for the handler to send instead of joining a round."""
        self.values: np.ndarray | None = None
        """Where the payload goes (``None``: no payload expected)."""
        self.received = 0
        """Elements of the payload received so far."""
        self.answered = False
        self.ok_sent = False
        self.failed = False


def mismatch(detail: str) -> Result:
    """A MISMATCH answer."""
    return Result(status=ResultStatus.MISMATCH, detail=detail[:1024])


class RoundState:
    """Everything one member knows about one round."""

    def __init__(
        self,
        *,
        tag: RoundTag,
        me: PeerID,
        plan: ReducePlan,
        buffer: np.ndarray,
        weight: float,
        wire: WireDtype,
        chunk_elements: int,
        max_weights: dict[PeerID, float],
        started: float,
        relays: Mapping[PeerID, Sequence[PeerID]] | None = None,
    ) -> None:
        self.tag = tag
        self.me = me
        self.plan = plan
        self.members = plan.members
        self.member_set = frozenset(plan.members)
        self.shard = plan.shard_of(me)
        self.buffer = buffer
        self.weight = weight
        self.wire = wire
        self.chunk_elements = chunk_elements
        self.max_weights = max_weights
        """Per member, the largest weight the agreed configuration allows its contribution."""
        self.started = started
        self.relays = relays or {}
        """Peers whose agreed link with this member is down, with the members to relay through."""
        self.inbound: dict[PeerID, Inbound] = {}
        self.arrived = Beacon()
        """A contribution stream was accepted (wakes the owner role)."""
        self.progress = Beacon()
        """Contribution bytes arrived or a contribution failed (wakes the reducer)."""
        self.news = Beacon()
        """An owner's answer or report arrived (wakes the watchdog)."""
        self.failure: tuple[FailureKind, frozenset[PeerID], str] | None = None
        self.scope = anyio.CancelScope()
        self.timed_out = False
        self.refused_by: dict[PeerID, str] = {}
        """Owners that refused our contribution, with their reason."""
        self.unusable: dict[PeerID, str] = {}
        """Owners whose answer we could not use."""
        self.reported: dict[PeerID, frozenset[PeerID]] = {}
        """Owners that reported the round aborted, with whom they found missing."""
        self.answers: dict[PeerID, Result] = {}
        """First OK answer of every owner (ours included)."""
        self.awaiting: set[PeerID] = {s.owner for s in plan.shards if s.owner != me and s.size}
        """Owners we still expect an answer (or a revision) from."""
        self.owner_streams: dict[PeerID, Stream] = {}
        self.finished_streams: set[PeerID] = set()
        """Owners whose stream needs nothing more (no reset at the end)."""
        self.excluded: dict[PeerID, str] = {}
        """Exclusions anywhere in the round, with the first reason heard."""
        self.excluded_here: set[PeerID] = set()
        """Contributions this member, as owner, left out."""
        self.refused: dict[PeerID, str] = {}
        """Contributions whose header this owner refused, with the reason: its answers report them
        among the exclusions, so that every member leaves them out (section 4.3 of the spec)."""
        self.invalid_here: set[PeerID] = set()
        """Of those, the ones that failed a check here (header refused, or NaN/Inf values): what this
        member saw itself, as opposed to a contributor that gave up or an exclusion heard of."""
        self.unreachable: set[PeerID] = set()
        """Peers this member could not exchange with, first-hand (dial failed, connection closed, or
        on timeout: missing here only): the evidence behind a LINK_DOWN (spec section 4.5)."""
        self.bytes_sent = 0
        self.bytes_received = 0
        self.shard_done_at: float | None = None
        self.reduce_s = 0.0
        self.total_weight = 0.0

    # ------------------------------------------------------------------ failures
    def fail(self, kind: FailureKind, missing: frozenset[PeerID], detail: str) -> None:
        """End the round now; the first failure stands."""
        if self.failure is None:
            self.failure = (kind, missing - {self.me}, detail)
            log.info("round %s failed (%s): %s", self.tag, kind, detail)
        self.scope.cancel()

    @property
    def locally_failed(self) -> bool:
        """Some owner refused our contribution or sent an unusable answer."""
        return bool(self.refused_by or self.unusable)

    # ------------------------------------------------------------------ the owner's side
    def contributed(self, peer: PeerID) -> bool:
        """True once ``peer``'s contribution stream reached this owner."""
        return peer in self.inbound

    def accept(self, inbound: Inbound) -> None:
        """Take a contribution stream into this round, or set the refusal to answer it with."""
        peer = inbound.peer
        if peer not in self.member_set or peer == self.me:
            inbound.reply = mismatch(f"{peer.short()} is not a member of round {self.tag} here")
        elif peer in self.inbound:
            inbound.reply = Result(status=ResultStatus.REFUSED, detail="duplicate contribution")
        else:
            problem = self._check(peer, inbound.header)
            self.inbound[peer] = inbound
            if problem is not None:
                self.invalid_here.add(peer)
                self.refused[peer] = f"refused: {problem}"
                self.exclude_here(peer, self.refused[peer])
                inbound.reply = Result(status=ResultStatus.REFUSED, detail=problem[:1024])
                inbound.answered = True
            self.arrived.notify()
        inbound.assigned.set()

    def exclude_here(self, peer: PeerID, reason: str) -> None:
        """This owner leaves ``peer``'s contribution out (logged, naming the peer)."""
        if peer not in self.excluded_here:
            log.warning("excluding %s from round %s: %s", peer, self.tag, reason)
            self.excluded_here.add(peer)
            self.excluded.setdefault(peer, reason)

    def _check(self, peer: PeerID, header: Contribution) -> str | None:
        shard = self.shard
        if header.wire_dtype is not self.wire:
            return f"wire dtype {header.wire_dtype.name.lower()}, the round uses {self.wire.name.lower()}"
        if shard.size and (header.total_elements, header.start, header.stop) != (
            self.plan.length,
            shard.start,
            shard.stop,
        ):
            return (
                f"contribution for elements {header.start}..{header.stop} of {header.total_elements}, "
                f"this owner averages {shard.start}..{shard.stop} of {self.plan.length}"
            )
        # The weight the configuration allows this member, never the one it states (issue 20,
        # finding 4): a contribution may weigh less (a short batch), never more.
        allowed = self.max_weights[peer]
        if not (math.isfinite(header.weight) and 0 <= header.weight <= allowed):
            return f"weight {header.weight!r} is not a finite number in 0..{allowed:g} (its agreed allowance)"
        expected = shard.size * self.wire.itemsize if header.weight > 0 else 0
        if header.payload_bytes != expected:
            return f"payload of {header.payload_bytes} bytes, expected {expected}"
        return None

    def partial(self) -> frozenset[PeerID]:
        """Contributors whose contribution to our shard started but is not complete."""
        return frozenset(
            peer
            for peer, inbound in self.inbound.items()
            if inbound.values is not None and not inbound.failed and inbound.received < len(inbound.values)
        )

    def undelivered(self) -> frozenset[PeerID]:
        """Contributors whose contribution to our shard is not (completely) in."""
        missing: set[PeerID] = set()
        if not self.shard.size:  # an empty shard receives no contribution (spec section 4.1)
            return frozenset()
        for peer in self.members:
            if peer == self.me:
                continue
            inbound = self.inbound.get(peer)
            incomplete = inbound is not None and inbound.values is not None and inbound.received < len(inbound.values)
            if inbound is None or (incomplete and not inbound.failed):
                missing.add(peer)
        return frozenset(missing)

    def pair_suspects(self, missing_here: frozenset[PeerID]) -> frozenset[PeerID]:
        """On timeout: the peers whose exchange with this member alone failed.

        ``p`` is named if its contribution to our shard is not in (or we own nothing) and it has not
        answered us as an owner (or owns nothing), while every *other* owner of a non-empty shard
        answered us ``OK``: those owners hold ``p``'s contribution, so ``p`` is alive and linked to
        them, and so are we. A member that stalls is missing everywhere and is never named.
        """
        owners = {s.owner for s in self.plan.shards if s.size and s.owner != self.me}
        heard = set(self.answers) | set(self.reported) | set(self.refused_by) | set(self.unusable)
        candidates = set(missing_here) | (owners - heard)
        suspects = set()
        for peer in candidates:
            others = owners - {peer}
            if others and others <= set(self.answers):
                suspects.add(peer)
        return frozenset(suspects)

    # ------------------------------------------------------------------ exclusions across owners
    def round_exclusions(self) -> dict[PeerID, str]:
        """Every contribution some owner excluded (the same on every member that has all answers)."""
        excluded: dict[PeerID, str] = {}
        for owner in self.members:
            answer = self.answers.get(owner)
            if answer is not None:
                for exclusion in answer.excluded:
                    excluded.setdefault(exclusion.peer, exclusion.reason)
        for owner, reason in sorted(self.refused_by.items()):
            excluded.setdefault(self.me, f"refused by {owner.short()}: {reason}")
        return excluded

    def owners_to_revise(self, excluded: dict[PeerID, str]) -> list[PeerID]:
        """Owners whose shard holds values of a peer excluded elsewhere: they send a revision."""
        return [
            owner
            for owner in self.members
            if (answer := self.answers.get(owner)) is not None and set(answer.included) & set(excluded)
        ]
