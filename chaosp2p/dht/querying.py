"""The DHT machine driving its lookups: queries out, answers in, and what follows a finished lookup.

Theory of operation
-------------------
Each operation owns a :class:`~chaosp2p.dht.lookup.LookupState` seeded with the k closest
contacts of the routing table. ``_pump`` is the one loop: if the lookup may stop, it ends;
otherwise it sends the query of the operation (:data:`QUERY`: FIND_NODE, FIND_VALUE or
GET_PROVIDERS) to the next candidates, at most alpha in flight. A lookup may stop when the lookup
state says so (the k closest answered) or earlier once it has what its kind wanted
(:data:`ENOUGH`: a quorum of records, the peer, k providers). A bootstrap attempt nobody answered
yet stays open while dials the driver was asked for may still bring a peer.

An answer is taken only if it is the one the query asks for and lists no more than
``max_peers_per_response`` contacts; records and provider records in it are checked (key,
signature, liveness) before they count -- a bad record fails that peer, a bad provider record is
just skipped. Named contacts that survive :func:`~chaosp2p.dht.contacts.filter_contacts` become
candidates, never routing-table entries. A failed query (timeout, unreachable, garbage) marks the
peer failed in the lookup, which then routes around it.

When the lookup ends, :data:`AFTER_LOOKUP` says what follows, by :class:`LookupKind`: a result
for gets and finds, the PUT phase for stores and republishes (``storing.py``), the next step of
bootstrapping (``bootstrap.py``), nothing for a refresh (``maintenance.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.contacts import filter_contacts
from chaosp2p.dht.core import STATUS_COUNTER, DHTCore
from chaosp2p.dht.events import FindPeerResult, GetProvidersResult, GetResult
from chaosp2p.dht.keys import bucket_index, id_to_bytes
from chaosp2p.dht.lookup import LookupState
from chaosp2p.dht.messages import (
    Contact,
    FindNode,
    FindValue,
    GetProviders,
    Nodes,
    Providers,
    Request,
    Response,
    StoreStatus,
    Value,
)
from chaosp2p.dht.operation import (
    ANSWER_TYPE,
    LookupKind,
    LookupQuery,
    Operation,
    OpPhase,
    PendingRequest,
    RequestKind,
)
from chaosp2p.dht.records import check_provider, check_record
from chaosp2p.dht.timers import DHTTimer
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class Querying(DHTCore):
    """The lookup side of every operation."""

    def _new_op(
        self, now: float, kind: LookupKind, query: LookupQuery, target: int, *, key: bytes = b"", report: bool = True,
        op_id: int | None = None,
    ) -> Operation:
        seeds = [e.contact for e in self.routing_table.closest(target, self.config.k)]
        lookup = LookupState(target, seeds, k=self.config.k, alpha=self.config.alpha, own=self.peer_id)
        op = Operation(
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

    def _lookup_can_stop(self, now: float, op: Operation) -> bool:
        enough = ENOUGH.get(op.kind)
        if enough is not None and enough(op, self.config):
            return True
        if not op.lookup.done:
            return False
        if op.kind is LookupKind.BOOTSTRAP and not op.lookup.closest(1):
            # Nobody answered yet: keep the attempt open while dials the driver was asked for
            # may still bring a peer via add_contact.
            wait_until = self._timers.at(DHTTimer.BOOTSTRAP_WAIT)
            return wait_until is None or now >= wait_until
        return True

    def _pump(self, now: float, op: Operation) -> None:
        if op.phase is not OpPhase.LOOKUP:
            return
        if self._lookup_can_stop(now, op):
            self._lookup_finished(now, op)
            return
        for contact in op.lookup.next_queries():
            self._send_query(now, op, contact)
        if self._lookup_can_stop(now, op):  # e.g. every candidate already failed
            self._lookup_finished(now, op)

    def _send_query(self, now: float, op: Operation, contact: Contact) -> None:
        msg = QUERY[op.query](self._new_request_id(), (self._listen_addrs, self._relay_addrs), op)
        self._send_request(now, contact, msg, RequestKind.LOOKUP, op)

    def _lookup_finished(self, now: float, op: Operation) -> None:
        self._counts["lookups_completed"] += 1
        self._counts["lookup_messages"] += op.lookup.messages
        after: Callable[[float, Operation], None] = getattr(self, AFTER_LOOKUP[op.kind])
        after(now, op)

    # ================================================================== answers
    def _on_lookup_answer(self, now: float, op: Operation, peer: PeerID, pending: PendingRequest,
                          msg: Response) -> None:
        if op.phase is not OpPhase.LOOKUP:
            return
        if type(msg) is not ANSWER_TYPE[op.query]:
            self._counts["rejected_malformed"] += 1
            self._query_failed(now, op, peer)
            return
        closer = cast("Nodes | Value | Providers", msg).closer
        if len(closer) > self.config.max_peers_per_response:
            self._counts["rejected_garbage_peers"] += len(closer)
            self._query_failed(now, op, peer)
            return
        depth = op.lookup.depth_of(peer)
        take = TAKE.get(type(msg))
        if take is not None and not getattr(self, take)(now, op, peer, depth, msg):
            self._query_failed(now, op, peer)
            return
        good, garbage, dropped_relays = filter_contacts(closer, validator=self._validator, own=self.peer_id)
        if garbage:
            self._counts["rejected_garbage_peers"] += garbage
        self._counts["rejected_relay_addrs"] += dropped_relays
        if op.kind is LookupKind.FIND_PEER and op.found_peer is None:
            self._look_for_peer(op, peer, pending, good, depth)
        op.lookup.answered(peer, good)
        self._pump(now, op)

    def _take_value(self, now: float, op: Operation, peer: PeerID, depth: int, msg: Value) -> bool:
        """Keep the record a FIND_VALUE answer carries; False if it is bad (the peer failed)."""
        record = msg.record
        if record is None:
            return True
        cfg = self.config
        status = StoreStatus.MALFORMED if record.key != op.key else check_record(
            record, max_key_bytes=cfg.max_key_bytes, max_value_bytes=cfg.max_value_bytes
        )
        if status is StoreStatus.OK and not self._store.live(now, record):
            status = StoreStatus.MALFORMED  # lapsed, or from the future
        if status is not StoreStatus.OK:
            self._counts[STATUS_COUNTER[status]] += 1
            return False
        op.found[peer] = (record, depth)
        return True

    def _take_providers(self, now: float, op: Operation, peer: PeerID, depth: int, msg: Providers) -> bool:
        """Keep the valid provider records of a GET_PROVIDERS answer; False if it lists too many."""
        cfg = self.config
        if len(msg.providers) > cfg.max_providers_per_key:
            self._counts["rejected_oversized"] += 1
            return False
        for prov in msg.providers:
            status = StoreStatus.MALFORMED if prov.key != op.key else check_provider(
                prov, max_key_bytes=cfg.max_key_bytes, validator=self._validator
            )
            if status is StoreStatus.OK and not self._store.live(now, prov):
                status = StoreStatus.MALFORMED
            if status is not StoreStatus.OK:
                self._counts[STATUS_COUNTER[status]] += 1
                continue
            prov = self._checked_relay_part(prov)
            held = op.providers.get(prov.provider)
            if held is None or prov.seq > held[0].seq:
                op.providers[prov.provider] = (prov, depth)
        return True

    @staticmethod
    def _look_for_peer(
        op: Operation, peer: PeerID, pending: PendingRequest, good: list[Contact], depth: int
    ) -> None:
        wanted = op.key
        if peer.raw == wanted:
            op.found_peer = pending.contact
            op.found_depth = depth
            return
        for contact in good:
            if contact.peer_id.raw == wanted:
                op.found_peer = contact
                op.found_depth = depth
                return

    def _query_failed(self, now: float, op: Operation, peer: PeerID) -> None:
        op.lookup.failed(peer)
        self._pump(now, op)

    def _lookup_request_failed(self, now: float, op: Operation, peer: PeerID) -> None:
        """A query timed out or its peer is unreachable."""
        if op.phase is OpPhase.LOOKUP:
            self._query_failed(now, op, peer)

    # ================================================================== results of plain lookups
    def _get_done(self, now: float, op: Operation) -> None:
        best = max(op.found.values(), key=lambda rd: (rd[0].version, rd[0].value), default=None)
        hops = best[1] + 1 if best is not None else op.lookup.hops()
        self._finish(now, op, GetResult(key=op.key, record=best[0] if best else None,
                                        stats=self._stats(now, op, hops)))

    def _find_peer_done(self, now: float, op: Operation) -> None:
        hops = op.found_depth + 1 if op.found_peer is not None else op.lookup.hops()
        self._finish(now, op, FindPeerResult(peer_id=PeerID(op.key), contact=op.found_peer,
                                             stats=self._stats(now, op, hops)))

    def _get_providers_done(self, now: float, op: Operation) -> None:
        providers = tuple(rec for rec, _ in op.providers.values())
        self._finish(now, op, GetProvidersResult(key=op.key, providers=providers,
                                                 stats=self._stats(now, op, op.lookup.hops())))


Sender = tuple[tuple[str, ...], tuple[str, ...]]
"""Our listen addresses and our relay addresses, as every request carries them."""


def _find_node(request_id: int, sender: Sender, op: Operation) -> Request:
    addrs, relay_addrs = sender
    return FindNode(request_id=request_id, sender_addrs=addrs, target=id_to_bytes(op.target),
                    sender_relay_addrs=relay_addrs)


def _find_value(request_id: int, sender: Sender, op: Operation) -> Request:
    addrs, relay_addrs = sender
    return FindValue(request_id=request_id, sender_addrs=addrs, key=op.key, sender_relay_addrs=relay_addrs)


def _get_providers(request_id: int, sender: Sender, op: Operation) -> Request:
    addrs, relay_addrs = sender
    return GetProviders(request_id=request_id, sender_addrs=addrs, key=op.key, sender_relay_addrs=relay_addrs)


QUERY: dict[LookupQuery, Callable[[int, Sender, Operation], Request]] = {
    LookupQuery.FIND_NODE: _find_node,
    LookupQuery.FIND_VALUE: _find_value,
    LookupQuery.GET_PROVIDERS: _get_providers,
}
"""The request a lookup sends, built from its request id, our addresses and the operation."""

ENOUGH: dict[LookupKind, Callable[[Operation, DHTConfig], bool]] = {
    LookupKind.GET: lambda op, cfg: len(op.found) >= cfg.get_quorum,
    LookupKind.FIND_PEER: lambda op, cfg: op.found_peer is not None,
    LookupKind.GET_PROVIDERS: lambda op, cfg: len(op.providers) >= cfg.k,
}
"""Kinds whose lookup may stop before the k closest answered, once it has what they look for."""

TAKE: dict[type[Message], str] = {
    Value: "_take_value",
    Providers: "_take_providers",
}
"""What a lookup keeps from an answer besides its contacts, by answer type (Nodes: nothing)."""

AFTER_LOOKUP: dict[LookupKind, str] = {
    LookupKind.GET: "_get_done",
    LookupKind.FIND_PEER: "_find_peer_done",
    LookupKind.GET_PROVIDERS: "_get_providers_done",
    LookupKind.BOOTSTRAP: "_bootstrap_lookup_finished",  # bootstrap.py
    LookupKind.REFRESH: "_refresh_done",  # maintenance.py
    LookupKind.STORE: "_start_put",  # storing.py
    LookupKind.ADD_PROVIDER: "_start_put",
    LookupKind.REPUBLISH: "_start_put",
    LookupKind.REPUBLISH_PROVIDER: "_start_put",
}
"""What follows a finished lookup, by kind, as the name of a method of the assembled machine."""
