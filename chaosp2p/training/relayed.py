"""Reaching an owner over the agreed link graph: directly, or through a relay (issue 19).

A round's plan (``protocols/averaging.md`` section 5.1) makes the best-linked members owners. When
no member is linked to all the others, some contributor must reach an owner across a link the
configuration agrees is down; it then goes through a relay member linked to both (section 5.2),
the first in ring order that has a connection to the owner (:mod:`chaosp2p.transport.relay`). The
relay copies ciphertext: the contribution and the result are the same bytes as over a direct
link, so the round's result is bit-identical either way.

A failure on such a pair is not evidence about the direct link -- it is already agreed down -- so
the round does not name the peer as unreachable (no second LINK_DOWN, no flap counted); the
round fails and is redone like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from chaosp2p.errors import PeerUnreachable
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

Relays = Mapping[PeerID, Sequence[PeerID]]
"""Per peer whose agreed link with this member is down, the members to relay through, in order
(:func:`~chaosp2p.protocols.averaging.link_plan.relay_routes`)."""


async def reach(host: Host, peer: PeerID, addrs: Callable[[PeerID], Sequence[Multiaddr]], relays: Relays) -> Connection:
    """A connection to ``peer`` for a round: through the relays when the agreed link is down, else
    (or when no relay reaches it) direct -- as before relays existed, so a member that declared a
    working link down still reaches the owners over it."""
    through = relays.get(peer)
    if through:
        try:
            return await host.relay.connect(peer, through)
        except PeerUnreachable as exc:
            relay_error = exc
        try:
            return await host.connection_to(peer, list(addrs(peer)))
        except PeerUnreachable as exc:
            raise PeerUnreachable(f"{relay_error}; directly: {exc}") from None
    return await host.connection_to(peer, list(addrs(peer)))


__all__ = ["Relays", "reach"]
