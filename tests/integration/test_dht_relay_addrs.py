"""A private peer found through the DHT alone is reached at its relay address (issue 21).

Host level:
B (private) reserves at the relay R and announces its relay address in its DHT requests and
provider records. A knows only D, a DHT peer: it cannot dial B (the link is cut), is not connected
to R, and runs no membership. What it learns of B comes from D's FIND_NODE answers and a provider
lookup, and its DHT driver reaches B through R, dialing R itself.

Peer level: a private peer's node puts the relay address it reserved into its DHT announcements,
and the sources a state pull finds carry it (from the peer's provider record).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import numpy as np
import pytest

from chaosp2p import SnapshotStore
from chaosp2p.clock import MonotonicClock
from chaosp2p.dht import DHTConfig, DHTMachine
from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.relay import RelayConfig
from chaosp2p.protocols.relay.holding import ReservationConfig
from chaosp2p.runtime.dht_service import DHTService
from chaosp2p.state.service import run_provider_key
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import Host, open_host
from chaosp2p.transport.reach import reach
from chaosp2p.transport.relay_reservations import RelayReservations
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

from ..conditions import eventually
from .test_reach_through_relay import star

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(handshake_timeout_s=2.0, connect_timeout_s=0.5, request_timeout_s=5.0)
RELAY = RelayConfig(answer_timeout_s=2.0, reservation_duration_s=600.0, require_reservation=True)
PRIVATE = dataclasses.replace(ReservationConfig.local(), assume_private=True)
KEY = b"/prov/state/run-nat/1"


def dht_of(host: Host, task_group: anyio.abc.TaskGroup) -> DHTService:
    clock = host.clock
    machine = DHTMachine(
        host.identity,
        rng=random.Random(),
        config=DHTConfig.local(),
        now=clock.now(),
        wall_offset_s=time.time() - clock.now(),
    )
    return DHTService(machine=machine, host=host, clock=clock, task_group=task_group, publish=lambda event: None)


@dataclasses.dataclass
class World:
    """R (relay), D (DHT), B (private, reserved at R at ``addr``, in D's routing table); A, cut from
    B, its DHT not started."""

    r: Host
    d: Host
    b: Host
    a: Host
    d_dht: DHTService
    b_dht: DHTService
    a_dht: DHTService
    addr: CircuitAddr


@asynccontextmanager
async def world(folder: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    """The hosts and DHT services of :class:`World`."""
    ids = [Identity.generate() for _ in range(4)]
    async with AsyncExitStack() as stack:
        r, d, b = [await stack.enter_async_context(open_host(i, CONFIG, relay=RELAY)) for i in ids[:3]]
        rules = folder / "rules-a.json"
        write_link_rules(rules, {str(b.peer_id): LinkRule(cut=True)})
        monkeypatch.setenv(LINK_RULES_ENV, str(rules))
        a = await stack.enter_async_context(open_host(ids[3], CONFIG, relay=RELAY))
        monkeypatch.delenv(LINK_RULES_ENV)
        for host in (r, d, b, a):
            await host.listen("/ip4/127.0.0.1/tcp/0")
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        d_dht, b_dht, a_dht = dht_of(d, tg), dht_of(b, tg), dht_of(a, tg)
        await b.connect(r.addrs[0])
        reservations = RelayReservations(b, MonotonicClock(), PRIVATE, is_private=lambda: False)
        await reservations.step()
        [addr] = reservations.addrs
        d_dht.start([])
        b_dht.start([d.addrs[0]])
        await eventually(lambda: b_dht.ready)
        b_dht.set_relay_addrs(reservations.addrs)  # as a node does once reserved: announced at once
        await eventually(lambda: d_dht.machine.known_relay_addrs(b.peer_id) == (str(addr),))
        yield World(r=r, d=d, b=b, a=a, d_dht=d_dht, b_dht=b_dht, a_dht=a_dht, addr=addr)


async def test_a_lookup_finds_a_private_peer_and_its_driver_reaches_it_through_the_relay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        r, d, b, a, a_dht, addr = w.r, w.d, w.b, w.a, w.a_dht, w.addr
        assert a.connection(r.peer_id) is None and a.connection(d.peer_id) is None
        a_dht.start([d.addrs[0]])  # its self-lookup asks D, which names B, which it then asks
        await eventually(lambda: a.relayed_connection(b.peer_id) is not None)
        assert a_dht.machine.known_relay_addrs(b.peer_id) == (str(addr),)
        assert a.connection(b.peer_id) is None  # through R, not directly
        assert a.connection(r.peer_id) is not None  # A dialled R itself: nobody told it to connect there
        # The first request may time out while the circuit is built (local profile: 0.5 s); the
        # connection stays, and B answers the next lookup through it.
        found = await a_dht.find_peer(b.peer_id)
        assert found.contact is not None and found.contact.relay_addrs == (str(addr),)
        await a_dht.get(b"anything")  # a lookup that asks every peer it hears of, B included
        await eventually(lambda: b.peer_id in a_dht.machine.routing_table)  # B answered A
        assert a.connection(b.peer_id) is None


async def test_a_provider_lookup_gives_a_private_providers_signed_relay_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(tmp_path, monkeypatch) as w:
        d, b, a, d_dht, b_dht, a_dht, addr = w.d, w.b, w.a, w.d_dht, w.b_dht, w.a_dht, w.addr
        assert (await b_dht.add_provider(KEY)).ok
        [held] = d_dht.machine.held_providers(d.clock.now(), KEY)
        assert held.relay_addrs == (str(addr),)
        a_dht.start([d.addrs[0]])
        await eventually(lambda: a_dht.ready)
        [record] = await a_dht.get_providers(KEY)
        assert record.provider == b.peer_id and record.relay_addrs == (str(addr),)
        # What a state pull dials (``StateService.find_sources``): the plain addresses, then the relay's.
        dialable: list[Dialable] = [Multiaddr.parse(x) for x in record.addrs]
        dialable += [CircuitAddr.parse(x) for x in record.relay_addrs]
        existing = a.relayed_connection(b.peer_id)
        if existing is not None:  # the lookup itself may have asked B, through R
            await existing.aclose()
            await eventually(lambda: a.relayed_connection(b.peer_id) is None)
        connection = await reach(a, b.peer_id, dialable, relay_after_s=0.1)
        assert connection.relayed and connection.remote_peer == b.peer_id


async def test_a_private_node_announces_its_relay_address_in_the_dht_and_state_sources_carry_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Peers: R, then S (private: it reserves at R) and N bootstrapping from R; S and N cannot dial each other.
    async with star(tmp_path, monkeypatch, lambda c: c.replace(reservations=PRIVATE)) as (r, s, n):
        await eventually(lambda: r.dht.machine.known_relay_addrs(s.peer_id) != (), timeout_s=20.0)
        [addr] = r.dht.machine.known_relay_addrs(s.peer_id)  # the node told its DHT once it reserved
        assert CircuitAddr.parse(addr).relay_peer == r.peer_id
        store = SnapshotStore(s.config.transfer)
        store.publish("run", 1, {"w": np.arange(4096, dtype=np.float32)})
        await s.serve_state(store, runs=["run"])
        key = run_provider_key("run")
        await eventually(lambda: r.dht.machine.held_providers(r.clock.now(), key) != [])  # S announced it
        [source] = await n.state.find_sources("run", limit=4)
        # From S's provider record: what a state pull dials (reach: direct first, then this).
        assert source.peer == s.peer_id and CircuitAddr.parse(addr) in source.addrs


async def test_the_dht_goes_only_through_announced_relays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lookup meets many peers: one that cannot be dialled and announced no relay address is
    # reported unreachable at once, not after a circuit request at every relay A is connected to.
    async with world(tmp_path, monkeypatch) as w:
        await w.a.connect(w.r.addrs[0])  # A is connected to the relay B reserved at
        with pytest.raises(PeerUnreachable, match="timed out"):
            await reach(w.a, w.b.peer_id, w.b.addrs, relay_after_s=0.05, any_relay=False)
        assert w.a.relayed_connection(w.b.peer_id) is None
        connection = await reach(w.a, w.b.peer_id, [*w.b.addrs, w.addr], relay_after_s=0.05, any_relay=False)
        assert connection.relayed and connection.remote_peer == w.b.peer_id
