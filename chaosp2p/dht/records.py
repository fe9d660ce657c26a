"""Records, provider records, their signatures, and the local store that holds them.

Theory of operation: the store is a pure table keyed by key bytes, with every time passed in as
``now`` (monotonic seconds of *this* peer); ``wall_offset_s`` turns ``now`` into this peer's wall
clock. A record carries the wall-clock time its publisher issued it (``issued_at_ms``, signed for
signed records and provider records) and its lifetime ``ttl_ms``; it is stored with
``expires_at = now + min(remaining, absolute life left, max_ttl)``, where the absolute life left is
``issued_at_ms + ttl_ms`` minus our wall clock. So re-sending a signed record -- by a holder
republishing it or by anyone replaying it -- never keeps it alive past ``issued_at + ttl``: only
its owner can extend it, by signing a newer ``issued_at_ms``. Records issued more than
``max_clock_skew_s`` in our future are refused (MALFORMED), as are records already lapsed.

Unsigned keys are open to every writer, so nothing can stop a writer from overwriting them; what
the store prevents is *squatting*: an unsigned record's version must not exceed our wall clock in
milliseconds plus ``max_clock_skew_s`` (writers use the current time as the version), so a record
at the maximum version is impossible and whoever stops re-writing loses the key within the skew.

Acceptance rules (normative text in ``protocols/dht.md``), checked cheapest first so that rejecting
junk costs little: size limits (OVERSIZED) → shape and namespace (MALFORMED) → ordering against
what we hold (STALE) → signature (BAD_SIGNATURE) → quotas (QUOTA). A rejected record never
disturbs what is already stored, and a full store refuses newcomers rather than evicting anyone.

Ordering: a record replaces the stored one for its key only if ``(version, value)`` is larger. An
equal record refreshes the expiry (and the republish clock); this is what makes republishing by
any of the k holders converge. Signed keys (``/pk/<owner>/...``) additionally need a valid
signature by the owner, so nobody else can write or roll them back; unsigned keys are open to any
writer, the highest ``(version, value)`` wins.

Quotas are charged to the *sender*: the peer whose STORE or ADD_PROVIDER put the entry here (this
peer for its own). A signature says who wrote a record, not who made us hold it -- anyone can mint
identities and sign with them -- so charging the signer would let one sender store without limit
under throwaway keys. Each sender holds at most ``max_per_sender`` entries here, and at most
``max_providers_per_sender_per_key`` provider records under one key (its own and those it relays),
so one identity cannot fill a key's provider list and crowd out the real providers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaosp2p.dht.contacts import AddressValidator
from chaosp2p.dht.keys import MalformedKey, key_owner
from chaosp2p.dht.messages import ProviderRecord, Record, StoreStatus
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID

RECORD_SIGNING_DOMAIN = "chaosp2p/dht/record/2"
PROVIDER_SIGNING_DOMAIN = "chaosp2p/dht/provider/2"
PROVIDER_RELAY_SIGNING_DOMAIN = "chaosp2p/dht/provider-relay/1"


def record_signing_payload(key: bytes, value: bytes, version: int, ttl_ms: int, issued_at_ms: int) -> bytes:
    """Bytes a record's signature covers: msgpack ``[domain, key, value, version, ttl_ms, issued_at_ms]``."""
    return pack([RECORD_SIGNING_DOMAIN, key, value, version, ttl_ms, issued_at_ms])


def provider_signing_payload(
    key: bytes, provider: PeerID, addrs: tuple[str, ...], seq: int, ttl_ms: int, issued_at_ms: int
) -> bytes:
    """Bytes a provider record's signature covers: msgpack
    ``[domain, key, provider, addrs, seq, ttl_ms, issued_at_ms]``."""
    return pack([PROVIDER_SIGNING_DOMAIN, key, provider.raw, list(addrs), seq, ttl_ms, issued_at_ms])


def provider_relay_payload(
    key: bytes, provider: PeerID, seq: int, ttl_ms: int, issued_at_ms: int, relay_addrs: tuple[str, ...]
) -> bytes:
    """Bytes a provider record's ``relay_signature`` covers: msgpack
    ``[domain, key, provider, seq, ttl_ms, issued_at_ms, relay_addrs]``. Apart from the main
    signature, so a peer of the version before relay addresses still verifies the record; bound to
    the same issue (seq, ttl, issue time), so it cannot be moved onto another one."""
    return pack([PROVIDER_RELAY_SIGNING_DOMAIN, key, provider.raw, seq, ttl_ms, issued_at_ms, list(relay_addrs)])


def make_record(
    key: bytes, value: bytes, *, version: int, ttl_ms: int, issued_at_ms: int = 0, identity: Identity | None = None
) -> Record:
    """A fresh record issued at wall-clock ``issued_at_ms``; signed by ``identity`` when given
    (required for ``/pk/`` keys)."""
    if identity is None:
        return Record(key=key, value=value, version=version, ttl_ms=ttl_ms, remaining_ms=ttl_ms,
                      publisher=None, signature=b"", issued_at_ms=issued_at_ms)
    signature = identity.sign(record_signing_payload(key, value, version, ttl_ms, issued_at_ms))
    return Record(key=key, value=value, version=version, ttl_ms=ttl_ms, remaining_ms=ttl_ms,
                  publisher=identity.peer_id, signature=signature, issued_at_ms=issued_at_ms)


def make_provider_record(
    identity: Identity,
    key: bytes,
    addrs: tuple[str, ...],
    *,
    seq: int,
    ttl_ms: int,
    issued_at_ms: int = 0,
    relay_addrs: tuple[str, ...] = (),
) -> ProviderRecord:
    """A provider record for ``identity``'s peer issued at wall-clock ``issued_at_ms``, signed by it
    (its ``relay_addrs``, if any, under a signature of their own)."""
    peer = identity.peer_id
    signature = identity.sign(provider_signing_payload(key, peer, addrs, seq, ttl_ms, issued_at_ms))
    relay_signature = (
        identity.sign(provider_relay_payload(key, peer, seq, ttl_ms, issued_at_ms, relay_addrs)) if relay_addrs else b""
    )
    return ProviderRecord(key=key, provider=peer, addrs=addrs, seq=seq, ttl_ms=ttl_ms, remaining_ms=ttl_ms,
                          signature=signature, issued_at_ms=issued_at_ms, relay_addrs=relay_addrs,
                          relay_signature=relay_signature)


def provider_relay_problem(record: ProviderRecord, validator: AddressValidator) -> str | None:
    """Why ``record``'s relay addresses cannot be used (form, count, ``relay_signature``), or ``None``.

    A record with a bad relay part is still a good record without it: the caller strips the part
    (:func:`without_relay_addrs`) and keeps the rest, as a peer of the version before relay
    addresses would.
    """
    if not record.relay_addrs:
        return None
    problem = validator.relay_problem(record.provider, record.relay_addrs)
    if problem is not None:
        return problem
    payload = provider_relay_payload(
        record.key, record.provider, record.seq, record.ttl_ms, record.issued_at_ms, record.relay_addrs
    )
    return None if record.provider.verify(record.relay_signature, payload) else "bad relay signature"


def without_relay_addrs(record: ProviderRecord) -> ProviderRecord:
    """``record`` as a peer of the version before relay addresses holds it."""
    return replace(record, relay_addrs=(), relay_signature=b"")


def check_record(record: Record, *, max_key_bytes: int, max_value_bytes: int) -> StoreStatus:
    """Every rule a record must pass on its own (not against the store): sizes, namespace, signature."""
    if len(record.key) > max_key_bytes or len(record.value) > max_value_bytes:
        return StoreStatus.OVERSIZED
    status = _check_record_shape(record)
    if status is not StoreStatus.OK:
        return status
    return _check_record_signature(record)


def _check_record_shape(record: Record) -> StoreStatus:
    if not 0 < record.remaining_ms <= record.ttl_ms:
        return StoreStatus.MALFORMED
    try:
        owner = key_owner(record.key)
    except MalformedKey:
        return StoreStatus.MALFORMED
    if owner is None:
        if record.publisher is not None or record.signature:
            return StoreStatus.MALFORMED
        return StoreStatus.OK
    if record.publisher != owner:
        return StoreStatus.BAD_SIGNATURE  # someone else's record in the owner's namespace
    return StoreStatus.OK


def _check_record_signature(record: Record) -> StoreStatus:
    if record.publisher is None:
        return StoreStatus.OK
    payload = record_signing_payload(record.key, record.value, record.version, record.ttl_ms, record.issued_at_ms)
    return StoreStatus.OK if record.publisher.verify(record.signature, payload) else StoreStatus.BAD_SIGNATURE


def check_provider(
    record: ProviderRecord, *, max_key_bytes: int, validator: AddressValidator
) -> StoreStatus:
    """Every rule a provider record must pass on its own."""
    if len(record.key) > max_key_bytes:
        return StoreStatus.OVERSIZED
    if not 0 < record.remaining_ms <= record.ttl_ms or not validator.valid(record.provider, record.addrs):
        return StoreStatus.MALFORMED
    payload = provider_signing_payload(
        record.key, record.provider, record.addrs, record.seq, record.ttl_ms, record.issued_at_ms
    )
    return StoreStatus.OK if record.provider.verify(record.signature, payload) else StoreStatus.BAD_SIGNATURE


@dataclass(slots=True)
class StoredRecord:
    """A record as held here: the record as received plus our own clocks for it."""

    record: Record
    expires_at: float
    last_stored_at: float
    """When someone (or we) last stored this exact record here; drives republishing."""
    accountable: PeerID
    """Whose quota the record counts against: the peer that sent it here (whoever signed it)."""


@dataclass(slots=True)
class StoredProvider:
    """A provider record as held here."""

    record: ProviderRecord
    expires_at: float
    last_stored_at: float
    accountable: PeerID
    """Whose quota it counts against: the peer that sent it here (not the provider it names)."""


def _remaining_ms(expires_at: float, now: float, ttl_ms: int) -> int:
    return max(1, min(ttl_ms, int((expires_at - now) * 1000)))


class RecordStore:
    """Records and provider records held by this peer, with TTLs, quotas and ordering rules."""

    def __init__(
        self,
        *,
        max_key_bytes: int,
        max_value_bytes: int,
        max_ttl_s: float,
        max_per_sender: int,
        max_total: int,
        max_providers_per_key: int,
        max_providers_per_sender_per_key: int,
        validator: AddressValidator,
        max_clock_skew_s: float = 60.0,
        wall_offset_s: float = 0.0,
    ) -> None:
        self.max_clock_skew_s = max_clock_skew_s
        self.wall_offset_s = wall_offset_s
        """``now + wall_offset_s`` is this peer's wall clock (Unix seconds)."""
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self.max_ttl_s = max_ttl_s
        self.max_per_sender = max_per_sender
        self.max_total = max_total
        self.max_providers_per_key = max_providers_per_key
        self.max_providers_per_sender_per_key = max_providers_per_sender_per_key
        self.validator = validator
        self._records: dict[bytes, StoredRecord] = {}
        self._providers: dict[bytes, dict[PeerID, StoredProvider]] = {}
        self._counts: dict[PeerID, int] = {}
        self._total = 0
        self.expired = 0
        """Records and provider records dropped because their time ran out."""

    # ------------------------------------------------------------------ clocks
    def wall_ms(self, now: float) -> int:
        """This peer's wall clock at monotonic ``now``, in Unix milliseconds."""
        return int((now + self.wall_offset_s) * 1000)

    def _lifetime_s(self, now: float, issued_at_ms: int, ttl_ms: int, remaining_ms: int) -> float | None:
        """How long a record may live here from ``now``; ``None`` if it lapsed or comes from the future."""
        wall = self.wall_ms(now)
        if issued_at_ms > wall + self.max_clock_skew_s * 1000:
            return None
        left_ms = issued_at_ms + ttl_ms - wall
        if left_ms <= 0:
            return None
        return min(remaining_ms, left_ms) / 1000.0

    def live(self, now: float, record: Record | ProviderRecord) -> bool:
        """True if ``record`` has not lapsed and was not issued in our future (beyond the skew)."""
        return self._lifetime_s(now, record.issued_at_ms, record.ttl_ms, record.remaining_ms) is not None

    def max_unsigned_version(self, now: float) -> int:
        """The highest version an unsigned record may carry here now (anti-squatting bound)."""
        return self.wall_ms(now) + int(self.max_clock_skew_s * 1000)

    # ------------------------------------------------------------------ records
    def put_record(
        self, now: float, record: Record, sender: PeerID, *, verified: bool = False
    ) -> tuple[StoreStatus, int | None]:
        """Offer a record; returns the verdict and, on STALE, the version held here."""
        if len(record.key) > self.max_key_bytes or len(record.value) > self.max_value_bytes:
            return StoreStatus.OVERSIZED, None
        status = _check_record_shape(record)
        if status is not StoreStatus.OK:
            return status, None
        lifetime = self._lifetime_s(now, record.issued_at_ms, record.ttl_ms, record.remaining_ms)
        if lifetime is None:
            return StoreStatus.MALFORMED, None
        if record.publisher is None and record.version > self.max_unsigned_version(now):
            return StoreStatus.MALFORMED, None  # a version from the future: squatting
        held = self._records.get(record.key)
        if held is not None and held.expires_at <= now:
            self._drop_record(record.key)
            held = None
        expires_at = now + min(lifetime, self.max_ttl_s)
        if held is not None:
            ours, theirs = (held.record.version, held.record.value), (record.version, record.value)
            if theirs < ours:
                return StoreStatus.STALE, held.record.version
            if theirs == ours:
                held_proof = (held.record.ttl_ms, held.record.issued_at_ms, held.record.signature)
                same_proof = held_proof == (record.ttl_ms, record.issued_at_ms, record.signature)
                if not (verified or same_proof) and _check_record_signature(record) is not StoreStatus.OK:
                    return StoreStatus.BAD_SIGNATURE, None
                if record.issued_at_ms < held.record.issued_at_ms:
                    return StoreStatus.OK, None  # an older issue of what we hold: it extends nothing
                if not same_proof:
                    held.record = record
                held.expires_at = max(held.expires_at, expires_at)
                held.last_stored_at = now
                return StoreStatus.OK, None
        if not verified and _check_record_signature(record) is not StoreStatus.OK:
            return StoreStatus.BAD_SIGNATURE, None
        accountable = sender
        if held is None or held.accountable != accountable:
            if not self._has_room(accountable, new_entry=held is None):
                return StoreStatus.QUOTA, None
            if held is not None:
                self._release(held.accountable)
            self._take(accountable)
        self._records[record.key] = StoredRecord(
            record=record, expires_at=expires_at, last_stored_at=now, accountable=accountable
        )
        return StoreStatus.OK, None

    def get_record(self, now: float, key: bytes) -> Record | None:
        """The live record under ``key``, with ``remaining_ms`` as of ``now``."""
        held = self._records.get(key)
        if held is None:
            return None
        if held.expires_at <= now:
            self._drop_record(key)
            return None
        remaining = _remaining_ms(held.expires_at, now, held.record.ttl_ms)
        if remaining == held.record.remaining_ms:
            return held.record
        return replace(held.record, remaining_ms=remaining)

    def records(self) -> list[StoredRecord]:
        """All held records (live or not yet swept)."""
        return list(self._records.values())

    # ------------------------------------------------------------------ providers
    def put_provider(self, now: float, record: ProviderRecord, sender: PeerID) -> tuple[StoreStatus, int | None]:
        """Offer a provider record ``sender`` stored here; returns the verdict and, on STALE, the seq held.

        Its relay part must have been checked (:func:`provider_relay_problem`) or stripped.
        """
        if len(record.key) > self.max_key_bytes:
            return StoreStatus.OVERSIZED, None
        if not 0 < record.remaining_ms <= record.ttl_ms or not self.validator.valid(record.provider, record.addrs):
            return StoreStatus.MALFORMED, None
        lifetime = self._lifetime_s(now, record.issued_at_ms, record.ttl_ms, record.remaining_ms)
        if lifetime is None:
            return StoreStatus.MALFORMED, None
        table = self._providers.get(record.key)
        held = table.get(record.provider) if table is not None else None
        if held is not None and held.expires_at <= now:
            self._drop_provider(record.key, record.provider)
            held = None
        expires_at = now + min(lifetime, self.max_ttl_s)
        if held is not None:
            if record.seq < held.record.seq:
                return StoreStatus.STALE, held.record.seq
            if record.seq == held.record.seq and record.signature == held.record.signature:
                if record.relay_signature and record.relay_signature != held.record.relay_signature:
                    # The same issue with its relay part, which a holder of the version before
                    # relay addresses dropped on the way here: take it (it was checked).
                    held.record = replace(
                        held.record, relay_addrs=record.relay_addrs, relay_signature=record.relay_signature
                    )
                held.expires_at = max(held.expires_at, expires_at)
                held.last_stored_at = now
                return StoreStatus.OK, None
        payload = provider_signing_payload(
            record.key, record.provider, record.addrs, record.seq, record.ttl_ms, record.issued_at_ms
        )
        if not record.provider.verify(record.signature, payload):
            return StoreStatus.BAD_SIGNATURE, None
        if held is not None:
            # Same seq, different content: the provider re-signed. The later issue wins (that is
            # how a provider extends its record); on a tie the larger signature, so every holder
            # converges on one record.
            if record.seq == held.record.seq and (record.issued_at_ms, record.signature) < (
                held.record.issued_at_ms,
                held.record.signature,
            ):
                return StoreStatus.STALE, held.record.seq
            if held.accountable != sender:  # a new writer takes over the entry, within its own quotas
                if not self._provider_room(table, sender, new_entry=False):
                    return StoreStatus.QUOTA, None
                self._release(held.accountable)
                self._take(sender)
                held.accountable = sender
            newer = record.seq > held.record.seq
            held.record = record
            held.expires_at = expires_at if newer else max(held.expires_at, expires_at)
            held.last_stored_at = now
            return StoreStatus.OK, None
        if table is not None and len(table) >= self.max_providers_per_key:
            return StoreStatus.QUOTA, None
        if not self._provider_room(table, sender, new_entry=True):
            return StoreStatus.QUOTA, None
        self._take(sender)
        if table is None:
            table = self._providers[record.key] = {}
        table[record.provider] = StoredProvider(
            record=record, expires_at=expires_at, last_stored_at=now, accountable=sender
        )
        return StoreStatus.OK, None

    def get_providers(self, now: float, key: bytes, limit: int) -> list[ProviderRecord]:
        """Up to ``limit`` live provider records under ``key``, with ``remaining_ms`` as of ``now``."""
        table = self._providers.get(key)
        if not table:
            return []
        out: list[ProviderRecord] = []
        for peer, held in list(table.items()):
            if held.expires_at <= now:
                self._drop_provider(key, peer)
                continue
            if len(out) < limit:
                out.append(
                    replace(held.record, remaining_ms=_remaining_ms(held.expires_at, now, held.record.ttl_ms))
                )
        return out

    def providers(self) -> list[StoredProvider]:
        """All held provider records."""
        return [held for table in self._providers.values() for held in table.values()]

    # ------------------------------------------------------------------ maintenance
    def expire(self, now: float) -> int:
        """Drop everything whose time ran out; returns how many went."""
        before = self.expired
        for key in [k for k, held in self._records.items() if held.expires_at <= now]:
            self._drop_record(key)
        for key, table in list(self._providers.items()):
            for peer in [p for p, held in table.items() if held.expires_at <= now]:
                self._drop_provider(key, peer)
        return self.expired - before

    def due_for_republish(
        self, now: float, interval_s: float
    ) -> tuple[list[Record], list[ProviderRecord]]:
        """Live records nobody re-stored here for ``interval_s``, marked as republished now.

        Any holder that received a STORE for a record recently assumes the other holders did too
        and leaves the republishing to whoever's timer runs first (Kademlia's optimisation).
        """
        records: list[Record] = []
        providers: list[ProviderRecord] = []
        for held in self._records.values():
            if held.expires_at > now and now - held.last_stored_at >= interval_s:
                held.last_stored_at = now
                records.append(
                    replace(held.record, remaining_ms=_remaining_ms(held.expires_at, now, held.record.ttl_ms))
                )
        for table in self._providers.values():
            for prov in table.values():
                if prov.expires_at > now and now - prov.last_stored_at >= interval_s:
                    prov.last_stored_at = now
                    providers.append(
                        replace(prov.record, remaining_ms=_remaining_ms(prov.expires_at, now, prov.record.ttl_ms))
                    )
        return records, providers

    def count_for(self, sender: PeerID) -> int:
        """Records plus provider records counted against ``sender`` (the peer that stored them here)."""
        return self._counts.get(sender, 0)

    @property
    def total(self) -> int:
        """Records plus provider records held."""
        return self._total

    def __len__(self) -> int:
        return len(self._records)

    # ------------------------------------------------------------------ internals
    def _has_room(self, sender: PeerID, *, new_entry: bool) -> bool:
        if self._counts.get(sender, 0) >= self.max_per_sender:
            return False
        return not (new_entry and self._total >= self.max_total)

    def _provider_room(self, table: dict[PeerID, StoredProvider] | None, sender: PeerID, *, new_entry: bool) -> bool:
        """Room for one more provider record from ``sender`` under one key (``table``) and overall."""
        if table is not None:
            # At most max_providers_per_key (64) entries: counting them beats a second index.
            held = sum(1 for entry in table.values() if entry.accountable == sender)
            if held >= self.max_providers_per_sender_per_key:
                return False
        return self._has_room(sender, new_entry=new_entry)

    def _take(self, sender: PeerID) -> None:
        self._counts[sender] = self._counts.get(sender, 0) + 1
        self._total += 1

    def _release(self, sender: PeerID) -> None:
        left = self._counts.get(sender, 0) - 1
        if left > 0:
            self._counts[sender] = left
        else:
            self._counts.pop(sender, None)
        self._total -= 1

    def _drop_record(self, key: bytes) -> None:
        held = self._records.pop(key)
        self._release(held.accountable)
        self.expired += 1

    def _drop_provider(self, key: bytes, peer: PeerID) -> None:
        table = self._providers[key]
        held = table.pop(peer)
        if not table:
            del self._providers[key]
        self._release(held.accountable)
        self.expired += 1
