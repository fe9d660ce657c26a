"""All-reduce among in-process peers over real encrypted loopback connections."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import pytest

from chaosp2p.errors import ChaosError, ContributionRefused, RoundAborted, RoundMismatch
from chaosp2p.protocols.averaging.messages import PROTOCOL, Contribution, RoundTag, WireDtype, codec
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.runtime.node import Node, open_node
from chaosp2p.training.averager import Averager, RoundStats
from chaosp2p.training.averager_config import AveragerConfig
from chaosp2p.training.owner_role import OwnerRole
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

from ..conditions import eventually

pytestmark = pytest.mark.anyio

CONFIG = AveragerConfig(chunk_bytes=64 << 10, header_timeout_s=5.0, pending_wait_s=10.0, abort_grace_s=0.3)
"""Small chunks, so that even small test buffers go through many pipelined chunks."""


@dataclass
class Member:
    node: Node
    averager: Averager

    @property
    def peer(self) -> PeerID:
        return self.node.peer_id


@dataclass
class Swarm:
    members: list[Member]
    stack: AsyncExitStack

    @property
    def peers(self) -> list[PeerID]:
        return sorted(m.peer for m in self.members)

    def addrs(self, peer: PeerID) -> Sequence[Multiaddr]:
        for member in self.members:
            if member.peer == peer:
                return member.node.addrs
        return ()

    def by_peer(self) -> list[Member]:
        return sorted(self.members, key=lambda m: m.peer)

    async def close(self, member: Member) -> None:
        await member.node.aclose()


@asynccontextmanager
async def swarm(
    count: int,
    *,
    configs: Sequence[AveragerConfig] = (),
    peer_config: Callable[[int], PeerConfig] = lambda _index: PeerConfig.local(),
) -> AsyncIterator[Swarm]:
    """``count`` connected peers, each with an averager (``configs[i]`` for the i-th, by default
    ``CONFIG``) that expects contributions to run ``run`` from all of them; ``peer_config(i)`` is
    called right before the i-th node opens."""
    async with AsyncExitStack() as stack:
        members = []
        for index in range(count):
            node = await stack.enter_async_context(open_node(peer_config(index)))
            config = configs[index] if index < len(configs) else CONFIG
            members.append(Member(node, Averager(node.host, node.clock, config=config)))
        peers = frozenset(m.peer for m in members)
        for member in members:
            member.averager.expect_run("run", peers.__contains__)
        for i, a in enumerate(members):
            for b in members[i + 1 :]:
                await a.node.connect(b.node.addrs[0])
        with anyio.fail_after(10):
            for member in members:
                await member.node.wait_connected(count - 1)
        yield Swarm(members, stack)


def tag(step: int = 1, *, epoch: int = 0, digest: bytes = b"config-0") -> RoundTag:
    return RoundTag(run="run", epoch=epoch, config_digest=digest, step=step)


async def run_all(calls: Sequence[Callable[[], Any]], *, bound_s: float = 30.0) -> list[tuple[str, Any]]:
    """Run the calls concurrently; each outcome is ("ok", value) or ("error", exception)."""
    outcomes: list[tuple[str, Any]] = [("pending", None)] * len(calls)

    async def one(index: int) -> None:
        try:
            outcomes[index] = ("ok", await calls[index]())
        except Exception as exc:  # the test inspects it
            outcomes[index] = ("error", exc)

    with anyio.fail_after(bound_s):
        async with anyio.create_task_group() as tg:
            for index in range(len(calls)):
                tg.start_soon(one, index)
    return outcomes


def reduce_call(
    s: Swarm,
    member: Member,
    buffer: np.ndarray,
    *,
    weight: float = 1.0,
    max_weights: dict[PeerID, float] | None = None,
    round_tag: RoundTag | None = None,
    wire_dtype: str = "float32",
    timeout_s: float = 20.0,
    bandwidth: dict[PeerID, float | None] | None = None,
) -> Callable[[], Any]:
    async def call() -> RoundStats:
        return await member.averager.all_reduce(
            round_tag or tag(),
            buffer,
            weight=weight,
            max_weights=max_weights or dict.fromkeys(s.peers, 100.0),
            members=s.peers,
            addrs=s.addrs,
            bandwidth=bandwidth or {},
            wire_dtype=wire_dtype,
            timeout_s=timeout_s,
        )

    return call


def make_buffers(count: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(length).astype(np.float32) for _ in range(count)]


def weighted_mean(buffers: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    total = sum(w * b.astype(np.float64) for b, w in zip(buffers, weights, strict=True))
    return np.asarray(total / sum(weights))


def assert_equal_average(buffers: Sequence[np.ndarray], *, of: Sequence[np.ndarray]) -> None:
    """Every buffer holds the same bytes: the plain mean of ``of``."""
    expected = weighted_mean(of, [1.0] * len(of))
    for buffer in buffers:
        np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
        assert buffer.tobytes() == buffers[0].tobytes()


async def test_exact_weighted_average_and_identical_bytes_on_every_member() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        length = 300_007  # not a multiple of the alignment or of the chunk
        buffers = make_buffers(3, length)
        weights = [1.0, 2.0, 3.5]
        expected = weighted_mean(buffers, weights)
        outcomes = await run_all(
            [reduce_call(s, m, b, weight=w) for m, b, w in zip(members, buffers, weights, strict=True)]
        )
        assert [kind for kind, _ in outcomes] == ["ok"] * 3, outcomes
        for buffer in buffers:
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
            assert buffer.tobytes() == buffers[0].tobytes()
        stats = outcomes[0][1]
        assert stats.excluded == ()
        assert stats.members == tuple(s.peers)
        # each member sends and receives 2 (n-1)/n of the buffer, give or take its own shard's size
        assert 0.5 * length * 4 < stats.bytes_sent < 2 * length * 4


async def test_a_nan_contribution_is_excluded_and_named() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(3, 50_000, seed=1)
        clean = [b.copy() for b in buffers]
        buffers[1][12_345] = np.nan
        outcomes = await run_all([reduce_call(s, m, b) for m, b in zip(members, buffers, strict=True)])
        assert [kind for kind, _ in outcomes] == ["ok"] * 3, outcomes
        expected = weighted_mean([clean[0], clean[2]], [1.0, 1.0])
        for buffer in buffers:  # the culprit gets the clean average too
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
            assert buffer.tobytes() == buffers[0].tobytes()
        for _, stats in outcomes:
            assert [e.peer for e in stats.excluded] == [members[1].peer]
            assert "non-finite" in stats.excluded[0].reason
        # One NaN sits in one owner's shard: that owner saw it first-hand (the evidence an EVICT
        # needs); the others only heard of it.
        seen = [m.peer for m, (_, stats) in zip(members, outcomes, strict=True) if stats.invalid]
        assert len(seen) == 1 and seen[0] != members[1].peer
        assert [stats.invalid for _, stats in outcomes].count((members[1].peer,)) == 1


async def test_an_owner_sending_non_finite_averages_fails_the_round_and_nobody_applies_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        bad = members[2].peer
        encode = OwnerRole._encode

        def poisoned(self: OwnerRole) -> np.ndarray:
            wire = encode(self)
            if self.round.me == bad:  # a faulty owner: NaN in the averaged shard it sends out
                wire = np.full_like(wire, np.nan)
                self._wire_result = wire
            return wire

        monkeypatch.setattr(OwnerRole, "_encode", poisoned)
        buffers = make_buffers(3, 30_000, seed=3)
        outcomes = await run_all([reduce_call(s, m, b) for m, b in zip(members, buffers, strict=True)])
        for member, (kind, error) in zip(members[:2], outcomes[:2], strict=True):
            # The honest members refuse the shard: the round fails naming the owner, so the caller
            # never applies the buffer.
            assert kind == "error" and isinstance(error, RoundAborted), (member.peer, outcomes)
            assert error.missing == frozenset({bad}) and "non-finite" in str(error)


async def test_a_wrong_length_contribution_is_excluded() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(2, 40_000, seed=2)
        odd = np.ones(40_001, dtype=np.float32)
        clean = [b.copy() for b in buffers]
        # The odd member owns no shard here (bandwidth 0), as an observer or a newcomer would not.
        bandwidth: dict[PeerID, float | None] = {members[2].peer: 0.0}
        outcomes = await run_all(
            [
                reduce_call(s, members[0], buffers[0], bandwidth=bandwidth),
                reduce_call(s, members[1], buffers[1], bandwidth=bandwidth),
                reduce_call(s, members[2], odd, bandwidth=bandwidth),
            ]
        )
        assert outcomes[0][0] == outcomes[1][0] == "ok", outcomes
        expected = weighted_mean(clean, [1.0, 1.0])
        for buffer in buffers:
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
        for _, stats in outcomes[:2]:
            assert [e.peer for e in stats.excluded] == [members[2].peer]
            assert "elements" in stats.excluded[0].reason
            assert stats.invalid == (members[2].peer,)  # every owner refused its header itself
        kind, error = outcomes[2]
        assert kind == "error" and isinstance(error, ContributionRefused)
        assert error.by == frozenset({members[0].peer, members[1].peer})


async def test_a_wrong_length_shard_owner_is_named_by_the_others() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = [*make_buffers(2, 40_000, seed=3), np.ones(40_001, dtype=np.float32)]
        outcomes = await run_all([reduce_call(s, m, b) for m, b in zip(members, buffers, strict=True)])
        for kind, error in outcomes[:2]:
            assert kind == "error" and isinstance(error, RoundAborted), outcomes
            assert members[2].peer in error.missing
        assert outcomes[2][0] == "error"


async def test_a_wrong_tag_raises_round_mismatch() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(3, 10_000, seed=4)
        outcomes = await run_all(
            [
                reduce_call(s, members[0], buffers[0], round_tag=tag(5)),
                reduce_call(s, members[1], buffers[1], round_tag=tag(5, digest=b"config-other")),
                reduce_call(s, members[2], buffers[2], round_tag=tag(5)),
            ],
            bound_s=15,
        )
        for kind, error in outcomes:
            assert kind == "error" and isinstance(error, RoundMismatch), outcomes


async def test_a_member_ahead_makes_the_others_raise_round_mismatch() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(3, 10_000, seed=5)
        outcomes = await run_all(
            [
                reduce_call(s, members[0], buffers[0], round_tag=tag(5)),
                reduce_call(s, members[1], buffers[1], round_tag=tag(6), timeout_s=3.0),
                reduce_call(s, members[2], buffers[2], round_tag=tag(5)),
            ],
            bound_s=15,
        )
        for index in (0, 2):
            kind, error = outcomes[index]
            assert kind == "error" and isinstance(error, RoundMismatch), outcomes
        assert outcomes[1][0] == "error"


async def test_a_contribution_one_step_and_two_epochs_ahead_waits_for_its_round() -> None:
    # Two changes decided within one step both govern the next one (seen with two LINK_UPs a few
    # ms apart): the member first at that step is two epochs ahead of the others' last round. Its
    # contribution must wait for their round, not be refused (it then retried as attempt 1 while
    # the others waited for it in attempt 0, and members were STALLed).
    async with swarm(3) as s:
        members = s.by_peer()
        first = make_buffers(3, 10_000, seed=11)
        outcomes = await run_all([reduce_call(s, m, first[i], round_tag=tag(5)) for i, m in enumerate(members)])
        assert all(kind == "ok" for kind, _ in outcomes), outcomes
        second = make_buffers(3, 10_000, seed=12)
        expected = weighted_mean(second, [1.0, 1.0, 1.0])
        ahead = tag(6, epoch=2, digest=b"config-2")

        def late(index: int) -> Callable[[], Any]:
            async def call() -> RoundStats:
                await eventually(lambda: members[index].averager.statistics().early_contributions_waiting >= 1)
                return await reduce_call(s, members[index], second[index], round_tag=ahead)()

            return call

        outcomes = await run_all([late(0), reduce_call(s, members[1], second[1], round_tag=ahead), late(2)])
        assert all(kind == "ok" for kind, _ in outcomes), outcomes
        for buffer in second:
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)


async def test_a_member_that_disappears_mid_round_is_named_without_waiting_for_the_timeout() -> None:
    async with swarm(4) as s:
        members = s.by_peer()
        leaver = members[1]
        buffers = make_buffers(4, 200_000, seed=6)
        survivors = [m for m in members if m is not leaver]
        timeout_s = 60.0

        async def leave() -> None:
            # The others are in the round (their contributions reach the leaver) before it goes.
            await eventually(lambda: leaver.averager.statistics().early_contributions_waiting == 3)
            await s.close(leaver)

        started = anyio.current_time()
        calls = [reduce_call(s, m, buffers[i], timeout_s=timeout_s) for i, m in enumerate(members) if m is not leaver]
        outcomes = await run_all([*calls, leave], bound_s=20)
        elapsed = anyio.current_time() - started
        assert elapsed < timeout_s / 4
        for kind, error in outcomes[: len(survivors)]:
            assert kind == "error" and isinstance(error, RoundAborted), outcomes
            assert error.missing == frozenset({leaver.peer})


async def test_a_member_that_never_comes_is_named_after_the_timeout() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        absent = members[2]
        buffers = make_buffers(2, 10_000, seed=7)
        outcomes = await run_all(
            [reduce_call(s, m, b, timeout_s=1.5) for m, b in zip(members[:2], buffers, strict=True)], bound_s=15
        )
        for kind, error in outcomes:
            assert kind == "error" and isinstance(error, RoundAborted), outcomes
            assert error.missing == frozenset({absent.peer})


async def test_contributions_that_arrive_early_wait_for_the_round() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(3, 100_000, seed=8)
        expected = weighted_mean(buffers, [1.0, 1.0, 1.0])
        late = members[0]
        results: list[Any] = []

        async def early_ones() -> None:
            results.extend(await run_all([reduce_call(s, m, buffers[i]) for i, m in enumerate(members) if i]))

        async def late_one() -> None:
            await eventually(lambda: late.averager.statistics().early_contributions_waiting == 2)
            results.extend(await run_all([reduce_call(s, late, buffers[0])]))

        await run_all([early_ones, late_one])
        assert [kind for kind, _ in results] == ["ok"] * 3, results
        for buffer in buffers:
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
            assert buffer.tobytes() == buffers[0].tobytes()
        assert late.averager.statistics().early_contributions_held == 2


async def test_an_observer_with_weight_zero_receives_the_average_of_the_others() -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(3, 30_000, seed=9)
        expected = weighted_mean(buffers[:2], [1.0, 3.0])
        weights = [1.0, 3.0, 0.0]
        outcomes = await run_all(
            [reduce_call(s, m, b, weight=w) for m, b, w in zip(members, buffers, weights, strict=True)]
        )
        assert [kind for kind, _ in outcomes] == ["ok"] * 3, outcomes
        for buffer in buffers:
            np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
            assert buffer.tobytes() == buffers[0].tobytes()


@pytest.mark.parametrize(("wire_dtype", "tolerance"), [("float16", 2e-3), ("bfloat16", 1.6e-2)])
async def test_compressed_wire_formats_stay_within_their_precision(wire_dtype: str, tolerance: float) -> None:
    async with swarm(3) as s:
        members = s.by_peer()
        buffers = make_buffers(3, 70_000, seed=10)
        expected = weighted_mean(buffers, [1.0, 1.0, 1.0])
        outcomes = await run_all(
            [reduce_call(s, m, b, wire_dtype=wire_dtype) for m, b in zip(members, buffers, strict=True)]
        )
        assert [kind for kind, _ in outcomes] == ["ok"] * 3, outcomes
        for buffer in buffers:
            np.testing.assert_allclose(buffer, expected, rtol=tolerance, atol=tolerance)
            assert buffer.tobytes() == buffers[0].tobytes()
        assert outcomes[0][1].bytes_sent < 70_000 * 4  # half the float32 volume


async def test_consecutive_rounds_reuse_connections_and_buffers() -> None:
    async with swarm(2) as s:
        members = s.by_peer()
        for step in range(1, 4):
            buffers = make_buffers(2, 20_000, seed=step)
            expected = weighted_mean(buffers, [1.0, 1.0])
            outcomes = await run_all(
                [reduce_call(s, m, b, round_tag=tag(step)) for m, b in zip(members, buffers, strict=True)]
            )
            assert [kind for kind, _ in outcomes] == ["ok"] * 2, outcomes
            np.testing.assert_allclose(buffers[0], expected, rtol=1e-5, atol=1e-6)
        assert all(m.averager.statistics().rounds_completed == 3 for m in members)


# ---------------------------------------------------------------------------------- hostile peers (issue 20)
async def test_a_contribution_weighing_more_than_its_allowance_is_refused_and_left_out_by_everyone() -> None:
    """issue 20, finding 4: a contributor that states weight 1e30 used to set every member's result
    to its own values; now each owner refuses a weight above the member's agreed allowance."""
    async with swarm(3) as s:
        members = s.by_peer()
        attacker = members[2]
        buffers = [*make_buffers(2, 30_000, seed=11), np.full(30_000, 1e3, dtype=np.float32)]
        clean = [b.copy() for b in buffers[:2]]
        honest = dict.fromkeys(s.peers, 1.0)  # the agreed allowances: one share each
        lie = {**honest, attacker.peer: 1e30}  # what the attacker's own call claims
        outcomes = await run_all(
            [
                reduce_call(s, members[0], buffers[0], max_weights=honest),
                reduce_call(s, members[1], buffers[1], max_weights=honest),
                reduce_call(s, attacker, buffers[2], weight=1e30, max_weights=lie),
            ]
        )
        assert outcomes[0][0] == outcomes[1][0] == "ok", outcomes
        assert_equal_average(buffers[:2], of=clean)
        for _, stats in outcomes[:2]:
            assert [e.peer for e in stats.excluded] == [attacker.peer]
            assert "weight" in stats.excluded[0].reason
            assert stats.invalid == (attacker.peer,)  # first-hand: the evidence an EVICT needs
        kind, error = outcomes[2]
        assert kind == "error" and isinstance(error, ContributionRefused), outcomes


async def test_a_contribution_refused_by_one_owner_only_is_left_out_by_every_member() -> None:
    """issue 20, known limitation 1 of protocols/averaging.md: an owner that refuses a header now
    reports it in its answer, so the owners that accepted it revise their shards and every member
    ends with the same ``excluded`` (it used to differ, the refused values staying in other shards)."""
    strict = dataclasses.replace(CONFIG, max_weight=2.0)
    async with swarm(3, configs=[strict]) as s:
        refusing = s.members[0]  # the one with the strict configuration
        accepting, odd = (m for m in s.by_peer() if m is not refusing)
        # The refusing owner allows the odd member 2 (say, it knows of a later configuration);
        # the accepting owner and the odd member itself allow 10: the odd member sends 5.
        narrow = dict.fromkeys(s.peers, 2.0)
        wide = dict.fromkeys(s.peers, 10.0)
        buffers = make_buffers(3, 40_000, seed=12)
        clean = [b.copy() for b in buffers[:2]]
        outcomes = await run_all(
            [
                reduce_call(s, refusing, buffers[0], max_weights=narrow),
                reduce_call(s, accepting, buffers[1], max_weights=wide),
                reduce_call(s, odd, buffers[2], weight=5.0, max_weights=wide),
            ]
        )
        assert outcomes[0][0] == outcomes[1][0] == "ok", outcomes
        assert_equal_average(buffers[:2], of=clean)
        assert outcomes[0][1].excluded == outcomes[1][1].excluded
        assert [e.peer for e in outcomes[0][1].excluded] == [odd.peer]
        assert outcomes[0][1].invalid == (odd.peer,) and outcomes[1][1].invalid == ()
        kind, error = outcomes[2]  # refused by a minority of the owners: it names them
        assert kind == "error" and isinstance(error, RoundAborted) and error.missing == frozenset({refusing.peer})


async def _open_contributions(attacker: Node, target: Member, tags: Sequence[RoundTag]) -> list[Stream]:
    """Contribution headers for ``tags`` from ``attacker`` to ``target``, their payloads never sent."""
    connection = await attacker.host.connection_to(target.peer, list(target.node.addrs))
    streams = []
    for round_tag in tags:
        stream = connection.open_stream(PROTOCOL)
        header = Contribution(
            tag=round_tag,
            total_elements=1 << 20,
            start=0,
            stop=1 << 20,
            wire_dtype=WireDtype.FLOAT32,
            weight=1.0,
            payload_bytes=4 << 20,
        )
        await stream.send_message(codec, header)
        streams.append(stream)
    return streams


async def _late_round_after(s: Swarm, late: Member, streams: Sequence[Stream]) -> list[tuple[str, Any]]:
    """Once ``streams`` are answered or held at ``late``: a round in which the others reach ``late``
    before it starts (their contributions must wait for it)."""
    answers: list[Any] = []

    async def read(stream: Stream) -> None:
        try:
            answers.append(await stream.receive_message(codec))
        except ChaosError as exc:
            answers.append(exc)

    members = s.by_peer()
    buffers = make_buffers(len(members), 50_000, seed=13)
    expected = weighted_mean(buffers, [1.0] * len(members))
    results: list[Any] = []
    async with anyio.create_task_group() as readers:
        for stream in streams:
            readers.start_soon(read, stream)
        await eventually(lambda: len(answers) + late.averager.statistics().early_contributions_waiting >= len(streams))
        held = late.averager.statistics().early_contributions_held
        others = [reduce_call(s, m, buffers[i]) for i, m in enumerate(members) if m is not late]

        async def early_ones() -> None:
            results.extend(await run_all(others))

        async def late_one() -> None:
            # the others' contributions are held here too (a full table would refuse them)
            await eventually(lambda: late.averager.statistics().early_contributions_held >= held + len(others))
            results.extend(await run_all([reduce_call(s, late, buffers[members.index(late)])]))

        await run_all([early_ones, late_one])
        readers.cancel_scope.cancel()
    assert [kind for kind, _ in results] == ["ok"] * len(members), results
    for buffer in buffers:
        np.testing.assert_allclose(buffer, expected, rtol=1e-5, atol=1e-6)
    return results


async def test_a_stranger_cannot_fill_the_early_contribution_slots_with_made_up_runs() -> None:
    """issue 20, finding 5: 64 early contributions to made-up runs from a peer that is no member
    used to take every slot, and the members' own early contributions were refused."""
    async with swarm(3) as s:
        stranger = await s.stack.enter_async_context(open_node(PeerConfig.local()))
        late = s.by_peer()[0]
        slots = CONFIG.max_pending_streams
        junk = [RoundTag(run=f"junk-{i}", epoch=0, config_digest=b"x", step=1) for i in range(slots)]
        streams = await _open_contributions(stranger, late, junk)
        await _late_round_after(s, late, streams)
        assert late.averager.statistics().early_contributions_waiting == 0


async def test_one_member_holds_at_most_one_early_slot_per_run() -> None:
    """issue 20, finding 5 (per-peer cap): a member's newer early contribution replaces its older
    one, so one member cannot take every slot with made-up attempts of the run's next rounds."""
    async with swarm(3) as s:
        late, _, greedy = s.by_peer()
        junk = [tag(2) for _ in range(CONFIG.max_pending_streams)]
        junk = [dataclasses.replace(t, attempt=i) for i, t in enumerate(junk)]
        streams = await _open_contributions(greedy.node, late, junk)
        await _late_round_after(s, late, streams)
