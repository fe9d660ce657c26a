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
from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.reachability import PROTOCOL_ID, DialBackCode, Reachability, ReachabilityConfig, answer, codec
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


async def test_an_address_dial_back_proved_is_announced_first_and_others_dial_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A listens on every interface, and its only interface address (198.18.0.77, nothing routes
    # there) is what a host behind a port-forwarding NAT has: nobody can dial it. S1 and S2 see A
    # come from 127.0.0.1 and reach it there; once both did, A announces 127.0.0.1 first, and a
    # peer that knows A only from the membership gossip dials it there.
    monkeypatch.setattr("chaosp2p.transport.host.interface_addresses", lambda family: ["198.18.0.77"])
    reach = ReachabilityConfig.local().__class__(probe=True, min_confirmations=2, first_probe_delay_s=0.1)
    async with open_node(PeerConfig.local()) as s1, open_node(PeerConfig.local()) as s2:
        config = PeerConfig.local(
            listen=("/ip4/0.0.0.0/tcp/0",), bootstrap=(str(s1.addrs[0]), str(s2.addrs[0])), reachability=reach
        )
        async with open_node(config) as a:
            [listen] = a.host.listen_addrs
            assert listen.host == "198.18.0.77"
            proven = f"/ip4/127.0.0.1/tcp/{listen.port}"
            await eventually(lambda: a.announced.external == [proven])
            assert a.reachability.machine.working_addrs() == [proven]
            assert a.dht.machine.listen_addrs[0] == proven
            assert a.membership.machine.addresses(a.peer_id)[0] == proven
            await eventually(lambda: s1.membership.machine.addresses(a.peer_id)[:1] == (proven,))
            async with open_node(PeerConfig.local(bootstrap=(str(s1.addrs[0]),))) as c:
                await eventually(lambda: c.membership.machine.addresses(a.peer_id)[:1] == (proven,))
                connection = await c.connect(c.membership.machine.dial_addrs(a.peer_id)[0].with_peer(a.peer_id))
                assert connection.remote_peer == a.peer_id


async def test_one_servers_word_does_not_make_an_address_announced() -> None:
    # min_confirmations = 2, and only one server reached A at an address: nothing is announced.
    reach = ReachabilityConfig.local().__class__(probe=True, min_confirmations=2, first_probe_delay_s=0.1)
    async with open_node(PeerConfig.local()) as s1:
        config = PeerConfig.local(bootstrap=(str(s1.addrs[0]),), reachability=reach)
        async with open_node(config) as a:
            await eventually(lambda: a.reachability.machine.checks >= 1 and bool(a.reachability.machine.answers()))
            assert a.reachability.machine.confirmed_addrs()  # the one server did reach it
            assert a.reachability.machine.working_addrs() == []
            assert a.announced.external == []


async def test_an_ok_naming_an_address_we_did_not_ask_about_counts_as_no_answer() -> None:
    # A lying server: "reached you at 198.18.0.66" (someone else's address, were we to announce it).
    async with hosts(2) as [(a, a_reach), (s, _)]:

        async def liar(connection: object, request: object) -> object:
            return codec.to_obj(answer(DialBackCode.OK, addr="/ip4/198.18.0.66/tcp/4001"))

        s.set_request_handler(PROTOCOL_ID, liar)
        await a.connect(s.addrs[0])
        with pytest.raises(RemoteProtocolError, match="an address we did not name"):
            await a_reach.ask(s.peer_id)
        assert await a_reach.check() is Reachability.UNKNOWN
        assert a_reach.machine.confirmed_addrs() == [] and a_reach.machine.working_addrs() == []
