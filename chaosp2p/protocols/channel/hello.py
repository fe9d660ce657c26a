"""The first record on every connection: who I am, what I speak, where I listen.

Both sides send a ``Hello`` right after the Noise handshake and before anything else; a connection
is usable once each side has the other's. Stream opens name their protocol by its index in the
*receiver's* advertised list, so a peer can only open protocols the receiver announced, and version
negotiation needs no extra round trip: the opener picks the highest common major from the Hello.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.multiaddr import Multiaddr
from chaosp2p.wire.protocol_ids import ProtocolId

MAX_PROTOCOLS = 64
MAX_LISTEN_ADDRS = 16
MAX_AGENT_CHARS = 64


class HelloMessageType(enum.IntEnum):
    """Message types of ``/chaos/hello/1``. ONLY APPEND TO THIS LIST."""

    HELLO = 1


HELLO_CODEC = MessageCodec("hello", HelloMessageType)


@HELLO_CODEC.register(HelloMessageType.HELLO)
@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Message):
    """A peer's self-description, sent once per connection."""

    agent: str
    protocols: tuple[str, ...]
    listen_addrs: tuple[str, ...] = ()
    observed_addr: str = ""

    def validate(self) -> None:
        """Bound every list and string, and parse every id and address."""
        if len(self.agent) > MAX_AGENT_CHARS:
            raise RemoteProtocolError("hello: agent string too long")
        if len(self.protocols) > MAX_PROTOCOLS:
            raise RemoteProtocolError(f"hello: more than {MAX_PROTOCOLS} protocols")
        if len(self.listen_addrs) > MAX_LISTEN_ADDRS:
            raise RemoteProtocolError(f"hello: more than {MAX_LISTEN_ADDRS} listen addresses")
        for text in self.protocols:
            ProtocolId.parse(text)
        for text in (*self.listen_addrs, *((self.observed_addr,) if self.observed_addr else ())):
            try:
                Multiaddr.parse(text)
            except ConfigError as exc:  # the peer sent it, so it is a remote error
                raise RemoteProtocolError(f"hello: bad address {text[:80]!r}: {exc}") from None

    def protocol_ids(self) -> tuple[ProtocolId, ...]:
        """The advertised protocols, parsed."""
        return tuple(ProtocolId.parse(text) for text in self.protocols)
