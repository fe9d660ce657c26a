"""Limits and timing of hole punching.

A punch costs a responder a few SYNs to addresses the other peer named, so a responder takes part
in few punches per peer and few at once, and dials few addresses per punch; a punch that does not
connect within ``connect_timeout_s`` gives up (the relayed connection stays). A peer whose NAT
changes source ports, by its observers' evidence, does not try at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaosp2p.configbase import require, require_positive


@dataclass(frozen=True, slots=True, kw_only=True)
class HolePunchConfig:
    """How this peer punches holes (``[holepunch]`` in a profile)."""

    enabled: bool = True
    """Take part when a peer asks. ``False``: answer ``REFUSED``."""
    auto_upgrade: bool = True
    """Punch at once when this peer opens a relayed connection (as a node does); ``False``: only
    when asked (``await node.holepunch.punch(peer)``)."""
    max_dial_addrs: int = 4
    """Candidate addresses of the other side dialed per punch (in the order it named them)."""
    answer_timeout_s: float = 5.0
    """Wait for each coordination message over the relayed connection."""
    connect_timeout_s: float = 5.0
    """Wait for the simultaneous open itself (covers one SYN retransmission, sent after 1 s)."""
    punches_per_peer_per_s: float = 1.0 / 30.0
    """Refill rate of each peer's token bucket for punches it asks us for."""
    punch_burst: float = 3.0
    """Punches one peer may ask for at once."""
    max_concurrent: int = 4
    """Punches this peer answers at once, for everyone together."""
    max_tracked_peers: int = 1024
    """Peers whose rate is remembered (idle ones are forgotten first)."""
    min_mapping_observers: int = 2
    """Distinct peers (a majority of those reporting) that must have seen our dialled connections
    come from changed source ports before this peer declines punches at once as behind a symmetric
    NAT, instead of trying and waiting out ``connect_timeout_s``."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "max_dial_addrs",
            "answer_timeout_s",
            "connect_timeout_s",
            "punches_per_peer_per_s",
            "max_concurrent",
            "max_tracked_peers",
            "min_mapping_observers",
        )
        require(self.punch_burst >= 1, "HolePunchConfig.punch_burst must be >= 1")

    @classmethod
    def local(cls) -> HolePunchConfig:
        """One machine: short waits."""
        return cls(answer_timeout_s=2.0, connect_timeout_s=2.0)

    @classmethod
    def lan(cls) -> HolePunchConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> HolePunchConfig:
        """The internet: longer waits (the coordination crosses a relay twice)."""
        return replace(cls(), answer_timeout_s=10.0, connect_timeout_s=8.0)
