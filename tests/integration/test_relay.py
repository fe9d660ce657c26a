"""The circuit relay over real loopback sockets (``/chaos/relay/1``, ``protocols/relay.md``).

A and B may not dial each other (the harness's link cut: dials time out, handshakes are refused);
both are connected to R. A reaches B through R with the end-to-end handshake running over the
relayed bytes; the relay's refusals and limits; a relay that alters a byte or answers as B itself
makes the handshake fail, and everyone keeps serving.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.relay import PROTOCOL, PROTOCOL_ID, Hop, RelayConfig, Status, StatusCode, Stop, codec
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host, open_host
from chaosp2p.transport.relay import _socket_pair, bridge
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(
    handshake_timeout_s=2.0,
    connect_timeout_s=0.5,
    request_timeout_s=5.0,
    keepalive_interval_s=1.0,
    dead_connection_timeout_s=10.0,
    max_record_bytes=64 * 1024,
)
RELAY = RelayConfig(answer_timeout_s=2.0)


async def echo(connection: Connection, request: Any) -> Any:
    return request


async def sink(stream: Stream) -> None:
    """Read a stream to its end and answer with the SHA-256 of what arrived."""
    digest = hashlib.sha256()
    while data := await stream.receive_some():
        digest.update(data)
    await stream.send(digest.digest(), eof=True)


@dataclasses.dataclass
class Trio:
    a: Host
    b: Host
    r: Host


@asynccontextmanager
async def trio(
    folder: Path, monkeypatch: pytest.MonkeyPatch, *, relay: RelayConfig = RELAY, cut: bool = True
) -> AsyncIterator[Trio]:
    """Hosts A, B and R; A~B cut (when ``cut``), A and B connected to R."""
    ids = [Identity.generate() for _ in range(3)]
    a_id, b_id, _ = ids
    rules = {
        0: {str(b_id.peer_id): LinkRule(cut=True)} if cut else {},
        1: {str(a_id.peer_id): LinkRule(cut=True)} if cut else {},
        2: {},
    }
    async with AsyncExitStack() as stack:
        hosts = []
        for index, identity in enumerate(ids):
            path = folder / f"rules-{index}.json"
            write_link_rules(path, rules[index])
            monkeypatch.setenv(LINK_RULES_ENV, str(path))
            host = await stack.enter_async_context(open_host(identity, CONFIG, relay=relay if index == 2 else RELAY))
            host.set_request_handler("/chaos/echo/1", echo)
            host.set_stream_handler("/chaos/sink/1", sink)
            await host.listen("/ip4/127.0.0.1/tcp/0")
            hosts.append(host)
        monkeypatch.delenv(LINK_RULES_ENV)
        a, b, r = hosts
        for host in (a, b):
            await host.connect(r.addrs[0])
        if cut:
            await eventually(lambda: a.links is not None and a.links.is_cut(b.peer_id))
        yield Trio(a=a, b=b, r=r)


async def test_a_and_b_without_a_link_talk_through_r_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio(tmp_path, monkeypatch) as t:
        with pytest.raises(PeerUnreachable):  # the direct link is cut
            await t.a.connect(t.b.addrs[0])
        connection = await t.a.connection_to(t.b.peer_id, t.b.addrs, relay=True)
        assert connection.relayed and connection.remote_peer == t.b.peer_id
        assert t.a.connection(t.b.peer_id) is None  # "connected" elsewhere means the direct link
        assert t.a.relayed_connection(t.b.peer_id) is connection
        assert await connection.request("echo", {"via": "relay"}) == {"via": "relay"}
        await eventually(lambda: t.b.relayed_connection(t.a.peer_id) is not None)
        back = t.b.relayed_connection(t.a.peer_id)
        assert back is not None and back.relayed and not back.is_dialer
        assert await back.request("echo", "and back") == "and back"
        # Reused, not a second circuit.
        assert await t.a.relay.connect(t.b.peer_id) is connection
        assert t.r.relay.circuits.statistics().open == 1

        # A bulk stream through the relay arrives bit for bit.
        payload = os.urandom(8 << 20)
        stream = connection.open_stream("sink")
        await stream.send(payload, eof=True)
        assert bytes(await stream.receive_exactly(32)) == hashlib.sha256(payload).digest()
        assert t.r.relay.circuits.statistics().bytes_relayed > len(payload)

        # Closing the relayed connection closes the circuit at R.
        await connection.aclose("done")
        await eventually(lambda: t.r.relay.circuits.statistics().open == 0)
        await eventually(lambda: t.b.relayed_connection(t.a.peer_id) is None)


async def test_the_relay_never_dials_and_says_why_it_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with trio(tmp_path, monkeypatch, cut=False) as t, open_host(Identity.generate(), CONFIG) as c:
        await c.listen("/ip4/127.0.0.1/tcp/0")
        t.r.address_book[c.peer_id] = [c.listen_addrs[0]]  # R could dial C, but must not
        with pytest.raises(PeerUnreachable, match="NO_CONNECTION"):
            await t.a.relay.connect_via(t.r.peer_id, c.peer_id)
        assert t.r.connection(c.peer_id) is None
        with pytest.raises(PeerUnreachable, match="MALFORMED"):
            await t.a.relay.connect_via(t.r.peer_id, t.r.peer_id)
        # Still serving.
        assert await (await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)).request("echo", 1) == 1


async def test_a_relay_with_relaying_off_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    off = dataclasses.replace(RELAY, enabled=False)
    async with trio(tmp_path, monkeypatch, relay=off) as t:
        with pytest.raises(PeerUnreachable, match="DISABLED"):
            await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)
        with pytest.raises(PeerUnreachable, match="no relay reached"):
            await t.a.connection_to(t.b.peer_id, t.b.addrs, relay=True)


async def test_a_target_that_accepts_no_relayed_connections_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio(tmp_path, monkeypatch) as t:
        t.b.relay.accepted.enabled = False
        with pytest.raises(PeerUnreachable, match="TARGET_REFUSED"):
            await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)
        assert t.r.relay.circuits.statistics().open == 0


async def test_circuit_limits_per_peer_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limited = dataclasses.replace(RELAY, max_circuits_per_peer=1, max_circuit_bytes=1 << 20)
    async with trio(tmp_path, monkeypatch, relay=limited) as t:
        first = await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)
        with pytest.raises(PeerUnreachable, match="RESOURCE_LIMIT"):
            await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)
        # More than the circuit's byte budget: R resets both ends and the relayed connection closes.
        stream = first.open_stream("sink")
        with pytest.raises(Exception):  # noqa: B017 - a reset or a closed connection, both fine
            await stream.send(os.urandom(4 << 20), eof=True)
            await stream.receive_exactly(32)
        await eventually(lambda: first.closed)
        assert t.r.relay.circuits.statistics().closed_at_byte_cap == 1
        await eventually(lambda: t.r.relay.circuits.statistics().open == 0)
        # A new circuit can be made once the old one is gone.
        again = await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)
        assert await again.request("echo", "again") == "again"


async def _flip_a_byte(r: Host, stream: Stream) -> None:
    """A hostile relay: relays honestly except one flipped bit in B's first bytes towards A (in
    the middle of its handshake message, not its length prefix)."""
    hop = await stream.receive_message(codec)
    assert isinstance(hop, Hop)
    onward_connection = r.connection(hop.target)
    assert onward_connection is not None
    onward = onward_connection.open_stream(PROTOCOL)
    await onward.send_message(codec, Stop(source=stream.remote_peer))
    assert isinstance(await onward.receive_message(codec), Status)
    await stream.send_message(codec, Status(code=StatusCode.OK))

    async def copy(src: Stream, dst: Stream, flip: bool) -> None:
        while data := await src.receive_some():
            if flip:
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :]
                flip = False
            await dst.send(data)

    async with anyio.create_task_group() as tg:
        tg.start_soon(copy, stream, onward, False)
        tg.start_soon(copy, onward, stream, True)


async def _answer_as_itself(r: Host, stream: Stream) -> None:
    """A hostile relay: answers the HOP itself and runs the handshake with its own key."""
    await stream.receive_message(codec)
    await stream.send_message(codec, Status(code=StatusCode.OK))
    inner, outer = _socket_pair(1 << 16)
    r.spawn(functools.partial(bridge, stream, outer), name="hostile bridge")
    assert isinstance(stream.connection, Connection)
    await r.secure_relayed(inner, via=stream.connection, expected=None)
    await anyio.sleep_forever()


@pytest.mark.parametrize("hostile", [_flip_a_byte, _answer_as_itself], ids=["flips-a-byte", "claims-to-be-b"])
async def test_a_hostile_relay_fails_the_end_to_end_handshake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hostile: Any
) -> None:
    async with trio(tmp_path, monkeypatch) as t:
        t.r.set_stream_handler(PROTOCOL_ID, functools.partial(hostile, t.r))
        with pytest.raises(PeerUnreachable, match="end-to-end handshake failed") as caught:
            await t.a.relay.connect_via(t.r.peer_id, t.b.peer_id)
        assert t.r.peer_id.short() in str(caught.value) and "timed out" not in str(caught.value)
        assert t.a.relayed_connection(t.b.peer_id) is None and t.b.relayed_connection(t.a.peer_id) is None
        # Everyone keeps serving.
        for host, other in ((t.a, t.r), (t.b, t.r), (t.r, t.a)):
            connection = await host.connection_to(other.peer_id)
            assert await connection.request("echo", "alive") == "alive"


async def test_status_lists_a_relayed_connection_as_relayed() -> None:
    from chaosp2p.runtime.config import PeerConfig
    from chaosp2p.runtime.node import open_node
    from chaosp2p.runtime.status import STATUS_CODEC, StatusReport

    config = PeerConfig.local()
    async with open_node(config) as a, open_node(config) as b, open_node(config) as r:
        await a.host.connect(r.addrs[0])
        await b.host.connect(r.addrs[0])
        await a.host.relay.connect_via(r.peer_id, b.peer_id)
        report = a.status_report()
        rows = {(c.peer_id, c.relayed) for c in report.connections}
        # (Membership may also have connected A and B directly by now: that row says False.)
        assert (str(r.peer_id), False) in rows and {p for p, relayed in rows if relayed} == {str(b.peer_id)}
        decoded = STATUS_CODEC.from_obj(STATUS_CODEC.to_obj(report))
        assert isinstance(decoded, StatusReport)
        relayed = [c for c in decoded.to_json()["connections"] if c["relayed"]]
        assert [c["peer_id"] for c in relayed] == [str(b.peer_id)]
