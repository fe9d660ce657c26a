"""The DHT machine's PUT phase: a record or provider record sent to the k closest peers a lookup found.

Theory of operation
-------------------
Stores, provider announcements and republishes end their lookup here. A store or announcement
first decides what it puts (:data:`PREPARE_PUT`), now that the lookup has shown what the network
holds: a store without an explicit version takes one above every version found (signed keys), or
the wall-clock version bounded by what holders accept (open keys, see ``records.py``); an
announcement takes a seq one above any of ours. The item is kept locally too. A republish puts the
record it was given as is.

Then one STORE or ADD_PROVIDER goes to each of the k closest peers, carrying the time the item has
left; each acknowledgement, refusal or failed request settles one of them, and the operation ends
with its result (:data:`PUT_RESULT`) when none is outstanding -- at once if the item has lapsed or
the lookup found nobody.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from chaosp2p.dht.core import DHTCore
from chaosp2p.dht.events import AddProviderResult, LookupStats, OperationResult, StoreResult
from chaosp2p.dht.messages import (
    MAX_VERSION,
    AddProvider,
    ProviderRecord,
    Record,
    Request,
    Response,
    Store,
    Stored,
    StoreStatus,
)
from chaosp2p.dht.operation import (
    LookupKind,
    Operation,
    OpPhase,
    PendingRequest,
    RequestKind,
)
from chaosp2p.dht.records import make_provider_record, make_record
from chaosp2p.errors import LocalProtocolError
from chaosp2p.wire.identity import PeerID


class Storing(DHTCore):
    """The PUT phase of stores, provider announcements and republishes."""

    def _start_put(self, now: float, op: Operation) -> None:
        prepare = PREPARE_PUT.get(op.kind)
        if prepare is not None:
            getattr(self, prepare)(now, op)
        remaining = int((op.expires_at - now) * 1000)
        item: Record | ProviderRecord | None = op.record if op.record is not None else op.provider
        if item is None:  # pragma: no cover - every put kind sets one
            raise LocalProtocolError("put without a record")
        targets = op.lookup.closest(self.config.k)
        op.move(OpPhase.PUT)
        if remaining <= 0 or not targets:
            self._finish_put(now, op)
            return
        outgoing = replace(item, remaining_ms=min(remaining, item.ttl_ms))
        for contact in targets:
            msg = _put_request(self._new_request_id(), self._listen_addrs, self._relay_addrs, outgoing)
            op.outstanding += 1
            op.put_messages += 1
            self._send_request(now, contact, msg, RequestKind.PUT, op)

    def _prepare_store(self, now: float, op: Operation) -> None:
        """Decide the record's version (unless the caller gave one) and keep it locally."""
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

    def _prepare_provider(self, now: float, op: Operation) -> None:
        """Sign our provider record with a seq above any of ours, and keep it locally."""
        seqs = [rec.seq for peer, (rec, _) in op.providers.items() if peer == self.peer_id]
        held = self._store.get_providers(now, op.key, self.config.max_providers_per_key)
        seqs += [rec.seq for rec in held if rec.provider == self.peer_id]
        seq = min(max(seqs) + 1, MAX_VERSION) if seqs else 0
        op.provider = make_provider_record(self.identity, op.key, self._listen_addrs, seq=seq, ttl_ms=op.ttl_ms,
                                           issued_at_ms=self._store.wall_ms(now), relay_addrs=self._relay_addrs)
        status, _ = self._store.put_provider(now, op.provider, self.peer_id)
        op.stored_locally = status is StoreStatus.OK

    def _on_put_answer(self, now: float, op: Operation, peer: PeerID, pending: PendingRequest,
                       msg: Response) -> None:
        if isinstance(msg, Stored):
            if msg.accepted:
                op.accepted += 1
            else:
                op.rejected += 1
        else:
            self._counts["rejected_malformed"] += 1
            op.rejected += 1
        self._put_settled(now, op)

    def _put_request_failed(self, now: float, op: Operation, peer: PeerID) -> None:
        """A STORE or ADD_PROVIDER timed out or its peer is unreachable: it counts as refused."""
        op.rejected += 1
        op.put_failures += 1
        self._put_settled(now, op)

    def _put_settled(self, now: float, op: Operation) -> None:
        op.outstanding -= 1
        if op.outstanding <= 0 and op.phase is OpPhase.PUT:
            self._finish_put(now, op)

    def _finish_put(self, now: float, op: Operation) -> None:
        stats = self._stats(now, op, op.lookup.hops())
        result = PUT_RESULT.get(op.kind)
        self._finish(now, op, result(op, stats) if result is not None else None)


def _put_request(
    request_id: int, addrs: tuple[str, ...], relay_addrs: tuple[str, ...], item: Record | ProviderRecord
) -> Request:
    if isinstance(item, Record):
        return Store(request_id=request_id, sender_addrs=addrs, record=item, sender_relay_addrs=relay_addrs)
    return AddProvider(request_id=request_id, sender_addrs=addrs, provider=item, sender_relay_addrs=relay_addrs)


def _store_result(op: Operation, stats: LookupStats) -> OperationResult | None:
    if op.record is None:
        return None
    return StoreResult(key=op.key, version=op.record.version, accepted=op.accepted, rejected=op.rejected,
                       stored_locally=op.stored_locally, stats=stats)


def _provider_result(op: Operation, stats: LookupStats) -> OperationResult | None:
    if op.provider is None:
        return None
    return AddProviderResult(key=op.key, seq=op.provider.seq, accepted=op.accepted, rejected=op.rejected,
                             stats=stats)


PREPARE_PUT: dict[LookupKind, str] = {
    LookupKind.STORE: "_prepare_store",
    LookupKind.ADD_PROVIDER: "_prepare_provider",
}
"""Kinds that decide what they put once their lookup ends (republishes carry theirs from the start)."""

PUT_RESULT: dict[LookupKind, Callable[[Operation, LookupStats], OperationResult | None]] = {
    LookupKind.STORE: _store_result,
    LookupKind.ADD_PROVIDER: _provider_result,
}
"""The result a finished PUT reports, by kind (republishes report none)."""
