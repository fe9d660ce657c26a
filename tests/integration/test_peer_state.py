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


async def test_a_load_reports_where_its_time_went_and_how_each_source_did() -> None:
    # Issue 24: `seconds` alone mixed discovery, the version vote and the data phase; a slow pull
    # is explained by comparing its plans and each source's measured rate with a fast one's.
    async with open_peer(PeerConfig.local()) as source, open_peer(PeerConfig.local()) as newcomer:
        store = SnapshotStore(source.config.transfer)
        store.publish("run", 1, {"w": np.arange(4 << 20, dtype=np.float32)})
        await source.serve_state(store)
        loaded = await newcomer.load_state("run", sources=[str(source.addrs[0])])
        timings = loaded.timings
        assert timings.data_s == loaded.completed.elapsed_s > 0
        assert 0 < timings.verify_s <= timings.data_s
        assert timings.discovery_s > 0 and timings.setup_s > 0 and timings.commit_s >= 0
        (first, *_) = loaded.result.plans
        plan = first.plan
        assert plan.reason.value == "initial" and 0 <= first.at_s < timings.data_s
        assert sum(n for _, n in plan.shares) == plan.chunks
        assert [peer for peer, _ in plan.rates] == [source.peer_id] and plan.rates[0][1] > 0
        assert [peer for peer, _ in loaded.result.source_rates] == [source.peer_id]
        assert loaded.result.source_rates[0][1] > 0
