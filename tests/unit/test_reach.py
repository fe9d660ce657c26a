"""Reaching a peer directly or through a relay (chaosp2p/transport/reach.py), on a fake host.

The fake's ways to the peer are shielded from cancellation, as the last step of a real handshake
may be, and the relayed one completes right after the direct one: both complete before the
winner's cancellation could stop the other -- the race a real host runs into when both finish at
once. Exactly one connection must stay open.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from chaosp2p.errors import PeerUnreachable
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.reach import reach
from chaosp2p.wire.identity import Identity, PeerID

pytestmark = pytest.mark.anyio

PEER = Identity.from_seed(b"\x09" * 32).peer_id


class FakeConnection:
    """A connection that records being closed."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.reason = ""

    async def aclose(self, reason: str = "closed locally") -> None:
        self.closed = True
        self.reason = reason


class FakeRelay:
    def __init__(self, host: FakeHost) -> None:
        self.host = host

    async def connect(self, peer: PeerID) -> FakeConnection:
        self.host.relay_started.set()
        with anyio.CancelScope(shield=True):
            await self.host.direct_connected.wait()
        return self.host.relayed


class FakeHost:
    """A direct way to PEER that connects once ``go`` is set (or fails at once), and a relayed
    way that connects right after the direct one."""

    def __init__(self, *, relay_after_s: float = 1.0, direct_fails: bool = False) -> None:
        self.config = dataclasses.replace(TransportConfig.lan(), relay_after_s=relay_after_s)
        self.direct = FakeConnection("direct")
        self.relayed = FakeConnection("relayed")
        self.direct_fails = direct_fails
        self.go = anyio.Event()
        self.direct_started = anyio.Event()
        self.relay_started = anyio.Event()
        self.direct_connected = anyio.Event()
        self.relay = FakeRelay(self)
        self.relayed_appears = False
        """Another task's relayed connection appears once reach() looked for one (it is then reused)."""
        self._looked = False

    def connection(self, peer: PeerID) -> FakeConnection | None:
        return None

    def relayed_connection(self, peer: PeerID) -> FakeConnection | None:
        seen, self._looked = self._looked, True
        return self.relayed if self.relayed_appears and seen else None

    async def connection_to(self, peer: PeerID, addrs: Any) -> FakeConnection:
        self.direct_started.set()
        if self.direct_fails:
            self.direct_connected.set()
            raise PeerUnreachable("fake: no route")
        with anyio.CancelScope(shield=True):
            await self.go.wait()
        self.direct_connected.set()
        return self.direct


async def _race(host: FakeHost, **options: Any) -> Any:
    """reach(); the direct way connects once both ways are under way (only it, with a head start
    the test never lets pass)."""

    async def release() -> None:
        await host.direct_started.wait()
        if options.get("relay_after_s", host.config.relay_after_s) == 0.0:
            await host.relay_started.wait()
        host.go.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(release)
            return await reach(host, PEER, [], **options)  # type: ignore[arg-type]


async def test_when_both_ways_connect_the_losers_connection_is_closed_and_exactly_one_stays() -> None:
    host = FakeHost()
    assert await _race(host, relay_after_s=0.0) is host.direct
    assert not host.direct.closed
    assert host.relayed.closed and "connected first" in host.relayed.reason


async def test_a_losing_connection_another_task_opened_is_shared_and_stays_open() -> None:
    host = FakeHost()
    host.relayed_appears = True
    assert await _race(host, relay_after_s=0.0) is host.direct
    assert not host.direct.closed and not host.relayed.closed


async def test_the_head_start_comes_from_the_hosts_transport_config() -> None:
    # No head start in the config: the relay is tried at once (and its connection closed as the loser).
    eager = FakeHost(relay_after_s=0.0)
    assert await _race(eager) is eager.direct and eager.relayed.closed
    # A head start the direct way beats: the relay is never tried.
    patient = FakeHost(relay_after_s=3600.0)
    assert await _race(patient) is patient.direct and not patient.relay_started.is_set()
    # A failed direct dial ends the head start at once.
    failing = FakeHost(relay_after_s=3600.0, direct_fails=True)
    failing.direct_connected.set()  # the relayed way needs no wait here
    with anyio.fail_after(5):
        assert await reach(failing, PEER, []) is failing.relayed  # type: ignore[arg-type]


def test_profiles_give_the_direct_dial_a_head_start_that_grows_with_distance() -> None:
    local, lan, wan = TransportConfig.local(), TransportConfig.lan(), TransportConfig.wan()
    assert local.relay_after_s < lan.relay_after_s < wan.relay_after_s
    assert all(c.relay_after_s < c.connect_timeout_s for c in (local, lan, wan))
