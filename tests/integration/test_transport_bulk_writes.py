"""Bulk stream writes over real loopback sockets in one process: what one record costs the sender.

A state source sends about a thousand 1 MiB records per GiB; every pass through the event loop per
record is CPU the encryption needs on a shared core. A record that fits the socket buffer goes out
with the send lock's one pass; one that does not waits for room and still arrives whole.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import trio
import trio.lowlevel

from chaosp2p.errors import ConnectionClosed
from chaosp2p.transport.host import open_host
from chaosp2p.transport.sockets import send_nowait
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import Identity

from ..conditions import eventually
from .test_transport_nowait import CONFIG  # quick timers and 64 KiB records

pytestmark = pytest.mark.anyio

RECORD_BYTES = CONFIG.max_record_bytes


class _Steps(trio.abc.Instrument):
    """Counts the scheduler passes of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


@asynccontextmanager
async def sink(total: int) -> AsyncIterator[tuple[Stream, list[bytes]]]:
    """A client stream to a server that raises its window to ``total`` and reads it all."""
    received: list[bytes] = []
    window_open = anyio.Event()

    async def read_all(stream: Stream) -> None:
        stream.set_receive_window(total)
        window_open.set()
        buffer = bytearray(total)
        await stream.receive_into(buffer)
        received.append(bytes(buffer))

    async with open_host(Identity.generate(), CONFIG) as server, open_host(Identity.generate(), CONFIG) as client:
        server.set_stream_handler("/chaos/sink/1", read_all)
        addr = await server.listen("/ip4/127.0.0.1/tcp/0")
        connection = await client.connect(addr)
        stream = connection.open_stream("sink")
        await stream.send(b"")  # the SYN: the server's handler starts and opens the window
        with anyio.fail_after(5):
            await window_open.wait()
        await eventually(lambda: connection._sendable(stream) >= RECORD_BYTES)  # the grant's way
        yield stream, received


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_bulk_send_takes_one_scheduler_pass_per_record() -> None:
    records = 48
    total = records * RECORD_BYTES
    data = bytes(range(256)) * (total // 256)
    async with sink(total) as (stream, received):
        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            await stream.send(data)
        finally:
            trio.lowlevel.remove_instrument(steps)
        await eventually(lambda: bool(received))
        assert received == [data]
        # One pass per record (the send lock's), a few more if the socket buffer ever filled; a
        # second pass per record (a checkpoint and two cancel scopes around every write) was the
        # old cost.
        assert steps.steps <= records + records // 4, steps.steps


async def test_send_nowait_returns_what_the_kernel_did_not_take() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.setblocking(False)
        left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        payload = bytes(range(256)) * 4096  # 1 MiB: more than the socket buffers hold
        rest = send_nowait(left, [b"head", payload])
        unsent = sum(len(part) for part in rest)
        assert 0 < unsent < len(payload)
        right.setblocking(False)
        received = bytearray()
        while len(received) < 4 + len(payload) - unsent:
            received += right.recv(1 << 20)
        while rest:  # the rest, resent in order, completes the bytes exactly
            rest = send_nowait(left, rest)
            try:
                received += right.recv(1 << 20)
            except BlockingIOError:
                pass
        while len(received) < 4 + len(payload):
            received += right.recv(1 << 20)
        assert bytes(received) == b"head" + payload
        assert send_nowait(left, [b"", memoryview(b"")]) == []


async def test_send_nowait_on_a_closed_peer_raises_connection_closed() -> None:
    left, right = socket.socketpair()
    with left:
        left.setblocking(False)
        right.close()
        with pytest.raises(ConnectionClosed):
            send_nowait(left, [b"x" * 1000])
