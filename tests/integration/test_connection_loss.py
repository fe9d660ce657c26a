"""Which closes the transport reports as the remote host's doing (issue 19: membership checks a
peer at once when its host closed our connection without a goodbye)."""

from __future__ import annotations

import socket

import anyio
import pytest

from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity

from ..conditions import eventually
from .test_transport import CONFIG, server

pytestmark = pytest.mark.anyio


async def test_eof_from_the_remote_host_is_a_loss_and_a_goodbye_or_our_own_close_is_not() -> None:
    async with server() as (host, addr), open_host(Identity.generate(), CONFIG) as client:
        # The kernel of a killed process closes its sockets: FIN (or RST), no GOAWAY.
        lost = await client.connect(addr)
        await eventually(lambda: host.connection(client.peer_id) is not None)
        remote = host.connection(client.peer_id)
        assert remote is not None
        remote._sock.shutdown(socket.SHUT_RDWR)
        with anyio.fail_after(5):
            await lost.wait_closed()
        assert lost.closed_by_remote_host
        await eventually(lambda: host.connection(client.peer_id) is None)

        # A goodbye (leave, shutdown, idle cleanup) is no loss.
        polite = await client.connect(addr)
        await eventually(lambda: host.connection(client.peer_id) is not None)
        remote = host.connection(client.peer_id)
        assert remote is not None
        await remote.aclose("idle")
        with anyio.fail_after(5):
            await polite.wait_closed()
        assert not polite.closed_by_remote_host
        await eventually(lambda: host.connection(client.peer_id) is None)

        # Nor is a close of our own.
        ours = await client.connect(addr)
        await ours.aclose()
        assert ours.closed and not ours.closed_by_remote_host
