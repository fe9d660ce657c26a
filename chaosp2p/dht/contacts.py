"""Validation of peer contacts and addresses that arrive from the network.

A lookup feeds on contacts other peers hand us, so this is where garbage is stopped: a contact
must name at least one address that parses as a multiaddr we can dial, an address that names a
``/p2p/`` peer must name the contact itself, and a response may not carry more contacts than the
configured maximum. Parsing a multiaddr costs microseconds and the same addresses come back in
almost every response, so verdicts are cached (bounded).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from chaosp2p.dht.messages import Contact
from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

_INVALID = object()


class AddressValidator:
    """Decides whether an address list is acceptable for a peer; remembers parse results."""

    def __init__(self, *, max_addrs: int, cache_size: int = 8192) -> None:
        self.max_addrs = max_addrs
        self._cache_size = cache_size
        self._cache: dict[str, object] = {}

    def _parse(self, text: str) -> object:
        verdict = self._cache.get(text)
        if verdict is None:
            try:
                verdict = Multiaddr.parse(text).peer_id or False
            except (ConfigError, ValueError):
                verdict = _INVALID
            if len(self._cache) >= self._cache_size:
                self._cache.clear()  # crude but bounded; the working set refills in one lookup
            self._cache[text] = verdict
        return verdict

    def valid(self, peer: PeerID, addrs: Sequence[str], *, allow_empty: bool = False) -> bool:
        """True if ``addrs`` are all dialable multiaddrs for ``peer`` and within the count limit."""
        if len(addrs) > self.max_addrs or (not addrs and not allow_empty):
            return False
        for text in addrs:
            verdict = self._parse(text)
            if verdict is _INVALID or (verdict is not False and verdict != peer):
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
    seen: set[PeerID] = set()
    garbage = 0
    for contact in contacts:
        if contact.peer_id == own:
            continue
        if contact.peer_id in seen or not validator.valid(contact.peer_id, contact.addrs):
            garbage += 1
            continue
        seen.add(contact.peer_id)
        good.append(contact)
    return good, garbage
