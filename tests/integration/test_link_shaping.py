"""Per-link shaping in the transport (the cluster harness's network emulation), over real loopback
sockets in one process: delay, a cut that holds records and refuses new connections, restore."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from chaosp2p.errors import PeerUnreachable, RequestTimeout
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import open_host
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(
    handshake_timeout_s=2.0,
    connect_timeout_s=1.0,
    request_timeout_s=10.0,
    keepalive_interval_s=1.0,
    dead_connection_timeout_s=30.0,
    max_record_bytes=64 * 1024,
)


async def echo(connection: Connection, request: Any) -> Any:
    return request


def rewrite(path: Path, rules: dict[str, LinkRule], generation: int) -> None:
    write_link_rules(path, rules)
    os.utime(path, ns=(generation, generation))  # a fresh mtime even on coarse file-system clocks


async def test_delay_cut_and_restore_between_two_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server_rules, client_rules = tmp_path / "server.json", tmp_path / "client.json"
    server_id, client_id = Identity.generate(), Identity.generate()
    server_peer, client_peer = str(server_id.peer_id), str(client_id.peer_id)
    rewrite(server_rules, {client_peer: LinkRule(delay_s=0.1)}, 1)
    rewrite(client_rules, {server_peer: LinkRule(delay_s=0.1)}, 1)
    monkeypatch.setenv(LINK_RULES_ENV, str(server_rules))
    async with open_host(server_id, CONFIG) as server:
        server.set_request_handler("/chaos/echo/1", echo)
        addr = await server.listen("/ip4/127.0.0.1/tcp/0")
        monkeypatch.setenv(LINK_RULES_ENV, str(client_rules))
        async with open_host(client_id, CONFIG) as client:
            assert client.links is not None and server.links is not None
            connection = await client.connect(addr)
            # One request and its answer each cross the 100 ms one-way delay.
            started = anyio.current_time()
            assert await connection.request("echo", "slow") == "slow"
            assert anyio.current_time() - started >= 0.2

            third = Identity.generate()
            cut = {client_peer: LinkRule(cut=True), str(third.peer_id): LinkRule(cut=True)}
            rewrite(server_rules, cut, 2)
            rewrite(client_rules, {server_peer: LinkRule(cut=True)}, 2)
            await eventually(lambda: client.links.is_cut(server_peer) and server.links.is_cut(client_peer))
            with pytest.raises(RequestTimeout):
                await connection.request("echo", "held", timeout_s=1.0)
            monkeypatch.delenv(LINK_RULES_ENV)
            with pytest.raises(PeerUnreachable):  # nor can a new connection be made over a cut link
                async with open_host(third, CONFIG) as other:
                    assert other.links is None
                    await other.connect(addr)

            rewrite(server_rules, {}, 3)
            rewrite(client_rules, {}, 3)
            await eventually(lambda: not client.links.is_cut(server_peer) and not server.links.is_cut(client_peer))
            # The same connection carries traffic again: what was held is delivered, in order.
            with anyio.fail_after(10):
                assert await connection.request("echo", "back") == "back"
            assert not connection.closed
