"""Validation of peer contacts and addresses that arrive from the network.

A lookup feeds on contacts other peers hand us, so this is where garbage is stopped: a contact
must name at least one address that parses as a multiaddr we can dial, an address that names a
``/p2p/`` peer must name the contact itself, and a response may not carry more contacts than the
configured maximum. Parsing a multiaddr costs microseconds and the same addresses come back in
almost every response, so verdicts are cached (bounded, shared: the verdict depends only on the text).

Relay addresses (where a peer nobody can dial is reached through a relay) travel apart from the
plain ones and are checked apart: at most ``min(max_addrs, 8)`` of them, each a circuit address
whose target is the peer itself. A bad one is dropped with its reason and counted; the contact
keeps its other addresses, since its direct addresses may still work.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence

from chaosp2p.dht.config import HARD_MAX_RELAY_ADDRS
from chaosp2p.dht.messages import MAX_RELAY_ADDR_CHARS, Contact
from chaosp2p.errors import ConfigError
from chaosp2p.wire.circuit_addr import CircuitAddr
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


@functools.lru_cache(maxsize=1 << 12)
def _relay_verdict(text: str) -> tuple[bytes, str]:
    """``(raw PeerID of the target, "")`` for a well-formed relay address, else ``(b"", reason)``."""
    if len(text) > MAX_RELAY_ADDR_CHARS:
        return b"", "relay address too long"
    try:
        return CircuitAddr.parse(text).target.raw, ""
    except (ConfigError, ValueError) as exc:
        return b"", f"not a relay address: {exc}"


class AddressValidator:
    """Decides whether an address list is acceptable for a peer."""

    def __init__(self, *, max_addrs: int) -> None:
        self.max_addrs = max_addrs
        self.max_relay_addrs = min(max_addrs, HARD_MAX_RELAY_ADDRS)

    def valid(self, peer: PeerID, addrs: Sequence[str], *, allow_empty: bool = False) -> bool:
        """True if ``addrs`` are all dialable multiaddrs for ``peer`` and within the count limit."""
        if len(addrs) > self.max_addrs or (not addrs and not allow_empty):
            return False
        for text in addrs:
            verdict = _verdict(text)
            if verdict is not None and (verdict is _INVALID or verdict != peer.raw):
                return False
        return True

    def relay_problem(self, peer: PeerID, relay_addrs: Sequence[str]) -> str | None:
        """Why ``relay_addrs`` are not all acceptable relay addresses of ``peer``, or ``None``."""
        if len(relay_addrs) > self.max_relay_addrs:
            return f"{len(relay_addrs)} relay addresses (max {self.max_relay_addrs})"
        for text in relay_addrs:
            problem = _relay_problem(peer, text)
            if problem is not None:
                return problem
        return None

    def usable_relay_addrs(self, peer: PeerID, relay_addrs: Sequence[str]) -> tuple[tuple[str, ...], int]:
        """The acceptable relay addresses of ``peer`` among ``relay_addrs``, and how many were dropped.

        More than the maximum drops them all: a peer holds at most two reservations, so a long
        list is not a peer's honest claim.
        """
        if len(relay_addrs) > self.max_relay_addrs:
            return (), len(relay_addrs)
        kept = tuple(text for text in relay_addrs if _relay_problem(peer, text) is None)
        return kept, len(relay_addrs) - len(kept)


def announced_relay_addrs(addrs: Sequence[CircuitAddr], most: int) -> tuple[str, ...]:
    """At most ``most`` of our relay addresses to announce, each relay's first ones first.

    Two relays listening on several addresses each can give more than a contact carries; cutting
    the list short would drop the second relay, the one that keeps us reachable when the first goes.
    """
    by_relay: dict[PeerID, list[CircuitAddr]] = {}
    for addr in addrs:
        by_relay.setdefault(addr.relay_peer, []).append(addr)
    rounds = max((len(held) for held in by_relay.values()), default=0)
    spread = [str(held[i]) for i in range(rounds) for held in by_relay.values() if i < len(held)]
    return tuple(spread[:most])


def _relay_problem(peer: PeerID, text: str) -> str | None:
    target, reason = _relay_verdict(text)
    if reason:
        return reason
    return None if target == peer.raw else "relay address reaches another peer"


def filter_contacts(
    contacts: Iterable[Contact],
    *,
    validator: AddressValidator,
    own: PeerID | None,
) -> tuple[list[Contact], int, int]:
    """Keep the acceptable contacts of a response; also return how many were garbage, and how many
    relay addresses were dropped from the contacts kept.

    Our own id is skipped silently (honest peers may not know we asked); duplicates and contacts
    with bad addresses count as garbage; bad relay addresses are dropped, the contact kept.
    """
    good: list[Contact] = []
    seen: set[bytes] = set()
    own_raw = own.raw if own is not None else b""
    garbage = 0
    dropped_relays = 0
    for contact in contacts:
        raw = contact.peer_id.raw
        if raw == own_raw:
            continue
        if raw in seen or not validator.valid(contact.peer_id, contact.addrs):
            garbage += 1
            continue
        seen.add(raw)
        if contact.relay_addrs:
            kept, dropped = validator.usable_relay_addrs(contact.peer_id, contact.relay_addrs)
            if dropped:
                dropped_relays += dropped
                contact = dataclasses.replace(contact, relay_addrs=kept)
        good.append(contact)
    return good, garbage, dropped_relays
