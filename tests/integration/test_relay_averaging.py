"""Averaging when no member is linked to all the others (issue 19): relayed exchanges.

Four averagers over real encrypted loopback connections, two disjoint cut links (0~1, 2~3: the
harness's link shaper holds records and refuses dials). The plan on the agreed link graph
(``protocols/averaging.md`` section 5.1) makes all four owners, so 0 and 1 (and 2 and 3) must
exchange across their cut: they go through a relay member linked to both (section 5.2). Every
member ends with the same bytes, equal to the mean; nobody is named unreachable (the cut pairs are
already agreed down, so no new LINK_DOWN).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.averaging.link_plan import link_bandwidths, link_owners, relay_routes
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry
from chaosp2p.training.averager import RoundStats
from chaosp2p.wire.identity import PeerID

from .test_averager import Member, Swarm, make_buffers, run_all, tag, weighted_mean
from .test_link_averaging import _cut, _ring, shaped_swarm

pytestmark = pytest.mark.anyio


def _down(a: PeerID, b: PeerID) -> LinkEntry:
    x, y = sorted((a, b), key=lambda p: p.raw)
    return LinkEntry(a=x, b=y, up=False)


async def _two_cuts(s: Swarm, folder: Path) -> tuple[Sequence[Member], list[LinkEntry]]:
    """Cut 0~1 and 2~3 (ring order); the members in ring order and the agreed links (both down)."""
    m = _ring(s)
    await _cut(s, folder, m[0], m[1])
    await _cut(s, folder, m[2], m[3])
    return m, [_down(m[0].peer, m[1].peer), _down(m[2].peer, m[3].peer)]


def _call(s: Swarm, member: Member, buffer: np.ndarray, links: list[LinkEntry], step: int):  # type: ignore[no-untyped-def]
    async def call() -> RoundStats:
        return await member.averager.all_reduce(
            tag(step),
            buffer,
            weight=1.0,
            max_weights=dict.fromkeys(s.peers, 100.0),
            members=s.peers,
            addrs=s.addrs,
            bandwidth=dict(link_bandwidths(s.peers, links)),
            timeout_s=20.0,
            relays=relay_routes(s.peers, links, member.peer),
        )

    return call


async def test_two_disjoint_cuts_average_through_relays_bit_identically(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    async with shaped_swarm(4, tmp_path, monkeypatch) as s:
        m, links = await _two_cuts(s, tmp_path)
        assert link_owners(s.peers, links) == frozenset(s.peers)  # nobody is linked to all others
        assert relay_routes(s.peers, links, m[0].peer) == {m[1].peer: (m[2].peer, m[3].peer)}

        for step in (1, 2):  # the second round reuses the relayed connections
            buffers = make_buffers(4, 200_000, seed=step)
            out = [b.copy() for b in buffers]
            outcomes = await run_all([_call(s, x, out[i], links, step) for i, x in enumerate(m)], bound_s=30)
            assert all(kind == "ok" for kind, _ in outcomes), outcomes
            expected = weighted_mean(buffers, [1.0] * 4)
            for buffer in out:
                np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
                assert buffer.tobytes() == out[0].tobytes()
            assert all(x.averager.unreachable(tag(step)) == frozenset() for x in m)

        # The cut pairs talk over relayed connections only; the first member in ring order linked
        # to both ends relays.
        for a, b in ((m[0], m[1]), (m[2], m[3])):
            assert a.node.host.connection(b.peer) is None or a.node.host.links.is_cut(b.peer)  # type: ignore[union-attr]
            relayed = a.node.host.relayed_connection(b.peer) or b.node.host.relayed_connection(a.peer)
            assert relayed is not None and relayed.relayed
        assert m[2].node.host.relay.circuits.statistics().opened >= 1
        assert m[0].node.host.relay.circuits.statistics().opened >= 1
        assert m[3].node.host.relay.circuits.statistics().opened == 0


def _refusing(connection_to: Any, cut: PeerID) -> Any:
    async def connect(peer: PeerID, *args: Any, **kwargs: Any) -> Any:
        if peer == cut:
            raise PeerUnreachable(f"connecting to {peer.short()}: the link is cut")
        return await connection_to(peer, *args, **kwargs)

    return connect


async def test_a_failed_relayed_exchange_names_nobody_unreachable(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The cut pairs are already agreed down: when no relay serves them (relaying off everywhere)
    # the round fails, but a failure on such a pair is no evidence about its link, so the averager
    # names nobody unreachable there -- no second LINK_DOWN, no flap counted (section 5.2).
    async with shaped_swarm(4, tmp_path, monkeypatch) as s:
        m, links = await _two_cuts(s, tmp_path)
        for member in m:
            member.node.host.relay.circuits.enabled = False
        for a, b in ((m[0], m[1]), (m[1], m[0]), (m[2], m[3]), (m[3], m[2])):
            # The direct dial fails at once (a cut link's held connection would only time out,
            # and then the round names nobody in particular either).
            monkeypatch.setattr(a.node.host, "connection_to", _refusing(a.node.host.connection_to, b.peer))
        buffers = make_buffers(4, 50_000, seed=3)
        outcomes = await run_all([_call(s, x, buffers[i], links, 1) for i, x in enumerate(m)], bound_s=40)
        assert all(kind == "error" for kind, _ in outcomes), outcomes
        for a, b in ((m[0], m[1]), (m[1], m[0]), (m[2], m[3]), (m[3], m[2])):
            assert b.peer not in a.averager.unreachable(tag(1))
