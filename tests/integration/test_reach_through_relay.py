"""Reaching a peer that cannot be dialled (issue 21): ``transport.reach`` falls back to a relay, and a
state pull from a source behind it arrives bit for bit through the relay.

S (the source) and N (the newcomer) may not dial each other (the harness's link cut: dials fail,
handshakes are refused); both are connected to R, which relays."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

from chaosp2p import PeerConfig, SnapshotStore, open_peer
from chaosp2p.api.async_peer import AsyncPeer
from chaosp2p.errors import PeerUnreachable
from chaosp2p.transport.reach import reach
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def star(
    folder: Path, monkeypatch: pytest.MonkeyPatch, s_config: Callable[[PeerConfig], PeerConfig] = lambda c: c
) -> AsyncIterator[tuple[AsyncPeer, AsyncPeer, AsyncPeer]]:
    """R, then S (its config passed through ``s_config``) and N bootstrapping from R, with S~N cut."""
    ids = [Identity.generate() for _ in range(3)]
    _, s_id, n_id = ids
    rules = [{}, {str(n_id.peer_id): LinkRule(cut=True)}, {str(s_id.peer_id): LinkRule(cut=True)}]
    async with AsyncExitStack() as stack:
        peers: list[AsyncPeer] = []
        for index, identity in enumerate(ids):
            path = folder / f"rules-{index}.json"
            write_link_rules(path, rules[index])
            monkeypatch.setenv(LINK_RULES_ENV, str(path))
            bootstrap = (str(peers[0].addrs[0]),) if peers else ()
            config = PeerConfig.local(bootstrap=bootstrap)
            config = s_config(config) if index == 1 else config
            peers.append(await stack.enter_async_context(open_peer(config, identity=identity)))
        monkeypatch.delenv(LINK_RULES_ENV)
        r, s, n = peers
        await eventually(lambda: n.host.connection(r.peer_id) is not None)
        await eventually(lambda: s.host.connection(r.peer_id) is not None)
        yield r, s, n


async def test_reach_goes_through_a_relay_when_the_direct_dial_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with star(tmp_path, monkeypatch) as (r, s, n):
        host = n.host
        connection = await reach(host, s.peer_id, s.addrs, relay_after_s=0.2)
        assert connection.relayed and connection.remote_peer == s.peer_id
        assert await reach(host, s.peer_id, s.addrs) is connection  # reused, no second circuit
        assert not (await reach(host, r.peer_id, r.addrs)).relayed  # a direct one is preferred
        stranger = Identity.generate().peer_id
        with pytest.raises(PeerUnreachable, match="no relay reached it"):
            await reach(host, stranger, [], relay_after_s=0.2)


async def test_a_state_pull_through_a_relay_is_bit_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with star(tmp_path, monkeypatch) as (r, s, n):
        rng = np.random.default_rng(21)
        arrays = {"w": rng.standard_normal(1 << 20).astype(np.float32), "b": rng.integers(0, 255, 4099, np.uint8)}
        store = SnapshotStore(s.config.transfer)
        store.publish("run", 3, arrays)
        await s.serve_state(store)
        loaded = await n.load_state("run", sources=[str(s.addrs[0])])
        for name, array in arrays.items():
            assert loaded.arrays[name].dtype == array.dtype
            assert loaded.arrays[name].tobytes() == array.tobytes()
        assert n.host.relayed_connection(s.peer_id) is not None  # it came through R
        assert r.host.relay.circuits.statistics().bytes_relayed > sum(a.nbytes for a in arrays.values())
