"""A newcomer to a training run loads only the state the run vouches for (issue 10, item 1).

In-process peers on 127.0.0.1, as in ``test_collaboration.py``. One of three members lies: asked
for a snapshot of step s, it answers at once -- before the honest members have even reached s --
with a different state, which it publishes and signs with its real identity key. The newcomer
takes its snapshot from a single member (``max_snapshot_sources=1``), so before vouching it took
the first answer, the liar's, and trained on from a substituted state. Now it must refuse the
liar's state (a quorum of the configuration vouches for the honest one), load the honest state
from a member that vouched for it, and hold parameters bit-identical to the members' afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

torch = pytest.importorskip("torch")

import chaosp2p  # noqa: E402
from chaosp2p.api.async_peer import AsyncPeer  # noqa: E402
from chaosp2p.protocols.collab.messages import SnapshotReply, SnapshotRequest  # noqa: E402
from chaosp2p.protocols.collab.vouch import sign_vouch, vouched_reply  # noqa: E402
from chaosp2p.protocols.membership import MembershipConfig  # noqa: E402
from chaosp2p.state.torch_adapter import publish_torch  # noqa: E402
from chaosp2p.training import AsyncCollaboration, CollaborationConfig  # noqa: E402

from ..conditions import all_see_alive, eventually  # noqa: E402

pytestmark = pytest.mark.anyio
RUN = "vouched-run"
GLOBAL_BATCH = 12
EXTRA_STEPS = 8


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


class LyingCollaboration(AsyncCollaboration):
    """Trains honestly, but serves and vouches for a substituted state to every newcomer."""

    lied_about: list[int]

    async def handle_snapshot_request(self, request: SnapshotRequest) -> SnapshotReply:
        # The lie is built on a copy: the live model may be mid-step in a worker thread (the optimizer
        # steps off the event loop), so touching it here would make the liar's own training diverge.
        model, optimizer = copy.deepcopy((self.model, self.optimizer))
        with torch.no_grad():
            next(iter(model.parameters())).add_(0.25)
        info = publish_torch(self.service.store, self.run, request.step, model, optimizer)
        if not self._serving:
            await self.port.serve_state(self.service.store, runs=[self.run])
            self._serving = True
        config = self.configuration
        vouch = sign_vouch(
            self.port.identity,
            run=self.run,
            step=request.step,
            state_digest=info.digest,
            config_digest=config.digest,
        )
        self.lied_about.append(request.step)
        return vouched_reply(vouch, config, asker_config_digest=request.config_digest)


class Member:
    """One peer training the run until the shared target step."""

    def __init__(self, peer: AsyncPeer, *, liar: bool = False, **config: Any) -> None:
        self.peer = peer
        model, optimizer = _model()
        settings = CollaborationConfig.local(global_batch=GLOBAL_BATCH, round_timeout_min_s=3.0, **config)
        cls = LyingCollaboration if liar else AsyncCollaboration
        self.collab = cls(
            peer.training_port, peer.training, run=RUN, model=model, optimizer=optimizer, config=settings
        )
        if liar:
            self.collab.lied_about = []  # type: ignore[attr-defined]
        self.digests: dict[int, str] = {}

    async def train(self, target: list[int | None]) -> None:
        """Step until ``target[0]`` is set and reached (the members wait for the newcomer)."""
        while target[0] is None or self.collab.step_index < target[0]:
            step = self.collab.step_index
            start, stop = self.collab.batch_slice()
            generator = torch.Generator().manual_seed(step)
            x = torch.randn(GLOBAL_BATCH, 8, generator=generator)[start:stop]
            y = torch.randint(0, 2, (GLOBAL_BATCH,), generator=generator)[start:stop]
            self.collab.optimizer.zero_grad()
            torch.nn.functional.cross_entropy(self.collab.model(x), y).backward()
            await anyio.sleep(0.01)  # stands in for compute, so the join overlaps training
            result = await self.collab.step(samples=stop - start)
            self.digests[result.step] = self.collab.parameter_digest()


@asynccontextmanager
async def swarm(count: int) -> AsyncIterator[list[AsyncPeer]]:
    def config(**changes: Any) -> chaosp2p.PeerConfig:
        # lan failure detection: several peers share this event loop on a possibly busy machine.
        return chaosp2p.PeerConfig.local(membership=MembershipConfig.lan(), **changes)

    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(chaosp2p.open_peer(config()))
        peers = [first]
        for _ in range(count - 1):
            peers.append(await stack.enter_async_context(chaosp2p.open_peer(config(bootstrap=[str(first.addrs[0])]))))
        # Membership views converge by gossip; there is no single event to wait on.
        await eventually(lambda: all_see_alive(peers, count), timeout_s=30, interval_s=0.05)
        yield peers


async def test_a_member_serving_another_state_is_refused_and_the_vouched_state_loads_bit_exact() -> None:
    async with swarm(4) as peers:
        founder, honest = Member(peers[0]), Member(peers[1])
        liar = Member(peers[2], liar=True)
        newcomer = Member(peers[3], max_snapshot_sources=1)
        target: list[int | None] = [None]
        await founder.collab.start(found=True)
        with anyio.fail_after(100):
            async with anyio.create_task_group() as tg:
                tg.start_soon(founder.train, target)

                async def join_and_train(member: Member) -> None:
                    await member.collab.start(found=False)
                    await member.train(target)

                tg.start_soon(join_and_train, honest)
                tg.start_soon(join_and_train, liar)
                # The newcomer asks once the run has its three members (a condition, not a delay).
                await eventually(
                    lambda: len(founder.collab.configuration.participants(founder.collab.step_index)) >= 3,
                    timeout_s=100,
                    interval_s=0.02,
                )
                admitted = await newcomer.collab.start(found=False)
                target[0] = admitted + EXTRA_STEPS
                await newcomer.train(target)
        # Bit-exact: from its admission on, the newcomer's parameters equal every member's.
        for step in range(admitted, admitted + EXTRA_STEPS):
            roles = {"founder": founder, "honest": honest, "liar": liar, "newcomer": newcomer}
            by_role = {role: m.digests.get(step) for role, m in roles.items()}
            assert len(set(by_role.values())) == 1, f"members differ after step {step}: {by_role}"
        assert liar.collab.lied_about, "the liar was never asked for a snapshot"
        (joined,) = [r for r in newcomer.collab.take_events() if r.get("event") == "joined"]
        assert str(liar.peer.peer_id) in joined["refused"], joined
        assert "another state" in joined["refused"][str(liar.peer.peer_id)]
        assert joined["vouchers"] >= 2 and joined["sources"] == 1
        assert str(liar.peer.peer_id) not in joined["bytes_by_source"]
