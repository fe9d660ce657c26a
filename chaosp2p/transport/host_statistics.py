"""Counters of a :class:`~chaosp2p.transport.host.Host` (admission, handshakes, refusals)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostStatistics:
    """Counters of a host."""

    connections: int
    pending_handshakes: int
    handshakes_failed: int
    handshakes_timed_out: int
    connections_refused_at_capacity: int
    protocol_errors: int
    handshakes_replayed: int
    """Inbound first handshake messages refused as replayed or stale (under a swarm key only)."""
    connections_refused_per_peer: int
    """Inbound connections closed after the handshake: their identity held ``max_connections_per_peer``."""
    handshakes_evicted: int = 0
    """Pending inbound handshakes closed to make room for a newer connection."""
    handshakes_completed: int = 0
    """Inbound handshakes that completed."""
