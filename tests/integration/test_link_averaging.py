"""Averaging across a cut link (issue 19), over real encrypted loopback connections in one process.

The transport's link shaper (the cluster harness's network emulation) cuts the link between two of
four averagers: records are held and new dials fail, as across a firewall. The full butterfly then
fails -- early, once an unanswered ping shows the pair is cut -- and each end of the cut, and only
they, name the other as unreachable first-hand (the evidence behind a LINK_DOWN); the plan on the
agreed link graph, where the cut is down, completes with bit-identical results on all four.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

from chaosp2p.errors import RoundAborted
from chaosp2p.protocols.averaging.link_plan import link_bandwidths
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules

from ..conditions import eventually
from .test_averager import CONFIG, Member, Swarm, make_buffers, reduce_call, run_all, swarm, tag, weighted_mean

pytestmark = pytest.mark.anyio


def _rewrite(path: Path, rules: dict[str, LinkRule], generation: int) -> None:
    write_link_rules(path, rules)
    os.utime(path, ns=(generation * 10**9, generation * 10**9))  # a fresh mtime on coarse clocks


@asynccontextmanager
async def shaped_swarm(count: int, folder: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Swarm]:
    """``count`` connected averagers, each host reading its own (empty) link rules file."""

    def shaped(index: int) -> PeerConfig:
        rules = folder / f"rules-{index}.json"
        _rewrite(rules, {}, 1)
        monkeypatch.setenv(LINK_RULES_ENV, str(rules))  # read by the host as it opens
        # A cut connection is not closed as dead during the test (the transport would after
        # dead_connection_timeout_s): what ends the round is the averager's own ping.
        transport = dataclasses.replace(TransportConfig.local(), dead_connection_timeout_s=120.0)
        return PeerConfig.local(transport=transport)

    async with swarm(count, configs=[CONFIG] * count, peer_config=shaped) as s:
        monkeypatch.delenv(LINK_RULES_ENV)
        yield s


async def _cut(s: Swarm, folder: Path, a: Member, b: Member) -> None:
    index = {id(m): i for i, m in enumerate(s.members)}
    _rewrite(folder / f"rules-{index[id(a)]}.json", {str(b.peer): LinkRule(cut=True)}, 2)
    _rewrite(folder / f"rules-{index[id(b)]}.json", {str(a.peer): LinkRule(cut=True)}, 2)

    def both_cut() -> bool:
        assert a.node.host.links is not None and b.node.host.links is not None
        return a.node.host.links.is_cut(b.peer) and b.node.host.links.is_cut(a.peer)

    await eventually(both_cut)


def _ring(s: Swarm) -> Sequence[Member]:
    return s.by_peer()


async def test_a_cut_link_is_named_by_its_two_ends_only_and_the_link_plan_goes_around_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with shaped_swarm(4, tmp_path, monkeypatch) as s:
        members = _ring(s)
        a, b = members[0], members[1]
        await _cut(s, tmp_path, a, b)
        buffers = make_buffers(4, 50_000, seed=19)

        # The full butterfly needs a~b: the round fails; a and b name each other, nobody else names
        # anyone. Not at the round's timeout (60 s): once every other owner answered, a and b ping
        # each other, and the unanswered ping ends the round (within the 20 s bound of run_all).
        full = [reduce_call(s, m, buffers[i].copy(), round_tag=tag(1), timeout_s=60.0) for i, m in enumerate(members)]
        outcomes = await run_all(full, bound_s=20)
        assert all(kind == "error" and isinstance(error, RoundAborted) for kind, error in outcomes), outcomes
        unreachable = {m.peer: m.averager.unreachable(tag(1)) for m in members}
        assert unreachable[a.peer] == frozenset({b.peer})
        assert unreachable[b.peer] == frozenset({a.peer})
        assert unreachable[members[2].peer] == unreachable[members[3].peer] == frozenset()

        # The plan on the agreed link graph (a~b down): a and b own nothing and exchange nothing.
        x, y = sorted((a.peer, b.peer), key=lambda p: p.raw)
        links = [LinkEntry(a=x, b=y, up=False)]
        bandwidth = dict(link_bandwidths(s.peers, links))
        assert bandwidth[a.peer] == bandwidth[b.peer] == 0.0
        out = [buffer.copy() for buffer in buffers]
        calls = [
            reduce_call(s, m, out[i], round_tag=tag(2), timeout_s=10.0, bandwidth=bandwidth)  # type: ignore[arg-type]
            for i, m in enumerate(members)
        ]
        outcomes = await run_all(calls, bound_s=30)
        assert all(kind == "ok" for kind, _ in outcomes), outcomes
        expected = weighted_mean(buffers, [1.0] * 4)
        for buffer in out:
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
            assert buffer.tobytes() == out[0].tobytes()


async def test_a_member_ahead_does_not_fail_a_round_in_which_this_member_owns_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 64-element buffer is one block: the first member owns it, the others own empty shards and
    # only wait for its answer. A contribution to the *next* round (a big buffer, where everyone
    # owns a shard) from a member that has not contributed here is no proof of disagreement for an
    # owner of an empty shard: nobody contributes to it, and the sender may have completed the round.
    async with shaped_swarm(3, tmp_path, monkeypatch) as s:
        _owner, waiting, ahead = _ring(s)
        small = np.ones(64, dtype=np.float32)
        big = np.ones(30_000, dtype=np.float32)
        outcomes = await run_all(
            [
                reduce_call(s, waiting, small, round_tag=tag(1), timeout_s=2.0),
                reduce_call(s, ahead, big, round_tag=tag(2), timeout_s=2.0),
            ],
            bound_s=20,
        )
        # The owner never started round 1, so it times out -- but as an abort, not a mismatch.
        kind, error = outcomes[0]
        assert kind == "error" and isinstance(error, RoundAborted), outcomes
