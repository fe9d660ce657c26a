"""Limits of the circuit relay, for both roles: a relay (HOP) and a relayed target (STOP).

Conservative by default: a relay copies other peers' bytes with its own CPU and bandwidth, so it
serves few circuits, each capped in bytes and duration. The caps are large enough for what a
relay is used for here -- averaging rounds between two members whose direct link is down -- since
a circuit that ends mid-round costs that round; a circuit that reached its cap is simply replaced
by a new one for the next round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaosp2p.configbase import require_positive


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayConfig:
    """How this peer relays for others and accepts relayed connections (``[relay]`` in a profile)."""

    enabled: bool = True
    """Relay for other peers (answer HOP). ``False``: refuse every HOP with ``DISABLED``."""
    accept_relayed: bool = True
    """Accept connections through relays (answer STOP). ``False``: refuse with ``DISABLED``."""
    max_circuits: int = 16
    """Circuits this peer relays at once, for everyone together."""
    max_circuits_per_peer: int = 4
    """Circuits one peer may be an end of at this relay (as source or target), and relayed
    connections one source may hold to this peer."""
    max_circuit_bytes: int = 4 << 30
    """Bytes one circuit may carry (both directions together); then the relay closes it."""
    max_circuit_duration_s: float = 1800.0
    """Longest life of one circuit; then the relay closes it."""
    answer_timeout_s: float = 5.0
    """How long a relay waits for the target's STATUS (and a source for the relay's)."""
    window_bytes: int = 4 << 20
    """Receive window of each spliced stream (bounds the bytes a circuit holds in memory)."""
    max_reservations: int = 64
    """Peers holding a reservation at this relay at once (one slot per peer; asking again renews it)."""
    reservation_duration_s: float = 3600.0
    """Life of a reservation; the holder renews it before then."""
    require_reservation: bool = False
    """Relay only to targets holding a reservation (``NO_RESERVATION`` otherwise). Off by default:
    members relay for members (``protocols/averaging.md`` §5.2) without reserving."""
    reserve_only_when_public: bool = True
    """Grant reservations only while this peer's own reachability (dial-back) is ``public``;
    otherwise refuse ``NOT_PUBLIC``. A peer dialled by a private one may be private too (two peers
    on one LAN behind one NAT): its relay addresses would reach nobody outside. ``False`` in the
    ``local`` profile, where every peer reaches every other and no dial-back checks run."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "max_circuits",
            "max_circuits_per_peer",
            "max_circuit_bytes",
            "max_circuit_duration_s",
            "answer_timeout_s",
            "window_bytes",
            "max_reservations",
            "reservation_duration_s",
        )

    @classmethod
    def local(cls) -> RelayConfig:
        """One machine: short answer timeout; every peer can dial every other, so any peer may hold slots."""
        return cls(answer_timeout_s=2.0, reserve_only_when_public=False)

    @classmethod
    def lan(cls) -> RelayConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> RelayConfig:
        """The internet: public peers relay for others, with smaller byte caps and longer answers."""
        return replace(cls(), max_circuit_bytes=1 << 30, max_circuit_duration_s=600.0, answer_timeout_s=10.0)
