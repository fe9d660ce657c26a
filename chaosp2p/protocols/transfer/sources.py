"""The sources of one pull: their states, their leases, and the control requests outstanding on them.

Each source's state changes only through ``SOURCE_TRANSITIONS`` (:meth:`SourceBook.move`). Version
queries, lease openings and renewals are *asks*: each carries a deadline after which an unanswered
source counts as timed out. Data requests are not asks -- the chunk scheduler tracks those.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer.messages import PROTOCOL, ReleaseLease, VersionInfo
from chaosp2p.protocols.transfer.payload import PayloadSlot
from chaosp2p.protocols.transfer.planner import SourceEstimate
from chaosp2p.protocols.transfer.transitions import SOURCE_TRANSITIONS, SourceInput, SourceState, advance
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class Ask(enum.Enum):
    """What a control request asked."""

    VERSIONS = "versions"
    OPEN = "open"
    RENEW = "renew"


@dataclass(slots=True)
class Pending:
    """A control request waiting for its answer."""

    peer: PeerID
    ask: Ask
    wants_body: bool
    deadline: float


@dataclass(slots=True)
class SourceRecord:
    """What the pull knows about one source."""

    estimate: SourceEstimate
    status: SourceState = SourceState.QUERYING
    versions: list[VersionInfo] = field(default_factory=list)
    lease_id: int | None = None
    lease_ttl_s: float = 0.0
    last_sent: float = 0.0
    last_activity: float = 0.0
    manifest_slot: PayloadSlot | None = None
    dropped_because: str = ""

    @property
    def peer(self) -> PeerID:
        """The source's peer id."""
        return self.estimate.peer


class SourceBook:
    """Every source of one pull and the control requests outstanding on them."""

    def __init__(self, request_timeout_s: float) -> None:
        self.request_timeout_s = request_timeout_s
        self.records: dict[PeerID, SourceRecord] = {}
        self.pending: dict[int, Pending] = {}
        self.outgoing: list[Outgoing] = []
        self._next_request = 1

    def add(self, estimate: SourceEstimate) -> SourceRecord:
        """Start tracking a source (in QUERYING)."""
        record = self.records[estimate.peer] = SourceRecord(estimate=estimate)
        return record

    def move(self, src: SourceRecord, event: SourceInput) -> None:
        """Change ``src``'s state through the table (an illegal move raises ``LocalProtocolError``)."""
        src.status = advance(SOURCE_TRANSITIONS, src.status, event, f"source {src.peer.short()}")

    def in_state(self, *states: SourceState) -> list[SourceRecord]:
        """The sources in any of ``states``."""
        return [s for s in self.records.values() if s.status in states]

    def new_id(self) -> int:
        """A fresh request id (unique within this pull, across control and data requests)."""
        request_id = self._next_request
        self._next_request += 1
        return request_id

    def send(self, now: float, src: SourceRecord, message: Message) -> None:
        """Queue ``message`` for ``src`` (any message renews its lease there)."""
        src.last_sent = now
        self.outgoing.append(Outgoing(to=src.peer, protocol=PROTOCOL, message=message))

    def ask(self, now: float, src: SourceRecord, message: Message, ask: Ask, wants_body: bool) -> None:
        """Send a control request that must be answered within ``request_timeout_s``."""
        request_id = getattr(message, "request_id")  # noqa: B009 - every request type has one
        self.pending[request_id] = Pending(src.peer, ask, wants_body, now + self.request_timeout_s)
        self.send(now, src, message)

    def take(self, src: SourceRecord, request_id: int) -> Pending | None:
        """The ask ``request_id`` of ``src``, now answered; ``None`` if there is no such ask."""
        pending = self.pending.get(request_id)
        if pending is None or pending.peer != src.peer:
            return None
        del self.pending[request_id]
        return pending

    def waiting(self, ask: Ask) -> bool:
        """Some ask of this kind is unanswered."""
        return any(p.ask is ask for p in self.pending.values())

    def forget(self, peer: PeerID) -> None:
        """Drop the asks outstanding on ``peer``."""
        for request_id in [rid for rid, p in self.pending.items() if p.peer == peer]:
            del self.pending[request_id]

    def release(self, src: SourceRecord) -> None:
        """Release ``src``'s lease, if it holds (or is being granted) one."""
        if src.lease_id is not None and src.status in (SourceState.LEASED, SourceState.OPENING):
            self.outgoing.append(Outgoing(to=src.peer, protocol=PROTOCOL, message=ReleaseLease(lease_id=src.lease_id)))

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the queued messages."""
        out, self.outgoing = self.outgoing, []
        return out
