"""From a failed round to a first-hand LINK_DOWN (issue 19).

A round that failed because this member could not exchange with one peer -- dialling it failed,
its connection closed, or on timeout it was missing here while every other owner had its
contribution (:meth:`~chaosp2p.training.averager.Averager.unreachable`) -- names the *link*, not
the peer. The collaboration hands those peers to the run's negotiation at once
(:meth:`~chaosp2p.training.port.RunGates.link_failed`), which raises a LINK_DOWN signed by this
member (an endpoint of the link) unless membership already holds the peer failed. The next
configuration's link plan (``protocols/averaging.md`` section 5.1) gives neither end of a down link
a shard whenever some member is linked to all the others, so the round redone under it completes.
"""

from __future__ import annotations

import logging
from typing import Protocol

from chaosp2p.protocols.averaging.messages import RoundTag
from chaosp2p.training.port import RunGates
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")


class KnowsUnreachable(Protocol):
    """The averager's first-hand verdict on a finished round."""

    def unreachable(self, tag: RoundTag) -> frozenset[PeerID]:
        """The peers round ``tag`` could not exchange with, first-hand."""
        ...


def report_unreachable(runs: RunGates, averager: KnowsUnreachable, tag: RoundTag) -> list[PeerID]:
    """Declare the links to the peers ``tag``'s failed round could not reach down; those raised."""
    raised = []
    for peer in sorted(averager.unreachable(tag), key=lambda p: p.raw):
        if runs.link_failed(tag.run, peer):
            log.info("run %r: round %s could not exchange with %s: LINK_DOWN raised", tag.run, tag, peer.short())
            raised.append(peer)
    return raised


__all__ = ["KnowsUnreachable", "report_unreachable"]
