"""Events the DHT machine emits, operation results, and its statistics snapshot."""

from __future__ import annotations

from dataclasses import dataclass

from chaosp2p.dht.messages import Contact, ProviderRecord, Record
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupStats:
    """How one operation's network work went."""

    hops: int
    """Sequential round trips to the peer that ended the lookup (0: answered locally)."""
    messages: int
    """Requests this operation sent (lookup queries plus stores)."""
    failures: int
    """Requests that timed out, hit an unreachable peer, or got garbage back."""
    duration_s: float
    """From ``start_*`` to completion, on the clock the driver passes in."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreResult:
    """Outcome of :meth:`DHTMachine.start_store`."""

    key: bytes
    version: int
    accepted: int
    """Remote peers that acknowledged the record."""
    rejected: int
    """Remote peers that refused it (stale, quota...) or did not answer."""
    stored_locally: bool
    stats: LookupStats

    @property
    def ok(self) -> bool:
        """True if at least one remote peer holds the record."""
        return self.accepted > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GetResult:
    """Outcome of :meth:`DHTMachine.start_get`: the newest valid record found, if any."""

    key: bytes
    record: Record | None
    stats: LookupStats

    @property
    def ok(self) -> bool:
        """True if a record was found."""
        return self.record is not None

    @property
    def value(self) -> bytes | None:
        """The value found, if any."""
        return self.record.value if self.record is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class FindPeerResult:
    """Outcome of :meth:`DHTMachine.start_find_peer`."""

    peer_id: PeerID
    contact: Contact | None
    stats: LookupStats

    @property
    def ok(self) -> bool:
        """True if the peer's addresses were found."""
        return self.contact is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class AddProviderResult:
    """Outcome of :meth:`DHTMachine.start_add_provider`."""

    key: bytes
    seq: int
    accepted: int
    rejected: int
    stats: LookupStats

    @property
    def ok(self) -> bool:
        """True if at least one remote peer holds the provider record."""
        return self.accepted > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class GetProvidersResult:
    """Outcome of :meth:`DHTMachine.start_get_providers`: verified providers, newest record each."""

    key: bytes
    providers: tuple[ProviderRecord, ...]
    stats: LookupStats

    @property
    def ok(self) -> bool:
        """True if any provider was found."""
        return bool(self.providers)


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapResult:
    """Outcome of :meth:`DHTMachine.start_bootstrap` (emitted once it succeeded)."""

    attempts: int
    routing_table_size: int
    stats: LookupStats

    @property
    def ok(self) -> bool:
        """Always True: a bootstrap only completes by reaching somebody."""
        return True


OperationResult = (
    StoreResult | GetResult | FindPeerResult | AddProviderResult | GetProvidersResult | BootstrapResult
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DHTOperationDone:
    """The operation ``op_id`` (returned by a ``start_*`` call) finished with ``result``."""

    op_id: int
    result: OperationResult


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapDialRequested:
    """The driver should dial ``addr`` (a bootstrap address without ``/p2p/``) and then call
    ``add_contact(now, peer_id, (addr,))`` with the PeerID the handshake proved."""

    addr: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapRetrying:
    """No bootstrap peer answered; another attempt starts at ``retry_at`` (or when ``add_contact``
    brings a new peer)."""

    attempt: int
    delay_s: float
    retry_at: float
    reason: str


DHTEvent = DHTOperationDone | BootstrapDialRequested | BootstrapRetrying


@dataclass(frozen=True, slots=True, kw_only=True)
class DHTStatistics:
    """Counters since the machine started (a snapshot; see :meth:`DHTMachine.statistics`)."""

    requests_received: int = 0
    requests_sent: int = 0
    responses_received: int = 0
    request_timeouts: int = 0
    unexpected_responses: int = 0
    """Answers with an unknown request id or from the wrong peer (late or spoofed)."""
    rate_limited: int = 0
    rejected_bad_signature: int = 0
    rejected_oversized: int = 0
    rejected_quota: int = 0
    rejected_stale: int = 0
    rejected_garbage_peers: int = 0
    """Contacts (or whole responses) dropped for bad addresses, duplicates or excess count."""
    rejected_malformed: int = 0
    records_accepted: int = 0
    providers_accepted: int = 0
    records_expired: int = 0
    records_held: int = 0
    eviction_checks: int = 0
    evictions: int = 0
    lookups: int = 0
    lookups_completed: int = 0
    lookup_messages: int = 0
    republished: int = 0
    bootstrap_attempts: int = 0
    routing_table_size: int = 0
    rejected_relay_addrs: int = 0
    """Relay addresses dropped (the rest of their contact, request or provider record kept): more
    than the maximum, not a relay address, one that reaches another peer, or a bad relay signature."""
