"""The all-reduce shard plan: a deterministic, aligned, bandwidth-proportional partition."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.averaging.plan import plan_shards
from chaosp2p.wire.identity import Identity, PeerID

PEERS = sorted(Identity.from_seed(bytes([i]) * 32).peer_id for i in range(12))

bandwidths = st.one_of(st.none(), st.just(0.0), st.floats(min_value=1e3, max_value=1e11))


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[PeerID], int, dict[PeerID, float | None], int]:
    count = draw(st.integers(min_value=1, max_value=len(PEERS)))
    members = draw(st.permutations(PEERS))[:count]
    length = draw(st.integers(min_value=0, max_value=5_000_000))
    bandwidth = {peer: draw(bandwidths) for peer in members}
    if all(v == 0.0 for v in bandwidth.values()):
        bandwidth[members[0]] = 1e6
    align = draw(st.sampled_from([1, 16, 64, 1024]))
    return list(members), length, bandwidth, align


@settings(max_examples=300, deadline=None)
@given(instances())
def test_shards_cover_the_buffer_contiguously_in_member_order(case: tuple) -> None:
    members, length, bandwidth, align = case
    plan = plan_shards(members, length, bandwidth, align_elements=align)
    assert plan.members == tuple(members)
    assert plan.shards[0].start == 0
    assert plan.shards[-1].stop == length
    for before, after in zip(plan.shards, plan.shards[1:], strict=False):
        assert before.stop == after.start
    assert sum(shard.size for shard in plan.shards) == length
    for shard in plan.shards:
        assert shard.size >= 0
        assert shard.start % align == 0 or shard.start == length
        assert shard.stop % align == 0 or shard.stop == length


@settings(max_examples=300, deadline=None)
@given(instances())
def test_shards_follow_bandwidth_within_one_block(case: tuple) -> None:
    members, length, bandwidth, align = case
    plan = plan_shards(members, length, bandwidth, align_elements=align)
    known = [v for v in bandwidth.values() if v is not None]
    default = (sum(known) / len(known) if known else 1.0) or 1.0
    weights = [default if bandwidth[p] is None else bandwidth[p] for p in members]
    blocks = math.ceil(length / align)
    for shard, weight in zip(plan.shards, weights, strict=True):
        quota = blocks * weight / sum(weights)
        assert abs(math.ceil(shard.size / align) - quota) <= 1 + 1e-9
        if weight == 0:
            assert shard.size == 0


@settings(max_examples=100, deadline=None)
@given(instances())
def test_the_plan_is_a_pure_function_of_its_inputs(case: tuple) -> None:
    members, length, bandwidth, align = case
    first = plan_shards(members, length, dict(bandwidth), align_elements=align)
    reordered = dict(reversed(list(bandwidth.items())))  # the mapping's order is irrelevant
    assert plan_shards(list(members), length, reordered, align_elements=align) == first


def test_unknown_bandwidth_means_equal_shares() -> None:
    plan = plan_shards(PEERS[:4], 4 * 64 * 100, {}, align_elements=64)
    assert [s.size for s in plan.shards] == [6400] * 4


def test_a_faster_member_owns_more() -> None:
    plan = plan_shards(PEERS[:3], 64 * 400, {PEERS[0]: 1e9, PEERS[1]: 3e9, PEERS[2]: None}, align_elements=64)
    assert [s.size for s in plan.shards] == [64 * 67, 64 * 200, 64 * 133]


def test_shard_of_finds_the_owner() -> None:
    plan = plan_shards(PEERS[:3], 1000, {})
    assert plan.shard_of(PEERS[1]).owner == PEERS[1]
    with pytest.raises(LookupError):
        plan.shard_of(PEERS[5])


@pytest.mark.parametrize(
    ("members", "bandwidth"),
    [
        ([], {}),
        ([PEERS[0], PEERS[0]], {}),
        (PEERS[:2], {PEERS[0]: -1.0}),
        (PEERS[:2], {PEERS[0]: float("nan")}),
        (PEERS[:2], {PEERS[0]: 0.0, PEERS[1]: 0.0}),
    ],
)
def test_bad_inputs_are_config_errors(members: list[PeerID], bandwidth: dict[PeerID, float | None]) -> None:
    with pytest.raises(ConfigError):
        plan_shards(members, 100, bandwidth)
