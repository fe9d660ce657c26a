"""Wire format of the collaboration protocol (``/chaos/collab/1``): how a newcomer catches up.

One stream per request; the first frame names the request:

* :class:`SnapshotRequest` -> :class:`SnapshotReply`: "publish a snapshot of ``run`` when you
  complete ``step``". The member answers once the snapshot is served (``ok``) or at once if it is
  already past that step or does not train the run. Every member of a synchronous run holds
  bit-identical state at a step, so the newcomer can pull the snapshot from all of them in parallel.
  An ``ok`` reply carries the member's *vouch* (:mod:`chaosp2p.protocols.collab.vouch`): its signature over
  the snapshot's digest and the digest of the configuration that governed the step, plus that
  configuration's encoding when it is not the one the request named.
* :class:`FetchUpdate` -> :class:`UpdateHeader` + raw bytes, or :class:`Refused`: "give me the
  averaged update you applied at ``step`` under ``config_digest``" -- for a member whose own round
  failed after some others had completed it (it cannot redo a round the others finished).
* :class:`ObserveRequest` -> :class:`ObserveAccepted`, then one :class:`UpdateHeader` frame per
  completed step followed by exactly ``numel * 4`` raw bytes: the averaged update (a gradient in
  synchronous mode, a pseudo-gradient in DiLoCo mode) the members applied at that step. A newcomer
  replays them on top of the snapshot until it is admitted. The member that accepts becomes the
  newcomer's *sponsor*: its acceptance carries a signed :class:`Ticket` that the newcomer shows
  the other members with its snapshot requests (:mod:`chaosp2p.protocols.collab.ticket`).

Members-only: a member answers ``SnapshotRequest`` only from members of the run's configuration or
from a newcomer holding a valid ticket of one, and ``FetchUpdate`` only from members.

Limits: run ids are bounded, ``numel`` must equal the receiver's own model size (checked before a
byte is read), and a refusal carries a bounded reason. ``protocols/collab.md`` is the normative
description, with test vectors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "collab"
"""Protocol name (streams are opened with ``connection.open_stream(PROTOCOL)``)."""
PROTOCOL_ID = ProtocolId(PROTOCOL, 1)
"""``/chaos/collab/1``."""

MAX_RUN_CHARS = 256
"""A run id has 1 to this many characters."""
MAX_REASON_CHARS = 512
"""Longest refusal reason."""
MAX_STEP = (1 << 53) - 1
"""Largest step, epoch and ``numel`` (exact in a float64, as JSON readers need)."""
LAYOUT_BYTES = 16
"""Size of a model layout digest (``chaosp2p.training.flat.layout_digest``)."""
MAX_DIGEST_BYTES = 64
"""Longest configuration digest in :class:`UpdateHeader` and :class:`FetchUpdate`."""
VOUCH_DIGEST_BYTES = 32
"""Size of a vouch's state and configuration digests (SHA-256)."""
VOUCH_SIGNATURE_BYTES = 64
"""Size of a vouch's Ed25519 signature."""
MAX_CONFIGURATION_BYTES = 16 << 20
TICKET_SIGNATURE_BYTES = 64
"""Size of a ticket's Ed25519 signature."""
"""As negotiation's limit; a frame is bounded by the transport's ``max_frame_bytes`` first."""


class CollabMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    SNAPSHOT_REQUEST = 1
    SNAPSHOT_REPLY = 2
    OBSERVE_REQUEST = 3
    OBSERVE_ACCEPTED = 4
    UPDATE_HEADER = 5
    REFUSED = 6
    FETCH_UPDATE = 7


codec = MessageCodec(PROTOCOL, CollabMessageType)
"""Encoder/decoder for every collaboration message."""


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise RemoteProtocolError(f"{PROTOCOL}: {what}")


def _check_run(run: str) -> None:
    _check(1 <= len(run) <= MAX_RUN_CHARS, f"run id must have 1..{MAX_RUN_CHARS} characters")


def _check_step(step: int, what: str = "step") -> None:
    _check(0 <= step <= MAX_STEP, f"{what} out of range: {step}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """A sponsor's grant: ``newcomer`` may ask the run's members for snapshots of steps up to
    ``until_step`` (signed by ``sponsor``; see :mod:`chaosp2p.protocols.collab.ticket`)."""

    sponsor: PeerID
    newcomer: PeerID
    until_step: int
    signature: bytes

    def validate(self) -> None:
        """Hard limits."""
        _check_step(self.until_step, "ticket until_step")
        _check(len(self.signature) == TICKET_SIGNATURE_BYTES, "ticket signature must have 64 bytes")


@codec.register(CollabMessageType.SNAPSHOT_REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRequest(Message):
    """Publish a snapshot of ``run`` once you complete ``step`` (model layout ``layout``)."""

    run: str
    step: int
    layout: bytes
    config_digest: bytes = b""
    """The configuration the newcomer holds (empty: none); a reply citing another one includes it."""
    ticket: Ticket | None = None
    """The sponsor's ticket naming the asker: required unless the asker is a member of the run."""

    def validate(self) -> None:
        """Hard limits."""
        _check_run(self.run)
        _check_step(self.step)
        _check(len(self.layout) == LAYOUT_BYTES, "layout digest must have 16 bytes")
        _check(len(self.config_digest) in (0, VOUCH_DIGEST_BYTES), "configuration digest must have 32 bytes")
        if self.ticket is not None:
            self.ticket.validate()


@codec.register(CollabMessageType.SNAPSHOT_REPLY)
@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotReply(Message):
    """The snapshot at ``step`` is served (``ok``), or why not."""

    ok: bool
    step: int
    reason: str = ""
    state_digest: bytes = b""
    """The vouch: SHA-256 of the snapshot's manifest (empty when not ``ok``) ..."""
    config_digest: bytes = b""
    """... the configuration that governed ``step`` on this member ..."""
    signature: bytes = b""
    """... and the member's Ed25519 signature over both (``vouch.vouch_statement``)."""
    configuration: bytes = b""
    """That configuration's encoding, when it is not the one the request named (else empty)."""

    def validate(self) -> None:
        """Hard limits."""
        _check_step(self.step)
        _check(len(self.reason) <= MAX_REASON_CHARS, "reason too long")
        _check(len(self.state_digest) in (0, VOUCH_DIGEST_BYTES), "state digest must have 32 bytes")
        _check(len(self.config_digest) in (0, VOUCH_DIGEST_BYTES), "configuration digest must have 32 bytes")
        _check(len(self.signature) in (0, VOUCH_SIGNATURE_BYTES), "signature must have 64 bytes")
        _check(len(self.configuration) <= MAX_CONFIGURATION_BYTES, "configuration too large")


@codec.register(CollabMessageType.OBSERVE_REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveRequest(Message):
    """Stream me the averaged update of every step you complete from now on."""

    run: str
    layout: bytes

    def validate(self) -> None:
        """Hard limits."""
        _check_run(self.run)
        _check(len(self.layout) == LAYOUT_BYTES, "layout digest must have 16 bytes")


@codec.register(CollabMessageType.OBSERVE_ACCEPTED)
@dataclass(frozen=True, slots=True, kw_only=True)
class ObserveAccepted(Message):
    """Updates follow, starting after ``completed`` (the newest step this member completed)."""

    completed: int
    numel: int
    ticket: Ticket | None = None
    """This sponsor's ticket for the newcomer, to attach to its snapshot requests."""

    def validate(self) -> None:
        """Hard limits."""
        _check_step(self.completed)
        _check(0 < self.numel <= MAX_STEP, "numel out of range")
        if self.ticket is not None:
            self.ticket.validate()


@codec.register(CollabMessageType.UPDATE_HEADER)
@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateHeader(Message):
    """The averaged update of ``step`` (under ``epoch``/``config_digest``): ``numel`` float32 follow."""

    step: int
    epoch: int
    config_digest: bytes
    numel: int

    def validate(self) -> None:
        """Hard limits."""
        _check_step(self.step)
        _check_step(self.epoch, "epoch")
        _check(len(self.config_digest) <= MAX_DIGEST_BYTES, "config digest too long")
        _check(0 < self.numel <= MAX_STEP, "numel out of range")


@codec.register(CollabMessageType.REFUSED)
@dataclass(frozen=True, slots=True, kw_only=True)
class Refused(Message):
    """The member will not serve this request."""

    reason: str

    def validate(self) -> None:
        """Hard limits."""
        _check(len(self.reason) <= MAX_REASON_CHARS, "reason too long")


@codec.register(CollabMessageType.FETCH_UPDATE)
@dataclass(frozen=True, slots=True, kw_only=True)
class FetchUpdate(Message):
    """Send me the averaged update you applied at ``step`` under ``config_digest``, if you have it."""

    run: str
    step: int
    config_digest: bytes

    def validate(self) -> None:
        """Hard limits."""
        _check_run(self.run)
        _check_step(self.step)
        _check(len(self.config_digest) <= MAX_DIGEST_BYTES, "config digest too long")
