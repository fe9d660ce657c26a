"""Reachability by dial-back over real loopback sockets (``/chaos/dialback/1``, ``protocols/reachability.md``).

A asks S to dial it back: with A's listener open S completes a handshake with A there (public);
with A's listener closed S cannot (private). A request naming a third party's address (another IP)
is refused and that party sees no connection; the node reports the result under ``reachability``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from chaosp2p import PeerConfig
from chaosp2p.protocols.reachability import DialBackCode, Reachability, ReachabilityConfig
from chaosp2p.runtime.node import open_node
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import Host, open_host
from chaosp2p.transport.reachability import ReachabilityService
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(handshake_timeout_s=2.0, connect_timeout_s=1.0, request_timeout_s=5.0)
REACH = ReachabilityConfig.local()


@asynccontextmanager
async def hosts(count: int, *, listen: tuple[str, ...] = ()) -> AsyncIterator[list[tuple[Host, ReachabilityService]]]:
    """``count`` hosts with a dial-back service each, listening on 127.0.0.1 (or ``listen[i]``)."""
    async with AsyncExitStack() as stack:
        made = []
        for index in range(count):
            host = await stack.enter_async_context(open_host(Identity.generate(), CONFIG))
            service = ReachabilityService(host, REACH)
            await host.listen(listen[index] if index < len(listen) else "/ip4/127.0.0.1/tcp/0")
            made.append((host, service))
        yield made


async def test_a_peer_whose_listener_answers_is_public_and_one_whose_listener_is_closed_is_private() -> None:
    async with hosts(2) as [(a, a_reach), (s, _)]:
        await a.connect(s.addrs[0])
        assert a_reach.servers() == [s.peer_id]
        assert await a_reach.check() is Reachability.PUBLIC
        assert a_reach.machine.confirmed_addrs() == [str(a.listen_addrs[0])]

        a._listeners[0].close()  # nobody answers at A's announced address any more (a firewall's view)
        assert await a_reach.check() is Reachability.PRIVATE
        [answer] = a_reach.machine.answers()
        assert not answer.reached
        assert a.connection(s.peer_id) is not None  # the check changed nothing else


async def test_a_request_naming_a_third_partys_address_is_refused_and_nobody_is_dialed() -> None:
    # C listens on another loopback IP (127.0.0.2): to S it is a third party, not A.
    async with hosts(3, listen=("/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.2/tcp/0")) as made:
        [(a, a_reach), (s, s_reach), (c, _)] = made
        await a.connect(s.addrs[0])
        response = await a_reach.ask(
            s.peer_id, [str(c.listen_addrs[0]), f"/ip4/10.255.255.1/tcp/{a.listen_addrs[0].port}"]
        )
        assert response.code == DialBackCode.BAD_REQUEST
        assert "127.0.0.1" in response.reason
        assert s_reach.gate.statistics().refused_address == 1
        stats = c.statistics()
        assert stats.handshakes_completed == 0 and stats.handshakes_failed == 0 and stats.pending_handshakes == 0


async def test_a_requester_beyond_its_rate_is_refused() -> None:
    async with hosts(2) as [(a, a_reach), (s, _)]:
        await a.connect(s.addrs[0])
        codes = [(await a_reach.ask(s.peer_id)).code for _ in range(int(REACH.request_burst) + 1)]
        assert codes[:-1] == [DialBackCode.OK] * int(REACH.request_burst)
        assert codes[-1] == DialBackCode.REFUSED


async def test_a_node_checks_in_the_background_and_reports_reachability_in_status() -> None:
    reach = ReachabilityConfig.local().__class__(probe=True, min_confirmations=1, first_probe_delay_s=0.1)
    async with open_node(PeerConfig.local()) as server:
        config = PeerConfig.local(bootstrap=(str(server.addrs[0]),), reachability=reach)
        async with open_node(config) as node:
            await eventually(lambda: node.reachability.reachability is Reachability.PUBLIC)
            shown = node.status_report().to_json()["reachability"]
            assert shown["status"] == "public"
            assert shown["addrs"] == [str(node.host.listen_addrs[0])]
            assert shown["reached"] == 1 and shown["not_reached"] == 0
            assert server.status_report().to_json()["reachability"]["status"] == "unknown"  # local: no checks
