"""The table of reservations a relay grants (pure): who may count on circuits to it, until when.

A peer that nobody can dial (behind a NAT or a firewall) reserves a slot at a relay it is connected
to; the relay answers with the slot's lifetime and the relay addresses others dial it at
(``/ip4/R/tcp/p/p2p/R/p2p-circuit/p2p/B``). One slot per peer -- asking again renews it -- and at
most ``max_reservations`` peers at once; expired slots are dropped before a new one is refused.
With ``require_reservation`` the relay admits circuits only to targets holding a live slot.
With ``reserve_only_when_public`` (the default beyond one machine) a relay grants slots only while
its own reachability is ``public``: "a peer the reserver dialled" is not proof that others can dial
it (two private peers on one LAN dial each other), the relay's dial-back checks are.
No clock is read here: time is an argument.
"""

from __future__ import annotations

from chaosp2p.protocols.reachability.machine import Reachability
from chaosp2p.protocols.relay.circuits import Refusal
from chaosp2p.protocols.relay.config import RelayConfig
from chaosp2p.protocols.relay.messages import StatusCode
from chaosp2p.wire.identity import PeerID


class ReservationTable:
    """Reservations held at this relay (see the module docstring)."""

    def __init__(self, config: RelayConfig, *, enabled: bool) -> None:
        self.config = config
        self.enabled = enabled
        self._expires: dict[PeerID, float] = {}
        self.granted = 0
        """Reservations granted or renewed since start."""
        self.refused = 0

    def reserve(self, peer: PeerID, now: float, *, own: Reachability | None = None) -> float | Refusal:
        """Grant or renew ``peer``'s slot: its expiry time, or why not. ``own``: this relay's
        reachability (None: it runs no dial-back checks, and grants as if public)."""
        if not self.enabled:
            self.refused += 1
            return Refusal(StatusCode.DISABLED, "this peer relays for nobody")
        if self.config.reserve_only_when_public and own is not None and own is not Reachability.PUBLIC:
            self.refused += 1
            return Refusal(
                StatusCode.NOT_PUBLIC,
                f"this relay's own reachability is {own.value}, not public: its relay addresses may reach nobody",
            )
        if peer not in self._expires and len(self._expires) >= self.config.max_reservations:
            self.expire(now)
            if len(self._expires) >= self.config.max_reservations:
                self.refused += 1
                return Refusal(
                    StatusCode.RESOURCE_LIMIT, f"{self.config.max_reservations} reservations held (max_reservations)"
                )
        expires = now + self.config.reservation_duration_s
        self._expires[peer] = expires
        self.granted += 1
        return expires

    def holds(self, peer: PeerID, now: float) -> bool:
        """Whether ``peer`` holds a live slot."""
        return self._expires.get(peer, float("-inf")) > now

    def release(self, peer: PeerID) -> None:
        """Drop ``peer``'s slot (its connection to the relay closed)."""
        self._expires.pop(peer, None)

    def expire(self, now: float) -> None:
        """Drop the slots whose time is up."""
        for peer in [p for p, expires in self._expires.items() if expires <= now]:
            del self._expires[peer]

    def __len__(self) -> int:
        return len(self._expires)
