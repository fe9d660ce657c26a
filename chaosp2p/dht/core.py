"""Shared state and helpers of the DHT machine (see :mod:`chaosp2p.dht.machine` for the theory).

Theory of operation
-------------------
:class:`DHTCore` holds what every part of the machine uses: the identity and advertised addresses,
the routing table, the record store, the rate limiter, the address book of peers met in lookups,
the requests in flight, the timers, the operations running, the bootstrap progress, and the
outgoing queue, events and counters. It sends requests (each gets an id, a deadline and a
:class:`~chaosp2p.dht.operation.PendingRequest`) and admits peers that talked to us directly into
the routing table, pinging the least-recently-seen entry of a full bucket first.

The roles build on it: answering requests (``serving.py``), driving lookups (``querying.py``),
the PUT phase (``storing.py``), bootstrapping (``bootstrap.py``), and refresh, republish and
expiry (``maintenance.py``); ``machine.py`` puts them together and routes inputs to them.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.contacts import AddressValidator
from chaosp2p.dht.events import DHTEvent, DHTOperationDone, LookupStats, OperationResult
from chaosp2p.dht.keys import key_owner
from chaosp2p.dht.messages import (
    MAX_REQUEST_ID,
    MAX_TTL_MS,
    PROTOCOL,
    Contact,
    Ping,
    ProviderRecord,
    Request,
    StoreStatus,
)
from chaosp2p.dht.operation import (
    BootstrapProgress,
    Operation,
    OpPhase,
    PendingRequest,
    RequestKind,
)
from chaosp2p.dht.records import RecordStore, provider_relay_problem, without_relay_addrs
from chaosp2p.dht.routing import RoutingTable
from chaosp2p.dht.timers import DHTTimer, TimerTable
from chaosp2p.errors import ConfigError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr

COUNTERS = (
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
    "rejected_relay_addrs",
)
"""The machine's counters, each a field of :class:`~chaosp2p.dht.events.DHTStatistics`."""

STATUS_COUNTER = {
    StoreStatus.STALE: "rejected_stale",
    StoreStatus.BAD_SIGNATURE: "rejected_bad_signature",
    StoreStatus.OVERSIZED: "rejected_oversized",
    StoreStatus.QUOTA: "rejected_quota",
    StoreStatus.MALFORMED: "rejected_malformed",
}
"""The counter a refused record or provider record counts against, by the reason it was refused."""


class DHTCore:
    """State and primitives shared by the roles of :class:`~chaosp2p.dht.machine.DHTMachine`."""

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
        self._validator = AddressValidator(max_addrs=cfg.max_addrs_per_peer)
        self.set_listen_addrs(listen_addrs)
        self._relay_addrs: tuple[str, ...] = ()
        self.routing_table = RoutingTable(self.peer_id, k=cfg.k)
        self._store = RecordStore(
            max_key_bytes=cfg.max_key_bytes,
            max_value_bytes=cfg.max_value_bytes,
            max_ttl_s=cfg.max_record_ttl_s,
            max_per_sender=cfg.max_records_per_sender,
            max_total=cfg.max_records_total,
            max_providers_per_key=cfg.max_providers_per_key,
            max_providers_per_sender_per_key=cfg.max_providers_per_sender_per_key,
            validator=self._validator,
            max_clock_skew_s=cfg.max_clock_skew_s,
            wall_offset_s=wall_offset_s,
        )
        self._limiter = RateLimiter(
            rate_per_s=cfg.rate_limit_requests_per_s, burst=cfg.rate_limit_burst, max_senders=cfg.max_tracked_senders
        )
        self._outgoing: list[Outgoing] = []
        self._events: list[DHTEvent] = []
        self._pending: dict[int, PendingRequest] = {}
        self._pending_by_peer: dict[PeerID, set[int]] = {}
        self._timers = TimerTable(self._pending)
        # The draws below keep their order: simulations replay from the seed.
        self._next_request_id = rng.getrandbits(62)
        self._ops: dict[int, Operation] = {}
        self._next_op_id = 1
        self._addr_book: OrderedDict[PeerID, Contact] = OrderedDict()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._bucket_touched: dict[int, float] = {}
        self._timers.arm(DHTTimer.REFRESH, now + cfg.refresh_interval_s * self._jitter())
        self._timers.arm(DHTTimer.REPUBLISH, now + cfg.republish_interval_s / 2 * self._jitter())
        self._timers.arm(DHTTimer.SWEEP, now + cfg.expiry_sweep_interval_s)
        self._boot = BootstrapProgress(started_at=now)

    # ================================================================== addresses
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

    @property
    def relay_addrs(self) -> tuple[str, ...]:
        """Our relay addresses, advertised beside :attr:`listen_addrs` while nobody can dial us."""
        return self._relay_addrs

    @property
    def max_relay_addrs(self) -> int:
        """How many relay addresses a contact, request or provider record may carry here."""
        return self._validator.max_relay_addrs

    def _known(self, peer: PeerID) -> Contact | None:
        entry = self.routing_table.get(peer)
        return entry.contact if entry is not None else self._addr_book.get(peer)

    def known_addrs(self, peer: PeerID) -> tuple[str, ...]:
        """Addresses we know for ``peer`` (routing table first, then lookup contacts) -- what the
        driver dials when an :class:`Outgoing` is addressed to a peer it has no connection to."""
        contact = self._known(peer)
        return contact.addrs if contact is not None else ()

    def known_relay_addrs(self, peer: PeerID) -> tuple[str, ...]:
        """The relay addresses we know for ``peer`` (checked on entry), from the same contact."""
        contact = self._known(peer)
        return contact.relay_addrs if contact is not None else ()

    def known_multiaddrs(self, peer: PeerID) -> tuple[Multiaddr, ...]:
        """:meth:`known_addrs`, parsed."""
        return tuple(Multiaddr.parse(a) for a in self.known_addrs(peer))

    def dial_addrs(self, peer: PeerID) -> tuple[Dialable, ...]:
        """Where to reach ``peer``: its addresses, then its relay addresses -- the runtime driver's
        address resolver, for :func:`~chaosp2p.transport.reach.reach`."""
        relayed = tuple(CircuitAddr.parse(a) for a in self.known_relay_addrs(peer))
        return (*self.known_multiaddrs(peer), *relayed)

    def _remember(self, contact: Contact) -> None:
        book = self._addr_book
        peer = contact.peer_id
        if peer in book:
            book.move_to_end(peer)
        book[peer] = contact
        if len(book) > self.config.address_book_size:
            book.popitem(last=False)

    # ================================================================== routing-table admission
    def _seen(
        self, now: float, peer: PeerID, addrs: tuple[str, ...], relay_addrs: tuple[str, ...] | None = None
    ) -> None:
        """``peer`` talked to us directly: admit or refresh it; a full bucket checks its oldest first."""
        lrs = self.routing_table.seen(now, peer, addrs, relay_addrs)
        if lrs is None:
            return
        self._counts["eviction_checks"] += 1
        entry = self.routing_table.get(lrs)
        contact = entry.contact if entry is not None else Contact(peer_id=lrs, addrs=())
        ping = Ping(
            request_id=self._new_request_id(), sender_addrs=self._listen_addrs, sender_relay_addrs=self._relay_addrs
        )
        self._send_request(now, contact, ping, RequestKind.EVICTION_CHECK, None)

    def _sender_relay_addrs(self, sender: PeerID, relay_addrs: tuple[str, ...]) -> tuple[str, ...]:
        """The usable ones of the relay addresses ``sender`` claims for itself (bad ones counted)."""
        if not relay_addrs:
            return ()
        kept, dropped = self._validator.usable_relay_addrs(sender, relay_addrs)
        self._counts["rejected_relay_addrs"] += dropped
        return kept

    def _checked_relay_part(self, record: ProviderRecord) -> ProviderRecord:
        """``record``, or ``record`` without its relay addresses when they are bad (counted)."""
        if record.relay_addrs and provider_relay_problem(record, self._validator) is not None:
            self._counts["rejected_relay_addrs"] += len(record.relay_addrs)
            return without_relay_addrs(record)
        return record

    def _closest(self, target: int, exclude: PeerID) -> tuple[Contact, ...]:
        return tuple(e.contact for e in self.routing_table.closest(target, self.config.k, exclude=exclude))

    # ================================================================== requests we send
    def _new_request_id(self) -> int:
        self._next_request_id = (self._next_request_id + 1) & MAX_REQUEST_ID
        return self._next_request_id

    def _send_request(
        self,
        now: float,
        contact: Contact,
        msg: Request,
        kind: RequestKind,
        op: Operation | None,
    ) -> None:
        request_id = msg.request_id
        peer = contact.peer_id
        if contact.addrs and peer not in self.routing_table:
            self._remember(contact)  # so the driver can resolve where to send this
        self._pending[request_id] = PendingRequest(peer=peer, kind=kind, op=op, contact=contact)
        self._pending_by_peer.setdefault(peer, set()).add(request_id)
        self._timers.add_request(now + self.config.request_timeout_s, request_id)
        self._counts["requests_sent"] += 1
        self._outgoing.append(Outgoing(to=peer, protocol=PROTOCOL, message=msg))

    def _matches(self, request_id: int, sender: PeerID) -> bool:
        pending = self._pending.get(request_id)
        return pending is not None and pending.peer == sender

    def _pop_pending(self, request_id: int) -> PendingRequest:
        pending = self._pending.pop(request_id)
        ids = self._pending_by_peer.get(pending.peer)
        if ids is not None:
            ids.discard(request_id)
            if not ids:
                del self._pending_by_peer[pending.peer]
        return pending

    # ================================================================== operations
    def _new_op_id(self) -> int:
        op_id = self._next_op_id
        self._next_op_id += 1
        return op_id

    def _stats(self, now: float, op: Operation, hops: int) -> LookupStats:
        return LookupStats(
            hops=max(hops, 0),
            messages=op.lookup.messages + op.put_messages,
            failures=op.lookup.failures + op.put_failures,
            duration_s=now - op.started_at,
        )

    def _finish(self, now: float, op: Operation, result: OperationResult | None) -> None:
        op.move(OpPhase.DONE)
        self._ops.pop(op.op_id, None)
        if op.report and result is not None:
            self._events.append(DHTOperationDone(op_id=op.op_id, result=result))

    # ================================================================== helpers
    def _count_status(self, status: StoreStatus, ok_counter: str) -> None:
        self._counts[STATUS_COUNTER.get(status, ok_counter)] += 1

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
