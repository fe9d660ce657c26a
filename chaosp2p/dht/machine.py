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

Where each part lives: the shared state and request bookkeeping in ``core.py``; what an operation
is, as data, in ``operation.py`` and the timers in ``timers.py``; the roles in ``serving.py``
(answering requests), ``querying.py`` (lookups), ``storing.py`` (the PUT phase), ``bootstrap.py``
and ``maintenance.py`` (refresh, republish, expiry). This module puts them together: the
operations the driver starts, and the tables that route each input -- a message by its type, an
answer or a failure by why the request was sent, a timer by its kind -- to the role that handles it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chaosp2p.dht.bootstrap import Bootstrapping
from chaosp2p.dht.events import DHTEvent, DHTStatistics
from chaosp2p.dht.keys import MalformedKey, key_id, key_owner, node_id
from chaosp2p.dht.maintenance import Maintenance
from chaosp2p.dht.messages import (
    MAX_VERSION,
    PROTOCOL,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    Contact,
    ProviderRecord,
    Record,
    Response,
)
from chaosp2p.dht.operation import (
    BootstrapState,
    LookupKind,
    LookupQuery,
    Operation,
    PendingRequest,
    RequestKind,
)
from chaosp2p.dht.records import make_record
from chaosp2p.dht.serving import RequestServing
from chaosp2p.dht.storing import Storing
from chaosp2p.dht.timers import DHTTimer
from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class DHTMachine(RequestServing, Storing, Bootstrapping, Maintenance):
    """A Kademlia DHT peer as a :class:`chaosp2p.protocols.base.MessageMachine`."""

    protocols: Sequence[str] = (PROTOCOL,)

    # ================================================================== operations the driver starts
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
        query = LookupQuery.FIND_NODE if version is not None else LookupQuery.FIND_VALUE
        op = self._new_op(now, LookupKind.STORE, query, key_id(key), key=key)
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
        op = self._new_op(now, LookupKind.GET, LookupQuery.FIND_VALUE, key_id(key), key=key)
        local = self._store.get_record(now, key)
        if local is not None:
            op.found[self.peer_id] = (local, -1)
        self._pump(now, op)
        return op.op_id

    def start_find_peer(self, now: float, peer: PeerID) -> int:
        """Find ``peer``'s addresses; returns the op id (result: :class:`FindPeerResult`)."""
        op = self._new_op(now, LookupKind.FIND_PEER, LookupQuery.FIND_NODE, node_id(peer), key=peer.raw)
        if peer == self.peer_id:
            op.found_peer = Contact(peer_id=peer, addrs=self._listen_addrs, relay_addrs=self._relay_addrs)
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
        op = self._new_op(now, LookupKind.ADD_PROVIDER, LookupQuery.GET_PROVIDERS, key_id(key), key=key)
        op.ttl_ms = ttl_ms
        op.expires_at = now + ttl_ms / 1000.0
        self._pump(now, op)
        return op.op_id

    def start_get_providers(self, now: float, key: bytes) -> int:
        """Find verified providers of ``key``; returns the op id (result: :class:`GetProvidersResult`)."""
        self._check_key(key)
        op = self._new_op(now, LookupKind.GET_PROVIDERS, LookupQuery.GET_PROVIDERS, key_id(key), key=key)
        for record in self._store.get_providers(now, key, self.config.max_providers_per_key):
            op.providers[record.provider] = (record, -1)
        self._pump(now, op)
        return op.op_id

    def set_relay_addrs(self, now: float, addrs: Sequence[str]) -> None:
        """Replace our relay addresses (``…/p2p/<relay>/p2p-circuit/p2p/<us>``; empty: none).

        They go out with every request from now on. A change is announced at once: a self-lookup
        tells the peers closest to us (those asked about us), and our provider records are
        re-issued, so that whoever looks us up finds where we are relayed now.
        """
        checked = tuple(str(a) for a in addrs)
        problem = self._validator.relay_problem(self.peer_id, checked)
        if problem is not None:
            raise ConfigError(f"relay addresses: {problem}")
        if checked != self._relay_addrs:
            self._relay_addrs = checked
            if len(self.routing_table):
                own = self.routing_table.own_id
                self._pump(now, self._new_op(now, LookupKind.REFRESH, LookupQuery.FIND_NODE, own, report=False))
            self._reissue_own_providers(now, every=True)

    # ================================================================== what this peer holds
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
        name = RECEIVE.get(type(message))
        if name is None:
            self._counts["rejected_malformed"] += 1
            return
        handler: Callable[[float, PeerID, Any], None] = getattr(self, name)
        handler(now, sender, message)

    def handle_timeout(self, now: float) -> None:
        """Run request deadlines and the periodic timers due at ``now``."""
        timers = self._timers
        for timer in DHTTimer:
            # Read each deadline in its turn: an earlier handler may have armed or cancelled it.
            at = timers.at(timer)
            if at is not None and now >= at:
                getattr(self, ON_TIMER[timer])(now)

    def next_deadline(self) -> float | None:
        """The earliest request deadline or periodic timer."""
        return self._timers.earliest()

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

    # ================================================================== settling our requests
    def _on_response(self, now: float, sender: PeerID, msg: Response) -> None:
        request_id = msg.request_id
        if not self._matches(request_id, sender):
            self._counts["unexpected_responses"] += 1
            return
        pending = self._pop_pending(request_id)
        self._counts["responses_received"] += 1
        contact = pending.contact
        # An answer says nothing of the sender's relay addresses: an entry keeps those its own
        # requests announced; a newcomer starts with those of the contact that named it.
        self._seen(now, sender, contact.addrs, None if sender in self.routing_table else contact.relay_addrs)
        name = ON_ANSWER.get(pending.kind)
        if name is not None and pending.op is not None:
            handler: Callable[[float, Operation, PeerID, PendingRequest, Response], None] = getattr(self, name)
            handler(now, pending.op, sender, pending, msg)

    def _fail_request(self, now: float, request_id: int, *, timeout: bool) -> None:
        pending = self._pop_pending(request_id)
        if timeout:
            self._counts["request_timeouts"] += 1
        if pending.kind is RequestKind.EVICTION_CHECK:
            self.routing_table.check_failed(pending.peer)  # the silent old entry makes room
        elif timeout:
            self.routing_table.record_failure(pending.peer, limit=self.config.failures_before_removal)
        name = ON_FAILURE.get(pending.kind)
        if name is not None and pending.op is not None:
            handler: Callable[[float, Operation, PeerID], None] = getattr(self, name)
            handler(now, pending.op, pending.peer)

    def _expire_requests(self, now: float) -> None:
        while (request_id := self._timers.pop_due_request(now)) is not None:
            if request_id in self._pending:
                self._fail_request(now, request_id, timeout=True)


__all__ = ["BootstrapState", "DHTMachine"]


RECEIVE: dict[type[Message], str] = {
    **dict.fromkeys(REQUEST_TYPES, "_on_request"),  # serving.py
    **dict.fromkeys(RESPONSE_TYPES, "_on_response"),
}
"""Where each message type goes, by handler name (a table of bound methods on each machine would
make every machine a reference cycle, as negotiation's ``_HANDLERS`` notes)."""

ON_ANSWER: dict[RequestKind, str] = {
    RequestKind.LOOKUP: "_on_lookup_answer",  # querying.py
    RequestKind.PUT: "_on_put_answer",  # storing.py
}
"""What an answer feeds, by why the request was sent (pings and eviction checks: only ``_seen``)."""

ON_FAILURE: dict[RequestKind, str] = {
    RequestKind.LOOKUP: "_lookup_request_failed",  # querying.py
    RequestKind.PUT: "_put_request_failed",  # storing.py
}
"""What a failed request means to its operation, by why it was sent."""

ON_TIMER: dict[DHTTimer, str] = {
    DHTTimer.REQUESTS: "_expire_requests",
    DHTTimer.SWEEP: "_sweep_due",  # maintenance.py
    DHTTimer.REFRESH: "_refresh_due",
    DHTTimer.REPUBLISH: "_republish_due",
    DHTTimer.BOOTSTRAP_RETRY: "_bootstrap_retry_due",  # bootstrap.py
    DHTTimer.BOOTSTRAP_WAIT: "_bootstrap_wait_over",
}
"""The handler of each timer kind; ``handle_timeout`` runs the due ones in :class:`DHTTimer` order."""
