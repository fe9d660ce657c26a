"""Wire format of the circuit relay (``/chaos/relay/1``).

A circuit is two streams spliced by a relay R: the source A opens a stream to R and sends
:class:`Hop` naming the target B; R opens a stream to B over a connection it already has and sends
:class:`Stop` naming A; B answers R with :class:`Status`, R answers A with :class:`Status`. After an
``OK`` both streams carry raw bytes, which R copies unchanged from one to the other: A and B run
their own end-to-end handshake over them, so R relays ciphertext it can neither read nor forge.

Limits: one message per stream before the raw bytes, a reason is bounded, a status code outside
the known ones is an error. ``protocols/relay.md`` is the normative description, with test vectors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.multiaddr import check_addr_texts
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "relay"
"""Protocol name (streams are opened with ``connection.open_stream(PROTOCOL)``)."""
PROTOCOL_ID = ProtocolId(PROTOCOL, 1)
"""``/chaos/relay/1``."""

MAX_REASON_CHARS = 256
"""Longest refusal reason."""


class RelayMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    HOP = 1
    STOP = 2
    STATUS = 3
    RESERVE = 4
    RESERVATION = 5


class StatusCode(enum.IntEnum):
    """Answers to HOP and STOP. ONLY APPEND TO THIS LIST."""

    OK = 0
    DISABLED = 1
    """The relay (HOP) or the target (STOP) does not take circuits."""
    NO_CONNECTION = 2
    """The relay has no open connection to the target (it never dials on anyone's behalf)."""
    RESOURCE_LIMIT = 3
    """A circuit limit (total or per peer) is reached."""
    TARGET_REFUSED = 4
    """The target refused the STOP, did not answer in time, or does not speak the protocol."""
    MALFORMED = 5
    """The request makes no sense (a circuit to oneself, or to the relay itself)."""
    NO_RESERVATION = 6
    """The relay takes circuits only to peers holding a reservation, and the target holds none."""
    NOT_PUBLIC = 7
    """(To RESERVE) the relay's own dial-back checks do not say it is public: relay addresses at
    it might reach nobody outside its network (``reserve_only_when_public``)."""


codec = MessageCodec(PROTOCOL, RelayMessageType)
"""Encoder/decoder for every relay message."""


@codec.register(RelayMessageType.HOP)
@dataclass(frozen=True, slots=True, kw_only=True)
class Hop(Message):
    """Source to relay: open a circuit to ``target`` over your connection to it."""

    target: PeerID


@codec.register(RelayMessageType.STOP)
@dataclass(frozen=True, slots=True, kw_only=True)
class Stop(Message):
    """Relay to target: ``source`` asked for a circuit to you; the bytes after your OK are its."""

    source: PeerID


@codec.register(RelayMessageType.STATUS)
@dataclass(frozen=True, slots=True, kw_only=True)
class Status(Message):
    """The answer to a HOP or a STOP: ``code`` (a :class:`StatusCode`) and a reason when refused."""

    code: int
    reason: str = ""

    def validate(self) -> None:
        """Known code, bounded reason."""
        if self.code not in StatusCode.__members__.values():
            raise RemoteProtocolError(f"{PROTOCOL}: unknown status code {self.code}")
        if len(self.reason) > MAX_REASON_CHARS:
            raise RemoteProtocolError(f"{PROTOCOL}: reason longer than {MAX_REASON_CHARS} characters")

    @property
    def ok(self) -> bool:
        """True for an ``OK``."""
        return self.code == StatusCode.OK


MAX_RESERVATION_ADDRS = 8
"""Most relay addresses one :class:`Reservation` lists."""
MAX_ADDR_CHARS = 512
"""Longest relay address text (two PeerIDs and the relay's address)."""


@codec.register(RelayMessageType.RESERVE)
@dataclass(frozen=True, slots=True, kw_only=True)
class Reserve(Message):
    """Peer to relay: keep a slot for circuits to me (or renew mine)."""


@codec.register(RelayMessageType.RESERVATION)
@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation(Message):
    """Relay to peer: the slot is yours for ``ttl_s`` seconds; others reach you at ``addrs``."""

    ttl_s: float
    addrs: tuple[str, ...] = ()

    def validate(self) -> None:
        """A positive, finite lifetime; bounded addresses."""
        if not 0 < self.ttl_s < float("inf"):
            raise RemoteProtocolError(f"{PROTOCOL}: reservation lifetime {self.ttl_s!r} is not positive and finite")
        check_addr_texts(self.addrs, max_count=MAX_RESERVATION_ADDRS, max_chars=MAX_ADDR_CHARS, what=PROTOCOL)


def refusal(code: StatusCode, reason: str) -> Status:
    """A refusing :class:`Status` with the reason cut to size."""
    return Status(code=int(code), reason=reason[:MAX_REASON_CHARS])
