"""Messages sent from the calling task (``Connection.try_send_message_nowait``), over real loopback
sockets in one process: delivered whole and in order, also when the socket buffer fills up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.protocol_ids import ProtocolId

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(
    handshake_timeout_s=2.0,
    connect_timeout_s=2.0,
    request_timeout_s=5.0,
    keepalive_interval_s=1.0,
    dead_connection_timeout_s=20.0,
    max_record_bytes=64 * 1024,
)


@asynccontextmanager
async def blob_connection() -> AsyncIterator[tuple[Connection, list[bytes]]]:
    """A client connection to a server that collects every "blob" message body it receives."""
    received: list[bytes] = []
    async with open_host(Identity.generate(), CONFIG) as server, open_host(Identity.generate(), CONFIG) as client:
        server.set_message_handler(ProtocolId("blob", 1), lambda connection, body: received.append(body))
        addr = await server.listen("/ip4/127.0.0.1/tcp/0")
        yield await client.connect(addr), received


async def test_an_idle_connection_sends_at_once_and_in_order_with_queued_sends() -> None:
    async with blob_connection() as (connection, received):
        assert connection.try_send_message_nowait("blob", b"first")
        await connection.send_message("blob", b"second")  # the awaited path after a direct one
        assert connection.try_send_message_nowait("blob", b"third")
        await eventually(lambda: len(received) == 3, timeout_s=10)
        assert received == [b"first", b"second", b"third"]


async def test_a_full_socket_buffer_keeps_records_whole_and_in_order() -> None:
    """Far more than the kernel buffers at once, sent without yielding: some records go out in
    parts (their tail waits for the next writer), later ones fall back to the awaited path."""
    async with blob_connection() as (connection, received):
        count, size = 400, 60_000
        bodies = [bytes([i % 251]) * size + i.to_bytes(4, "big") for i in range(count)]
        direct = deferred = 0
        for body in bodies:
            if connection.try_send_message_nowait("blob", body):
                direct += 1
            else:
                deferred += 1
                await connection.send_message("blob", body)
        await eventually(lambda: len(received) == count, timeout_s=60)
        assert received == bodies
        assert direct > 0 and deferred > 0  # both paths (and a partial write between them) were taken


async def test_a_closed_connection_refuses_the_direct_path() -> None:
    async with blob_connection() as (connection, _):
        await connection.aclose("done")
        assert not connection.try_send_message_nowait("blob", b"late")
