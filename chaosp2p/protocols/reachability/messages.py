"""Wire format of dial-back reachability checks (``/chaos/dialback/1``).

A peer A asks a peer S it is connected to: "dial me back at these addresses" (:class:`DialRequest`);
S dials those of them at A's *own observed IP* -- the address A's connection to S comes from -- and
answers with :class:`DialResponse`. S never dials an address at another IP, so A cannot use S to
reach or scan third parties. One request and one response per stream (the host's request framing).

Limits: at most :data:`MAX_REQUEST_ADDRS` addresses of at most :data:`MAX_ADDR_CHARS` characters, a
bounded reason, a code outside the known ones is an error. ``protocols/reachability.md`` is the
normative description, with test vectors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.multiaddr import check_addr_texts
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "dialback"
"""Protocol name (requests go through ``connection.request(PROTOCOL, ...)``)."""
PROTOCOL_ID = ProtocolId(PROTOCOL, 1)
"""``/chaos/dialback/1``."""

MAX_REQUEST_ADDRS = 8
"""Most addresses one request may name."""
MAX_ADDR_CHARS = 256
"""Longest address text."""
MAX_REASON_CHARS = 256
"""Longest reason."""


class DialBackMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    REQUEST = 1
    RESPONSE = 2


class DialBackCode(enum.IntEnum):
    """Answers to a dial-back request. ONLY APPEND TO THIS LIST."""

    OK = 0
    """The server dialed an address and the requester answered the handshake there (``addr``)."""
    DIAL_FAILED = 1
    """The server dialed every eligible address; none reached the requester."""
    REFUSED = 2
    """Rate limit or too many dial-backs under way: ask later (says nothing about reachability)."""
    BAD_REQUEST = 3
    """No address at the requester's observed IP (third-party addresses are never dialed)."""
    DISABLED = 4
    """The server does not dial back."""


codec = MessageCodec(PROTOCOL, DialBackMessageType)
"""Encoder/decoder for both messages."""


@codec.register(DialBackMessageType.REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class DialRequest(Message):
    """Requester to server: dial me back at one of ``addrs`` (multiaddr texts)."""

    addrs: tuple[str, ...]

    def validate(self) -> None:
        """Bounded count and lengths (checked before any address is parsed)."""
        check_addr_texts(self.addrs, max_count=MAX_REQUEST_ADDRS, max_chars=MAX_ADDR_CHARS, what=PROTOCOL)


@codec.register(DialBackMessageType.RESPONSE)
@dataclass(frozen=True, slots=True, kw_only=True)
class DialResponse(Message):
    """Server to requester: ``code`` (a :class:`DialBackCode`), the address that worked, a reason."""

    code: int
    addr: str = ""
    reason: str = ""

    def validate(self) -> None:
        """Known code, bounded texts."""
        if self.code not in DialBackCode.__members__.values():
            raise RemoteProtocolError(f"{PROTOCOL}: unknown code {self.code}")
        if len(self.addr) > MAX_ADDR_CHARS or len(self.reason) > MAX_REASON_CHARS:
            raise RemoteProtocolError(f"{PROTOCOL}: address or reason too long")


def answer(code: DialBackCode, reason: str = "", addr: str = "") -> DialResponse:
    """A :class:`DialResponse` with the texts cut to size."""
    return DialResponse(code=int(code), addr=addr[:MAX_ADDR_CHARS], reason=reason[:MAX_REASON_CHARS])
