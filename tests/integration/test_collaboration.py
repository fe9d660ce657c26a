"""Collaborations among in-process peers on 127.0.0.1: averaging, joins, leaves and failures.

Each peer is a real :func:`chaosp2p.open_peer` with its own transport (encrypted TCP on loopback);
they share one event loop, so the test drives every member's training loop as a task. Gradients are
synthetic but deterministic per (member, step); what is checked is the protocol's promise: every
member of a synchronous run holds bit-identical parameters after every step, through a join, a
graceful leave and a crash.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

torch = pytest.importorskip("torch")

import chaosp2p  # noqa: E402
from chaosp2p.api.async_peer import AsyncPeer  # noqa: E402
from chaosp2p.errors import ChaosError  # noqa: E402
from chaosp2p.protocols.membership import MembershipConfig  # noqa: E402
from chaosp2p.training import AsyncCollaboration, CollaborationConfig, TrainingError  # noqa: E402

from ..conditions import all_see_alive, eventually  # noqa: E402

pytestmark = pytest.mark.anyio
RUN = "test-run"
GLOBAL_BATCH = 12


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


class Member:
    """One peer training the test run."""

    def __init__(self, peer: AsyncPeer, seed: int, **changes: object) -> None:
        self.peer = peer
        self.seed = seed
        model, optimizer = _model()
        config = CollaborationConfig.local(global_batch=GLOBAL_BATCH, round_timeout_min_s=3.0, **changes)
        self.collab = AsyncCollaboration(
            peer.training_port, peer.training, run=RUN, model=model, optimizer=optimizer, config=config
        )
        self.digests: dict[int, str] = {}
        self.members: dict[int, int] = {}
        self.compute_s = 0.005  # stands in for compute, so joins overlap training

    async def train_until(self, steps: int) -> None:
        while self.collab.step_index < steps:
            step = self.collab.step_index
            start, stop = self.collab.batch_slice()
            generator = torch.Generator().manual_seed(step)
            x = torch.randn(GLOBAL_BATCH, 8, generator=generator)[start:stop]
            y = torch.randint(0, 2, (GLOBAL_BATCH,), generator=generator)[start:stop]
            self.collab.optimizer.zero_grad()
            torch.nn.functional.cross_entropy(self.collab.model(x), y).backward()
            await anyio.sleep(self.compute_s * (stop - start) / GLOBAL_BATCH * 2)  # compute ~ samples
            result = await self.collab.step(samples=stop - start)
            if result.step >= 0:  # a DiLoCo inner step reports -1
                self.digests[result.step] = self.collab.parameter_digest()
                self.members[result.step] = result.members


def _config(**changes: object) -> chaosp2p.PeerConfig:
    # Several peers share one event loop here (and the test machine may be busy): the lan failure
    # detector keeps a slow loop from being taken for a dead peer. Crashes are tested with processes.
    return chaosp2p.PeerConfig.local(membership=MembershipConfig.lan(), **changes)


@asynccontextmanager
async def swarm(count: int) -> AsyncIterator[list[AsyncPeer]]:
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(chaosp2p.open_peer(_config()))
        peers = [first]
        for _ in range(count - 1):
            config = _config(bootstrap=[str(first.addrs[0])])
            peers.append(await stack.enter_async_context(chaosp2p.open_peer(config)))
        # Membership views converge by gossip; there is no single event to wait on.
        await eventually(lambda: all_see_alive(peers, count), timeout_s=20, interval_s=0.05)
        try:
            yield peers
        finally:
            # Leave together: one after another, each leaver waits (up to 5 s) for a step that the
            # idle others never take; together, each sees every other member leaving and stops.
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    for peer in peers:
                        for collaboration in peer.training.collaborations():
                            tg.start_soon(collaboration.leave)


def _agree(members: list[Member], steps: range) -> None:
    for step in steps:
        digests = {m.digests.get(step) for m in members if step in m.digests}
        assert len(digests) == 1, f"members differ after step {step}: {digests}"


async def test_joiners_catch_up_and_every_member_holds_identical_parameters() -> None:
    async with swarm(3) as peers:
        founder, *newcomers = (Member(p, i) for i, p in enumerate(peers))
        await founder.collab.start(found=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(founder.train_until, 60)

            async def join_and_train(member: Member) -> None:
                await member.collab.start(found=False)
                await member.train_until(60)

            for member in newcomers:
                tg.start_soon(join_and_train, member)
        everyone = [founder, *newcomers]
        admitted = min(min(m.digests) for m in newcomers)
        assert admitted > 0, "the newcomers joined a run that had already trained"
        _agree(everyone, range(admitted, 60))
        assert max(founder.members.values()) == 3
        status = founder.peer.status_report()
        (run,) = status.runs
        assert run.run == RUN and len(run.members) == 3


async def test_the_sponsor_does_not_send_a_newcomer_the_updates_before_its_snapshot() -> None:
    async with swarm(2) as peers:
        founder, newcomer = Member(peers[0], 0), Member(peers[1], 1)
        await founder.collab.start(found=True)
        await founder.train_until(3)  # completed steps 0-2, then pauses
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:

                async def join_and_train() -> None:
                    await newcomer.collab.start(found=False)
                    await newcomer.train_until(12)

                tg.start_soon(join_and_train)
                # The newcomer observes the founder (completed 2) and asks for a snapshot of step
                # 2 + snapshot_ahead_steps = 4; only then does the founder train on.
                # No event marks a request's arrival.
                await eventually(lambda: founder.collab.snapshots.wanted(4), timeout_s=60)
                tg.start_soon(founder.train_until, 12)
        # Steps 3 and 4 were never sent to the newcomer (it replays from step 5 on), and it still
        # reached the founder's state exactly.
        assert founder.collab.feed.skipped == 2
        (joined,) = [r for r in newcomer.collab.take_events() if r.get("event") == "joined"]
        assert joined["snapshot_step"] == 4 and joined["replayed_steps"] >= 1
        _agree([founder, newcomer], range(min(newcomer.digests), 12))


async def test_after_a_graceful_leave_the_others_go_on_with_identical_parameters() -> None:
    async with swarm(3) as peers:
        members = [Member(p, i) for i, p in enumerate(peers)]
        await members[0].collab.start(found=True)

        async def join_and_train(member: Member) -> None:
            await member.collab.start(found=False)
            await member.train_until(20)

        async with anyio.create_task_group() as tg:
            tg.start_soon(members[0].train_until, 20)
            for member in members[1:]:
                tg.start_soon(join_and_train, member)
        survivors = members[:2]
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(members[2].collab.leave)  # the others train on meanwhile
                for member in survivors:
                    tg.start_soon(member.train_until, 35)
        _agree(survivors, range(20, 35))
        assert survivors[0].members[34] == 2


async def test_diloco_members_hold_identical_global_parameters_after_each_outer_step() -> None:
    async with swarm(2) as peers:
        members = []
        for index, peer in enumerate(peers):
            model, optimizer = _model()
            config = CollaborationConfig.local(global_batch=GLOBAL_BATCH, mode="diloco", local_steps=3)
            member = Member(peer, index)
            member.collab = AsyncCollaboration(
                peer.training_port, peer.training, run=RUN, model=model, optimizer=optimizer, config=config
            )
            members.append(member)
        await members[0].collab.start(found=True)

        async def join_and_train(member: Member) -> None:
            await member.collab.start(found=False)
            await member.train_until(8)

        async with anyio.create_task_group() as tg:
            tg.start_soon(members[0].train_until, 8)
            tg.start_soon(join_and_train, members[1])
        joined = min(members[1].digests)
        _agree(members, range(joined, 8))
        # Between outer steps the members train locally on different samples: the live models
        # differ, and the outer step brings them back to the same global parameters.
        assert members[0].collab.step_index == members[1].collab.step_index == 8


async def test_a_slow_member_gets_a_smaller_share_of_the_global_batch() -> None:
    async with swarm(2) as peers:
        fast, slow = Member(peers[0], 0), Member(peers[1], 1)
        for member in (fast, slow):
            member.collab.config = member.collab.config.replace(rebalance_interval_steps=3)
        slow.compute_s = 0.05
        await fast.collab.start(found=True)

        async def join_and_train(member: Member) -> None:
            await member.collab.start(found=False)
            await member.train_until(40)

        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                tg.start_soon(fast.train_until, 40)
                tg.start_soon(join_and_train, slow)
        shares = {m.peer_id: m.batch_share for m in fast.collab.configuration.members}
        assert shares[slow.peer.peer_id] < shares[fast.peer.peer_id], shares
        assert sum(shares.values()) == GLOBAL_BATCH
        _agree([fast, slow], range(min(slow.digests), 40))


class PoisonedMember(Member):
    """A member whose gradients are NaN: its contributions fail the checks every round."""

    async def train_until(self, steps: int) -> None:
        while self.collab.step_index < steps:
            self.collab.optimizer.zero_grad()
            for p in self.collab.model.parameters():
                p.grad = torch.full_like(p, float("nan"))
            await anyio.sleep(self.compute_s)
            result = await self.collab.step(samples=GLOBAL_BATCH // 3)
            self.excluded_in.append(result.excluded)
            self.digests[result.step] = self.collab.parameter_digest()


async def test_a_member_sending_nan_is_excluded_then_evicted_and_the_others_stay_identical_and_finite() -> None:
    async with swarm(3) as peers:
        good = [Member(peers[0], 0), Member(peers[1], 1)]
        bad = PoisonedMember(peers[2], 2)
        bad.excluded_in = []
        evicted: list[str] = []
        await good[0].collab.start(found=True)

        async def join_and_train(member: Member, until: int) -> None:
            await member.collab.start(found=False)
            await member.train_until(until)

        async def poison() -> None:
            await bad.collab.start(found=False)
            try:
                await bad.train_until(10_000)  # until the run evicts it
            except TrainingError as exc:
                evicted.append(str(exc))

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(good[0].train_until, 25)
                tg.start_soon(join_and_train, good[1], 25)
                tg.start_soon(poison)
        # Each good member, as a shard owner, saw NaN from it round after round and signed an EVICT
        # after evict_after_invalid_rounds; with both signatures (a quorum of 3) the run removed it.
        assert evicted and "evicted" in evicted[0]
        assert bad.peer.negotiation.removed_reason(RUN) == "evicted"
        final = good[0].collab.configuration
        assert final == good[1].collab.configuration
        assert not final.has_member(bad.peer.peer_id) and len(final) == 2
        assert good[0].members[24] == good[1].members[24] == 2
        # Until then it was left out of every round it contributed to, and every member -- itself
        # included -- applied the same clean average: parameters identical and finite throughout.
        # Once its eviction is agreed (for a later step) the configuration allows it weight 0, so
        # its last rounds carry nothing to exclude (issue 20: weights from the configuration).
        joined = max(min(m.digests) for m in (*good, bad))
        flags = [str(bad.peer.peer_id) in excluded for excluded in bad.excluded_in]
        assert flags and flags[0] and flags == sorted(flags, reverse=True), bad.excluded_in
        _agree([*good, bad], range(joined, 25))
        for member in good:
            for p in member.collab.model.parameters():
                assert torch.isfinite(p).all()


async def test_async_peer_collaborate_founds_and_joins_a_run_and_leaving_frees_the_averager() -> None:
    """``AsyncPeer.collaborate``, the README's async entry point, end to end on two peers."""
    async with swarm(2) as peers:
        founder, newcomer = peers
        config = CollaborationConfig.local(global_batch=GLOBAL_BATCH, round_timeout_min_s=3.0)
        models = [_model() for _ in peers]
        digests: list[dict[int, str]] = [{}, {}]

        async def train(collab: AsyncCollaboration, index: int, steps: int) -> None:
            model, optimizer = models[index]
            while collab.step_index < steps:
                start, stop = collab.batch_slice()
                generator = torch.Generator().manual_seed(collab.step_index)
                x = torch.randn(GLOBAL_BATCH, 8, generator=generator)[start:stop]
                y = torch.randint(0, 2, (GLOBAL_BATCH,), generator=generator)[start:stop]
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                await anyio.sleep(0.002)
                result = await collab.step(samples=stop - start)
                digests[index][result.step] = collab.parameter_digest()

        first = await founder.collaborate(RUN, *models[0], found=True, config=config)
        assert founder.training.collaborations() == [first]
        async with anyio.create_task_group() as tg:
            tg.start_soon(train, first, 0, 40)  # trains on alone once the newcomer left
            second = await newcomer.collaborate(RUN, *models[1], found=False, config=config, timeout_s=60)
            await train(second, 1, 20)
            await second.leave(timeout_s=30)
        shared = sorted(set(digests[0]) & set(digests[1]))
        assert shared, "the two peers never trained the same step"
        assert all(digests[0][step] == digests[1][step] for step in shared)
        assert len(first.configuration.members) == 1, "the newcomer's leave was not committed"
        assert newcomer.training.collaborations() == []
        assert RUN not in newcomer.training.averager._latest, "leaving kept the run's memory in the averager"


async def test_a_runs_snapshots_are_served_to_its_members_and_admitted_newcomers_only() -> None:
    """Issue 20, finding 11: once a member published a snapshot for a newcomer, any peer could pull
    the run's model and optimizer state from it over /chaos/transfer/1."""
    async with swarm(3) as peers:
        founder, newcomer = Member(peers[0], 0), Member(peers[1], 1)
        outsider = peers[2]
        await founder.collab.start(found=True)
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(founder.train_until, 60)

                async def join_and_train() -> None:
                    await newcomer.collab.start(found=False)  # loads the snapshot it asked for
                    await newcomer.train_until(60)

                tg.start_soon(join_and_train)
        (joined,) = [r for r in newcomer.collab.take_events() if r.get("event") == "joined"]
        source = str(founder.peer.addrs[0])
        with pytest.raises(ChaosError):
            await outsider.load_state(RUN, sources=[source])
        loaded = await newcomer.peer.load_state(RUN, sources=[source])  # a member may
        assert loaded.step == joined["snapshot_step"]


async def test_a_closed_run_admits_its_listed_peer_and_refuses_an_outsider() -> None:
    """Issue 20, finding 11: RUN_INFO told anyone connected a run's configuration, and anyone could
    join. A closed run's members tell an outsider nothing and refuse its JOIN."""
    async with swarm(3) as peers:
        listed, outsider = peers[1], peers[2]
        founder = Member(peers[0], 0, admitted_peers=(str(listed.peer_id),))
        newcomer, stranger = Member(listed, 1), Member(outsider, 2)
        await founder.collab.start(found=True)
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(founder.train_until, 12)

                async def join_and_train() -> None:
                    await newcomer.collab.start(found=False)
                    await newcomer.train_until(12)

                tg.start_soon(join_and_train)
                with pytest.raises((ChaosError, TimeoutError)):
                    await stranger.collab.start(found=False, timeout_s=1.5)
        assert max(founder.members.values()) == 2
        config = founder.peer.training_port.runs.configuration(RUN)
        assert config is not None and not config.has_member(outsider.peer_id)
        _agree([founder, newcomer], range(min(newcomer.digests), 12))


async def test_members_leaving_together_stop_serving_at_once_instead_of_failing_rounds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Both leave while neither trains: each serves its last rounds with weight 0, so those rounds
    # average nothing. Once both leaves are agreed, each sees nobody left to serve and stops, rather
    # than failing the round max_round_attempts times and then giving up.
    caplog.set_level(logging.INFO, logger="chaosp2p.training")
    async with swarm(2) as peers:
        members = [Member(p, i) for i, p in enumerate(peers)]
        await members[0].collab.start(found=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(members[0].train_until, 6)
            tg.start_soon(_join_and_train, members[1], 6)
        async with anyio.create_task_group() as tg:
            for member in members:
                tg.start_soon(member.collab.leave)
    said = [r.getMessage() for r in caplog.records]
    assert any("every other member is leaving too" in text for text in said), said
    assert not any("stopped serving rounds with weight 0" in text for text in said), said
    assert not any("did not commit our leave" in text for text in said), said


async def _join_and_train(member: Member, steps: int) -> None:
    await member.collab.start(found=False)
    await member.train_until(steps)
