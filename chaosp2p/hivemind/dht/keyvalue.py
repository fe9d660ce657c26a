"""hivemind's ``DHT.store`` / ``DHT.get`` on chaosp2p's signed-record DHT (async, on the peer's loop).

See :mod:`chaosp2p.hivemind.dht.entries` for the layout: each writer publishes its own entries of
key K as the signed record ``/pk/<writer>/hivemind/<id of K>`` and announces itself as a provider
of ``hivemind-key/<id of K>``; a read fetches every provider's record and merges them. Record
validators (:mod:`chaosp2p.hivemind.dht.validation`) sign entries on the way in and check them on
the way out, one entry at a time, as hivemind's peers do.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import anyio

from chaosp2p.errors import ChaosError
from chaosp2p.hivemind.dht.entries import Entries, merge
from chaosp2p.hivemind.dht.validation import IS_REGULAR_VALUE, CompositeValidator, DHTRecord, dht_key_id
from chaosp2p.hivemind.utils.serializer import MSGPackSerializer
from chaosp2p.hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time
from chaosp2p.wire.identity import PeerID

if TYPE_CHECKING:
    from chaosp2p.api.async_peer import AsyncPeer

log = logging.getLogger("chaosp2p.hivemind")

MIN_RECORD_TTL_S = 1.0
"""A record about to expire still lives this long (the DHT needs a positive lifetime)."""


def record_name(key_id: bytes) -> bytes:
    """The name, under ``/pk/<writer>/``, of a writer's record for a key."""
    return b"hivemind/" + key_id.hex().encode()


def provider_key(key_id: bytes) -> bytes:
    """The key whose providers are the writers of a hivemind key."""
    return b"hivemind-key/" + key_id.hex().encode()


class KeyValueStore:
    """hivemind's key-value semantics for one peer (see the module docstring). Use it on the peer's loop."""

    def __init__(self, peer: AsyncPeer, validator: CompositeValidator) -> None:
        self._peer = peer
        self.validator = validator
        self._own: dict[bytes, Entries] = {}
        self._announced_until: dict[bytes, float] = {}
        self._locks: dict[bytes, anyio.Lock] = {}

    @property
    def _max_ttl_s(self) -> float:
        return self._peer.config.dht.max_record_ttl_s

    async def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        """Add this peer's entry for ``key`` (``subkey``) until ``expiration_time``; False if refused."""
        key_id = dht_key_id(key)
        subkey_bytes = None if subkey is None else MSGPackSerializer.dumps(subkey)
        record = DHTRecord(
            key_id,
            IS_REGULAR_VALUE if subkey_bytes is None else subkey_bytes,
            MSGPackSerializer.dumps(value),
            float(expiration_time),
        )
        if self.validator:
            record = dataclasses.replace(record, value=self.validator.sign_value(record))
            if not self.validator.validate(record):
                log.debug("DHT store of %r refused by the record validators", key)
                return False
        lock = self._locks.setdefault(key_id, anyio.Lock())
        async with lock:
            held = self._own.setdefault(key_id, Entries())
            trial = held.copy()
            now = get_dht_time()
            if not trial.store(subkey_bytes, record.value, record.expiration_time, now):
                return False
            expiration = trial.expiration
            assert expiration is not None
            ttl_s = min(max(expiration - now, MIN_RECORD_TTL_S), self._max_ttl_s)
            raw = trial.encode()
            if len(raw) > self._peer.config.dht.max_value_bytes:
                log.warning("DHT store of %r refused: this peer's entries would exceed %d bytes", key, len(raw))
                return False
            dht = self._peer.dht
            try:
                await dht.store_signed(record_name(key_id), raw, ttl_s=ttl_s)
                if self._announced_until.get(key_id, float("-inf")) < expiration:
                    await dht.add_provider(provider_key(key_id), ttl_s=ttl_s)
                    self._announced_until[key_id] = now + ttl_s
            except ChaosError as exc:
                log.warning("DHT store of %r failed: %s", key, exc)
                return False
            self._own[key_id] = trial
            return True

    async def get(self, key: Any) -> ValueWithExpiration[Any] | None:
        """Every writer's unexpired entries of ``key``, merged as hivemind merges replicas (None: none)."""
        key_id = dht_key_id(key)
        me = self._peer.peer_id
        holdings: list[tuple[PeerID, Entries]] = []
        own = self._own.get(key_id)
        if own is not None:
            holdings.append((me, own))
        try:
            providers = await self._peer.dht.get_providers(provider_key(key_id))
        except ChaosError as exc:
            log.warning("DHT get of %r: looking up its writers failed: %s", key, exc)
            providers = ()
        writers = list(dict.fromkeys(record.provider for record in providers if record.provider != me))

        async def fetch(writer: PeerID) -> None:
            try:
                raw = await self._peer.dht.get_signed(writer, record_name(key_id))
                if raw is not None:
                    holdings.append((writer, self._checked(key_id, Entries.decode(raw))))
            except ChaosError as exc:  # one writer's bad or missing record must not fail the read
                log.debug("DHT get of %r: skipping %s's entries: %s", key, writer, exc)

        async with anyio.create_task_group() as tg:
            for writer in writers:
                tg.start_soon(fetch, writer)
        merged = merge((entries for _, entries in holdings), get_dht_time())
        return None if merged is None else self._result(key_id, merged)

    def _checked(self, key_id: bytes, entries: Entries) -> Entries:
        """The entries the validators accept (each entry on its own, as hivemind checks each record)."""
        if not self.validator:
            return entries
        if entries.regular is not None:
            value, expiration = entries.regular
            if not self.validator.validate(DHTRecord(key_id, IS_REGULAR_VALUE, value, expiration)):
                entries.regular = None
        for subkey, (value, expiration) in list(entries.subkeys.items()):
            if not self.validator.validate(DHTRecord(key_id, subkey, value, expiration)):
                del entries.subkeys[subkey]
        return entries

    def _result(self, key_id: bytes, merged: Entries) -> ValueWithExpiration[Any] | None:
        expiration = merged.expiration
        assert expiration is not None
        if merged.regular is not None:
            value = self._load(DHTRecord(key_id, IS_REGULAR_VALUE, *merged.regular))
            return None if value is None else ValueWithExpiration(value[0], expiration)
        result: dict[Any, ValueWithExpiration[Any]] = {}
        for subkey, (raw, entry_expiration) in merged.subkeys.items():
            loaded = self._load(DHTRecord(key_id, subkey, raw, entry_expiration))
            if loaded is None:
                continue
            try:
                name = MSGPackSerializer.loads(subkey)
                result[name] = ValueWithExpiration(loaded[0], entry_expiration)
            except (ValueError, TypeError) as exc:  # an unhashable or undecodable subkey
                log.debug("DHT get: skipping a subkey: %s", exc)
        return ValueWithExpiration(result, expiration)

    def _load(self, record: DHTRecord) -> tuple[Any] | None:
        raw = self.validator.strip_value(record) if self.validator else record.value
        try:
            return (MSGPackSerializer.loads(raw),)
        except Exception as exc:  # whatever a writer's bytes raise while unpacking
            log.debug("DHT get: skipping an undecodable value: %s", exc)
            return None


__all__ = ["KeyValueStore", "provider_key", "record_name"]
