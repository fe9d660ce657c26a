"""Per-peer tables of a running node stay bounded however many identities it hears of (issue 10)."""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.runtime.config import PeerConfig
from chaosp2p.runtime.node import open_node
from chaosp2p.transport.config import TransportConfig
from chaosp2p.wire.identity import Identity

pytestmark = pytest.mark.anyio


async def test_the_bandwidth_table_forgets_the_least_recent_peers() -> None:
    transport = dataclasses.replace(TransportConfig.local(), max_tracked_peers=4)
    async with open_node(PeerConfig.local(transport=transport)) as node:
        peers = [Identity.generate().peer_id for _ in range(10)]
        for n, peer in enumerate(peers):
            node.record_transfer(peer, 1000 * (n + 1), 1.0)
        assert [node.link_estimate(p)[0] for p in peers[-4:]] == [7000.0, 8000.0, 9000.0, 10000.0]
        assert all(node.link_estimate(p)[0] is None for p in peers[:6])
