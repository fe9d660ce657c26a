"""The Kademlia DHT as one sans-I/O message machine.

Theory of operation
-------------------
The machine answers six requests (PING, FIND_NODE, FIND_VALUE, STORE, ADD_PROVIDER, GET_PROVIDERS)
from its routing table and record store, and runs *operations* started by the local driver
(``start_store``/``start_get``/... return an op id; completion is a :class:`DHTOperationDone` event).
Every operation is an iterative lookup (:class:`LookupState`) towards ``sha256(key)`` or a peer's
node id, optionally followed by a PUT phase that sends STORE or ADD_PROVIDER to the k closest
peers the lookup found:

    LOOKUP --lookup done, nothing to put--> DONE
    LOOKUP --lookup done, put to k closest--> PUT --all acks or timeouts--> DONE

Requests are datagrams with a request id; an answer is matched by id *and* sender, everything
else is dropped and counted. Each request has a deadline (``request_timeout_s``); a timeout or a
``peer_unreachable`` from the driver fails it, which is how lookups route around crashed peers.

Who gets into the routing table: only peers that talked to us directly -- they sent a request
(with their listen addresses) or answered ours. Contacts other peers name are lookup candidates
only. A full bucket pings its least-recently-seen entry before admitting anyone (see
:mod:`chaosp2p.dht.routing`).

Background work, all on timers the driver runs through ``next_deadline``/``handle_timeout``:
a bucket refresh (self-lookup + a random lookup per stale bucket), republishing of held records
nobody re-stored within ``republish_interval_s``, an expiry sweep, and bootstrap retries with
exponential backoff (each failed attempt is announced with :class:`BootstrapRetrying`).

Bootstrap addresses without ``/p2p/``: the machine cannot address a datagram to an unknown peer,
so it emits :class:`BootstrapDialRequested`; the driver dials, learns the PeerID from the secure
handshake and calls :meth:`DHTMachine.add_contact`, which feeds the peer into the running attempt.
"""

from __future__ import annotations

import enum
import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.contacts import AddressValidator, filter_contacts
from chaosp2p.dht.events import (
    AddProviderResult,
    BootstrapDialRequested,
    BootstrapResult,
    BootstrapRetrying,
    DHTEvent,
    DHTOperationDone,
    DHTStatistics,
    FindPeerResult,
    GetProvidersResult,
    GetResult,
    LookupStats,
    OperationResult,
    StoreResult,
)
from chaosp2p.dht.keys import MalformedKey, bucket_index, id_from_bytes, id_to_bytes, key_id, key_owner, node_id
from chaosp2p.dht.lookup import LookupState
from chaosp2p.dht.messages import (
    MAX_REQUEST_ID,
    MAX_TTL_MS,
    MAX_VERSION,
    PROTOCOL,
    AddProvider,
    Contact,
    FindNode,
    FindValue,
    GetProviders,
    Nodes,
    Ping,
    Pong,
    ProviderRecord,
    Providers,
    Record,
    Store,
    Stored,
    StoreStatus,
    Value,
)
from chaosp2p.dht.records import (
    RecordStore,
    check_provider,
    check_record,
    make_provider_record,
    make_record,
)
from chaosp2p.dht.routing import RoutingTable
from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message
from chaosp2p.wire.multiaddr import Multiaddr


class OpKind(enum.Enum):
    """What an operation is for."""

    STORE = "store"
    GET = "get"
    FIND_PEER = "find_peer"
    ADD_PROVIDER = "add_provider"
    GET_PROVIDERS = "get_providers"
    BOOTSTRAP = "bootstrap"
    REFRESH = "refresh"
    REPUBLISH = "republish"
    REPUBLISH_PROVIDER = "republish_provider"


class OpPhase(enum.Enum):
    """Phase of an operation."""

    LOOKUP = "lookup"
    PUT = "put"
    DONE = "done"


_OP_TRANSITIONS: dict[tuple[OpPhase, str], OpPhase] = {
    (OpPhase.LOOKUP, "put"): OpPhase.PUT,
    (OpPhase.LOOKUP, "finish"): OpPhase.DONE,
    (OpPhase.PUT, "finish"): OpPhase.DONE,
}


class BootstrapState(enum.Enum):
    """Where bootstrapping stands."""

    IDLE = "idle"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"


_BOOTSTRAP_TRANSITIONS: dict[tuple[BootstrapState, str], BootstrapState] = {
    (BootstrapState.IDLE, "start"): BootstrapState.RUNNING,
    (BootstrapState.DONE, "start"): BootstrapState.RUNNING,
    (BootstrapState.RUNNING, "success"): BootstrapState.DONE,
    (BootstrapState.RUNNING, "fail"): BootstrapState.BACKOFF,
    (BootstrapState.BACKOFF, "retry"): BootstrapState.RUNNING,
}


_Request = Ping | FindNode | FindValue | Store | AddProvider | GetProviders
_Response = Pong | Nodes | Value | Stored | Providers


class _Query(enum.Enum):
    FIND_NODE = "find_node"
    FIND_VALUE = "find_value"
    GET_PROVIDERS = "get_providers"


_ANSWER_TYPE: dict[_Query, type[Message]] = {
    _Query.FIND_NODE: Nodes,
    _Query.FIND_VALUE: Value,
    _Query.GET_PROVIDERS: Providers,
}


class _RequestKind(enum.Enum):
    LOOKUP = "lookup"
    PUT = "put"
    EVICTION_CHECK = "eviction_check"
    PING = "ping"


@dataclass(slots=True, eq=False)
class _Operation:
    op_id: int
    kind: OpKind
    query: _Query
    started_at: float
    target: int
    lookup: LookupState
    report: bool
    key: bytes = b""
    phase: OpPhase = OpPhase.LOOKUP
    # STORE: what to put (record None until the version is decided after the lookup).
    record: Record | None = None
    value: bytes = b""
    ttl_ms: int = 0
    expires_at: float = 0.0
    provider: ProviderRecord | None = None
    found: dict[PeerID, tuple[Record, int]] = field(default_factory=dict)
    providers: dict[PeerID, tuple[ProviderRecord, int]] = field(default_factory=dict)
    found_peer: Contact | None = None
    found_depth: int = 0
    outstanding: int = 0
    accepted: int = 0
    rejected: int = 0
    put_messages: int = 0
    put_failures: int = 0
    stored_locally: bool = False

    def step(self, event: str) -> None:
        try:
            self.phase = _OP_TRANSITIONS[(self.phase, event)]
        except KeyError:
            raise LocalProtocolError(f"DHT operation {self.op_id}: {event!r} illegal in {self.phase.value}") from None


@dataclass(slots=True)
class _Pending:
    peer: PeerID
    kind: _RequestKind
    op: _Operation | None
    addrs: tuple[str, ...]


_COUNTERS = (
    "requests_received",
    "requests_sent",
    "responses_received",
    "request_timeouts",
    "unexpected_responses",
    "rate_limited",
    "rejected_bad_signature",
    "rejected_oversized",
    "rejected_quota",
    "rejected_stale",
    "rejected_garbage_peers",
    "rejected_malformed",
    "records_accepted",
    "providers_accepted",
    "eviction_checks",
    "lookups",
    "lookups_completed",
    "lookup_messages",
    "republished",
    "bootstrap_attempts",
)

_STATUS_COUNTER = {
    StoreStatus.STALE: "rejected_stale",
    StoreStatus.BAD_SIGNATURE: "rejected_bad_signature",
    StoreStatus.OVERSIZED: "rejected_oversized",
    StoreStatus.QUOTA: "rejected_quota",
    StoreStatus.MALFORMED: "rejected_malformed",
}


class DHTMachine:
    """A Kademlia DHT peer as a :class:`chaosp2p.protocols.base.MessageMachine`."""

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(
        self,
        identity: Identity,
        *,
        rng: random.Random,
        config: DHTConfig | None = None,
        listen_addrs: Sequence[str] = (),
        now: float = 0.0,
        wall_offset_s: float = 0.0,
    ) -> None:
        """``now + wall_offset_s`` must be this peer's wall clock (Unix seconds): records carry the
        wall-clock time they were issued, which bounds their life (see ``records.py``)."""
        self.identity = identity
        self.peer_id = identity.peer_id
        self.config = cfg = config or DHTConfig()
        self._rng = rng
        self._listen_addrs: tuple[str, ...] = ()
        self.set_listen_addrs(listen_addrs)
        self.routing_table = RoutingTable(self.peer_id, k=cfg.k)
        self._validator = AddressValidator(max_addrs=cfg.max_addrs_per_peer)
        self._store = RecordStore(
            max_key_bytes=cfg.max_key_bytes,
            max_value_bytes=cfg.max_value_bytes,
            max_ttl_s=cfg.max_record_ttl_s,
            max_per_publisher=cfg.max_records_per_publisher,
            max_total=cfg.max_records_total,
            max_providers_per_key=cfg.max_providers_per_key,
            validator=self._validator,
            max_clock_skew_s=cfg.max_clock_skew_s,
            wall_offset_s=wall_offset_s,
        )
        self._limiter = RateLimiter(
            rate_per_s=cfg.rate_limit_requests_per_s, burst=cfg.rate_limit_burst, max_senders=cfg.max_tracked_senders
        )
        self._outgoing: list[Outgoing] = []
        self._events: list[DHTEvent] = []
        self._pending: dict[int, _Pending] = {}
        self._pending_by_peer: dict[PeerID, set[int]] = {}
        self._timeouts: list[tuple[float, int]] = []
        self._next_request_id = rng.getrandbits(62)
        self._ops: dict[int, _Operation] = {}
        self._next_op_id = 1
        self._addr_book: OrderedDict[PeerID, tuple[str, ...]] = OrderedDict()
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._bucket_touched: dict[int, float] = {}
        self._next_refresh = now + cfg.refresh_interval_s * self._jitter()
        self._next_republish = now + cfg.republish_interval_s / 2 * self._jitter()
        self._next_sweep = now + cfg.expiry_sweep_interval_s
        # bootstrap
        self._boot_state = BootstrapState.IDLE
        self._boot_peers: list[tuple[PeerID | None, str]] = []
        self._boot_extra: dict[PeerID, Contact] = {}
        self._boot_op_id = 0
        self._boot_op: _Operation | None = None
        self._boot_attempts = 0
        self._boot_started_at = now
        self._boot_wait_until: float | None = None
        self._boot_retry_at: float | None = None

    # ================================================================== public API
    @property
    def listen_addrs(self) -> tuple[str, ...]:
        """The multiaddrs we advertise in requests and provider records."""
        return self._listen_addrs

    def set_listen_addrs(self, addrs: Sequence[str]) -> None:
        """Replace the advertised listen addresses (validated; ``/p2p/`` must name us if present)."""
        parsed = [Multiaddr.parse(a) for a in addrs]
        for addr in parsed:
            if addr.peer_id is not None and addr.peer_id != self.peer_id:
                raise ConfigError(f"listen address {addr} names another peer")
        if len(parsed) > self.config.max_addrs_per_peer:
            raise ConfigError("too many listen addresses")
        self._listen_addrs = tuple(str(a) for a in parsed)

    def known_addrs(self, peer: PeerID) -> tuple[str, ...]:
        """Addresses we know for ``peer`` (routing table first, then lookup contacts) -- what the
        driver dials when an :class:`Outgoing` is addressed to a peer it has no connection to."""
        entry = self.routing_table.get(peer)
        if entry is not None:
            return entry.contact.addrs
        return self._addr_book.get(peer, ())

    def known_multiaddrs(self, peer: PeerID) -> tuple[Multiaddr, ...]:
        """:meth:`known_addrs`, parsed -- the shape of the runtime driver's address resolver."""
        return tuple(Multiaddr.parse(a) for a in self.known_addrs(peer))

    def add_contact(self, now: float, peer: PeerID, addrs: Sequence[str]) -> None:
        """The driver knows ``peer`` is at ``addrs`` (e.g. it resolved a bootstrap address).

        During a bootstrap attempt the peer joins the attempt at once (a retry in backoff starts
        immediately); otherwise it is pinged and enters the routing table when it answers.
        """
        if peer == self.peer_id:
            return
        checked = tuple(addrs)
        if not self._validator.valid(peer, checked):
            raise ConfigError(f"invalid addresses for {peer}: {checked!r}")
        self._remember_addrs(peer, checked)
        contact = Contact(peer_id=peer, addrs=checked)
        if self._boot_state in (BootstrapState.RUNNING, BootstrapState.BACKOFF):
            self._boot_extra[peer] = contact
            if self._boot_state is BootstrapState.BACKOFF:
                self._boot_step("retry")
                self._bootstrap_attempt(now)
            elif self._boot_op is not None and self._boot_op.phase is OpPhase.LOOKUP:
                self._boot_op.lookup.add(contact, depth=0)
                self._pump(now, self._boot_op)
            return
        self._send_request(now, peer, checked, Ping(request_id=self._new_request_id(),
                                                     sender_addrs=self._listen_addrs), _RequestKind.PING, None)

    def start_bootstrap(self, now: float, peers: Sequence[tuple[PeerID | None, str]]) -> int:
        """Join the DHT through ``peers`` (``(PeerID or None, multiaddr)``); returns the op id.

        Completes (``DHTOperationDone`` with :class:`BootstrapResult`) once any bootstrap peer
        answered the self-lookup. Until then every failed attempt emits :class:`BootstrapRetrying`
        and the next one follows after an exponential backoff; addresses without a PeerID emit
        :class:`BootstrapDialRequested` on every attempt.
        """
        if not peers:
            raise ConfigError("start_bootstrap needs at least one bootstrap address")
        if self._boot_state in (BootstrapState.RUNNING, BootstrapState.BACKOFF):
            raise LocalProtocolError("a bootstrap is already running")
        resolved: list[tuple[PeerID | None, str]] = []
        for peer, text in peers:
            addr = Multiaddr.parse(text)
            if addr.peer_id is not None:
                if peer is not None and peer != addr.peer_id:
                    raise ConfigError(f"bootstrap address {text} names another peer than {peer}")
                peer = addr.peer_id
            if peer == self.peer_id:
                continue
            resolved.append((peer, str(addr)))
        if not resolved:
            raise ConfigError("start_bootstrap: every bootstrap address is our own")
        self._boot_peers = resolved
        self._boot_extra = {}
        self._boot_attempts = 0
        self._boot_started_at = now
        self._boot_op_id = self._new_op_id()
        self._boot_step("start")
        self._bootstrap_attempt(now)
        return self._boot_op_id

    @property
    def bootstrap_state(self) -> BootstrapState:
        """Where bootstrapping stands."""
        return self._boot_state

    def start_store(
        self, now: float, key: bytes, value: bytes, *, ttl_s: float | None = None, version: int | None = None
    ) -> int:
        """Store ``value`` under ``key`` on the k closest peers; returns the op id.

        ``/pk/<our-id>/...`` keys are signed with our identity. Without ``version`` the operation
        first looks the key up and uses one more than the highest version it finds (0 if none), so
        a store supersedes what the network holds. The record lives ``ttl_s`` (default from the
        config) and is republished by its holders until then.
        """
        cfg = self.config
        self._check_key(key)
        if len(value) > cfg.max_value_bytes:
            raise ConfigError(f"value of {len(value)} bytes exceeds max_value_bytes={cfg.max_value_bytes}")
        try:
            owner = key_owner(key)
        except MalformedKey as exc:
            raise ConfigError(f"malformed signed key: {exc}") from None
        if owner is not None and owner != self.peer_id:
            raise ConfigError("cannot store under another peer's /pk/ namespace")
        ttl_ms = self._ttl_ms(ttl_s, cfg.default_record_ttl_s)
        if version is not None and not 0 <= version <= MAX_VERSION:
            raise ConfigError("version out of range")
        query = _Query.FIND_NODE if version is not None else _Query.FIND_VALUE
        op = self._new_op(now, OpKind.STORE, query, key_id(key), key=key)
        op.value = value
        op.ttl_ms = ttl_ms
        op.expires_at = now + ttl_ms / 1000.0
        if version is not None:
            op.record = make_record(key, value, version=version, ttl_ms=ttl_ms,
                                    issued_at_ms=self._store.wall_ms(now), identity=self._signer(key))
        self._pump(now, op)
        return op.op_id

    def start_get(self, now: float, key: bytes) -> int:
        """Find the newest valid record under ``key``; returns the op id (result: :class:`GetResult`).

        The lookup stops once ``get_quorum`` peers returned a valid record; a record held locally
        counts as one of them (with the default quorum of 1 it answers without any network).
        """
        self._check_key(key)
        op = self._new_op(now, OpKind.GET, _Query.FIND_VALUE, key_id(key), key=key)
        local = self._store.get_record(now, key)
        if local is not None:
            op.found[self.peer_id] = (local, -1)
        self._pump(now, op)
        return op.op_id

    def start_find_peer(self, now: float, peer: PeerID) -> int:
        """Find ``peer``'s addresses; returns the op id (result: :class:`FindPeerResult`)."""
        op = self._new_op(now, OpKind.FIND_PEER, _Query.FIND_NODE, node_id(peer), key=peer.raw)
        if peer == self.peer_id:
            op.found_peer = Contact(peer_id=peer, addrs=self._listen_addrs)
            op.found_depth = -1
        else:
            entry = self.routing_table.get(peer)
            if entry is not None:
                op.found_peer = entry.contact
                op.found_depth = -1
        self._pump(now, op)
        return op.op_id

    def start_add_provider(self, now: float, key: bytes, *, ttl_s: float | None = None) -> int:
        """Announce that we provide ``key`` (e.g. :func:`state_provider_key`); returns the op id.

        The record carries our listen addresses and a seq one above any of ours the lookup finds.
        """
        self._check_key(key)
        if not self._listen_addrs:
            raise LocalProtocolError("cannot advertise as a provider without listen addresses")
        ttl_ms = self._ttl_ms(ttl_s, self.config.default_provider_ttl_s)
        op = self._new_op(now, OpKind.ADD_PROVIDER, _Query.GET_PROVIDERS, key_id(key), key=key)
        op.ttl_ms = ttl_ms
        op.expires_at = now + ttl_ms / 1000.0
        self._pump(now, op)
        return op.op_id

    def start_get_providers(self, now: float, key: bytes) -> int:
        """Find verified providers of ``key``; returns the op id (result: :class:`GetProvidersResult`)."""
        self._check_key(key)
        op = self._new_op(now, OpKind.GET_PROVIDERS, _Query.GET_PROVIDERS, key_id(key), key=key)
        for record in self._store.get_providers(now, key, self.config.max_providers_per_key):
            op.providers[record.provider] = (record, -1)
        self._pump(now, op)
        return op.op_id

    def refresh(self, now: float) -> None:
        """Refresh the routing table now: a self-lookup plus a random lookup in every bucket that is
        neither empty nor full and saw no lookup within ``refresh_interval_s``."""
        self._start_refresh(now)

    def held_record(self, now: float, key: bytes) -> Record | None:
        """The live record this peer holds under ``key`` (no network)."""
        return self._store.get_record(now, key)

    def held_providers(self, now: float, key: bytes) -> list[ProviderRecord]:
        """The live provider records this peer holds under ``key`` (no network)."""
        return self._store.get_providers(now, key, self.config.max_providers_per_key)

    @property
    def active_operations(self) -> int:
        """Operations started and not finished (internal ones included)."""
        return len(self._ops)

    def statistics(self) -> DHTStatistics:
        """A snapshot of the counters."""
        return DHTStatistics(
            **self._counts,
            records_expired=self._store.expired,
            records_held=self._store.total,
            evictions=self.routing_table.evictions,
            routing_table_size=len(self.routing_table),
        )

    # ================================================================== MessageMachine
    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """Handle one DHT message from ``sender`` (never raises for what a peer sent)."""
        if protocol != PROTOCOL or sender == self.peer_id:
            return
        try:
            message.validate()
        except RemoteProtocolError:
            self._counts["rejected_malformed"] += 1
            request_id = getattr(message, "request_id", None)
            if isinstance(request_id, int) and self._matches(request_id, sender):
                self._fail_request(now, request_id, timeout=False)
            return
        if isinstance(message, (Ping, FindNode, FindValue, Store, AddProvider, GetProviders)):
            self._on_request(now, sender, message)
        elif isinstance(message, (Pong, Nodes, Value, Stored, Providers)):
            self._on_response(now, sender, message)
        else:
            self._counts["rejected_malformed"] += 1

    def handle_timeout(self, now: float) -> None:
        """Run request deadlines and the periodic timers due at ``now``."""
        while self._timeouts and self._timeouts[0][0] <= now:
            _, request_id = heapq.heappop(self._timeouts)
            if request_id in self._pending:
                self._fail_request(now, request_id, timeout=True)
        if now >= self._next_sweep:
            self._store.expire(now)
            self._next_sweep = now + self.config.expiry_sweep_interval_s
        if now >= self._next_refresh:
            self._next_refresh = now + self.config.refresh_interval_s * self._jitter()
            self._start_refresh(now)
        if now >= self._next_republish:
            self._next_republish = now + self.config.republish_interval_s / 2 * self._jitter()
            self._republish(now)
        if self._boot_retry_at is not None and now >= self._boot_retry_at:
            self._boot_retry_at = None
            if self._boot_state is BootstrapState.BACKOFF:
                self._boot_step("retry")
                self._bootstrap_attempt(now)
        if self._boot_wait_until is not None and now >= self._boot_wait_until:
            self._boot_wait_until = None
            if self._boot_op is not None and self._boot_op.phase is OpPhase.LOOKUP:
                self._pump(now, self._boot_op)

    def next_deadline(self) -> float | None:
        """The earliest request deadline or periodic timer."""
        timeouts = self._timeouts
        while timeouts and timeouts[0][1] not in self._pending:
            heapq.heappop(timeouts)
        deadline = min(self._next_sweep, self._next_refresh, self._next_republish)
        if timeouts and timeouts[0][0] < deadline:
            deadline = timeouts[0][0]
        for extra in (self._boot_retry_at, self._boot_wait_until):
            if extra is not None and extra < deadline:
                deadline = extra
        return deadline

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the queued messages."""
        out, self._outgoing = self._outgoing, []
        return out

    def take_events(self) -> list[DHTEvent]:
        """Remove and return the queued events."""
        events, self._events = self._events, []
        return events

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """The driver could not reach ``peer``: fail its requests at once and drop it."""
        for request_id in list(self._pending_by_peer.get(peer, ())):
            self._fail_request(now, request_id, timeout=False)
        self.routing_table.remove(peer)
        self._addr_book.pop(peer, None)

    # ================================================================== requests we answer
    def _on_request(self, now: float, sender: PeerID, msg: _Request) -> None:
        self._counts["requests_received"] += 1
        if not self._limiter.allow(sender, now):
            self._counts["rate_limited"] += 1
            return
        addrs = msg.sender_addrs
        if addrs and not self._validator.valid(sender, addrs):
            self._counts["rejected_garbage_peers"] += 1
            addrs = ()
        self._seen(now, sender, addrs)
        reply: Message
        if isinstance(msg, Ping):
            reply = Pong(request_id=msg.request_id)
        elif isinstance(msg, FindNode):
            reply = Nodes(request_id=msg.request_id, closer=self._closest(id_from_bytes(msg.target), sender))
        elif isinstance(msg, FindValue):
            record = self._store.get_record(now, msg.key) if len(msg.key) <= self.config.max_key_bytes else None
            reply = Value(request_id=msg.request_id, record=record, closer=self._closest(key_id(msg.key), sender))
        elif isinstance(msg, Store):
            status, current = self._store.put_record(now, msg.record, sender)
            self._count_status(status, "records_accepted")
            reply = Stored(request_id=msg.request_id, accepted=status is StoreStatus.OK, reason=status,
                           current_version=current)
        elif isinstance(msg, AddProvider):
            status, current = self._store.put_provider(now, msg.provider)
            self._count_status(status, "providers_accepted")
            reply = Stored(request_id=msg.request_id, accepted=status is StoreStatus.OK, reason=status,
                           current_version=current)
        else:
            assert isinstance(msg, GetProviders)
            providers = self._store.get_providers(now, msg.key, self.config.max_providers_per_key)
            reply = Providers(request_id=msg.request_id, providers=tuple(providers),
                              closer=self._closest(key_id(msg.key), sender))
        self._outgoing.append(Outgoing(to=sender, protocol=PROTOCOL, message=reply))

    def _closest(self, target: int, exclude: PeerID) -> tuple[Contact, ...]:
        return tuple(e.contact for e in self.routing_table.closest(target, self.config.k, exclude=exclude))

    def _count_status(self, status: StoreStatus, ok_counter: str) -> None:
        self._counts[_STATUS_COUNTER.get(status, ok_counter)] += 1

    def _seen(self, now: float, peer: PeerID, addrs: tuple[str, ...]) -> None:
        lrs = self.routing_table.seen(now, peer, addrs)
        if lrs is None:
            return
        self._counts["eviction_checks"] += 1
        entry = self.routing_table.get(lrs)
        lrs_addrs = entry.contact.addrs if entry is not None else ()
        ping = Ping(request_id=self._new_request_id(), sender_addrs=self._listen_addrs)
        self._send_request(now, lrs, lrs_addrs, ping, _RequestKind.EVICTION_CHECK, None)

    # ================================================================== answers to our requests
    def _matches(self, request_id: int, sender: PeerID) -> bool:
        pending = self._pending.get(request_id)
        return pending is not None and pending.peer == sender

    def _on_response(self, now: float, sender: PeerID, msg: _Response) -> None:
        request_id = msg.request_id
        if not self._matches(request_id, sender):
            self._counts["unexpected_responses"] += 1
            return
        pending = self._pop_pending(request_id)
        self._counts["responses_received"] += 1
        self._seen(now, sender, pending.addrs)
        op = pending.op
        if pending.kind is _RequestKind.LOOKUP and op is not None:
            self._on_lookup_answer(now, op, sender, pending, msg)
        elif pending.kind is _RequestKind.PUT and op is not None:
            if isinstance(msg, Stored):
                if msg.accepted:
                    op.accepted += 1
                else:
                    op.rejected += 1
            else:
                self._counts["rejected_malformed"] += 1
                op.rejected += 1
            self._put_settled(now, op)

    def _on_lookup_answer(self, now: float, op: _Operation, peer: PeerID, pending: _Pending, msg: _Response) -> None:
        if op.phase is not OpPhase.LOOKUP:
            return
        cfg = self.config
        if isinstance(msg, (Pong, Stored)) or type(msg) is not _ANSWER_TYPE[op.query]:
            self._counts["rejected_malformed"] += 1
            op.lookup.failed(peer)
            self._pump(now, op)
            return
        closer = msg.closer
        if len(closer) > cfg.max_peers_per_response:
            self._counts["rejected_garbage_peers"] += len(closer)
            op.lookup.failed(peer)
            self._pump(now, op)
            return
        depth = op.lookup.depth_of(peer)
        if isinstance(msg, Value) and msg.record is not None:
            record = msg.record
            status = StoreStatus.MALFORMED if record.key != op.key else check_record(
                record, max_key_bytes=cfg.max_key_bytes, max_value_bytes=cfg.max_value_bytes
            )
            if status is StoreStatus.OK and not self._store.live(now, record):
                status = StoreStatus.MALFORMED  # lapsed, or from the future
            if status is not StoreStatus.OK:
                self._counts[_STATUS_COUNTER[status]] += 1
                op.lookup.failed(peer)
                self._pump(now, op)
                return
            op.found[peer] = (record, depth)
        elif isinstance(msg, Providers):
            if len(msg.providers) > cfg.max_providers_per_key:
                self._counts["rejected_oversized"] += 1
                op.lookup.failed(peer)
                self._pump(now, op)
                return
            for prov in msg.providers:
                status = StoreStatus.MALFORMED if prov.key != op.key else check_provider(
                    prov, max_key_bytes=cfg.max_key_bytes, validator=self._validator
                )
                if status is StoreStatus.OK and not self._store.live(now, prov):
                    status = StoreStatus.MALFORMED
                if status is not StoreStatus.OK:
                    self._counts[_STATUS_COUNTER[status]] += 1
                    continue
                held = op.providers.get(prov.provider)
                if held is None or prov.seq > held[0].seq:
                    op.providers[prov.provider] = (prov, depth)
        good, garbage = filter_contacts(closer, validator=self._validator, own=self.peer_id)
        if garbage:
            self._counts["rejected_garbage_peers"] += garbage
        if op.kind is OpKind.FIND_PEER and op.found_peer is None:
            wanted = op.key
            if peer.raw == wanted:
                op.found_peer = Contact(peer_id=peer, addrs=pending.addrs)
                op.found_depth = depth
            else:
                for contact in good:
                    if contact.peer_id.raw == wanted:
                        op.found_peer = contact
                        op.found_depth = depth
                        break
        op.lookup.answered(peer, good)
        self._pump(now, op)

    # ================================================================== sending and failing
    def _new_request_id(self) -> int:
        self._next_request_id = (self._next_request_id + 1) & MAX_REQUEST_ID
        return self._next_request_id

    def _send_request(
        self,
        now: float,
        peer: PeerID,
        addrs: tuple[str, ...],
        msg: _Request,
        kind: _RequestKind,
        op: _Operation | None,
    ) -> None:
        request_id = msg.request_id
        if addrs and peer not in self.routing_table:
            self._remember_addrs(peer, addrs)  # so the driver can resolve where to send this
        self._pending[request_id] = _Pending(peer=peer, kind=kind, op=op, addrs=addrs)
        self._pending_by_peer.setdefault(peer, set()).add(request_id)
        heapq.heappush(self._timeouts, (now + self.config.request_timeout_s, request_id))
        self._counts["requests_sent"] += 1
        self._outgoing.append(Outgoing(to=peer, protocol=PROTOCOL, message=msg))

    def _pop_pending(self, request_id: int) -> _Pending:
        pending = self._pending.pop(request_id)
        ids = self._pending_by_peer.get(pending.peer)
        if ids is not None:
            ids.discard(request_id)
            if not ids:
                del self._pending_by_peer[pending.peer]
        return pending

    def _fail_request(self, now: float, request_id: int, *, timeout: bool) -> None:
        pending = self._pop_pending(request_id)
        if timeout:
            self._counts["request_timeouts"] += 1
        if pending.kind is _RequestKind.EVICTION_CHECK:
            self.routing_table.check_failed(pending.peer)
        elif timeout:
            self.routing_table.record_failure(pending.peer, limit=self.config.failures_before_removal)
        op = pending.op
        if op is None:
            return
        if pending.kind is _RequestKind.LOOKUP:
            if op.phase is OpPhase.LOOKUP:
                op.lookup.failed(pending.peer)
                self._pump(now, op)
        elif pending.kind is _RequestKind.PUT:
            op.rejected += 1
            op.put_failures += 1
            self._put_settled(now, op)

    # ================================================================== operations
    def _new_op_id(self) -> int:
        op_id = self._next_op_id
        self._next_op_id += 1
        return op_id

    def _new_op(
        self, now: float, kind: OpKind, query: _Query, target: int, *, key: bytes = b"", report: bool = True,
        op_id: int | None = None,
    ) -> _Operation:
        seeds = [e.contact for e in self.routing_table.closest(target, self.config.k)]
        lookup = LookupState(target, seeds, k=self.config.k, alpha=self.config.alpha, own=self.peer_id)
        op = _Operation(
            op_id=op_id if op_id is not None else self._new_op_id(),
            kind=kind,
            query=query,
            started_at=now,
            target=target,
            lookup=lookup,
            report=report,
            key=key,
        )
        self._ops[op.op_id] = op
        self._counts["lookups"] += 1
        self._bucket_touched[bucket_index(self.routing_table.own_id, target)] = now
        return op

    def _lookup_can_stop(self, now: float, op: _Operation) -> bool:
        if op.kind is OpKind.GET and len(op.found) >= self.config.get_quorum:
            return True
        if op.kind is OpKind.FIND_PEER and op.found_peer is not None:
            return True
        if op.kind is OpKind.GET_PROVIDERS and len(op.providers) >= self.config.k:
            return True
        if not op.lookup.done:
            return False
        if op.kind is OpKind.BOOTSTRAP and not op.lookup.closest(1):
            # Nobody answered yet: keep the attempt open while dials the driver was asked for
            # may still bring a peer via add_contact.
            return self._boot_wait_until is None or now >= self._boot_wait_until
        return True

    def _pump(self, now: float, op: _Operation) -> None:
        if op.phase is not OpPhase.LOOKUP:
            return
        if self._lookup_can_stop(now, op):
            self._lookup_finished(now, op)
            return
        for contact in op.lookup.next_queries():
            self._send_query(now, op, contact)
        if self._lookup_can_stop(now, op):  # e.g. every candidate already failed
            self._lookup_finished(now, op)

    def _send_query(self, now: float, op: _Operation, contact: Contact) -> None:
        request_id = self._new_request_id()
        msg: _Request
        if op.query is _Query.FIND_NODE:
            msg = FindNode(request_id=request_id, sender_addrs=self._listen_addrs, target=id_to_bytes(op.target))
        elif op.query is _Query.FIND_VALUE:
            msg = FindValue(request_id=request_id, sender_addrs=self._listen_addrs, key=op.key)
        else:
            msg = GetProviders(request_id=request_id, sender_addrs=self._listen_addrs, key=op.key)
        self._send_request(now, contact.peer_id, contact.addrs, msg, _RequestKind.LOOKUP, op)

    def _lookup_finished(self, now: float, op: _Operation) -> None:
        self._counts["lookups_completed"] += 1
        self._counts["lookup_messages"] += op.lookup.messages
        kind = op.kind
        if kind is OpKind.GET:
            best = max(op.found.values(), key=lambda rd: (rd[0].version, rd[0].value), default=None)
            hops = best[1] + 1 if best is not None else op.lookup.hops()
            self._finish(now, op, GetResult(key=op.key, record=best[0] if best else None,
                                            stats=self._stats(now, op, hops)))
        elif kind is OpKind.FIND_PEER:
            hops = op.found_depth + 1 if op.found_peer is not None else op.lookup.hops()
            self._finish(now, op, FindPeerResult(peer_id=PeerID(op.key), contact=op.found_peer,
                                                 stats=self._stats(now, op, hops)))
        elif kind is OpKind.GET_PROVIDERS:
            providers = tuple(rec for rec, _ in op.providers.values())
            self._finish(now, op, GetProvidersResult(key=op.key, providers=providers,
                                                     stats=self._stats(now, op, op.lookup.hops())))
        elif kind is OpKind.BOOTSTRAP:
            self._bootstrap_lookup_finished(now, op)
        elif kind is OpKind.REFRESH:
            self._finish(now, op, None)
        else:
            self._start_put(now, op)

    def _start_put(self, now: float, op: _Operation) -> None:
        message_for: Record | ProviderRecord
        if op.kind is OpKind.STORE:
            if op.record is None:
                versions = [rec.version for rec, _ in op.found.values()]
                local = self._store.get_record(now, op.key)
                if local is not None:
                    versions.append(local.version)
                signer = self._signer(op.key)
                if signer is None:
                    # Open keys are versioned by wall-clock time, bounded by what holders accept,
                    # so nobody can take one out of reach with a huge version (records.py).
                    wall = self._store.wall_ms(now)
                    version = min(max([*versions, wall - 1]) + 1, self._store.max_unsigned_version(now))
                else:
                    version = min(max(versions) + 1, MAX_VERSION) if versions else 0
                op.record = make_record(op.key, op.value, version=version, ttl_ms=op.ttl_ms,
                                        issued_at_ms=self._store.wall_ms(now), identity=signer)
            status, _ = self._store.put_record(now, op.record, self.peer_id, verified=True)
            op.stored_locally = status is StoreStatus.OK
        elif op.kind is OpKind.ADD_PROVIDER:
            seqs = [rec.seq for peer, (rec, _) in op.providers.items() if peer == self.peer_id]
            seqs += [rec.seq for rec in self.held_providers(now, op.key) if rec.provider == self.peer_id]
            seq = min(max(seqs) + 1, MAX_VERSION) if seqs else 0
            op.provider = make_provider_record(self.identity, op.key, self._listen_addrs, seq=seq, ttl_ms=op.ttl_ms,
                                               issued_at_ms=self._store.wall_ms(now))
            status, _ = self._store.put_provider(now, op.provider)
            op.stored_locally = status is StoreStatus.OK
        remaining = int((op.expires_at - now) * 1000)
        if op.record is not None:
            message_for = op.record
        elif op.provider is not None:
            message_for = op.provider
        else:  # pragma: no cover - every put kind sets one
            raise LocalProtocolError("put without a record")
        targets = op.lookup.closest(self.config.k)
        op.step("put")
        if remaining <= 0 or not targets:
            self._finish_put(now, op)
            return
        outgoing = replace(message_for, remaining_ms=min(remaining, message_for.ttl_ms))
        for contact in targets:
            request_id = self._new_request_id()
            msg: _Request
            if isinstance(outgoing, Record):
                msg = Store(request_id=request_id, sender_addrs=self._listen_addrs, record=outgoing)
            else:
                msg = AddProvider(request_id=request_id, sender_addrs=self._listen_addrs, provider=outgoing)
            op.outstanding += 1
            op.put_messages += 1
            self._send_request(now, contact.peer_id, contact.addrs, msg, _RequestKind.PUT, op)

    def _put_settled(self, now: float, op: _Operation) -> None:
        op.outstanding -= 1
        if op.outstanding <= 0 and op.phase is OpPhase.PUT:
            self._finish_put(now, op)

    def _finish_put(self, now: float, op: _Operation) -> None:
        stats = self._stats(now, op, op.lookup.hops())
        if op.kind is OpKind.STORE and op.record is not None:
            self._finish(now, op, StoreResult(key=op.key, version=op.record.version, accepted=op.accepted,
                                              rejected=op.rejected, stored_locally=op.stored_locally, stats=stats))
        elif op.kind is OpKind.ADD_PROVIDER and op.provider is not None:
            self._finish(now, op, AddProviderResult(key=op.key, seq=op.provider.seq, accepted=op.accepted,
                                                    rejected=op.rejected, stats=stats))
        else:
            self._finish(now, op, None)

    def _stats(self, now: float, op: _Operation, hops: int) -> LookupStats:
        return LookupStats(
            hops=max(hops, 0),
            messages=op.lookup.messages + op.put_messages,
            failures=op.lookup.failures + op.put_failures,
            duration_s=now - op.started_at,
        )

    def _finish(self, now: float, op: _Operation, result: OperationResult | None) -> None:
        op.step("finish")
        self._ops.pop(op.op_id, None)
        if op.report and result is not None:
            self._events.append(DHTOperationDone(op_id=op.op_id, result=result))

    # ================================================================== bootstrap
    def _boot_step(self, event: str) -> None:
        try:
            self._boot_state = _BOOTSTRAP_TRANSITIONS[(self._boot_state, event)]
        except KeyError:
            raise LocalProtocolError(f"bootstrap: {event!r} is illegal in state {self._boot_state.value}") from None

    def _bootstrap_attempt(self, now: float) -> None:
        self._boot_attempts += 1
        self._counts["bootstrap_attempts"] += 1
        own = self.routing_table.own_id
        op = self._new_op(now, OpKind.BOOTSTRAP, _Query.FIND_NODE, own, report=False, op_id=self._boot_op_id)
        unresolved = [addr for peer, addr in self._boot_peers if peer is None]
        for peer, addr in self._boot_peers:
            if peer is not None:
                op.lookup.add(Contact(peer_id=peer, addrs=(addr,)), depth=0)
        for contact in self._boot_extra.values():
            op.lookup.add(contact, depth=0)
        for addr in unresolved:
            self._events.append(BootstrapDialRequested(addr=addr))
        self._boot_wait_until = now + 2 * self.config.request_timeout_s if unresolved else None
        self._boot_op = op
        self._pump(now, op)

    def _bootstrap_lookup_finished(self, now: float, op: _Operation) -> None:
        self._boot_op = None
        self._boot_wait_until = None
        self._ops.pop(op.op_id, None)
        if op.lookup.closest(1):
            op.step("finish")
            self._boot_step("success")
            result = BootstrapResult(
                attempts=self._boot_attempts,
                routing_table_size=len(self.routing_table),
                stats=LookupStats(hops=op.lookup.hops(), messages=op.lookup.messages,
                                  failures=op.lookup.failures, duration_s=now - self._boot_started_at),
            )
            self._events.append(DHTOperationDone(op_id=op.op_id, result=result))
            return
        op.step("finish")
        self._boot_step("fail")
        cfg = self.config
        base = min(cfg.bootstrap_backoff_max_s, cfg.bootstrap_backoff_min_s * 2 ** min(self._boot_attempts - 1, 30))
        delay = base * (0.5 + 0.5 * self._rng.random())
        self._boot_retry_at = now + delay
        tried = len(self._boot_peers) + len(self._boot_extra)
        self._events.append(BootstrapRetrying(
            attempt=self._boot_attempts, delay_s=delay, retry_at=now + delay,
            reason=f"none of {tried} bootstrap peers answered",
        ))

    # ================================================================== maintenance
    def _start_refresh(self, now: float) -> None:
        if not len(self.routing_table):
            return
        own = self.routing_table.own_id
        ops = [self._new_op(now, OpKind.REFRESH, _Query.FIND_NODE, own, report=False)]
        indexes = self.routing_table.bucket_indexes()
        horizon = now - self.config.refresh_interval_s
        for index in range(indexes[0], 256):
            # Empty buckets: the self-lookup already asked the peers nearest to them. Full buckets
            # have every contact they can use. Neither is worth a lookup of its own.
            touched = self._bucket_touched.get(index, -1e18) > horizon
            if touched or not 0 < len(self.routing_table.bucket(index)) < self.config.k:
                continue
            target = own ^ ((1 << index) | self._rng.getrandbits(index))
            ops.append(self._new_op(now, OpKind.REFRESH, _Query.FIND_NODE, target, report=False))
        for op in ops:
            self._pump(now, op)

    def _republish(self, now: float) -> None:
        self._reissue_own(now)
        records, providers = self._store.due_for_republish(now, self.config.republish_interval_s)
        for record in records:
            op = self._new_op(now, OpKind.REPUBLISH, _Query.FIND_NODE, key_id(record.key), key=record.key,
                              report=False)
            op.record = record
            op.expires_at = now + record.remaining_ms / 1000.0
            self._counts["republished"] += 1
            self._pump(now, op)
        for provider in providers:
            op = self._new_op(now, OpKind.REPUBLISH_PROVIDER, _Query.FIND_NODE, key_id(provider.key),
                              key=provider.key, report=False)
            op.provider = provider
            op.expires_at = now + provider.remaining_ms / 1000.0
            self._counts["republished"] += 1
            self._pump(now, op)

    def _reissue_own(self, now: float) -> None:
        """Re-sign our own signed records and provider records before they lapse.

        Their life is fixed by the signed ``issued_at_ms + ttl_ms``, which nobody else can move, so
        as long as this peer runs it is the one that keeps them alive (Kademlia's "original
        publisher republishes"); once it stops, they lapse within their TTL.
        """
        wall = self._store.wall_ms(now)
        margin_ms = self.config.republish_interval_s * 1000
        for held in self._store.records():
            record = held.record
            left_ms = record.issued_at_ms + record.ttl_ms - wall
            if record.publisher != self.peer_id or held.expires_at <= now or left_ms > record.ttl_ms / 2 + margin_ms:
                continue
            fresh = make_record(record.key, record.value, version=record.version, ttl_ms=record.ttl_ms,
                                issued_at_ms=wall, identity=self.identity)
            self._store.put_record(now, fresh, self.peer_id, verified=True)
            op = self._new_op(now, OpKind.REPUBLISH, _Query.FIND_NODE, key_id(record.key), key=record.key,
                              report=False)
            op.record = fresh
            op.expires_at = now + fresh.ttl_ms / 1000.0
            self._counts["republished"] += 1
            self._pump(now, op)
        for prov in self._store.providers():
            provider = prov.record
            left_ms = provider.issued_at_ms + provider.ttl_ms - wall
            if provider.provider != self.peer_id or prov.expires_at <= now or left_ms > provider.ttl_ms / 2 + margin_ms:
                continue
            fresh_provider = make_provider_record(self.identity, provider.key, self._listen_addrs or provider.addrs,
                                                  seq=provider.seq, ttl_ms=provider.ttl_ms, issued_at_ms=wall)
            self._store.put_provider(now, fresh_provider)
            op = self._new_op(now, OpKind.REPUBLISH_PROVIDER, _Query.FIND_NODE, key_id(provider.key),
                              key=provider.key, report=False)
            op.provider = fresh_provider
            op.expires_at = now + fresh_provider.ttl_ms / 1000.0
            self._counts["republished"] += 1
            self._pump(now, op)

    # ================================================================== helpers
    def _jitter(self) -> float:
        return 0.9 + 0.2 * self._rng.random()

    def _signer(self, key: bytes) -> Identity | None:
        return self.identity if key_owner(key) is not None else None

    def _check_key(self, key: bytes) -> None:
        if not 0 < len(key) <= self.config.max_key_bytes:
            raise ConfigError(f"a key is 1..{self.config.max_key_bytes} bytes")

    def _ttl_ms(self, ttl_s: float | None, default_s: float) -> int:
        ttl = default_s if ttl_s is None else ttl_s
        if not 0 < ttl <= self.config.max_record_ttl_s:
            raise ConfigError(f"ttl_s must be in (0, {self.config.max_record_ttl_s}]")
        return max(1, min(MAX_TTL_MS, int(ttl * 1000)))

    def _remember_addrs(self, peer: PeerID, addrs: tuple[str, ...]) -> None:
        book = self._addr_book
        if peer in book:
            book.move_to_end(peer)
        book[peer] = addrs
        if len(book) > self.config.address_book_size:
            book.popitem(last=False)
