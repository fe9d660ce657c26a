"""The DHT machine answering requests: PING, FIND_NODE, FIND_VALUE, STORE, ADD_PROVIDER, GET_PROVIDERS.

Theory of operation
-------------------
Every request passes the same gate before it is served: it is counted, rate-limited per sender
(over the limit it is dropped without an answer), and the listen addresses it carries are checked
-- garbage addresses are counted and ignored, but the request is still served; so are bad relay
addresses, one by one (``contacts.py``). A sender that gets
this far talked to us directly, so it is offered to the routing table (``_seen``), which is the
only way a peer enters it. Then :data:`SERVE` picks the handler by message type; each builds the
one answer from the routing table or the record store, and stores go through the same acceptance
rules as everything else the store holds (``records.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaosp2p.dht.core import DHTCore
from chaosp2p.dht.keys import id_from_bytes, key_id
from chaosp2p.dht.messages import (
    PROTOCOL,
    AddProvider,
    FindNode,
    FindValue,
    GetProviders,
    Nodes,
    Ping,
    Pong,
    Providers,
    Request,
    Store,
    Stored,
    StoreStatus,
    Value,
)
from chaosp2p.protocols.base import Outgoing
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class RequestServing(DHTCore):
    """The machine's answers to other peers' requests."""

    def _on_request(self, now: float, sender: PeerID, msg: Request) -> None:
        self._counts["requests_received"] += 1
        if not self._limiter.allow(sender, now):
            self._counts["rate_limited"] += 1
            return
        addrs = msg.sender_addrs
        if addrs and not self._validator.valid(sender, addrs):
            self._counts["rejected_garbage_peers"] += 1
            addrs = ()
        self._seen(now, sender, addrs, self._sender_relay_addrs(sender, msg.sender_relay_addrs))
        serve: Callable[[float, PeerID, Any], Message] = getattr(self, SERVE[type(msg)])
        reply = serve(now, sender, msg)
        self._outgoing.append(Outgoing(to=sender, protocol=PROTOCOL, message=reply))

    def _serve_ping(self, now: float, sender: PeerID, msg: Ping) -> Message:
        return Pong(request_id=msg.request_id)

    def _serve_find_node(self, now: float, sender: PeerID, msg: FindNode) -> Message:
        return Nodes(request_id=msg.request_id, closer=self._closest(id_from_bytes(msg.target), sender))

    def _serve_find_value(self, now: float, sender: PeerID, msg: FindValue) -> Message:
        record = self._store.get_record(now, msg.key) if len(msg.key) <= self.config.max_key_bytes else None
        return Value(request_id=msg.request_id, record=record, closer=self._closest(key_id(msg.key), sender))

    def _serve_store(self, now: float, sender: PeerID, msg: Store) -> Message:
        status, current = self._store.put_record(now, msg.record, sender)
        self._count_status(status, "records_accepted")
        return Stored(request_id=msg.request_id, accepted=status is StoreStatus.OK, reason=status,
                      current_version=current)

    def _serve_add_provider(self, now: float, sender: PeerID, msg: AddProvider) -> Message:
        status, current = self._store.put_provider(now, self._checked_relay_part(msg.provider), sender)
        self._count_status(status, "providers_accepted")
        return Stored(request_id=msg.request_id, accepted=status is StoreStatus.OK, reason=status,
                      current_version=current)

    def _serve_get_providers(self, now: float, sender: PeerID, msg: GetProviders) -> Message:
        providers = self._store.get_providers(now, msg.key, self.config.max_providers_per_key)
        return Providers(request_id=msg.request_id, providers=tuple(providers),
                         closer=self._closest(key_id(msg.key), sender))


SERVE: dict[type[Message], str] = {
    Ping: "_serve_ping",
    FindNode: "_serve_find_node",
    FindValue: "_serve_find_value",
    Store: "_serve_store",
    AddProvider: "_serve_add_provider",
    GetProviders: "_serve_get_providers",
}
"""The handler of each request type, by name (as negotiation's ``_HANDLERS``: a table of bound
methods on each machine would make every machine a reference cycle)."""
