"""Which members own shards, from the agreed link graph (pure, no I/O).

Theory of operation
-------------------
The butterfly (:mod:`.plan`) needs a direct link between every contributor and every owner of a
non-empty shard, and nothing between two members that own nothing: a member that owns an empty
shard exchanges with nobody as an owner (``protocols/averaging.md`` section 4.1). So one cut link
a~b stops every round if both ``a`` and ``b`` own something, and stops none if at most one of them
does. The agreed configuration carries a link snapshot (up/down and the measured bandwidth of each
pair, ``protocols/negotiation.md``); every member holds it bit for bit, so the choice below is the
same everywhere.

Rule (section 5.1 of the spec): a member's **degree** is the number of other participants it has a
usable agreed link to (an entry that is up, or no entry at all: a pair never reported down is
assumed usable, as before this rule existed). The **owners** are the participants of maximal
degree; every other participant owns an empty shard. When some participant is linked to all the
others (the usual case: no link down, or a few down links among members that still have a common
neighbour), the owners are exactly the participants linked to all others, so every exchange the
round needs runs over an up link and the round completes. When no participant is linked to all the
others (two disjoint cuts among four members, say), the round still needs a pair whose link is
down: that pair exchanges through a **relay** (spec section 5.2), a member with a usable agreed link
to both ends, the first such in ring order (:func:`relays_for`; the others follow as fallbacks).
The owners' arithmetic does not change: a relayed contribution is the same bytes, so results stay
bit-identical on every member.

Why maximal degree rather than "linked to all": it needs no special case for the fallback, and it
bounds what a member that declares its own links down can do. A member that declares *every* one
of its links down (lying or not) has degree 0 and simply owns nothing; the others keep the maximal
degree ``n - 2`` and own everything, and the liar still has to contribute to them (over the links
it claims are down: if they really are, it cannot take part and membership fails it). A member can
only declare links it is an endpoint of (the negotiation refuses any other, ``forged_origin``), so
it cannot take a shard away from two honest members that are linked to each other.

Shards are sized by bandwidth among the owners: an owner's figure is the median bandwidth of its
usable links to other participants with a known bandwidth; an owner with none known gets the mean
of the owners' known figures (1.0 if none is known), so unknown bandwidth means an equal share.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from chaosp2p.protocols.averaging.plan import DEFAULT_ALIGN_ELEMENTS, ReducePlan, plan_shards
from chaosp2p.protocols.negotiation.link_graph import fully_linked, link_owners, link_table, pair_key, usable
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry
from chaosp2p.wire.identity import PeerID


def link_bandwidths(members: Sequence[PeerID], links: Iterable[LinkEntry]) -> dict[PeerID, float]:
    """The bandwidth figure of every participant for :func:`~.plan.plan_shards`: 0.0 for a non-owner.

    Every member computes the same figures from the same (members, links): floats combined in the
    same order.
    """
    table = link_table(links)
    owners = link_owners(members, table.values())
    known: dict[PeerID, float] = {}
    for peer in members:
        if peer not in owners:
            continue
        figures = [
            e.bandwidth_bytes_per_s
            for other in members
            if other != peer
            and (e := table.get(pair_key(peer, other))) is not None
            and e.up
            and e.bandwidth_bytes_per_s > 0
        ]
        if figures:
            known[peer] = float(statistics.median(figures))
    default = sum(known[p] for p in members if p in known) / len(known) if known else 1.0
    return {peer: (known.get(peer, default) if peer in owners else 0.0) for peer in members}


def plan_on_links(
    members: Sequence[PeerID],
    length: int,
    links: Iterable[LinkEntry],
    *,
    align_elements: int = DEFAULT_ALIGN_ELEMENTS,
) -> ReducePlan:
    """The reduce plan of a round among ``members`` (ring order) under the agreed ``links``."""
    return plan_shards(members, length, link_bandwidths(members, list(links)), align_elements=align_elements)


def relays_for(members: Sequence[PeerID], links: Iterable[LinkEntry], a: PeerID, b: PeerID) -> tuple[PeerID, ...]:
    """The members that may relay between ``a`` and ``b``: usable agreed links to both, in ring order.

    Every member computes the same list from the same (members, links), and so do ``a`` and ``b``.
    """
    table = link_table(links)
    return tuple(peer for peer in members if peer not in (a, b) and usable(table, peer, a) and usable(table, peer, b))


def relay_routes(members: Sequence[PeerID], links: Iterable[LinkEntry], me: PeerID) -> dict[PeerID, tuple[PeerID, ...]]:
    """For every other member whose agreed link with ``me`` is down: the relays to reach it through."""
    entries = list(links)
    table = link_table(entries)
    return {
        peer: relays_for(members, entries, me, peer) for peer in members if peer != me and not usable(table, me, peer)
    }


__all__ = ["fully_linked", "link_bandwidths", "link_owners", "plan_on_links", "relay_routes", "relays_for"]
