"""The agreed link graph of a configuration: which pairs are usable, and which members are best linked.

Pure functions of a link snapshot (``Configuration.links``), shared by the averaging plan
(:mod:`chaosp2p.protocols.averaging.link_plan`: the members of maximal degree own the shards) and by
the negotiation (a LINK_DOWN between two such members breaks the plan of the step the run is in, so
it is urgent, ``protocols/negotiation.md`` section 3d). A pair is **usable** if its entry is up or if
the snapshot has no entry for it (never reported down).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from chaosp2p.protocols.negotiation.run_configuration import LinkEntry
from chaosp2p.wire.identity import PeerID


def pair_key(a: PeerID, b: PeerID) -> bytes:
    """The snapshot's key of the pair (the smaller raw id first)."""
    return a.raw + b.raw if a.raw < b.raw else b.raw + a.raw


def link_table(links: Iterable[LinkEntry]) -> dict[bytes, LinkEntry]:
    """The snapshot by :func:`pair_key`."""
    return {pair_key(link.a, link.b): link for link in links}


def usable(table: Mapping[bytes, LinkEntry], a: PeerID, b: PeerID) -> bool:
    """Is the agreed link ``a``~``b`` usable (up, or never reported)?"""
    entry = table.get(pair_key(a, b))
    return entry is None or entry.up


def degrees(members: Sequence[PeerID], table: Mapping[bytes, LinkEntry]) -> dict[PeerID, int]:
    """Per member, how many of the other ``members`` it has a usable link to."""
    return {peer: sum(1 for other in members if other != peer and usable(table, peer, other)) for peer in members}


def link_owners(members: Sequence[PeerID], links: Iterable[LinkEntry]) -> frozenset[PeerID]:
    """The members of maximal degree: those that own a non-empty shard of a round among ``members``."""
    degree = degrees(members, link_table(links))
    top = max(degree.values(), default=0)
    return frozenset(peer for peer in members if degree[peer] == top)


def fully_linked(members: Sequence[PeerID], links: Iterable[LinkEntry]) -> bool:
    """Does some member have a usable link to every other one (a round then needs no down link)?"""
    degree = degrees(members, link_table(links))
    return any(d == len(members) - 1 for d in degree.values())


__all__ = ["degrees", "fully_linked", "link_owners", "link_table", "pair_key", "usable"]
