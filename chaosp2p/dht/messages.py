"""Wire messages of the Kademlia DHT (protocol ``dht``, id ``/chaos/dht/1``).

Field order is the wire order (see ``protocols/dht.md``). ``validate()`` enforces only the
protocol's hard limits and structural rules, so a decoder can refuse absurd input before it is
used; the machine applies the (smaller) configured limits itself and counts what it rejects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.dht.config import (
    HARD_MAX_ADDRS,
    HARD_MAX_CONTACTS,
    HARD_MAX_KEY_BYTES,
    HARD_MAX_PROVIDERS,
    HARD_MAX_RELAY_ADDRS,
    HARD_MAX_VALUE_BYTES,
)
from chaosp2p.dht.keys import ID_BYTES
from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.multiaddr import MAX_MULTIADDR_CHARS
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "dht"
PROTOCOL_ID = ProtocolId("dht", 1)
MAX_REQUEST_ID = (1 << 64) - 1
MAX_VERSION = (1 << 63) - 1
MAX_TTL_MS = 1 << 40
SIGNATURE_BYTES = 64
MAX_RELAY_ADDR_CHARS = 2 * MAX_MULTIADDR_CHARS
"""A relay address is the relay's multiaddr, ``/p2p-circuit`` and the target's id."""


class DHTMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse a value."""

    PING = 1
    PONG = 2
    FIND_NODE = 3
    NODES = 4
    FIND_VALUE = 5
    VALUE = 6
    STORE = 7
    STORED = 8
    ADD_PROVIDER = 9
    GET_PROVIDERS = 10
    PROVIDERS = 11


class StoreStatus(enum.IntEnum):
    """Why a STORE or ADD_PROVIDER was (not) accepted. Append-only."""

    OK = 0
    STALE = 1
    """We hold a newer (or equal-version, higher-valued) record."""
    BAD_SIGNATURE = 2
    OVERSIZED = 3
    QUOTA = 4
    """The publisher's quota or our total capacity is used up."""
    MALFORMED = 5
    """A rule other than size or signature was broken (bad namespace, TTL, addresses...)."""


DHT_CODEC = MessageCodec(PROTOCOL, DHTMessageType)


def _fail(message: str) -> None:
    raise RemoteProtocolError(f"dht: {message}")


def _check_request_id(request_id: int) -> None:
    if not 0 <= request_id <= MAX_REQUEST_ID:
        _fail("request_id out of range")


def _check_addrs(addrs: tuple[str, ...], most: int = HARD_MAX_ADDRS, chars: int = MAX_MULTIADDR_CHARS,
                 what: str = "address") -> None:
    if len(addrs) > most:
        _fail(f"more than {most} {what}es")
    for addr in addrs:
        if len(addr) > chars:
            _fail(f"{what} too long")


def _check_relay_addrs(relay_addrs: tuple[str, ...]) -> None:
    # Hard caps only: the form (a circuit address naming the peer) is checked by the machine,
    # which drops bad ones and keeps the rest of the message (``contacts.py``).
    _check_addrs(relay_addrs, HARD_MAX_RELAY_ADDRS, MAX_RELAY_ADDR_CHARS, "relay address")


def _check_sender(msg: Ping | FindNode | FindValue | Store | AddProvider | GetProviders) -> None:
    _check_request_id(msg.request_id)
    _check_addrs(msg.sender_addrs)
    _check_relay_addrs(msg.sender_relay_addrs)


def _check_key(key: bytes) -> None:
    if not 0 < len(key) <= HARD_MAX_KEY_BYTES:
        _fail(f"key must be 1..{HARD_MAX_KEY_BYTES} bytes")


def _check_issued_at(issued_at_ms: int) -> None:
    if not 0 <= issued_at_ms <= MAX_VERSION:
        _fail("issued_at_ms out of range")


def _check_ttl(ttl_ms: int, remaining_ms: int) -> None:
    if not 0 < ttl_ms <= MAX_TTL_MS:
        _fail("ttl_ms out of range")
    if not 0 < remaining_ms <= ttl_ms:
        _fail("remaining_ms must be in 1..ttl_ms")


def _check_contacts(contacts: tuple[Contact, ...]) -> None:
    if len(contacts) > HARD_MAX_CONTACTS:
        _fail(f"more than {HARD_MAX_CONTACTS} contacts")
    for contact in contacts:
        contact.validate()


@dataclass(frozen=True, slots=True, kw_only=True)
class Contact:
    """A peer as named in a response: its id, the multiaddrs it listens on, and where it is relayed."""

    peer_id: PeerID
    addrs: tuple[str, ...]
    relay_addrs: tuple[str, ...] = ()
    """Appended: relay addresses (``…/p2p/<relay>/p2p-circuit/p2p/<peer_id>``) of a peer nobody
    can dial. Never in ``addrs``: a peer of the version before them drops a contact whose
    ``addrs`` hold one (``protocols/dht.md`` §3.1)."""

    def validate(self) -> None:
        """Hard caps only; multiaddr syntax is checked (and counted) by the machine."""
        _check_addrs(self.addrs)
        _check_relay_addrs(self.relay_addrs)


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """A value under a key. Signed (``/pk/`` keys) or unsigned (``publisher=None``, no signature).

    ``ttl_ms`` is the lifetime the publisher declared from ``issued_at_ms`` (its wall clock, Unix
    milliseconds); both are signed, so nobody can stretch a signed record past
    ``issued_at_ms + ttl_ms``. ``remaining_ms`` is what is left at the sender, relative to the
    moment of sending (it can only shorten the life, never extend it).
    """

    key: bytes
    value: bytes
    version: int
    ttl_ms: int
    remaining_ms: int
    publisher: PeerID | None
    signature: bytes
    issued_at_ms: int = 0

    def validate(self) -> None:
        """Hard caps and the signed/unsigned shape."""
        _check_key(self.key)
        if len(self.value) > HARD_MAX_VALUE_BYTES:
            _fail("value exceeds the protocol limit")
        if not 0 <= self.version <= MAX_VERSION:
            _fail("version out of range")
        _check_ttl(self.ttl_ms, self.remaining_ms)
        _check_issued_at(self.issued_at_ms)
        if self.publisher is None:
            if self.signature:
                _fail("an unsigned record carries no signature")
        elif len(self.signature) != SIGNATURE_BYTES:
            _fail("a signed record needs a 64-byte signature")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderRecord:
    """"``provider`` (reachable at ``addrs``) holds what ``key`` names", signed by the provider."""

    key: bytes
    provider: PeerID
    addrs: tuple[str, ...]
    seq: int
    ttl_ms: int
    remaining_ms: int
    signature: bytes
    issued_at_ms: int = 0
    """When the provider signed it (Unix ms); it lapses at ``issued_at_ms + ttl_ms`` at the latest."""
    relay_addrs: tuple[str, ...] = ()
    """Appended: where the provider is relayed, outside ``signature`` (so a peer of the version
    before them still verifies the record) and covered by ``relay_signature`` instead."""
    relay_signature: bytes = b""
    """The provider's signature over ``records.provider_relay_payload`` (empty when ``relay_addrs`` is)."""

    def validate(self) -> None:
        """Hard caps and shape."""
        _check_key(self.key)
        _check_addrs(self.addrs)
        _check_relay_addrs(self.relay_addrs)
        if len(self.relay_signature) != (SIGNATURE_BYTES if self.relay_addrs else 0):
            _fail("relay addresses need a 64-byte relay signature, and only they")
        if not 0 <= self.seq <= MAX_VERSION:
            _fail("seq out of range")
        _check_ttl(self.ttl_ms, self.remaining_ms)
        _check_issued_at(self.issued_at_ms)
        if len(self.signature) != SIGNATURE_BYTES:
            _fail("a provider record needs a 64-byte signature")


@DHT_CODEC.register(DHTMessageType.PING)
@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    """Liveness probe; also how a full bucket checks its least-recently-seen entry."""

    request_id: int
    sender_addrs: tuple[str, ...]
    sender_relay_addrs: tuple[str, ...] = ()
    """Appended: the requester's relay addresses (as :attr:`Contact.relay_addrs`)."""

    def validate(self) -> None:
        """Check ranges."""
        _check_sender(self)


@DHT_CODEC.register(DHTMessageType.PONG)
@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    """Answer to :class:`Ping`."""

    request_id: int

    def validate(self) -> None:
        """Check ranges."""
        _check_request_id(self.request_id)


@DHT_CODEC.register(DHTMessageType.FIND_NODE)
@dataclass(frozen=True, slots=True, kw_only=True)
class FindNode(Message):
    """Ask for the contacts closest to a 32-byte target id."""

    request_id: int
    sender_addrs: tuple[str, ...]
    target: bytes
    sender_relay_addrs: tuple[str, ...] = ()
    """Appended: the requester's relay addresses (as :attr:`Contact.relay_addrs`)."""

    def validate(self) -> None:
        """Check ranges."""
        _check_sender(self)
        if len(self.target) != ID_BYTES:
            _fail(f"target must be {ID_BYTES} bytes")


@DHT_CODEC.register(DHTMessageType.NODES)
@dataclass(frozen=True, slots=True, kw_only=True)
class Nodes(Message):
    """Answer to :class:`FindNode`: the responder's closest known contacts to the target."""

    request_id: int
    closer: tuple[Contact, ...]

    def validate(self) -> None:
        """Check ranges."""
        _check_request_id(self.request_id)
        _check_contacts(self.closer)


@DHT_CODEC.register(DHTMessageType.FIND_VALUE)
@dataclass(frozen=True, slots=True, kw_only=True)
class FindValue(Message):
    """Ask for the record under ``key`` (and contacts closer to ``sha256(key)``)."""

    request_id: int
    sender_addrs: tuple[str, ...]
    key: bytes
    sender_relay_addrs: tuple[str, ...] = ()
    """Appended: the requester's relay addresses (as :attr:`Contact.relay_addrs`)."""

    def validate(self) -> None:
        """Check ranges."""
        _check_sender(self)
        _check_key(self.key)


@DHT_CODEC.register(DHTMessageType.VALUE)
@dataclass(frozen=True, slots=True, kw_only=True)
class Value(Message):
    """Answer to :class:`FindValue`: the record if held, and closer contacts either way."""

    request_id: int
    record: Record | None
    closer: tuple[Contact, ...]

    def validate(self) -> None:
        """Check ranges."""
        _check_request_id(self.request_id)
        if self.record is not None:
            self.record.validate()
        _check_contacts(self.closer)


@DHT_CODEC.register(DHTMessageType.STORE)
@dataclass(frozen=True, slots=True, kw_only=True)
class Store(Message):
    """Ask the receiver to hold ``record``."""

    request_id: int
    sender_addrs: tuple[str, ...]
    record: Record
    sender_relay_addrs: tuple[str, ...] = ()
    """Appended: the requester's relay addresses (as :attr:`Contact.relay_addrs`)."""

    def validate(self) -> None:
        """Check ranges."""
        _check_sender(self)
        self.record.validate()


@DHT_CODEC.register(DHTMessageType.STORED)
@dataclass(frozen=True, slots=True, kw_only=True)
class Stored(Message):
    """Answer to :class:`Store` and :class:`AddProvider`."""

    request_id: int
    accepted: bool
    reason: StoreStatus
    current_version: int | None = None
    """On ``STALE``: the version (or provider seq) the receiver holds."""

    def validate(self) -> None:
        """Check ranges and that ``accepted`` agrees with ``reason``."""
        _check_request_id(self.request_id)
        if self.accepted != (self.reason is StoreStatus.OK):
            _fail("accepted must be true exactly when reason is OK")
        if self.current_version is not None and not 0 <= self.current_version <= MAX_VERSION:
            _fail("current_version out of range")


@DHT_CODEC.register(DHTMessageType.ADD_PROVIDER)
@dataclass(frozen=True, slots=True, kw_only=True)
class AddProvider(Message):
    """Ask the receiver to hold a provider record (answered with :class:`Stored`)."""

    request_id: int
    sender_addrs: tuple[str, ...]
    provider: ProviderRecord
    sender_relay_addrs: tuple[str, ...] = ()
    """Appended: the requester's relay addresses (as :attr:`Contact.relay_addrs`)."""

    def validate(self) -> None:
        """Check ranges."""
        _check_sender(self)
        self.provider.validate()


@DHT_CODEC.register(DHTMessageType.GET_PROVIDERS)
@dataclass(frozen=True, slots=True, kw_only=True)
class GetProviders(Message):
    """Ask for provider records under ``key`` (and contacts closer to ``sha256(key)``)."""

    request_id: int
    sender_addrs: tuple[str, ...]
    key: bytes
    sender_relay_addrs: tuple[str, ...] = ()
    """Appended: the requester's relay addresses (as :attr:`Contact.relay_addrs`)."""

    def validate(self) -> None:
        """Check ranges."""
        _check_sender(self)
        _check_key(self.key)


@DHT_CODEC.register(DHTMessageType.PROVIDERS)
@dataclass(frozen=True, slots=True, kw_only=True)
class Providers(Message):
    """Answer to :class:`GetProviders`."""

    request_id: int
    providers: tuple[ProviderRecord, ...]
    closer: tuple[Contact, ...]

    def validate(self) -> None:
        """Check ranges."""
        _check_request_id(self.request_id)
        if len(self.providers) > HARD_MAX_PROVIDERS:
            _fail(f"more than {HARD_MAX_PROVIDERS} provider records")
        for provider in self.providers:
            provider.validate()
        _check_contacts(self.closer)


REQUEST_TYPES: tuple[type[Message], ...] = (Ping, FindNode, FindValue, Store, AddProvider, GetProviders)
RESPONSE_TYPES: tuple[type[Message], ...] = (Pong, Nodes, Value, Stored, Providers)

Request = Ping | FindNode | FindValue | Store | AddProvider | GetProviders
"""A request (the types of :data:`REQUEST_TYPES`)."""
Response = Pong | Nodes | Value | Stored | Providers
"""An answer to a :data:`Request` (the types of :data:`RESPONSE_TYPES`)."""
