"""Wire format of hole punching (``/chaos/holepunch/1``), exchanged over a relayed connection.

The initiator sends :class:`Connect` with its candidate addresses, the responder answers with its
own :class:`Connect` (or a :class:`Result` ``REFUSED``), the initiator sends :class:`Sync` and both
open TCP connections to each other from their listen ports at the same moment. Each then tells the
other how its attempt ended (:class:`Result`), and both derive the same roles for the connection
handshake from the two results (:func:`chaosp2p.protocols.holepunch.machine.decide`).

Limits: at most :data:`MAX_PUNCH_ADDRS` addresses of at most :data:`MAX_ADDR_CHARS` characters; an
unknown outcome is an error. ``protocols/holepunch.md`` is the normative description, with vectors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.multiaddr import check_addr_texts
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "holepunch"
"""Protocol name (streams are opened with ``connection.open_stream(PROTOCOL)``)."""
PROTOCOL_ID = ProtocolId(PROTOCOL, 1)
"""``/chaos/holepunch/1``."""

MAX_PUNCH_ADDRS = 8
"""Most candidate addresses one :class:`Connect` may carry."""
MAX_ADDR_CHARS = 256
"""Longest address text."""


class PunchMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    CONNECT = 1
    SYNC = 2
    RESULT = 3


class Outcome(enum.IntEnum):
    """How one side's simultaneous open ended. ONLY APPEND TO THIS LIST."""

    CONNECTED = 0
    """Its own socket is connected (a simultaneous open, or the other side's listener accepted it)."""
    TAKEN = 1
    """Its connect found the connection already made: the other side's SYN reached its listener,
    so its host accepted an inbound connection from the other side."""
    FAILED = 2
    """No connection (refused, timed out, nothing to dial)."""
    REFUSED = 3
    """The responder will not punch now (disabled, rate limit, busy); sent instead of its CONNECT."""


class Refusal(enum.IntEnum):
    """Why a responder sent ``REFUSED`` (:attr:`Result.reason`). ONLY APPEND TO THIS LIST; a code
    this peer does not know reads as :attr:`UNSPECIFIED`."""

    UNSPECIFIED = 0
    """Disabled, rate limit, busy, or a peer that gives no reason (every earlier version)."""
    PORTS_CHANGED = 1
    """The responder's NAT changes source ports (a symmetric, port-randomising NAT, seen by its
    peers): a punch cannot work, so the relayed connection stays without one."""


codec = MessageCodec(PROTOCOL, PunchMessageType)
"""Encoder/decoder for every hole-punching message."""


@codec.register(PunchMessageType.CONNECT)
@dataclass(frozen=True, slots=True, kw_only=True)
class Connect(Message):
    """The sender's candidate addresses: where the other side should connect to."""

    addrs: tuple[str, ...]

    def validate(self) -> None:
        """Bounded count and lengths."""
        check_addr_texts(self.addrs, max_count=MAX_PUNCH_ADDRS, max_chars=MAX_ADDR_CHARS, what=PROTOCOL)


@codec.register(PunchMessageType.SYNC)
@dataclass(frozen=True, slots=True, kw_only=True)
class Sync(Message):
    """Initiator to responder: connect now (the initiator connects half a round trip later)."""


@codec.register(PunchMessageType.RESULT)
@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Message):
    """How the sender's attempt ended (an :class:`Outcome`); with ``REFUSED``, why (a
    :class:`Refusal`; appended in this version, so absent from an older peer's: ``UNSPECIFIED``)."""

    outcome: int
    reason: int = 0

    def validate(self) -> None:
        """Known outcome."""
        if self.outcome not in Outcome.__members__.values():
            raise RemoteProtocolError(f"{PROTOCOL}: unknown outcome {self.outcome}")
        if not 0 <= self.reason < 2**16:
            raise RemoteProtocolError(f"{PROTOCOL}: refusal reason {self.reason} out of range")


def refusal(code: int) -> Refusal:
    """The :class:`Refusal` named by ``code`` (an unknown one from a newer peer: ``UNSPECIFIED``)."""
    return Refusal(code) if code in Refusal.__members__.values() else Refusal.UNSPECIFIED
