"""Reservations a private peer holds at relays, and the relay addresses they give it (issue 21).

A peer nobody can dial (reachability ``private``, ``protocols/reachability.md``) is reached through
a relay. It reserves a slot (``protocols/relay.md`` §6) at up to ``max_relays`` peers it dialled
itself -- a peer we reached by dialing is one others can dial too, unlike one that dialled us --
and that speak the relay protocol. Each answer's relay addresses are what the node announces for
others to dial it. A slot is renewed when ``renew_fraction`` of its life has passed and dropped
when the connection to its relay closes (the relay forgets it then too); a refused or failed
reservation leaves that relay alone for ``retry_after_s``.

:func:`~chaosp2p.protocols.relay.holding.plan` decides (pure); :class:`RelayReservations` carries it out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError
from chaosp2p.protocols.relay import PROTOCOL
from chaosp2p.protocols.relay.holding import Held, ReservationConfig, circuit_addrs, plan
from chaosp2p.transport.host import Host
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.transport")


@dataclass
class RelayReservations:
    """Carries out :func:`plan` against a host (see the module docstring). The node makes one."""

    host: Host
    clock: Clock
    config: ReservationConfig
    is_private: Callable[[], bool]
    """This peer's reachability is private (the node reads its reachability service)."""
    held: dict[PeerID, Held] = field(default_factory=dict)
    backoff: dict[PeerID, float] = field(default_factory=dict)
    changed: list[Callable[[tuple[CircuitAddr, ...]], None]] = field(default_factory=list)
    """Called with :attr:`addrs` whenever they change (the node announces them)."""

    @property
    def addrs(self) -> tuple[CircuitAddr, ...]:
        """The relay addresses of every slot held, relays in PeerID order."""
        return tuple(a for relay in sorted(self.held, key=lambda p: p.raw) for a in self.held[relay].addrs)

    def candidates(self) -> list[PeerID]:
        """Relays we could reserve at: peers we dialled that speak the relay protocol, in PeerID order."""
        found = []
        for peer in self.host.connected_peers():
            connection = self.host.connection(peer)
            if connection is not None and connection.is_dialer and connection.supports(PROTOCOL):
                found.append(peer)
        return sorted(found, key=lambda p: p.raw)

    async def run(self) -> None:
        """Step every ``check_interval_s`` until cancelled."""
        while True:
            await self.step()
            await anyio.sleep(self.config.check_interval_s)

    async def step(self) -> None:
        """One look: reserve, renew and drop as :func:`plan` says."""
        private = self.config.assume_private or self.is_private()
        if not private and not self.held:
            return  # the common case of a public peer: nothing to look at
        before = self.addrs
        now = self.clock.now()
        todo = plan(
            now,
            private=private,
            candidates=self.candidates(),
            held=self.held,
            backoff=self.backoff,
            config=self.config,
        )
        for relay in todo.drop:
            self.held.pop(relay, None)
        for relay in todo.reserve:
            try:
                answer = await self.host.relay.reserve(relay)
            except ChaosError as exc:
                log.debug("reservation at %s failed: %s", relay.short(), exc)
                self.held.pop(relay, None)
                self.backoff[relay] = self.clock.now() + self.config.retry_after_s
                continue
            granted = self.clock.now()
            addrs = circuit_addrs(relay, self.host.peer_id, answer)
            self.held[relay] = Held(granted_at=granted, expires_at=granted + answer.ttl_s, addrs=addrs)
        if self.addrs != before:
            log.info("relay addresses now %s", [str(a) for a in self.addrs])
            for callback in list(self.changed):
                callback(self.addrs)


__all__ = ["RelayReservations"]
