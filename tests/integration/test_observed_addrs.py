"""A host learns the address others see it at from their hellos (issue 21, deliverable 2)."""

from __future__ import annotations

import pytest

from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = TransportConfig(handshake_timeout_s=2.0, connect_timeout_s=0.5, request_timeout_s=5.0)


async def test_each_side_learns_where_the_other_saw_it() -> None:
    async with open_host(Identity.generate(), CONFIG) as a, open_host(Identity.generate(), CONFIG) as b:
        await a.listen("/ip4/127.0.0.1/tcp/0")
        await b.listen("/ip4/127.0.0.1/tcp/0")
        await a.connect(b.addrs[0])
        # A dialled: B saw A's outbound socket (an ephemeral port), not A's listener.
        await eventually(lambda: len(a.observed.all()) == 1 and len(b.observed.all()) == 1)
        (seen_a,) = a.observed.all()
        assert seen_a.host == "127.0.0.1" and seen_a.port != a.listen_addrs[0].port
        # B accepted: A saw the address it dialled.
        assert [str(x) for x in b.observed.all()] == [str(b.listen_addrs[0])]
        assert a.observed.confirmed() == []  # one observer is a claim, not a confirmation
