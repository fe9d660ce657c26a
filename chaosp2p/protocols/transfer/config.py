"""State-transfer configuration: chunking, pipelining, self-healing thresholds and peer limits.

One frozen dataclass serves both ends of ``/chaos/transfer/1``: the source side reads the lease and
request limits, the newcomer reads the pipelining and healing knobs, and both apply the manifest
limits (``max_*``) to anything a remote peer sent before memory is taken for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from chaosp2p.configbase import require, require_positive

HASH_ALGORITHMS = ("xxh3_128", "blake3")
"""Chunk and manifest hash algorithms a peer may name (``blake3`` needs the optional package)."""

MIN_CHUNK_BYTES = 1024
"""Smallest chunk a local snapshot is cut into (a peer's manifest may use any size >= 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferConfig:
    """How snapshots are cut, served and pulled.

    Every ``max_*`` bounds something a remote peer controls and is checked before it is used.
    """

    chunk_bytes: int = 4 << 20
    """Hash/verify/request unit of snapshots this peer builds (a pull uses the manifest's value)."""
    hash_algorithm: str = "xxh3_128"
    """Chunk and manifest hash of snapshots this peer builds: ``xxh3_128`` or ``blake3``."""
    max_inflight_chunks_per_source: int = 16
    """Most chunks outstanding on one source at once, over all its requests (bounds its receive window)."""
    max_requests_per_source: int = 8
    """Most requests outstanding on one source (the next ones wait at the source while one is sent)."""
    pipeline_target_s: float = 0.25
    """Keep about this much of a source's measured rate requested ahead (round trips, scheduling delays)."""
    max_chunks_per_request: int = 8
    """Most chunks one ``GetChunks`` asks for (a batch is one header and one contiguous payload)."""
    request_target_s: float = 0.05
    """Size each request to about this much of the source's measured rate (at least one chunk)."""
    request_timeout_s: float = 5.0
    """Wait this long for a version list or a manifest before treating the source as failed."""
    stall_timeout_s: float = 10.0
    """A source with requests outstanding that shows no progress for this long is dropped."""
    replan_factor: float = 1.5
    """Replan when a source's measured rate differs from the rate its plan assumed by this factor."""
    check_interval_s: float = 0.5
    """Least time between two re-plans on measured rates (and between periodic checks)."""
    progress_interval_s: float = 0.25
    """At most one progress event per this interval (plus one at the end)."""
    max_replans: int = 64
    """Re-plans on measured rates per transfer (failures and new sources always replan)."""
    max_chunk_retries: int = 3
    """A chunk that fails verification this many times fails the whole transfer."""
    max_manifest_entries: int = 100_000
    """Named buffers a manifest may list."""
    max_name_chars: int = 1024
    """Longest buffer name (and run id) accepted."""
    max_dims: int = 32
    """Most dimensions a buffer's shape may have."""
    max_state_bytes: int = 1 << 40
    """Largest snapshot a newcomer agrees to stage (it also checks free memory or disk first)."""
    max_staging_memory_fraction: float = 0.8
    """An in-memory staging buffer may take at most this share of the memory available right now."""
    max_chunk_bytes: int = 64 << 20
    """Largest chunk size a manifest may declare (the unit the newcomer hashes and retries)."""
    max_manifest_bytes: int = 64 << 20
    """Largest encoded manifest body (it travels as a raw payload after its header)."""
    max_request_bytes: int = 64 << 20
    """Largest byte range a source serves for one request."""
    lease_ttl_s: float = 60.0
    """A source drops a newcomer's lease after this long without a request on it."""
    max_leases: int = 64
    """Leases a source grants at once, over all newcomers (more get ``BUSY``)."""
    max_leases_per_peer: int = 4
    """Leases one newcomer may hold on a source at once."""
    max_queued_requests: int = 32
    """Requests a source reads ahead on one stream (so a newcomer can cancel those not yet started)."""
    max_shards: int = 4096
    """Passed to the shard planner."""
    per_shard_overhead_s: float = 0.0
    """Passed to the shard planner: fixed cost the planner charges per shard."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "chunk_bytes",
            "max_inflight_chunks_per_source",
            "max_requests_per_source",
            "max_chunks_per_request",
            "request_target_s",
            "pipeline_target_s",
            "request_timeout_s",
            "stall_timeout_s",
            "check_interval_s",
            "progress_interval_s",
            "max_chunk_retries",
            "max_manifest_entries",
            "max_name_chars",
            "max_dims",
            "max_state_bytes",
            "max_chunk_bytes",
            "max_manifest_bytes",
            "max_request_bytes",
            "lease_ttl_s",
            "max_leases",
            "max_leases_per_peer",
            "max_queued_requests",
            "max_shards",
            "max_staging_memory_fraction",
        )
        for name in (
            "request_timeout_s",
            "stall_timeout_s",
            "replan_factor",
            "request_target_s",
            "pipeline_target_s",
            "max_staging_memory_fraction",
            "check_interval_s",
            "progress_interval_s",
            "lease_ttl_s",
            "per_shard_overhead_s",
        ):
            value = getattr(self, name)
            require(math.isfinite(value), f"TransferConfig.{name} must be finite (got {value!r})")
        require(self.max_replans >= 0, "TransferConfig.max_replans must be >= 0")
        require(self.per_shard_overhead_s >= 0, "TransferConfig.per_shard_overhead_s must be >= 0")
        require(self.replan_factor > 1.0, "TransferConfig.replan_factor must be > 1")
        require(self.max_staging_memory_fraction <= 1.0, "TransferConfig.max_staging_memory_fraction must be <= 1")
        require(
            self.hash_algorithm in HASH_ALGORITHMS,
            f"TransferConfig.hash_algorithm must be one of {HASH_ALGORITHMS} (got {self.hash_algorithm!r})",
        )
        require(
            MIN_CHUNK_BYTES <= self.chunk_bytes <= self.max_chunk_bytes,
            f"TransferConfig.chunk_bytes must be in {MIN_CHUNK_BYTES}..max_chunk_bytes "
            f"({self.max_chunk_bytes}); got {self.chunk_bytes}",
        )
        require(
            self.max_chunk_bytes <= self.max_request_bytes,
            "TransferConfig.max_request_bytes must be >= max_chunk_bytes (a source must serve a chunk)",
        )
        require(self.max_dims <= 64, "TransferConfig.max_dims must be at most 64")
        require(
            self.max_leases_per_peer <= self.max_leases,
            "TransferConfig.max_leases_per_peer must be <= max_leases",
        )
        require(
            self.lease_ttl_s > self.request_timeout_s,
            "TransferConfig.lease_ttl_s must exceed request_timeout_s (renewals need time to arrive)",
        )

    @classmethod
    def local(cls) -> TransferConfig:
        """One machine (loopback): fast links, so failures and slow sources are judged quickly."""
        return cls(
            request_timeout_s=2.0,
            stall_timeout_s=3.0,
            check_interval_s=0.25,
            progress_interval_s=0.1,
            lease_ttl_s=30.0,
        )

    @classmethod
    def lan(cls) -> TransferConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> TransferConfig:
        """Institutions across the internet: long RTTs need deeper pipelines and patience."""
        return replace(
            cls(),
            max_inflight_chunks_per_source=32,
            request_target_s=0.25,
            pipeline_target_s=1.0,
            request_timeout_s=20.0,
            stall_timeout_s=45.0,
            check_interval_s=2.0,
            progress_interval_s=0.5,
            lease_ttl_s=300.0,
        )
