"""Relay addresses: ``/ip4/R/tcp/p/p2p/<relay>/p2p-circuit/p2p/<target>``.

Where a peer nobody can dial is reached: connect to the relay at its address (which must name the
relay's PeerID), then open a circuit through it to the target (``protocols/relay.md`` §6). Kept
apart from :class:`~chaosp2p.wire.multiaddr.Multiaddr`, which stays a plain TCP address (a peer of
an earlier version refuses a relay address there with a clear error instead of dialing it).
"""

from __future__ import annotations

from dataclasses import dataclass

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import MAX_MULTIADDR_CHARS, Multiaddr

CIRCUIT = "/p2p-circuit"
"""The part that separates the relay's address from the target."""


@dataclass(frozen=True, slots=True)
class CircuitAddr:
    """A target reached through a relay: the relay's address (naming the relay) and the target."""

    relay: Multiaddr
    target: PeerID

    def __post_init__(self) -> None:
        if self.relay.peer_id is None:
            raise ConfigError("a relay address must name the relay: /ip4/…/tcp/…/p2p/<relay>/p2p-circuit/…")
        if self.relay.peer_id == self.target:
            raise ConfigError("a relay address through the target itself")

    @property
    def relay_peer(self) -> PeerID:
        """The relay's PeerID."""
        assert self.relay.peer_id is not None  # checked in __post_init__
        return self.relay.peer_id

    @property
    def peer_id(self) -> PeerID:
        """The peer this address reaches (as :attr:`Multiaddr.peer_id`)."""
        return self.target

    @classmethod
    def parse(cls, text: str) -> CircuitAddr:
        """Parse ``<relay multiaddr with /p2p>/p2p-circuit/p2p/<target>``."""
        if len(text) > 2 * MAX_MULTIADDR_CHARS:
            raise ConfigError("relay address too long")
        relay_text, separator, rest = text.partition(CIRCUIT)
        parts = rest.split("/")
        if not separator or len(parts) != 3 or parts[0] != "" or parts[1] not in ("p2p", "ipfs"):
            raise ConfigError(f"invalid relay address {text!r}: expected <relay>/p2p/<id>/p2p-circuit/p2p/<id>")
        return cls(Multiaddr.parse(relay_text), PeerID.parse(parts[2]))

    def with_peer(self, peer_id: PeerID) -> CircuitAddr:
        """The same relay, towards ``peer_id``."""
        return CircuitAddr(self.relay, peer_id)

    def without_peer(self) -> CircuitAddr:
        """Itself: a relay address always names its target."""
        return self

    def __str__(self) -> str:
        return f"{self.relay}{CIRCUIT}/p2p/{self.target}"


Dialable = Multiaddr | CircuitAddr
"""An address a host can connect to: direct, or through a relay."""


def is_circuit(text: str) -> bool:
    """Whether ``text`` is a relay address rather than a plain multiaddr."""
    return CIRCUIT in text
