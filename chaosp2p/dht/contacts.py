"""Validation of peer contacts and addresses that arrive from the network.

A lookup feeds on contacts other peers hand us, so this is where garbage is stopped: a contact
must name at least one address that parses as a multiaddr we can dial, an address that names a
``/p2p/`` peer must name the contact itself, and a response may not carry more contacts than the
configured maximum. Parsing a multiaddr costs microseconds and the same addresses come back in
almost every response, so verdicts are cached (bounded, shared: the verdict depends only on the text).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from chaosp2p.dht.messages import Contact
from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

_INVALID = b"!"


@functools.lru_cache(maxsize=1 << 14)
def _verdict(text: str) -> bytes | None:
    """``None``: a valid address naming no peer; the raw PeerID it names; or ``_INVALID``.

    A pure function of the text, so one bounded cache serves every machine in a process (a
    simulation runs hundreds of machines that all see the same addresses).
    """
    try:
        named = Multiaddr.parse(text).peer_id
    except (ConfigError, ValueError):
        return _INVALID
    return named.raw if named is not None else None


class AddressValidator:
    """Decides whether an address list is acceptable for a peer."""

    def __init__(self, *, max_addrs: int) -> None:
        self.max_addrs = max_addrs

    def valid(self, peer: PeerID, addrs: Sequence[str], *, allow_empty: bool = False) -> bool:
        """True if ``addrs`` are all dialable multiaddrs for ``peer`` and within the count limit."""
        if len(addrs) > self.max_addrs or (not addrs and not allow_empty):
            return False
        for text in addrs:
            verdict = _verdict(text)
            if verdict is not None and (verdict is _INVALID or verdict != peer.raw):
                return False
        return True


def filter_contacts(
    contacts: Iterable[Contact],
    *,
    validator: AddressValidator,
    own: PeerID | None,
) -> tuple[list[Contact], int]:
    """Keep the acceptable contacts of a response; also return how many were garbage.

    Our own id is skipped silently (honest peers may not know we asked); duplicates and contacts
    with bad addresses count as garbage.
    """
    good: list[Contact] = []
    seen: set[bytes] = set()
    own_raw = own.raw if own is not None else b""
    garbage = 0
    for contact in contacts:
        raw = contact.peer_id.raw
        if raw == own_raw:
            continue
        if raw in seen or not validator.valid(contact.peer_id, contact.addrs):
            garbage += 1
            continue
        seen.add(raw)
        good.append(contact)
    return good, garbage
