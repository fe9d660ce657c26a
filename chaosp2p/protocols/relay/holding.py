"""Which relay slots a private peer holds (pure): its config, and the plan of each step.

A peer nobody can dial (reachability ``private``, ``protocols/reachability.md``) reserves a slot
(``protocols/relay.md`` §6) at up to ``max_relays`` relays, renews each once ``renew_fraction`` of
its life has passed, forgets one whose relay went away or whose time is up, and leaves a relay that
refused alone for ``retry_after_s``. The driver is ``chaosp2p.transport.relay_reservations``. No
clock is read here: time is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from chaosp2p.configbase import require, require_positive
from chaosp2p.errors import ConfigError
from chaosp2p.protocols.relay.messages import MAX_RESERVATION_ADDRS, Reservation
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationConfig:
    """When and where a private peer reserves relay slots (``[reservations]`` in a profile)."""

    enabled: bool = True
    """Reserve slots while this peer's reachability is private. ``False``: never."""
    max_relays: int = 2
    """Relays to hold a slot at, at once."""
    check_interval_s: float = 5.0
    """How often the driver looks at reachability, connections and expiries."""
    renew_fraction: float = 0.5
    """Renew a slot once this fraction of its life has passed."""
    retry_after_s: float = 30.0
    """How long a relay that refused (or failed) is left alone."""
    assume_private: bool = False
    """Act as if reachability were private whatever dial-back says (for tests and for a peer its
    operator knows to be behind NAT)."""

    def __post_init__(self) -> None:
        require_positive(self, "max_relays", "check_interval_s", "retry_after_s")
        require(0.0 < self.renew_fraction < 1.0, "ReservationConfig.renew_fraction must be in (0, 1)")

    @classmethod
    def local(cls) -> ReservationConfig:
        """One machine: look often."""
        return cls(check_interval_s=0.5, retry_after_s=2.0)

    @classmethod
    def lan(cls) -> ReservationConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> ReservationConfig:
        """The internet: look less often."""
        return replace(cls(), check_interval_s=15.0, retry_after_s=60.0)


@dataclass(frozen=True, slots=True)
class Held:
    """One slot held at a relay: when it was granted, when it expires, the addresses it gave."""

    granted_at: float
    expires_at: float
    addrs: tuple[CircuitAddr, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do now: relays to reserve (or renew) at, slots to forget."""

    reserve: tuple[PeerID, ...] = ()
    drop: tuple[PeerID, ...] = ()


def plan(
    now: float,
    *,
    private: bool,
    candidates: Sequence[PeerID],
    held: dict[PeerID, Held],
    backoff: dict[PeerID, float],
    config: ReservationConfig,
) -> Plan:
    """The step from ``held`` given reachability and the relays we could use (``candidates``, in
    preference order: connected, dialled by us, speaking the relay protocol)."""
    if not private or not config.enabled:
        return Plan(drop=tuple(held))
    usable = set(candidates)
    drop = tuple(r for r, h in held.items() if r not in usable or h.expires_at <= now)
    keep = [r for r in held if r not in drop]
    renew = [
        r for r in keep if now >= held[r].granted_at + config.renew_fraction * (held[r].expires_at - held[r].granted_at)
    ]
    fresh = [r for r in candidates if r not in held and backoff.get(r, float("-inf")) <= now]
    return Plan(reserve=(*renew, *fresh[: max(0, config.max_relays - len(keep))]), drop=drop)


def circuit_addrs(relay: PeerID, me: PeerID, reservation: Reservation) -> tuple[CircuitAddr, ...]:
    """The relay addresses of a RESERVATION answer that name ``relay`` and ``me`` (others are ignored:
    the relay's answer is untrusted input), at most ``MAX_RESERVATION_ADDRS``."""
    good: list[CircuitAddr] = []
    for text in reservation.addrs[:MAX_RESERVATION_ADDRS]:
        try:
            addr = CircuitAddr.parse(text)
        except (ConfigError, ValueError):
            continue
        if addr.relay_peer == relay and addr.target == me:
            good.append(addr)
    return tuple(good)


__all__ = ["Held", "Plan", "ReservationConfig", "circuit_addrs", "plan"]
