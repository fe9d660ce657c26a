"""Hole punching over real loopback sockets (``/chaos/holepunch/1``, ``protocols/holepunch.md``).

A and B reach each other through R (a relayed connection); a punch gives them a direct connection
that the host then prefers. When no attempt connects (both listeners closed: a closed port) or the
other side refuses, the punch fails with one log line and the relayed connection keeps working.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest

from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.holepunch import HolePunchConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.holepunch import HolePunchService, punch
from chaosp2p.transport.host import Host, open_host
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(handshake_timeout_s=2.0, connect_timeout_s=1.0, request_timeout_s=5.0)
PUNCH = HolePunchConfig.local()


async def echo(connection: Connection, request: Any) -> Any:
    return request


@dataclasses.dataclass
class Trio:
    a: Host
    b: Host
    r: Host
    services: list[HolePunchService]


@asynccontextmanager
async def relayed_pair(b_punch: HolePunchConfig = PUNCH, *, auto: bool = False) -> AsyncIterator[Trio]:
    """A and B connected to R, and A~B relayed through R; every host serves hole punching (and
    with ``auto`` A punches as soon as its relayed connection opens)."""
    async with AsyncExitStack() as stack:
        hosts, services = [], []
        for index in range(3):
            host = await stack.enter_async_context(open_host(Identity.generate(), CONFIG))
            services.append(HolePunchService(host, b_punch if index == 1 else PUNCH))
            host.set_request_handler("/chaos/echo/1", echo)
            await host.listen("/ip4/127.0.0.1/tcp/0")
            hosts.append(host)
        a, b, r = hosts
        for host in (a, b):
            await host.connect(r.addrs[0])
        if auto:
            a.relay.opened.append(services[0].upgrade_soon)
        relayed = await a.relay.connect(b.peer_id)
        assert relayed.relayed and (auto or a.connection(b.peer_id) is None)
        yield Trio(a=a, b=b, r=r, services=services)


async def test_two_hosts_with_a_relayed_connection_end_up_with_a_direct_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chaosp2p.transport")
    async with relayed_pair() as t:
        direct = await punch(t.a, t.b.peer_id, PUNCH)
        assert not direct.relayed and direct.remote_peer == t.b.peer_id
        assert t.a.connection(t.b.peer_id) is direct  # the host now prefers it
        assert await t.a.connection_to(t.b.peer_id) is direct
        await eventually(lambda: t.b.connection(t.a.peer_id) is not None)
        assert await direct.request("echo", "direct") == "direct"
        back = t.b.connection(t.a.peer_id)
        assert back is not None and await back.request("echo", "and back") == "and back"
        # Not through R: R's circuit carries only the relayed connection's bytes.
        assert t.r.relay.circuits.statistics().open == 1
        relayed = t.a.relayed_connection(t.b.peer_id)
        assert relayed is not None and await relayed.request("echo", "still there") == "still there"
        assert await punch(t.a, t.b.peer_id, PUNCH) is direct  # a second punch reuses it
        await eventually(lambda: t.services[1].punched == 1)
        assert any(
            "hole punch with" in r.getMessage() and "direct connection" in r.getMessage() for r in caplog.records
        )


async def test_a_failed_punch_keeps_the_relayed_connection_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chaosp2p.transport")
    async with relayed_pair() as t:
        for host in (t.a, t.b):
            host._listeners[0].close()  # nothing answers at either listen port: every SYN is refused
        with pytest.raises(PeerUnreachable, match=r"hole punch with .* failed"):
            await punch(t.a, t.b.peer_id, PUNCH)
        assert t.a.connection(t.b.peer_id) is None
        relayed = t.a.relayed_connection(t.b.peer_id)
        assert relayed is not None and await relayed.request("echo", "relayed") == "relayed"
        lines = [r.getMessage() for r in caplog.records if "hole punch with" in r.getMessage()]
        assert any("failed" in line and "the relayed connection stays" in line for line in lines), lines
        await eventually(lambda: t.services[1].failed == 1)


async def test_a_peer_that_does_not_punch_refuses_and_the_relayed_connection_stays() -> None:
    async with relayed_pair(b_punch=dataclasses.replace(PUNCH, enabled=False)) as t:
        with pytest.raises(PeerUnreachable, match="refused"):
            await punch(t.a, t.b.peer_id, PUNCH)
        assert t.services[1].refused == 1 and t.a.connection(t.b.peer_id) is None
        relayed = t.a.relayed_connection(t.b.peer_id)
        assert relayed is not None and await relayed.request("echo", "relayed") == "relayed"


def report_changed_ports(host: Host) -> None:
    """Two observers say our dialled connections came from other ports than our sockets had (what
    a symmetric NAT's peers report; on loopback nothing changes ports, so the reports are made up)."""
    for port in (61001, 61002):
        host.observed.add(Identity.generate().peer_id, f"/ip4/198.18.0.3/tcp/{port}", local_port=port - 20000)


async def test_a_peer_behind_a_symmetric_nat_refuses_at_once_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chaosp2p.transport")
    async with relayed_pair() as t:
        report_changed_ports(t.b)
        with pytest.raises(PeerUnreachable, match=r"the peer's NAT changes source ports \(symmetric\)"):
            await punch(t.a, t.b.peer_id, PUNCH)
        # B refused before any SYN: no attempt was made, so nothing waited out connect_timeout_s.
        assert (t.services[1].refused, t.services[1].failed, t.services[1].punched) == (1, 0, 0)
        assert t.a.connection(t.b.peer_id) is None
        relayed = t.a.relayed_connection(t.b.peer_id)
        assert relayed is not None and await relayed.request("echo", "relayed") == "relayed"
        lines = [r.getMessage() for r in caplog.records if "hole punch with" in r.getMessage()]
        assert any("changes source ports" in line and "relayed connection stays" in line for line in lines), lines


async def test_a_peer_that_knows_its_nat_changes_ports_does_not_start_a_punch() -> None:
    async with relayed_pair() as t:
        report_changed_ports(t.a)
        with pytest.raises(PeerUnreachable, match=r"our NAT changes source ports"):
            await punch(t.a, t.b.peer_id, PUNCH)
        assert t.services[1].refused == t.services[1].failed == 0  # B was never asked
        # One observer is a claim, not evidence: with a higher bar the punch is tried (and works).
        direct = await punch(t.a, t.b.peer_id, dataclasses.replace(PUNCH, min_mapping_observers=3))
        assert not direct.relayed


async def test_a_hosts_dialled_connections_report_their_source_ports() -> None:
    async with relayed_pair() as t:
        # On loopback nothing translates: A's and B's observers (R) saw the ports their sockets had.
        assert t.a.observed.port_mapping(min_observers=1).value == "kept"
        assert t.r.observed.port_mapping(min_observers=1).value == "unknown"  # R dialled nobody


async def test_a_punch_needs_a_relayed_connection() -> None:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(open_host(Identity.generate(), CONFIG))
        with pytest.raises(PeerUnreachable, match="no relayed connection"):
            await punch(a, Identity.generate().peer_id, PUNCH)


async def test_a_relayed_connection_is_upgraded_at_once_when_the_service_watches_the_relay() -> None:
    async with relayed_pair(auto=True) as t:  # as a node wires it
        await eventually(lambda: t.services[0].punched == 1)  # counted once punch() returned
        assert t.a.connection(t.b.peer_id) is not None
        relayed = t.a.relayed_connection(t.b.peer_id)
        assert relayed is not None and await relayed.request("echo", "relayed") == "relayed"  # it stays


async def test_no_punch_towards_a_peer_that_does_not_speak_the_protocol() -> None:
    async with AsyncExitStack() as stack:
        a, b, r = [await stack.enter_async_context(open_host(Identity.generate(), CONFIG)) for _ in "abr"]
        service = HolePunchService(a, PUNCH)  # B and R have none: older peers
        for host in (a, b, r):
            await host.listen("/ip4/127.0.0.1/tcp/0")
        for host in (a, b):
            await host.connect(r.addrs[0])
        a.relay.opened.append(service.upgrade_soon)
        await a.relay.connect(b.peer_id)
        with pytest.raises(PeerUnreachable, match="does not speak"):
            await punch(a, b.peer_id, PUNCH)
        assert service.failed == 0  # the automatic upgrade did not even try


async def test_simultaneous_open_skips_what_it_cannot_dial_and_reports_failure() -> None:
    from chaosp2p.protocols.holepunch import Outcome
    from chaosp2p.transport.holepunch import simultaneous_open
    from chaosp2p.wire.multiaddr import Multiaddr

    async with open_host(Identity.generate(), CONFIG) as host:
        own = await host.listen("/ip4/127.0.0.1/tcp/0")
        closed = Multiaddr.parse("/ip4/127.0.0.1/tcp/1")  # nothing listens on port 1: refused at once
        v6_only = Multiaddr.parse("/ip6/::1/tcp/4001")  # no ip6 listen port to punch from: skipped
        outcome, sock = await simultaneous_open(
            {"ip4": own.port}, [closed, v6_only], timeout_s=2.0, buffer_bytes=1 << 16
        )
        assert (outcome, sock) == (Outcome.FAILED, None)
        assert await simultaneous_open({}, [closed], timeout_s=2.0, buffer_bytes=1 << 16) == (Outcome.FAILED, None)


def test_the_listen_port_is_shared_with_punch_sockets_only() -> None:
    import socket

    from chaosp2p.transport.sockets import Listener, bound_socket

    listener = Listener("127.0.0.1", 0, buffer_bytes=1 << 16)
    try:
        port = listener.address[1]
        with pytest.raises(PeerUnreachable, match="cannot listen"):
            Listener("127.0.0.1", port, buffer_bytes=1 << 16)  # a second peer on the port still fails
        plain = socket.socket()
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # and so does anyone without SO_REUSEPORT
        plain.close()
        bound_socket(socket.AF_INET, port, buffer_bytes=1 << 16).close()  # a punch socket may share it
    finally:
        listener.close()
