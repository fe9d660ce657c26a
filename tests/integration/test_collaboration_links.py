"""Four members train through a link cut for good between two of them (issue 19).

Real peers (:func:`chaosp2p.open_peer`, encrypted TCP on 127.0.0.1) in one event loop, each host
reading its own link rules file (the cluster harness's network emulation). After a few steps the
link between two members is cut and never restored: the first round after the cut fails, its two
ends declare the link down first-hand at once (LINK_DOWN signed by an endpoint), the run agrees on a
configuration whose link plan gives neither end a shard, and all four keep stepping with
bit-identical parameters at every shared step. On ``main`` every member stalled after the cut.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pytest

torch = pytest.importorskip("torch")

import chaosp2p  # noqa: E402
from chaosp2p.api.async_peer import AsyncPeer  # noqa: E402
from chaosp2p.transport.shaper import LINK_RULES_ENV, LinkRule, write_link_rules  # noqa: E402

from ..conditions import all_see_alive, eventually  # noqa: E402
from .test_collaboration import Member, _agree, _config  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _rewrite(path: Path, rules: dict[str, LinkRule], generation: int) -> None:
    write_link_rules(path, rules)
    os.utime(path, ns=(generation * 10**9, generation * 10**9))


@asynccontextmanager
async def shaped_swarm(count: int, folder: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[AsyncPeer]]:
    async with AsyncExitStack() as stack:
        peers: list[AsyncPeer] = []
        for index in range(count):
            rules = folder / f"rules-{index}.json"
            _rewrite(rules, {}, 1)
            monkeypatch.setenv(LINK_RULES_ENV, str(rules))
            config = _config() if not peers else _config(bootstrap=[str(peers[0].addrs[0])])
            peers.append(await stack.enter_async_context(chaosp2p.open_peer(config)))
        monkeypatch.delenv(LINK_RULES_ENV)
        await eventually(lambda: all_see_alive(peers, count), timeout_s=20, interval_s=0.05)
        yield peers


async def test_four_members_keep_training_with_equal_digests_through_a_permanent_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with shaped_swarm(4, tmp_path, monkeypatch) as peers:
        members = [Member(p, i) for i, p in enumerate(peers)]
        await members[0].collab.start(found=True)

        async def join_and_train(member: Member, steps: int) -> None:
            await member.collab.start(found=False)
            await member.train_until(steps)

        async with anyio.create_task_group() as tg:
            tg.start_soon(members[0].train_until, 30)
            for member in members[1:]:
                tg.start_soon(join_and_train, member, 30)
        assert all(m.members[29] == 4 for m in members), "everyone joined"

        # Cut the link between two members for good.
        a, b = members[1], members[2]
        _rewrite(tmp_path / "rules-1.json", {str(b.peer.peer_id): LinkRule(cut=True)}, 2)
        _rewrite(tmp_path / "rules-2.json", {str(a.peer.peer_id): LinkRule(cut=True)}, 2)
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for member in members:
                    tg.start_soon(member.train_until, 60)
        _agree(members, range(29, 60))
        assert all(m.members[59] == 4 for m in members), "nobody was removed: the cut only moved the shards"
        governing = members[0].collab.configuration
        link = governing.link(a.peer.peer_id, b.peer.peer_id)
        assert link is not None and not link.up, "the run agreed that the cut link is down"
