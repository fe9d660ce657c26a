"""Wire messages of the negotiation protocol (``"negotiation"``).

Every message is the msgpack array ``[type, field1, field2, ...]`` built by
:class:`~chaosp2p.wire.messages.MessageCodec`; nested records (operations, ballots, values, commit
records) are arrays of their fields in declaration order. Configurations travel as ``bytes``: their
canonical encoding followed by the digest (``configuration_decode.decode_configuration`` checks both).
``protocols/negotiation.md`` is the normative description, with test vectors.

In every Paxos message ``epoch`` is the epoch *being decided* (e + 1 for members holding C_e).
``validate()`` enforces only hard, configuration-independent limits; the machine applies the
configured limits and every semantic rule.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from chaosp2p.protocols.negotiation.config import MAX_STEP
from chaosp2p.protocols.negotiation.operations import (
    DIGEST_BYTES,
    PROTOCOL,
    SIGNATURE_BYTES,
    WIRE_MAX_HISTORY,
    WIRE_MAX_MEMBERS,
    WIRE_MAX_OPS,
    WIRE_MAX_REASON_CHARS,
    Operation,
    check_count,
    check_run,
    check_uint,
    reject,
)
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec

WIRE_MAX_STEP_TIME_S = 86400.0
WIRE_MAX_CONFIGURATION_BYTES = 16 << 20
MAX_REQUEST_ID = (1 << 64) - 1
WIRE_MAX_RELAY = 1024
"""Relay targets in one ACCEPT/COMMIT (groups are about sqrt(members) large)."""


class NegotiationMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    OPS_ANNOUNCE = 1
    PREPARE = 2
    PROMISE = 3
    NACK = 4
    ACCEPT = 5
    ACCEPTED = 6
    REFUSE_PAST = 7
    COMMIT = 8
    SYNC = 9
    SYNC_REQUEST = 10
    SYNC_REPLY = 11
    RUN_INFO_REQUEST = 12
    RUN_INFO = 13
    JOIN_REQUEST = 14
    JOIN_REFUSED = 15


codec = MessageCodec(PROTOCOL, NegotiationMessageType)
"""Encoder/decoder for every negotiation message."""


def _check_step(value: int, what: str) -> None:
    """A step a peer reports: -1 (none yet) up to MAX_STEP."""
    if not -1 <= value <= MAX_STEP:
        raise reject(f"{what} step out of range: {value}")


def _check_progress(entered: int, completed: int, step_time_s: float) -> None:
    _check_step(entered, "entered")
    _check_step(completed, "completed")
    if not (math.isfinite(step_time_s) and 0.0 <= step_time_s <= WIRE_MAX_STEP_TIME_S):
        raise reject(f"step time out of range: {step_time_s!r}")


def _check_ops(ops: tuple[Operation, ...]) -> None:
    check_count(len(ops), WIRE_MAX_OPS, "operations")


def _check_digest(digest: bytes) -> None:
    if len(digest) != DIGEST_BYTES:
        raise reject("digest must be 32 bytes")


def _check_configuration(raw: bytes) -> None:
    check_count(len(raw), WIRE_MAX_CONFIGURATION_BYTES, "configuration bytes")


# ---------------------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Ballot:
    """A Paxos ballot: ordered by round, then by the proposer's PeerID bytes."""

    round: int
    proposer: PeerID

    def validate(self) -> None:
        """Bounds of the round."""
        check_uint(self.round, "ballot round")

    def key(self) -> tuple[int, bytes]:
        """A fast sort key (PeerID comparisons go through the dataclass machinery)."""
        return (self.round, self.proposer.raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Value:
    """What one Paxos instance decides: the operations and the step from which they apply."""

    ops: tuple[Operation, ...]
    activation_step: int
    proposed_at: float = 0.0
    """The proposer's clock when the value was first proposed (observability only)."""

    def validate(self) -> None:
        """Bounds of the batch and the step."""
        _check_ops(self.ops)
        check_uint(self.activation_step, "activation step")
        if not math.isfinite(self.proposed_at):
            raise reject("proposed_at must be finite")


@dataclass(frozen=True, slots=True, kw_only=True)
class Certificate:
    """Signatures of a quorum of C_(epoch-1) over the acceptance statement of one ballot (wire record)."""

    ballot: Ballot
    signers: bytes
    """Bitmap over the previous configuration's members in order: bit i (byte i // 8, least
    significant bit first) is set if member i signed."""
    signatures: tuple[bytes, ...]
    """One per set bit, in member order."""

    def validate(self) -> None:
        """Hard limits (the count against the configuration is checked by :func:`check_certificate`)."""
        check_uint(self.ballot.round, "certificate ballot round")
        check_count(len(self.signers), WIRE_MAX_MEMBERS // 8, "certificate bitmap bytes")
        check_count(len(self.signatures), WIRE_MAX_MEMBERS, "certificate signatures")
        if any(len(s) != SIGNATURE_BYTES for s in self.signatures):
            raise reject("certificate signatures must be 64 bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitRecord:
    """One decided instance: epoch ``epoch`` was produced by ``value`` and has ``digest``; the
    ``certificate`` holds the quorum of C_(epoch-1) that accepted ``value`` (``certificates.py``)."""

    epoch: int
    value: Value
    digest: bytes
    certificate: Certificate | None = None

    def validate(self) -> None:
        """Bounds of the epoch and the digest."""
        check_uint(self.epoch, "epoch")
        _check_digest(self.digest)


@dataclass(frozen=True, slots=True, kw_only=True)
class SignedPromise:
    """One acceptor's signed PROMISE for a ballot, as an ACCEPT carries it to justify its value
    (``justification.py``). ``accepted_ballot``/``accepted_digest``: its accepted value then (the
    digest of the configuration it makes); ``backer``/``backing``: another member's signature
    proving that value was proposed or accepted at that ballot (without it the claim counts as
    none); ``completed``: its progress; ``signature``: its own, over ``justification.promise_statement``."""

    signer: PeerID
    accepted_ballot: Ballot | None = None
    accepted_digest: bytes = b""
    backer: PeerID | None = None
    backing: bytes = b""
    completed: int = -1
    signature: bytes = b""

    def validate(self) -> None:
        """Bounds and shape."""
        _check_step(self.completed, "completed")
        if len(self.signature) != SIGNATURE_BYTES:
            raise reject("promise signature must be 64 bytes")
        if self.backing and len(self.backing) != SIGNATURE_BYTES:
            raise reject("promise backing must be 64 bytes")
        if (self.accepted_ballot is None) != (not self.accepted_digest):
            raise reject("accepted ballot and digest come together")
        if self.accepted_digest:
            _check_digest(self.accepted_digest)


# ---------------------------------------------------------------------------------------- messages
@codec.register(NegotiationMessageType.OPS_ANNOUNCE)
@dataclass(frozen=True, slots=True, kw_only=True)
class OpsAnnounce(Message):
    """New pending operations, sent to the best-ranked proposers; carries the sender's progress."""

    run: str
    epoch: int
    """The sender's current epoch."""
    ops: tuple[Operation, ...]
    entered: int = -1
    completed: int = -1
    step_time_s: float = 0.0

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        _check_ops(self.ops)
        _check_progress(self.entered, self.completed, self.step_time_s)


@codec.register(NegotiationMessageType.PREPARE)
@dataclass(frozen=True, slots=True, kw_only=True)
class Prepare(Message):
    """Phase 1a: promise not to accept ballots below ``ballot`` for instance ``epoch``."""

    run: str
    epoch: int
    ballot: Ballot

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")


@codec.register(NegotiationMessageType.PROMISE)
@dataclass(frozen=True, slots=True, kw_only=True)
class Promise(Message):
    """Phase 1b: the promise, with the acceptor's accepted value, pending ops and progress."""

    run: str
    epoch: int
    ballot: Ballot
    accepted_ballot: Ballot | None = None
    accepted_value: Value | None = None
    ops: tuple[Operation, ...] = ()
    entered: int = -1
    completed: int = -1
    step_time_s: float = 0.0
    accepted_digest: bytes = b""
    """Digest of the configuration ``accepted_value`` makes (signed in ``signature``)."""
    backer: PeerID | None = None
    """Who signed ``backing``: the accepted ballot's proposer, or (when the sender is that
    proposer) another member that accepted the value."""
    backing: bytes = b""
    signature: bytes = b""
    """The sender's signature over ``justification.promise_statement``: a later ACCEPT carries it."""

    def validate(self) -> None:
        """Bounds; an accepted ballot and value come together."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        _check_ops(self.ops)
        _check_progress(self.entered, self.completed, self.step_time_s)
        if (self.accepted_ballot is None) != (self.accepted_value is None):
            raise reject("accepted ballot and value come together")
        if self.accepted_digest:
            _check_digest(self.accepted_digest)
        for sig in (self.backing, self.signature):
            if sig and len(sig) != SIGNATURE_BYTES:
                raise reject("promise signatures must be 64 bytes")


@codec.register(NegotiationMessageType.NACK)
@dataclass(frozen=True, slots=True, kw_only=True)
class Nack(Message):
    """Refusal of ``ballot``: the acceptor promised ``promised``, or already knows ``known_epoch``."""

    run: str
    epoch: int
    ballot: Ballot
    promised: Ballot | None = None
    known_epoch: int = 0

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        check_uint(self.known_epoch, "known epoch")


@codec.register(NegotiationMessageType.ACCEPT)
@dataclass(frozen=True, slots=True, kw_only=True)
class Accept(Message):
    """Phase 2a: accept ``value`` at ``ballot`` for instance ``epoch``."""

    run: str
    epoch: int
    ballot: Ballot
    value: Value
    adopted: bool = False
    """The proposer took the value from a promise (it may have been chosen): accept it even if
    it would be refused as a fresh value (completed past S, or failing the acceptor itself)."""
    relay_to: tuple[PeerID, ...] = ()
    """Members the receiver forwards this ACCEPT to (large runs disseminate through relays)."""
    proposer_signature: bytes = b""
    """The ballot's proposer's signature over ``justification.propose_statement``: what an
    acceptor shows later, in its promises, to prove the value was proposed at this ballot."""
    justification: tuple[SignedPromise, ...] = ()
    """A quorum of signed promises for ``ballot`` (empty at the coordinator's round 0)."""
    skipped: Value | None = None
    """The value those promises force, when the proposer found it dead and proposes another."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        check_count(len(self.relay_to), WIRE_MAX_RELAY, "relay targets")
        check_count(len(self.justification), WIRE_MAX_MEMBERS, "justifying promises")
        if self.proposer_signature and len(self.proposer_signature) != SIGNATURE_BYTES:
            raise reject("proposer signature must be 64 bytes")
        for promise in self.justification:
            promise.validate()

    def relayed(self, relay_to: tuple[PeerID, ...]) -> Accept:
        """This ACCEPT with other relay targets. A direct constructor call: ``dataclasses.replace``
        costs ~10 us, and one dissemination in a run of 1024 members makes ~32 copies."""
        return Accept(
            run=self.run,
            epoch=self.epoch,
            ballot=self.ballot,
            value=self.value,
            adopted=self.adopted,
            relay_to=relay_to,
            proposer_signature=self.proposer_signature,
            justification=self.justification,
            skipped=self.skipped,
        )


@codec.register(NegotiationMessageType.ACCEPTED)
@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted(Message):
    """Phase 2b: the acceptor accepted ``ballot`` (and is gated at its activation step)."""

    run: str
    epoch: int
    ballot: Ballot
    entered: int = -1
    completed: int = -1
    step_time_s: float = 0.0
    signature: bytes = b""
    """The acceptor's signature over the acceptance statement (``certificates.statement``): what
    the proposer gathers into the COMMIT's certificate. Empty from peers before certificates."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        _check_progress(self.entered, self.completed, self.step_time_s)
        if self.signature and len(self.signature) != SIGNATURE_BYTES:
            raise reject("acceptance signature must be 64 bytes")


@codec.register(NegotiationMessageType.REFUSE_PAST)
@dataclass(frozen=True, slots=True, kw_only=True)
class RefusePast(Message):
    """The acceptor already completed the proposed activation step (``completed`` >= S)."""

    run: str
    epoch: int
    ballot: Ballot
    completed: int
    """The refuser's completed step; -1 (none yet) when it refuses a value that FAILs it."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        _check_step(self.completed, "completed")


@codec.register(NegotiationMessageType.COMMIT)
@dataclass(frozen=True, slots=True, kw_only=True)
class Commit(Message):
    """Instance ``epoch`` decided ``value``; C_epoch has ``digest``.

    ``configuration`` (the full encoded C_epoch) is sent only to members admitted by this value:
    they do not hold C_{epoch-1} to compute it from.
    """

    run: str
    epoch: int
    value: Value
    digest: bytes
    configuration: bytes = b""
    relay_to: tuple[PeerID, ...] = ()
    """Members the receiver forwards this COMMIT to (large runs disseminate through relays)."""
    certificate: Certificate | None = None
    """Signatures of a quorum of C_(epoch-1) that accepted ``value`` (see ``certificates.py``):
    no receiver installs C_epoch without it."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        _check_digest(self.digest)
        _check_configuration(self.configuration)
        check_count(len(self.relay_to), WIRE_MAX_RELAY, "relay targets")

    def relayed(self, relay_to: tuple[PeerID, ...]) -> Commit:
        """This COMMIT with other relay targets (see :meth:`Accept.relayed`)."""
        return Commit(
            run=self.run,
            epoch=self.epoch,
            value=self.value,
            digest=self.digest,
            configuration=self.configuration,
            relay_to=relay_to,
            certificate=self.certificate,
        )

    @classmethod
    def of(cls, run: str, record: CommitRecord, configuration: bytes = b"") -> Commit:
        """The COMMIT of a decision kept as a commit record (with its certificate)."""
        return cls(
            run=run,
            epoch=record.epoch,
            value=record.value,
            digest=record.digest,
            configuration=configuration,
            certificate=record.certificate,
        )

    def record(self) -> CommitRecord:
        """The decision this COMMIT carries, as a commit record."""
        return CommitRecord(epoch=self.epoch, value=self.value, digest=self.digest, certificate=self.certificate)


@codec.register(NegotiationMessageType.SYNC)
@dataclass(frozen=True, slots=True, kw_only=True)
class Sync(Message):
    """Anti-entropy beacon to ring neighbours: the sender holds C_epoch with ``digest``."""

    run: str
    epoch: int
    digest: bytes

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.epoch, "epoch")
        _check_digest(self.digest)


@codec.register(NegotiationMessageType.SYNC_REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRequest(Message):
    """Ask for the committed values from ``from_epoch`` on."""

    run: str
    from_epoch: int

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_uint(self.from_epoch, "from epoch")


@codec.register(NegotiationMessageType.SYNC_REPLY)
@dataclass(frozen=True, slots=True, kw_only=True)
class SyncReply(Message):
    """Committed values in epoch order, or (when the gap is beyond the history) a snapshot."""

    run: str
    commits: tuple[CommitRecord, ...] = ()
    snapshot: bytes = b""
    """The sender's current configuration, encoded (empty unless commits cannot bridge the gap)."""
    certificate: Certificate | None = None
    """The snapshot's certificate (by the configuration before it)."""
    previous: bytes = b""
    """The configuration before the snapshot, encoded: it names the certificate's signers, so that
    a receiver that holds an older configuration can count how many of *its* members signed."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_count(len(self.commits), WIRE_MAX_HISTORY, "commit records")
        _check_configuration(self.snapshot)
        _check_configuration(self.previous)


@codec.register(NegotiationMessageType.RUN_INFO_REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfoRequest(Message):
    """A prospective newcomer asks a member about ``run``."""

    run: str
    request_id: int
    known_epoch: int = -1
    """The epoch of the configuration the asker already trusts (-1: none): the answer then carries
    what it needs to check the newer one against it."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        if not 0 <= self.request_id <= MAX_REQUEST_ID:
            raise reject("request id out of range")
        _check_step(self.known_epoch, "known epoch")


@codec.register(NegotiationMessageType.RUN_INFO)
@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfoReply(Message):
    """The member's current configuration (empty: not a member of ``run``) and training step."""

    run: str
    request_id: int
    configuration: bytes = b""
    step: int = -1
    certificate: Certificate | None = None
    """The certificate of ``configuration`` (signatures of a quorum of the configuration before
    it); None for C_0. A newcomer that holds the configuration before it can check it."""
    previous: bytes = b""
    """The configuration before ``configuration`` (only when the request named an older trusted
    epoch): it names the certificate's signers."""

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        if not 0 <= self.request_id <= MAX_REQUEST_ID:
            raise reject("request id out of range")
        _check_configuration(self.configuration)
        _check_configuration(self.previous)
        if not -1 <= self.step <= MAX_STEP:
            raise reject("step out of range")


@codec.register(NegotiationMessageType.JOIN_REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest(Message):
    """A newcomer asks a member (its sponsor) to propose its signed JOIN."""

    run: str
    op: Operation

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)


@codec.register(NegotiationMessageType.JOIN_REFUSED)
@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRefused(Message):
    """The sponsor cannot sponsor the join (``reason``); try another member."""

    run: str
    reason: str

    def validate(self) -> None:
        """Bounds."""
        check_run(self.run)
        check_count(len(self.reason), WIRE_MAX_REASON_CHARS, "reason length")


NegotiationMessage = (
    OpsAnnounce
    | Prepare
    | Promise
    | Nack
    | Accept
    | Accepted
    | RefusePast
    | Commit
    | Sync
    | SyncRequest
    | SyncReply
    | RunInfoRequest
    | RunInfoReply
    | JoinRequest
    | JoinRefused
)
"""Every negotiation message class."""

__all__ = [
    "PROTOCOL",
    "Accept",
    "Accepted",
    "Ballot",
    "Certificate",
    "Commit",
    "CommitRecord",
    "JoinRefused",
    "JoinRequest",
    "Nack",
    "NegotiationMessage",
    "NegotiationMessageType",
    "OpsAnnounce",
    "PeerID",
    "Prepare",
    "Promise",
    "RefusePast",
    "RunInfoReply",
    "RunInfoRequest",
    "SignedPromise",
    "Sync",
    "SyncReply",
    "SyncRequest",
    "Value",
    "codec",
]
