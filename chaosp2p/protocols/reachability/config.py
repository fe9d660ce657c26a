"""Limits and timing of dial-back reachability checks, for both roles.

A server spends a TCP connect and a handshake per address it dials for someone else, so it answers
few requests per requester and runs few dial-backs at once; a requester asks a handful of peers
and re-checks rarely. One answer alone decides only where the profile says so (``local``): on a
real network one peer could lie, so ``lan``/``wan`` want two agreeing answers (or every peer asked,
when fewer were there to ask).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaosp2p.configbase import require, require_positive


@dataclass(frozen=True, slots=True, kw_only=True)
class ReachabilityConfig:
    """How this peer checks its own reachability and dials others back (``[reachability]``)."""

    serve: bool = True
    """Dial other peers back when they ask. ``False``: answer ``DISABLED``."""
    probe: bool = True
    """Check this peer's own reachability in the background."""
    probe_peers: int = 3
    """Peers asked per check (connected peers that speak the protocol)."""
    min_confirmations: int = 2
    """Agreeing answers needed to call this peer public or private (fewer if fewer peers were asked)."""
    first_probe_delay_s: float = 2.0
    """Wait after start before the first check (the bootstrap connections come first)."""
    probe_interval_s: float = 300.0
    """Time between checks once one got answers."""
    retry_interval_s: float = 10.0
    """Time before the next check when the last one had nobody to ask or no answer."""
    answer_timeout_s: float = 10.0
    """How long a requester waits for an answer (the server's dials included)."""
    dial_timeout_s: float = 5.0
    """A server's limit on one dial-back: connect and handshake."""
    max_dials_per_request: int = 2
    """Addresses a server dials for one request at most (in the order named)."""
    max_concurrent_dials: int = 4
    """Requests a server works on at once, for everyone together."""
    requests_per_peer_per_s: float = 1.0 / 30.0
    """Refill rate of each requester's token bucket."""
    request_burst: float = 3.0
    """Requests one requester may make at once."""
    max_tracked_requesters: int = 1024
    """Requesters whose rate a server remembers (idle ones are forgotten first)."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "probe_peers",
            "min_confirmations",
            "first_probe_delay_s",
            "probe_interval_s",
            "retry_interval_s",
            "answer_timeout_s",
            "dial_timeout_s",
            "max_dials_per_request",
            "max_concurrent_dials",
            "requests_per_peer_per_s",
            "max_tracked_requesters",
        )
        require(self.request_burst >= 1, "ReachabilityConfig.request_burst must be >= 1")

    @classmethod
    def local(cls) -> ReachabilityConfig:
        """One machine: every peer reaches every other, so no background checks (an explicit
        :meth:`~chaosp2p.transport.reachability.ReachabilityService.check` still works); one answer decides."""
        return cls(probe=False, min_confirmations=1, first_probe_delay_s=0.5, answer_timeout_s=5.0, dial_timeout_s=2.0)

    @classmethod
    def lan(cls) -> ReachabilityConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> ReachabilityConfig:
        """The internet: slower dials, longer answers."""
        return replace(cls(), answer_timeout_s=20.0, dial_timeout_s=10.0)
