"""Cut links for :class:`~chaosp2p.sim.negotiation.NegotiationSwarm`: rounds that need a cut link
fail, and their two ends declare the link down first-hand (issue 19).

The swarm's all-reduce oracle completes step k under configuration C once every participant is in
it. With cut links it also asks :meth:`LinkCuts.blocks`: the round needs every pair (participant,
owner), where the owners are the participants of maximal degree in C's link snapshot (the plan of
``protocols/averaging.md`` section 5.1). A round that needs a cut pair does not complete; after
``round_timeout_s`` each end of that pair that is still in the step calls ``link_changed(down)`` on
its machine at once, as the collaboration does on a failed round (``protocols/negotiation.md``
section 3d). A restored link is declared up by its smaller end ``up_after_s`` later (the probes'
hysteresis, shortened), and rounds it held up are tried again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from chaosp2p.errors import LocalProtocolError
from chaosp2p.protocols.negotiation.link_graph import link_owners
from chaosp2p.protocols.negotiation.machine import NegotiationMachine
from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.sim.network import SimNetwork
from chaosp2p.wire.identity import PeerID


class NegotiationSwarm(Protocol):
    """What this module uses of :class:`chaosp2p.sim.negotiation.NegotiationSwarm` (no import cycle)."""

    peers: dict[PeerID, Any]
    net: SimNetwork
    _oracle: Any
    _oracle_id: PeerID

    def call(self, peer: PeerID, action: Callable[[NegotiationMachine, float], Any]) -> Any:
        """Run ``action(machine, now)`` on a peer."""
        ...

    def _maybe_complete(self, config: Configuration, k: int) -> None: ...


class LinkCuts:
    """The links cut in a simulated swarm, and what rounds do about them."""

    def __init__(self, swarm: NegotiationSwarm, *, round_timeout_s: float = 0.1, up_after_s: float = 0.2) -> None:
        self._swarm = swarm
        self.round_timeout_s = round_timeout_s
        self.up_after_s = up_after_s
        self.cut: set[frozenset[PeerID]] = set()
        self._held: dict[tuple[int, bytes], Configuration] = {}
        self.declared: list[tuple[float, PeerID, PeerID, bool]] = []
        """Every first-hand link event raised: (time, by, other, up)."""

    def cut_link(self, a: PeerID, b: PeerID) -> None:
        """Cut the link a~b (both directions) until :meth:`restore`."""
        if a != b:
            self.cut.add(frozenset((a, b)))

    def restore(self, a: PeerID, b: PeerID) -> None:
        """Restore a~b; its smaller end declares it up ``up_after_s`` later if it is still up."""
        pair = frozenset((a, b))
        if pair not in self.cut:
            return
        self.cut.discard(pair)
        low, high = sorted(pair, key=lambda p: p.raw)

        def declare_up(now: float) -> None:
            if pair not in self.cut:
                self._declare(low, high, up=True)

        self._at(self.up_after_s, declare_up)
        for key, config in list(self._held.items()):
            if not self.needed(config, key[0]):
                del self._held[key]
                self._swarm._maybe_complete(config, key[0])

    def restore_all(self) -> None:
        """Restore every cut link."""
        for pair in list(self.cut):
            self.restore(*pair)

    def needed(self, config: Configuration, k: int) -> list[frozenset[PeerID]]:
        """The cut pairs a round of step ``k`` under ``config`` would need."""
        if not self.cut:
            return []
        members = config.participants(k)
        owners = link_owners(members, config.links)
        present = set(members)
        return [pair for pair in self.cut if pair <= present and pair & owners]

    def blocks(self, config: Configuration, k: int) -> bool:
        """Does a cut link hold up step ``k`` under ``config``? (Then its ends declare it down.)"""
        pairs = self.needed(config, k)
        if not pairs:
            return False
        key = (k, config.digest)
        if key not in self._held:
            self._held[key] = config
            self._at(self.round_timeout_s, lambda now: self._round_failed(config, k))
        return True

    def _round_failed(self, config: Configuration, k: int) -> None:
        key = (k, config.digest)
        if not any(r.running and r.trainer.in_step == key for r in self._swarm.peers.values()):
            self._held.pop(key, None)  # everyone moved on (a new configuration governs k)
            return
        for pair in self.needed(config, k):
            a, b = sorted(pair, key=lambda p: p.raw)
            for me, other in ((a, b), (b, a)):
                record = self._swarm.peers.get(me)
                if record is not None and record.running and record.trainer.in_step == (k, config.digest):
                    self._declare(me, other, up=False)

    def _declare(self, me: PeerID, other: PeerID, *, up: bool) -> None:
        record = self._swarm.peers.get(me)
        if record is None or not record.running:
            return
        self.declared.append((self._swarm.net.now, me, other, up))
        try:
            self._swarm.call(me, lambda m, now: m.link_changed(now, me, other, up=up))
        except LocalProtocolError:
            pass  # not a member (any more) in its own view

    def _at(self, delay_s: float, action: Callable[[float], None]) -> None:
        swarm = self._swarm
        swarm._oracle.at(swarm.net.now + delay_s, action)
        swarm.net.poke(swarm._oracle_id)


__all__ = ["LinkCuts"]
