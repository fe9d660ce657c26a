"""Wire messages of the membership protocol (``"membership"``).

Every message is the msgpack array ``[type, field1, field2, ...]`` built by
:class:`~chaosp2p.wire.messages.MessageCodec`; nested records (updates, resources, link summaries)
are arrays of their fields in declaration order. ``protocols/membership.md`` is the normative
description, with test vectors.

``validate()`` here enforces only hard, configuration-independent limits (so a decoded message can
never be absurd); the machine applies the tighter configured limits and the semantic checks
(address syntax, signatures, incarnation jumps) when it uses an update. Signatures are trailing
fields with a default (an older peer ignores them; see ``protocols/membership.md`` §2); what they
cover is defined in ``signing.py``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.membership.config import MAX_INCARNATION
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec

PROTOCOL = "membership"
"""The protocol name machines register under (``/chaos/membership/1`` on a stream)."""

MAX_SEQ = (1 << 64) - 1
WIRE_MAX_UPDATES = 1 << 16
"""Hard caps, whatever the configuration: updates/infos per message."""
WIRE_MAX_ADDRS = 32
WIRE_MAX_ADDR_CHARS = 512
WIRE_MAX_RELAY_ADDRS = 8
"""Most relay addresses one info record carries (``protocols/relay.md`` §6: one reservation lists at most 8)."""
WIRE_MAX_RELAY_ADDR_CHARS = 2 * WIRE_MAX_ADDR_CHARS
"""A relay address is the relay's multiaddr, ``/p2p-circuit`` and the target's id."""
WIRE_MAX_LINKS = 256
WIRE_MAX_RTT_S = 3600.0
WIRE_MAX_BANDWIDTH = 1e13
WIRE_MAX_CPU_CORES = 1 << 20
WIRE_MAX_MEMORY_BYTES = 1 << 62
WIRE_MAX_GPUS = 1 << 16
WIRE_MAX_SAMPLES_PER_S = 1e12
WIRE_SIGNATURE_BYTES = 64


class MembershipMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    PING = 1
    ACK = 2
    PING_REQ = 3
    NACK = 4
    PUSH_PULL = 5
    PUSH_PULL_REPLY = 6
    LEAVE = 7
    GOSSIP = 8


class UpdateKind(enum.IntEnum):
    """What a membership update claims about its subject. ONLY APPEND."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


codec = MessageCodec(PROTOCOL, MembershipMessageType)
"""Encoder/decoder for every membership message."""


def _reject(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"{PROTOCOL}: {message}")


def _check_count(value: int, cap: int, what: str) -> None:
    if value > cap:
        raise _reject(f"{what}: {value} exceeds {cap}")


def _check_number(value: float, cap: float, what: str) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= cap):
        raise _reject(f"{what} out of range: {value!r}")


def _check_seq(seq: int) -> None:
    if not 0 <= seq <= MAX_SEQ:
        raise _reject(f"sequence number out of range: {seq}")


def _check_signature(signature: bytes) -> None:
    if len(signature) not in (0, WIRE_SIGNATURE_BYTES):
        raise _reject(f"a signature is {WIRE_SIGNATURE_BYTES} bytes (or none), not {len(signature)}")


def peek_type(body: bytes | memoryview) -> int | None:
    """The message type of an encoded message, read from its first bytes without decoding it.

    The runtime asks this before it decodes a datagram, to charge the sender's rate limit (a
    PUSH_PULL costs more) and to apply the size cap of the type. ``None`` if the body does not start
    like a message; the decoder will then refuse it.
    """
    if len(body) < 2:
        return None
    head = body[0]
    if 0x91 <= head <= 0x9F:  # fixarray of 1-15 items: the type follows at once
        offset = 1
    elif head == 0xDC:  # array 16
        offset = 3
    elif head == 0xDD:  # array 32
        offset = 5
    else:
        return None
    if len(body) <= offset or body[offset] > 0x7F:  # positive fixint: every type number is < 128
        return None
    return int(body[offset])


@dataclass(frozen=True, slots=True, kw_only=True)
class Resources:
    """What a peer offers: reported by its driver, never probed by the machine."""

    cpu_cores: int = 0
    memory_bytes: int = 0
    gpus: int = 0
    gpu_memory_bytes: int = 0
    """Total over all GPUs."""
    train_samples_per_s: float = 0.0
    """Training throughput the application reports (0 = not reported)."""

    def validate(self) -> None:
        """Reject negative or absurd figures."""
        _check_number(self.cpu_cores, WIRE_MAX_CPU_CORES, "cpu_cores")
        _check_number(self.memory_bytes, WIRE_MAX_MEMORY_BYTES, "memory_bytes")
        _check_number(self.gpus, WIRE_MAX_GPUS, "gpus")
        _check_number(self.gpu_memory_bytes, WIRE_MAX_MEMORY_BYTES, "gpu_memory_bytes")
        _check_number(self.train_samples_per_s, WIRE_MAX_SAMPLES_PER_S, "train_samples_per_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSummary:
    """One overlay link as its source peer measures it."""

    peer: PeerID
    rtt_s: float
    """Smoothed heartbeat round-trip time (0 = not measured yet)."""
    bandwidth_bytes_per_s: float
    """Smoothed transfer rate (0 = no estimate yet)."""
    up: bool

    def validate(self) -> None:
        """Reject non-finite, negative or absurd measurements."""
        _check_number(self.rtt_s, WIRE_MAX_RTT_S, "rtt_s")
        _check_number(self.bandwidth_bytes_per_s, WIRE_MAX_BANDWIDTH, "bandwidth_bytes_per_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberUpdate:
    """A claim about one member: alive/suspect/dead/left at an incarnation."""

    kind: UpdateKind
    peer: PeerID
    incarnation: int
    addrs: tuple[str, ...] = ()
    """Multiaddrs where ``peer`` listens (required for ALIVE, empty otherwise)."""
    origin: PeerID | None = None
    """Who suspected/declared the subject (SUSPECT, DEAD): a hint's author, counted as a confirmation
    only when it is the peer that sent the hint."""
    signature: bytes = b""
    """ALIVE and LEFT: the subject's own Ed25519 signature over ``signing.alive_payload`` /
    ``left_payload`` (empty for SUSPECT and DEAD, which are hints, not claims)."""

    def validate(self) -> None:
        """Hard limits only; address syntax and the signature are checked by the machine when the
        update is news."""
        if not 0 <= self.incarnation <= MAX_INCARNATION:
            raise _reject(f"incarnation out of range: {self.incarnation}")
        _check_count(len(self.addrs), WIRE_MAX_ADDRS, "addresses per member")
        for addr in self.addrs:
            _check_count(len(addr), WIRE_MAX_ADDR_CHARS, "address length")
        _check_signature(self.signature)


@dataclass(frozen=True, slots=True, kw_only=True)
class InfoUpdate:
    """A member's cluster-monitor record: resources and link summaries, versioned by its owner."""

    peer: PeerID
    version: int
    resources: Resources
    links: tuple[LinkSummary, ...] = ()
    signature: bytes = b""
    """The owner's Ed25519 signature over ``signing.info_payload`` (the fields before it)."""
    relay_addrs: tuple[str, ...] = ()
    """Appended: relay addresses (``…/p2p/<relay>/p2p-circuit/p2p/<peer>``) where a peer nobody can
    dial is reached. Outside ``signature``, so a peer of an earlier version (which ignores trailing
    fields) still verifies the record."""
    relay_signature: bytes = b""
    """The owner's signature over ``signing.relay_payload`` (empty when ``relay_addrs`` is)."""

    def validate(self) -> None:
        """Hard limits only (nested records validate themselves on decode)."""
        if not 0 <= self.version <= MAX_INCARNATION:
            raise _reject(f"info version out of range: {self.version}")
        _check_count(len(self.links), WIRE_MAX_LINKS, "links per info")
        _check_signature(self.signature)
        _check_count(len(self.relay_addrs), WIRE_MAX_RELAY_ADDRS, "relay addresses per member")
        for addr in self.relay_addrs:
            _check_count(len(addr), WIRE_MAX_RELAY_ADDR_CHARS, "relay address length")
        _check_signature(self.relay_signature)


def _check_piggyback(updates: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]) -> None:
    _check_count(len(updates), WIRE_MAX_UPDATES, "updates per message")
    _check_count(len(infos), WIRE_MAX_UPDATES, "infos per message")


@codec.register(MembershipMessageType.PING)
@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    """Heartbeat / SWIM probe; answered by an ACK with the same ``seq``."""

    seq: int
    updates: tuple[MemberUpdate, ...] = ()
    infos: tuple[InfoUpdate, ...] = ()
    digest: int = 0
    """SWIM probes: 64-bit digest of the sender's live membership (0 = none; heartbeats omit it)."""
    info_digest: int = 0
    """SWIM probes: 64-bit digest of the info versions the sender holds (0 = none)."""

    def validate(self) -> None:
        """Bounds of seq, piggyback and digests."""
        _check_seq(self.seq)
        _check_piggyback(self.updates, self.infos)
        if not (0 <= self.digest <= MAX_SEQ and 0 <= self.info_digest <= MAX_SEQ):
            raise _reject("digest out of range")


@codec.register(MembershipMessageType.ACK)
@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Message):
    """Answer to a PING, or forwarded by a relay for a PING_REQ (then ``seq`` is the requester's)."""

    seq: int
    updates: tuple[MemberUpdate, ...] = ()
    infos: tuple[InfoUpdate, ...] = ()

    def validate(self) -> None:
        """Bounds of seq and piggyback."""
        _check_seq(self.seq)
        _check_piggyback(self.updates, self.infos)


@codec.register(MembershipMessageType.PING_REQ)
@dataclass(frozen=True, slots=True, kw_only=True)
class PingReq(Message):
    """Ask the receiver to probe ``target`` for us and forward its ACK (or a NACK) under ``seq``."""

    seq: int
    target: PeerID
    updates: tuple[MemberUpdate, ...] = ()
    infos: tuple[InfoUpdate, ...] = ()

    def validate(self) -> None:
        """Bounds of seq and piggyback."""
        _check_seq(self.seq)
        _check_piggyback(self.updates, self.infos)


@codec.register(MembershipMessageType.NACK)
@dataclass(frozen=True, slots=True, kw_only=True)
class Nack(Message):
    """A relay's answer when the target did not ACK in time: the relay itself is alive."""

    seq: int

    def validate(self) -> None:
        """Bounds of seq."""
        _check_seq(self.seq)


@codec.register(MembershipMessageType.PUSH_PULL)
@dataclass(frozen=True, slots=True, kw_only=True)
class PushPull(Message):
    """Full state sync: the sender's view; the receiver merges it and answers with its own."""

    seq: int
    join: bool
    members: tuple[MemberUpdate, ...]
    infos: tuple[InfoUpdate, ...] = ()
    signed: bool = True
    """False for the periodic anti-entropy sync: the records carry no signatures (but the sender's
    own), and neither do the reply's; a receiver that finds news in them asks again, signed."""

    def validate(self) -> None:
        """Bounds of seq and state."""
        _check_seq(self.seq)
        _check_piggyback(self.members, self.infos)


@codec.register(MembershipMessageType.PUSH_PULL_REPLY)
@dataclass(frozen=True, slots=True, kw_only=True)
class PushPullReply(Message):
    """The receiver's view, sent back for a PUSH_PULL."""

    seq: int
    members: tuple[MemberUpdate, ...]
    infos: tuple[InfoUpdate, ...] = ()

    def validate(self) -> None:
        """Bounds of seq and state."""
        _check_seq(self.seq)
        _check_piggyback(self.members, self.infos)


@codec.register(MembershipMessageType.LEAVE)
@dataclass(frozen=True, slots=True, kw_only=True)
class Leave(Message):
    """The sender leaves gracefully: remove it at once (no suspicion)."""

    incarnation: int
    signature: bytes = b""
    """The sender's signature over ``signing.left_payload``: receivers gossip the LEFT record on, and
    only a signed one is believed by those who did not hear the sender itself."""

    def validate(self) -> None:
        """Bounds of incarnation and signature."""
        if not 0 <= self.incarnation <= MAX_INCARNATION:
            raise _reject(f"incarnation out of range: {self.incarnation}")
        _check_signature(self.signature)


@codec.register(MembershipMessageType.GOSSIP)
@dataclass(frozen=True, slots=True, kw_only=True)
class Gossip(Message):
    """Updates only, sent on the gossip timer when there is news and no message to piggyback on."""

    updates: tuple[MemberUpdate, ...] = ()
    infos: tuple[InfoUpdate, ...] = ()

    def validate(self) -> None:
        """Bounds of piggyback."""
        _check_piggyback(self.updates, self.infos)
