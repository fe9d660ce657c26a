"""Configuration of the Kademlia DHT: one frozen dataclass with local/lan/wan profiles."""

from __future__ import annotations

from dataclasses import dataclass

from chaosp2p.configbase import require, require_positive

# Protocol-level hard caps (protocols/dht.md, "Limits"): a decoder refuses anything beyond these
# whatever the local configuration says, so configured limits must stay within them.
HARD_MAX_KEY_BYTES = 1024
HARD_MAX_VALUE_BYTES = 512 * 1024
HARD_MAX_CONTACTS = 64
HARD_MAX_ADDRS = 16
HARD_MAX_PROVIDERS = 64
HARD_MAX_RELAY_ADDRS = 8
"""Most relay addresses one contact, request or provider record carries (``protocols/relay.md`` §6)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DHTConfig:
    """Every tunable of :class:`chaosp2p.dht.DHTMachine`; units are in the field names."""

    k: int = 20
    """Bucket size and replication factor: records go to the ``k`` closest peers."""
    alpha: int = 3
    """Requests a lookup keeps in flight at once."""
    request_timeout_s: float = 2.0
    """A request with no answer after this long counts as a failure of that peer."""
    failures_before_removal: int = 2
    """Consecutive request timeouts after which a routing-table entry is dropped (an explicit
    ``peer_unreachable`` from the driver drops it at once)."""
    default_record_ttl_s: float = 3600.0
    """Lifetime of a stored value when the caller gives none."""
    default_provider_ttl_s: float = 3600.0
    """Lifetime of a provider record when the caller gives none."""
    max_record_ttl_s: float = 86400.0
    """Longest lifetime a record or provider record may claim; longer claims are clamped."""
    max_clock_skew_s: float = 60.0
    """How far ahead of ours another peer's wall clock may be: records issued further in our future,
    and unsigned records whose version (a wall-clock time in ms) is, are refused."""
    republish_interval_s: float = 600.0
    """A held record that nobody re-stored for this long is re-stored to the current k closest."""
    refresh_interval_s: float = 600.0
    """Period of the self-lookup plus random lookups that keep the buckets fresh."""
    expiry_sweep_interval_s: float = 30.0
    """Period at which expired records are dropped (reads also check expiry on their own)."""
    get_quorum: int = 1
    """A get finishes once this many peers returned a valid record (the highest version wins)."""
    max_key_bytes: int = 512
    max_value_bytes: int = 64 * 1024
    max_records_per_sender: int = 1024
    """Records plus provider records one peer may have stored here: they count against the peer
    that sent the STORE or ADD_PROVIDER, whoever signed them (identities are free to make)."""
    max_records_total: int = 65536
    """Records plus provider records this peer holds for everyone together."""
    max_providers_per_key: int = 64
    max_providers_per_sender_per_key: int = 4
    """Provider records under one key that one peer may have stored here (its own included): one
    identity cannot fill a key's provider list with throwaway providers."""
    max_peers_per_response: int = 20
    """Contacts a peer may put in one response; a response with more is rejected as garbage."""
    max_addrs_per_peer: int = 8
    rate_limit_requests_per_s: float = 200.0
    """Sustained request rate allowed per sender (token bucket refill)."""
    rate_limit_burst: int = 400
    """Token bucket size per sender."""
    max_tracked_senders: int = 4096
    """Token buckets kept (least recently used ones are forgotten)."""
    bootstrap_backoff_min_s: float = 1.0
    bootstrap_backoff_max_s: float = 60.0
    address_book_size: int = 4096
    """Addresses remembered for peers outside the routing table (lookup candidates)."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "k",
            "alpha",
            "request_timeout_s",
            "failures_before_removal",
            "default_record_ttl_s",
            "default_provider_ttl_s",
            "max_record_ttl_s",
            "max_clock_skew_s",
            "republish_interval_s",
            "refresh_interval_s",
            "expiry_sweep_interval_s",
            "get_quorum",
            "max_key_bytes",
            "max_value_bytes",
            "max_records_per_sender",
            "max_records_total",
            "max_providers_per_key",
            "max_providers_per_sender_per_key",
            "max_peers_per_response",
            "max_addrs_per_peer",
            "rate_limit_requests_per_s",
            "rate_limit_burst",
            "max_tracked_senders",
            "bootstrap_backoff_min_s",
            "bootstrap_backoff_max_s",
            "address_book_size",
        )
        require(self.alpha <= self.k, f"DHTConfig.alpha ({self.alpha}) must be <= k ({self.k})")
        require(
            self.default_record_ttl_s <= self.max_record_ttl_s
            and self.default_provider_ttl_s <= self.max_record_ttl_s,
            "DHTConfig default TTLs must be <= max_record_ttl_s",
        )
        require(
            self.bootstrap_backoff_min_s <= self.bootstrap_backoff_max_s,
            "DHTConfig.bootstrap_backoff_min_s must be <= bootstrap_backoff_max_s",
        )
        require(
            self.max_key_bytes <= HARD_MAX_KEY_BYTES,
            f"DHTConfig.max_key_bytes must be <= {HARD_MAX_KEY_BYTES} (protocol limit)",
        )
        require(
            self.max_value_bytes <= HARD_MAX_VALUE_BYTES,
            f"DHTConfig.max_value_bytes must be <= {HARD_MAX_VALUE_BYTES} (protocol limit)",
        )
        require(
            self.max_peers_per_response <= HARD_MAX_CONTACTS,
            f"DHTConfig.max_peers_per_response must be <= {HARD_MAX_CONTACTS} (protocol limit)",
        )
        require(
            self.k <= self.max_peers_per_response,
            "DHTConfig.k must be <= max_peers_per_response (we answer with k contacts)",
        )
        require(
            self.max_addrs_per_peer <= HARD_MAX_ADDRS,
            f"DHTConfig.max_addrs_per_peer must be <= {HARD_MAX_ADDRS} (protocol limit)",
        )
        require(
            self.max_providers_per_key <= HARD_MAX_PROVIDERS,
            f"DHTConfig.max_providers_per_key must be <= {HARD_MAX_PROVIDERS} (protocol limit)",
        )
        require(
            self.max_records_per_sender <= self.max_records_total,
            "DHTConfig.max_records_per_sender must be <= max_records_total",
        )
        require(
            self.max_providers_per_sender_per_key <= self.max_providers_per_key,
            "DHTConfig.max_providers_per_sender_per_key must be <= max_providers_per_key",
        )

    @classmethod
    def local(cls) -> DHTConfig:
        """Peers on one host: fast timeouts, short timers."""
        return cls(
            request_timeout_s=0.5,
            republish_interval_s=60.0,
            refresh_interval_s=60.0,
            bootstrap_backoff_min_s=0.2,
            bootstrap_backoff_max_s=5.0,
        )

    @classmethod
    def lan(cls) -> DHTConfig:
        """A data-centre or campus network (the defaults)."""
        return cls()

    @classmethod
    def wan(cls) -> DHTConfig:
        """Peers across regions: patient timeouts, hourly republish (as Kademlia proposes)."""
        return cls(
            request_timeout_s=5.0,
            republish_interval_s=3600.0,
            refresh_interval_s=1800.0,
            bootstrap_backoff_min_s=2.0,
            bootstrap_backoff_max_s=300.0,
        )
