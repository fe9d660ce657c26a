"""State transfer between in-process peers over real loopback connections."""

from __future__ import annotations

import numpy as np
import pytest

from chaosp2p import PeerConfig, SnapshotStore, open_peer

from ..conditions import eventually

pytestmark = pytest.mark.anyio


async def test_repeated_pulls_release_their_leases_at_the_source() -> None:
    async with open_peer(PeerConfig.local()) as source, open_peer(PeerConfig.local()) as newcomer:
        store = SnapshotStore(source.config.transfer)
        store.publish("run", 1, {"w": np.arange(1 << 20, dtype=np.float32)})
        await source.serve_state(store)
        for _ in range(8):  # more pulls than the per-peer lease limit
            loaded = await newcomer.load_state("run", sources=[str(source.addrs[0])])
            assert np.array_equal(loaded.arrays["w"], np.arange(1 << 20, dtype=np.float32))
        session = source.state.server.session
        assert session is not None
        await eventually(lambda: session.statistics().leases_active == 0)
        assert session.statistics().leases_granted == 8
