"""A private peer reserves at a relay and is reached at the relay address it announces (issue 21).

Host level: B, told it is private, reserves at R with :class:`RelayReservations` and gets a relay
address; A, connected to neither and unable to dial B directly, reaches B through that address.
Peer level: B's membership info carries the address; A, cut from B, learns it and reaches B.
"""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from chaosp2p.clock import MonotonicClock
from chaosp2p.protocols.relay import RelayConfig
from chaosp2p.protocols.relay.holding import ReservationConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import open_host
from chaosp2p.transport.reach import reach
from chaosp2p.transport.relay_reservations import RelayReservations
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import Identity

from ..conditions import eventually
from .test_reach_through_relay import star

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(handshake_timeout_s=2.0, connect_timeout_s=1.0, request_timeout_s=5.0)
RELAY = RelayConfig(answer_timeout_s=2.0, reservation_duration_s=600.0, require_reservation=True)
PRIVATE = dataclasses.replace(ReservationConfig.local(), assume_private=True)


async def test_a_private_host_reserves_and_a_stranger_reaches_it_at_the_announced_address() -> None:
    async with AsyncExitStack() as stack:
        a, b, r = [
            await stack.enter_async_context(open_host(Identity.generate(), CONFIG, relay=RELAY)) for _ in range(3)
        ]
        for host in (a, b, r):
            await host.listen("/ip4/127.0.0.1/tcp/0")
        await b.connect(r.addrs[0])  # B dialled R: a candidate relay
        announced: list[object] = []
        driver = RelayReservations(b, MonotonicClock(), PRIVATE, is_private=lambda: False)
        driver.changed.append(announced.append)
        await driver.step()
        [addr] = driver.addrs
        assert addr.relay_peer == r.peer_id and addr.target == b.peer_id
        assert announced == [driver.addrs] and r.relay.reservations.holds(b.peer_id, r.clock.now())

        closed = dataclasses.replace(b.listen_addrs[0], port=1)  # B's direct address does not work
        assert a.connection(r.peer_id) is None  # A is not connected to the relay
        connection = await reach(a, b.peer_id, [closed, addr], relay_after_s=0.1)
        assert connection.relayed and connection.remote_peer == b.peer_id
        assert a.connection(b.peer_id) is None

        # The relay goes away: the slot and its address are dropped, and announced as gone.
        await r.connection(b.peer_id).aclose()  # type: ignore[union-attr]
        await eventually(lambda: b.connection(r.peer_id) is None)
        await driver.step()
        assert driver.addrs == () and announced[-1] == ()


async def test_a_public_host_reserves_nowhere() -> None:
    async with AsyncExitStack() as stack:
        b, r = [await stack.enter_async_context(open_host(Identity.generate(), CONFIG, relay=RELAY)) for _ in range(2)]
        await r.listen("/ip4/127.0.0.1/tcp/0")
        await b.connect(r.addrs[0])
        driver = RelayReservations(b, MonotonicClock(), ReservationConfig.local(), is_private=lambda: False)
        await driver.step()
        assert driver.addrs == () and len(r.relay.reservations) == 0


async def test_peers_learn_a_private_members_relay_address_and_reach_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # R, then B (private) and A bootstrapping from R; A and B cannot dial each other.
    async with star(tmp_path, monkeypatch, lambda c: c.replace(reservations=PRIVATE)) as (r, b, a):
        membership = a.membership
        await eventually(lambda: membership.machine.relay_addrs(b.peer_id) != (), timeout_s=20.0)
        [addr] = membership.machine.relay_addrs(b.peer_id)
        assert addr.relay_peer == r.peer_id and addr.target == b.peer_id
        assert addr in membership.reach_addrs(b.peer_id)
        assert addr in a.negotiation._resolve(b.peer_id)  # negotiation dials with it too
        connection = await reach(a.host, b.peer_id, membership.reach_addrs(b.peer_id), relay_after_s=0.2)
        assert connection.relayed and connection.remote_peer == b.peer_id
        assert b.status_report().to_json()["reachability"]["relay_addrs"] == [str(addr)]
        # A node's relay judges reservations by its own dial-back checks (protocols/relay.md §6;
        # the local profile here grants whatever they say).
        own = r.host.relay.own_reachability
        assert own is not None and own() is r.reachability.reachability


async def test_a_link_probe_counts_a_direct_connection_only_not_the_relay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A link declared down is declared up again only when its probe gets a round trip over a
    *direct* connection. Reaching the peer at its relay address is no sign of the link: in the
    four-peer star across NAT (docs/results.md) such a probe raised LINK_UP between two trainers
    that can only reach each other through the relay, the plan exchanged over the pair directly,
    and each such step stalled 5-7.5 s until the round's dial timed out and the link went down again."""
    async with star(tmp_path, monkeypatch, lambda c: c.replace(reservations=PRIVATE)) as (r, b, a):
        await eventually(lambda: a.membership.machine.relay_addrs(b.peer_id) != (), timeout_s=20.0)
        assert any(isinstance(x, CircuitAddr) for x in a.negotiation._resolve(b.peer_id))  # the relay address
        relayed = await reach(a.host, b.peer_id, a.membership.reach_addrs(b.peer_id), relay_after_s=0.2)
        assert relayed.relayed and await relayed.ping() >= 0  # b is reachable through R ...
        # The cut direct dial waits out the connect timeout: shortened, so the test stays fast.
        a.host.config = dataclasses.replace(a.host.config, connect_timeout_s=0.2)
        assert not await a.negotiation._probe(b.peer_id, 10.0)  # ... but the a~b link is not up
        assert await a.negotiation._probe(r.peer_id, 10.0)  # a direct link is
