"""The DHT over real loopback connections between in-process peers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from chaosp2p import PeerConfig, open_peer
from chaosp2p.api.async_peer import AsyncPeer
from chaosp2p.dht import DHT_CODEC, make_record, signed_key
from chaosp2p.dht.messages import Store
from chaosp2p.errors import ConfigError

from ..conditions import eventually

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def small_swarm(count: int) -> AsyncIterator[list[AsyncPeer]]:
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_peer(PeerConfig.local()))
        peers = [first]
        for _ in range(count - 1):
            config = PeerConfig.local(bootstrap=(str(first.addrs[0]),))
            peers.append(await stack.enter_async_context(open_peer(config)))
        with anyio.fail_after(10):
            await first.wait_connected(count - 1)
            for peer in peers:
                await eventually(lambda peer=peer: len(peer.dht.machine.routing_table) >= 1)
        yield peers


async def test_store_on_one_peer_get_on_another() -> None:
    async with small_swarm(6) as peers:
        with anyio.fail_after(10):
            result = await peers[2].dht.store("run/alpha/config", b"lr=0.1")
            assert result.ok and result.accepted >= 1
            assert await peers[5].dht.get("run/alpha/config") == b"lr=0.1"
            assert await peers[4].dht.get("never/stored") is None


async def test_signed_records_cannot_be_overwritten_by_others() -> None:
    async with small_swarm(5) as peers:
        owner, intruder, reader = peers[1], peers[3], peers[4]
        key = signed_key(owner.peer_id, b"checkpoint")
        with anyio.fail_after(10):
            assert (await owner.dht.store_signed("checkpoint", b"step-100")).ok
            with pytest.raises(ConfigError, match="another peer's /pk/ namespace"):
                await intruder.dht.store(key, b"step-999")
            # A hostile peer bypasses its own checks and sends forged STOREs over the wire.
            forged = [
                make_record(key, b"step-999", version=10**6, ttl_ms=60_000, identity=intruder.host.identity),
                make_record(key, b"step-999", version=10**6, ttl_ms=60_000),
            ]
            for target in peers:
                if target is intruder:
                    continue
                connection = await intruder.host.connection_to(target.peer_id, target.addrs)
                for index, record in enumerate(forged):
                    store = Store(request_id=9000 + index, sender_addrs=(), record=record)
                    await connection.send_message("dht", DHT_CODEC.encode(store))
            await eventually(
                lambda: sum(p.dht.statistics().rejected_bad_signature for p in peers) >= 2 * (len(peers) - 1)
            )
            assert await reader.dht.get_signed(owner.peer_id, "checkpoint") == b"step-100"
            assert (await owner.dht.store_signed("checkpoint", b"step-200")).ok
            assert await reader.dht.get_signed(owner.peer_id, "checkpoint") == b"step-200"


async def test_provider_records_and_find_peer() -> None:
    async with small_swarm(5) as peers:
        with anyio.fail_after(10):
            assert (await peers[0].dht.add_provider("state/run-a/v7")).ok
            assert (await peers[2].dht.add_provider("state/run-a/v7")).ok
            providers = await peers[4].dht.get_providers("state/run-a/v7")
            assert {p.provider for p in providers} == {peers[0].peer_id, peers[2].peer_id}
            found = await peers[3].dht.find_peer(peers[1].peer_id)
            assert found.ok and found.contact is not None
            assert found.contact.addrs == tuple(str(a.without_peer()) for a in peers[1].addrs)
