"""The runtime's membership handler checks a sender's budgets before it decodes (issue 20, finding 7).

A fake host hands the handler datagrams as a connection's reader would; no sockets.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from chaosp2p.clock import VirtualClock
from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.membership import MembershipConfig
from chaosp2p.protocols.membership import codec as membership_codec
from chaosp2p.protocols.membership.messages import Gossip, MemberUpdate, Ping, UpdateKind
from chaosp2p.runtime.membership_service import MembershipService
from chaosp2p.transport.config import TransportConfig
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr
from tests.unit.membership_claims import identity, peer

pytestmark = pytest.mark.anyio


class FakeHost:
    """Enough of a Host for the membership service: it records the handlers registered on it."""

    def __init__(self) -> None:
        self.identity = identity(0)
        self.peer_id = self.identity.peer_id
        self.listen_addrs = [Multiaddr.parse("/ip4/127.0.0.1/tcp/4001")]
        self.config = TransportConfig.local()
        self.handlers: dict[str, Callable[[Any, bytes], None]] = {}

    def set_message_handler(self, protocol: Any, handler: Callable[[Any, bytes], None]) -> None:
        self.handlers[getattr(protocol, "name", protocol)] = handler

    def set_stream_handler(self, protocol: Any, handler: Any) -> None:
        pass

    def connection(self, peer: PeerID) -> None:
        return None

    async def connection_to(self, peer: PeerID, addrs: Any = ()) -> Any:
        raise PeerUnreachable(f"{peer} is not reachable from a fake host")


class FakeConnection:
    """The handler reads only who is on the other end."""

    def __init__(self, remote_peer: PeerID) -> None:
        self.remote_peer = remote_peer


async def test_datagrams_over_a_sender_s_budget_are_dropped_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20, finding 7: each membership datagram was decoded (~0.1 s per MiB) before the rate limit."""
    host = FakeHost()
    config = MembershipConfig.lan()
    decoded: list[int] = []
    real_decode = membership_codec.decode

    def counting_decode(body: bytes, *, max_bytes: int) -> Any:
        decoded.append(len(body))
        return real_decode(body, max_bytes=max_bytes)

    monkeypatch.setattr(membership_codec, "decode", counting_decode)
    async with anyio.create_task_group() as tg:
        service = MembershipService(
            host=host,  # type: ignore[arg-type]
            clock=VirtualClock(),  # time stands still: no budget refills during the flood
            config=config,
            rng=random.Random(1),
            task_group=tg,
            publish=lambda event: None,
            dht_contacts=lambda: [],
        )
        handler = host.handlers["membership"]
        # ~48 KB of hints about peers nobody knows: valid, answered by nothing, costly to decode.
        hints = tuple(MemberUpdate(kind=UpdateKind.SUSPECT, peer=peer(i % 200 + 1), incarnation=0) for i in range(1000))
        body = membership_codec.encode(Gossip(updates=hints))
        flooder = FakeConnection(peer(9))
        for _ in range(300):
            handler(flooder, body)
        budget = int(config.rate_limit_burst_bytes // len(body))  # the byte budget's burst
        assert len(decoded) == budget < 50
        assert service.machine.statistics().rate_limited == 300 - budget
        # Another sender is served as usual.
        handler(FakeConnection(peer(10)), membership_codec.encode(Ping(seq=1)))
        assert decoded[-1] == len(membership_codec.encode(Ping(seq=1)))
        tg.cancel_scope.cancel()
