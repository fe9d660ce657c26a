"""Relay reservations and relay addresses over real loopback sockets (``protocols/relay.md`` §6).

B reserves a slot at R and gets relay addresses; A dials one (``Host.connect`` or among B's
addresses in ``connection_to``) and holds a relayed connection to B. A relay that requires
reservations refuses circuits to a peer without one until it reserves; a full relay refuses more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest

from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.reachability import Reachability
from chaosp2p.protocols.relay import RelayConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host, open_host
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(handshake_timeout_s=2.0, connect_timeout_s=1.0, request_timeout_s=5.0)
RELAY = RelayConfig(answer_timeout_s=2.0, reservation_duration_s=600.0)


async def echo(connection: Connection, request: Any) -> Any:
    return request


@asynccontextmanager
async def hosts(count: int, relay: RelayConfig = RELAY) -> AsyncIterator[list[Host]]:
    """``count`` hosts on 127.0.0.1; the last is the relay R (with ``relay``), the others connect to it."""
    async with AsyncExitStack() as stack:
        made = []
        for index in range(count):
            config = relay if index == count - 1 else RELAY
            host = await stack.enter_async_context(open_host(Identity.generate(), CONFIG, relay=config))
            host.set_request_handler("/chaos/echo/1", echo)
            await host.listen("/ip4/127.0.0.1/tcp/0")
            made.append(host)
        for host in made[:-1]:
            await host.connect(made[-1].addrs[0])
        yield made


async def test_a_peer_reached_at_the_relay_address_its_reservation_gave() -> None:
    async with hosts(3) as [a, b, r]:
        reservation = await b.relay.reserve(r.peer_id)
        assert reservation.ttl_s == pytest.approx(600.0)
        [text] = reservation.addrs
        addr = CircuitAddr.parse(text)
        assert (addr.relay, addr.target) == (r.addrs[0], b.peer_id)
        assert r.relay.reservations.holds(b.peer_id, r.clock.now())

        connection = await a.connect(text)  # a relay address, as a string
        assert connection.relayed and connection.remote_peer == b.peer_id
        assert await connection.request("echo", "via R") == "via R"
        assert a.connection(b.peer_id) is None  # still no direct connection
        assert await a.connection_to(b.peer_id, [addr]) is connection  # reused, among B's addresses


async def test_connection_to_dials_a_relay_address_among_a_peers_addresses() -> None:
    async with hosts(3) as [a, b, r]:
        [text] = (await b.relay.reserve(r.peer_id)).addrs
        closed = dataclasses.replace(b.listen_addrs[0], port=1)  # a direct address that fails
        connection = await a.connection_to(b.peer_id, [closed, CircuitAddr.parse(text)])
        assert connection.relayed and connection.remote_peer == b.peer_id


async def test_a_relay_that_requires_reservations_relays_only_to_holders() -> None:
    async with hosts(3, dataclasses.replace(RELAY, require_reservation=True)) as [a, b, r]:
        with pytest.raises(PeerUnreachable, match="NO_RESERVATION"):
            await a.relay.connect_via(r.peer_id, b.peer_id)
        await b.relay.reserve(r.peer_id)
        connection = await a.relay.connect_via(r.peer_id, b.peer_id)
        assert await connection.request("echo", "reserved") == "reserved"


async def test_a_full_relay_refuses_another_reservation_and_a_holder_renews() -> None:
    async with hosts(3, dataclasses.replace(RELAY, max_reservations=1)) as [a, b, r]:
        await b.relay.reserve(r.peer_id)
        with pytest.raises(PeerUnreachable, match="RESOURCE_LIMIT"):
            await a.relay.reserve(r.peer_id)
        await b.relay.reserve(r.peer_id)  # a renewal fits
        assert r.relay.reservations.granted == 2 and r.relay.reservations.refused == 1


async def test_a_relay_that_relays_for_nobody_grants_no_reservation() -> None:
    async with hosts(2, dataclasses.replace(RELAY, enabled=False)) as [b, r]:
        with pytest.raises(PeerUnreachable, match="DISABLED"):
            await b.relay.reserve(r.peer_id)


async def test_a_relay_that_is_not_public_refuses_a_reservation_until_its_dial_backs_say_public() -> None:
    async with hosts(2) as [b, r]:
        own = [Reachability.UNKNOWN]
        r.relay.own_reachability = lambda: own[0]  # as a node wires its reachability service
        with pytest.raises(PeerUnreachable, match=r"refused \(NOT_PUBLIC: this relay's own reachability is unknown"):
            await b.relay.reserve(r.peer_id)
        assert not r.relay.reservations.holds(b.peer_id, r.clock.now())
        own[0] = Reachability.PUBLIC
        assert (await b.relay.reserve(r.peer_id)).addrs


async def test_a_slot_ends_with_the_holders_connection_to_the_relay() -> None:
    async with hosts(2) as [b, r]:
        await b.relay.reserve(r.peer_id)
        assert r.relay.reservations.holds(b.peer_id, r.clock.now())
        connection = b.connection(r.peer_id)
        assert connection is not None
        await connection.aclose("leaving")
        await eventually(lambda: not r.relay.reservations.holds(b.peer_id, r.clock.now()))
