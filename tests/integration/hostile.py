"""A deliberately misbehaving client for transport tests: speaks just enough of the protocol."""

from __future__ import annotations

import socket
import time

from chaosp2p.protocols.channel.handshake import NoiseHandshake, psk_for
from chaosp2p.protocols.channel.hello import HELLO_CODEC, Hello
from chaosp2p.protocols.channel.record_layer import TAG_BYTES, Flag, FrameType, RecordHeader, RecordSealer
from chaosp2p.transport.sockets import close_socket, connect_tcp, receive_some, send_all
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr


class HostileClient:
    """Completes a real handshake, then sends whatever records a test wants."""

    def __init__(self, sock: socket.socket, sealer: RecordSealer | None) -> None:
        self.sock = sock
        self.sealer = sealer

    @classmethod
    async def raw(cls, addr: Multiaddr) -> HostileClient:
        """Just a TCP connection, no handshake."""
        return cls(await connect_tcp(addr.host, addr.port, buffer_bytes=1 << 16), None)

    @classmethod
    async def authenticated(
        cls, addr: Multiaddr, *, swarm_key: bytes | None = None, hello: bool = True, identity: Identity | None = None
    ) -> HostileClient:
        """Handshake as ``identity`` (default: a fresh one) and (optionally) send a valid Hello."""
        sock = await connect_tcp(addr.host, addr.port, buffer_bytes=1 << 16)
        handshake = NoiseHandshake(
            initiator=True,
            identity=identity or Identity.generate(),
            psk=psk_for(swarm_key),
            wall_time_ms=int(time.time() * 1000),
        )
        while True:
            out = handshake.data_to_send()
            if out:
                await send_all(sock, [out])
            if handshake.complete:
                break
            handshake.receive_data(await receive_some(sock, 4096))
        client = cls(sock, RecordSealer(handshake.session().send_key))
        if hello:
            await client.record(
                FrameType.HELLO, Flag.NONE, 0, 0, HELLO_CODEC.encode(Hello(agent="hostile", protocols=()))
            )
        return client

    async def send(self, data: bytes) -> None:
        """Raw bytes onto the socket."""
        await send_all(self.sock, [data])

    async def record(
        self,
        kind: FrameType,
        flags: Flag,
        stream_id: int,
        value: int,
        payload: bytes,
        *,
        claimed_length: int | None = None,
    ) -> None:
        """A correctly sealed record (optionally lying about its length in the header)."""
        assert self.sealer is not None
        header = RecordHeader(len(payload) if claimed_length is None else claimed_length, kind, flags, stream_id, value)
        raw = header.pack()
        sealed = bytearray(len(payload) + TAG_BYTES)
        self.sealer.seal_into(raw, payload, memoryview(sealed))
        await send_all(self.sock, [raw, sealed])

    async def wait_closed_by_peer(self) -> bytes:
        """Read until the peer closes the connection; returns everything it sent."""
        received = bytearray()
        while True:
            try:
                received += await receive_some(self.sock, 65536)
            except Exception:  # ConnectionClosed on EOF or reset: what the test waits for
                return bytes(received)

    def close(self) -> None:
        close_socket(self.sock)
