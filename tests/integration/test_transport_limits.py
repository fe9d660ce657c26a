"""What one remote identity can make a peer hold or do before it proves anything (issue 20).

Memory follows the bytes a remote actually sent -- not the lengths it claims, nor the number of
connections or streams it opens -- and under a swarm key a copied first handshake message gets no
answer. Real sockets on 127.0.0.1, one process; memory is measured with :mod:`tracemalloc`.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from chaosp2p.protocols.channel.record_layer import Flag, FrameType
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import Host, open_host
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.framing import LENGTH_PREFIX
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

from ..conditions import eventually
from .hostile import HostileClient

pytestmark = pytest.mark.anyio

CONFIG = dataclasses.replace(TransportConfig.local(), max_streams_per_connection=64, handler_idle_timeout_s=60.0)
MiB = 1 << 20


@asynccontextmanager
async def server(
    config: TransportConfig = CONFIG, swarm_key: bytes | None = None
) -> AsyncIterator[tuple[Host, Multiaddr]]:
    async with open_host(Identity.generate(), config, swarm_key=swarm_key) as host:
        addr = await host.listen("/ip4/127.0.0.1/tcp/0")
        yield host, addr


@asynccontextmanager
async def traced() -> AsyncIterator[list[int]]:
    """Yields a list that holds, once the block ends, the bytes still allocated since it began."""
    tracemalloc.start()
    result: list[int] = []
    try:
        before = tracemalloc.get_traced_memory()[0]
        yield result
        result.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


async def test_a_length_prefix_takes_only_the_memory_of_the_bytes_that_came() -> None:
    """Issue 20, finding 6: a 4-byte frame length used to allocate the whole claimed body at once,
    so 250 streams with ~1 KB sent held 250 MiB. Now a frame's buffer grows as its bytes arrive."""
    entered = 0

    async def read_one_frame(stream: Stream) -> None:
        nonlocal entered
        entered += 1
        await stream.receive_frame()

    streams = 48
    async with server() as (host, addr):
        host.set_stream_handler("/chaos/frame/1", read_one_frame)
        index = [str(p) for p in host.protocols()].index("/chaos/frame/1")
        client = await HostileClient.authenticated(addr)
        async with traced() as grown:
            for n in range(streams):  # each: a prefix claiming the largest frame, then one byte
                claim = LENGTH_PREFIX.pack(CONFIG.max_frame_bytes) + b"x"
                await client.record(FrameType.DATA, Flag.SYN, 2 * n + 1, index, claim)
            await eventually(lambda: entered == streams)
            await anyio.wait_all_tasks_blocked()
        assert grown[0] < 4 * MiB, f"{streams} silent frames held {grown[0] / MiB:.1f} MiB"
        client.close()


async def test_a_frame_that_arrives_in_pieces_is_read_whole() -> None:
    """The growing buffer still delivers a large frame sent in many records, byte for byte."""
    got: list[object] = []

    async def read_one_frame(stream: Stream) -> None:
        got.append(await stream.receive_frame())

    async with server() as (host, addr), open_host(Identity.generate(), CONFIG) as client:
        host.set_stream_handler("/chaos/frame/1", read_one_frame)
        connection = await client.connect(addr)
        body = bytes(range(256)) * 3000  # ~750 KB: several records and window grants
        stream = connection.open_stream("frame", (1,))
        await stream.send_frame(body, eof=True)
        await eventually(lambda: bool(got))
        assert got == [body]


async def test_one_identity_holds_at_most_its_share_of_connections() -> None:
    """Issue 20, finding 6: one identity could open connections without limit (each one buffers);
    now it holds at most ``max_connections_per_peer`` inbound, and the rest close at once."""
    config = dataclasses.replace(CONFIG, max_connections_per_peer=3)
    async with server(config) as (host, addr):
        greedy = Identity.generate()
        clients = [await HostileClient.authenticated(addr, identity=greedy) for _ in range(5)]
        await eventually(lambda: host.statistics().connections_refused_per_peer == 2)
        await eventually(lambda: len(host.connections_to(greedy.peer_id)) == 3)
        refused = [c for c in clients if not await _still_open(c)]
        assert len(refused) == 2
        # Others are unaffected, and a slot freed is a slot the identity may use again.
        other = await HostileClient.authenticated(addr)
        await eventually(lambda: host.connection_count() == 4)
        next(c for c in clients if c not in refused).close()
        await eventually(lambda: len(host.connections_to(greedy.peer_id)) == 2)
        again = await HostileClient.authenticated(addr, identity=greedy)
        await eventually(lambda: len(host.connections_to(greedy.peer_id)) == 3)
        for c in [*clients, other, again]:
            c.close()


async def _still_open(client: HostileClient) -> bool:
    """False once the peer closed this connection (a closed one reads EOF at once)."""
    with anyio.move_on_after(0.2):
        await client.wait_closed_by_peer()
        return False
    return True


async def test_an_idle_connection_costs_far_less_than_two_records() -> None:
    """Issue 20, finding 6: every connection used to allocate two records of ``max_record_bytes``
    (2 MiB) up front; its buffers now start small and grow with the records that actually come."""
    connections = 16
    async with server(TransportConfig.local()) as (host, addr):
        async with traced() as grown:
            clients = [await HostileClient.authenticated(addr) for _ in range(connections)]
            await eventually(lambda: host.connection_count() == connections)
            await anyio.wait_all_tasks_blocked()
        assert grown[0] < connections * 256 * 1024, f"{connections} idle connections held {grown[0] / MiB:.1f} MiB"
        for c in clients:
            c.close()


async def test_bulk_records_still_flow_after_the_buffers_grow() -> None:
    """Records of the largest size arrive intact through buffers that started small."""
    received = bytearray()

    async def sink(stream: Stream) -> None:
        stream.set_receive_window(8 * MiB)
        while chunk := await stream.receive_some():
            received.extend(chunk)

    payload = bytes(range(251)) * (3 * MiB // 251)
    async with server(TransportConfig.local()) as (host, addr), open_host(
        Identity.generate(), TransportConfig.local()
    ) as client:
        host.set_stream_handler("/chaos/sink/1", sink)
        stream = (await client.connect(addr)).open_stream("sink", (1,))
        await stream.send(payload, eof=True)
        await eventually(lambda: len(received) == len(payload))
        assert received == payload


# ---------------------------------------------------------------------------- handshake replay
SWARM_KEY = bytes(range(32))


@asynccontextmanager
async def sniffing_relay(target: Multiaddr) -> AsyncIterator[tuple[Multiaddr, list[bytes]]]:
    """A TCP relay in front of ``target`` that keeps a copy of each dialer's first handshake message."""
    captured: list[bytes] = []

    async def relay(downstream: anyio.abc.SocketStream) -> None:
        upstream = await anyio.connect_tcp(target.host, target.port)
        async with downstream, upstream, anyio.create_task_group() as tg:
            tg.start_soon(_pump, upstream, downstream, None)
            await _pump(downstream, upstream, captured)
            tg.cancel_scope.cancel()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, relay)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        yield Multiaddr.parse(f"/ip4/127.0.0.1/tcp/{port}/p2p/{target.peer_id}"), captured
        tg.cancel_scope.cancel()


async def _pump(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream, capture: list[bytes] | None) -> None:
    first = bytearray()
    try:
        while True:
            data = await source.receive()
            if capture is not None and not capture:  # the first message: a 2-byte length, then that much
                first += data
                if len(first) >= 2 and len(first) >= 2 + int.from_bytes(first[:2], "big"):
                    capture.append(bytes(first[: 2 + int.from_bytes(first[:2], "big")]))
            await sink.send(data)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


async def test_a_sniffed_first_handshake_message_replayed_gets_no_answer() -> None:
    """Issue 20, finding 14: under a swarm key, a copy of a real dialer's first handshake message
    used to get an answer on every new connection (2 DH and a signature each, a "spoke" slot in the
    admission table, and proof that the address is in the swarm). Now it gets nothing."""
    async with server(CONFIG, swarm_key=SWARM_KEY) as (host, addr), sniffing_relay(addr) as (relayed, captured):
        async with open_host(Identity.generate(), CONFIG, swarm_key=SWARM_KEY) as member:
            await member.connect(relayed)  # a genuine handshake, seen by the relay
        assert len(captured) == 1
        for _ in range(3):
            replayer = await HostileClient.raw(addr)
            await replayer.send(captured[0])
            assert await replayer.wait_closed_by_peer() == b""  # not one byte of message 2
            replayer.close()
        assert host.statistics().handshakes_replayed == 3
        async with open_host(Identity.generate(), CONFIG, swarm_key=SWARM_KEY) as member:
            await member.connect(addr)  # members still get in
