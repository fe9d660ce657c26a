"""A connection's keepalive task sleeps until something can be due (issue 23, idle CPU): on a
connection that keeps receiving, it wakes about once per ``keepalive_interval_s`` (it used to wake
every half interval), sends no ping, and a quiet connection is still pinged and answers."""

from __future__ import annotations

import time

import anyio
import pytest

from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.protocol_ids import ProtocolId

from ..conditions import eventually

pytestmark = pytest.mark.anyio

INTERVAL_S = 0.4
CONFIG = TransportConfig(
    handshake_timeout_s=2.0,
    connect_timeout_s=2.0,
    keepalive_interval_s=INTERVAL_S,
    dead_connection_timeout_s=20.0,
)


async def test_a_receiving_connection_wakes_its_keepalive_about_once_per_interval() -> None:
    received: list[bytes] = []
    async with open_host(Identity.generate(), CONFIG) as server, open_host(Identity.generate(), CONFIG) as client:
        server.set_message_handler(ProtocolId("tick", 1), lambda connection, body: received.append(body))
        addr = await server.listen("/ip4/127.0.0.1/tcp/0")
        outgoing = await client.connect(addr)
        await eventually(lambda: server.connection(client.peer_id) is not None, timeout_s=10)
        incoming = server.connection(client.peer_id)
        assert incoming is not None
        before, started = incoming.keepalive_wakeups, time.monotonic()
        pings_before = incoming._ping_counter
        while time.monotonic() - started < 6 * INTERVAL_S:
            await outgoing.send_message("tick", b"x")
            await anyio.sleep(INTERVAL_S / 8)
        elapsed = time.monotonic() - started
        woken = incoming.keepalive_wakeups - before
        # Every half interval would be elapsed / (INTERVAL_S / 2) = 12 wake-ups; the deadline
        # moves with each message, so about one per interval (6) is left.
        assert woken <= 0.7 * elapsed / (INTERVAL_S / 2), woken
        assert incoming._ping_counter == pings_before  # traffic proves it alive: no ping
        assert len(received) > 0
        # The sender receives nothing but pongs: it still pings its quiet side and gets an RTT.
        await eventually(lambda: outgoing.rtt_s is not None, timeout_s=10)
