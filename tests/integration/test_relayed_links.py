"""A link its run holds usable but that this host reaches only through a relay is declared down
first-hand (``protocols/negotiation.md`` §3d), before a round needs it.

In the four-peer star across NAT (``peers/nat-star.toml``, docs/results.md) the links between a
newcomer and the trainers it reached only through the public peer's relay were assumed up at its
join; the first step whose plan used one stalled until that round's direct dial timed out (6.4 s).
Here S and N, cut from each other and members of one run with R, hold a relayed connection: N's
direct probe of S fails and N declares the S~N link down, so the plan relays the pair from then on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from chaosp2p.protocols.negotiation import RunParams
from chaosp2p.transport.reach import reach

from ..conditions import eventually
from .test_reach_through_relay import star

pytestmark = pytest.mark.anyio

RUN = "relayed-links"


async def test_a_link_reached_only_through_a_relay_is_declared_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chaosp2p.negotiation")
    async with star(tmp_path, monkeypatch) as (r, s, n):
        r.negotiation.create_run(RUN, RunParams(global_batch=4))
        for peer in (s, n):
            incarnation = peer.membership.own_incarnation()
            await peer.negotiation.join(RUN, r.peer_id, incarnation=incarnation, throughput=1.0, timeout_s=20.0)
        relayed = await reach(n.host, s.peer_id, s.addrs, relay_after_s=0.2)
        assert relayed.relayed and n.host.connection(s.peer_id) is None

        def agreed_down() -> bool:
            config = r.negotiation.configuration(RUN)
            link = None if config is None else config.link(s.peer_id, n.peer_id)
            return link is not None and not link.up

        await eventually(agreed_down, timeout_s=20.0)
        lines = [rec.getMessage() for rec in caplog.records if "only through a relay" in rec.getMessage()]
        assert lines and "link declared down" in lines[0], lines
        # R's links are direct: nothing else was declared down.
        config = r.negotiation.configuration(RUN)
        assert config is not None and config.link(r.peer_id, s.peer_id) is None
        assert config.link(r.peer_id, n.peer_id) is None
