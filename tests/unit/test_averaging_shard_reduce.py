"""The owner's arithmetic: weighted average, validation by the accumulator, wire formats."""

from __future__ import annotations

import numpy as np
import pytest

from chaosp2p.protocols.averaging.messages import WireDtype
from chaosp2p.protocols.averaging.shard_reduce import Part, ShardReducer, decode, encode
from chaosp2p.wire.identity import Identity

PEERS = sorted(Identity.from_seed(bytes([i + 1]) * 32).peer_id for i in range(5))


def parts_for(values: list[np.ndarray], weights: list[float]) -> list[Part]:
    return [Part(peer=p, weight=w, values=v) for p, v, w in zip(PEERS, values, weights, strict=False)]


def reduce_all(parts: list[Part], size: int, chunk: int = 1000) -> tuple[np.ndarray, ShardReducer]:
    out = np.empty(size, dtype=np.float32)
    reducer = ShardReducer(parts, out, chunk_elements=chunk)
    for index in range(reducer.chunk_count):
        reducer.reduce_chunk(index)
    return out, reducer


def reference(values: list[np.ndarray], weights: list[float]) -> np.ndarray:
    total = sum(w * v.astype(np.float64) for v, w in zip(values, weights, strict=True))
    return np.asarray(total / sum(weights))


def test_weighted_average_is_independent_of_the_order_parts_are_given_in() -> None:
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(10_001).astype(np.float32) for _ in range(4)]
    weights = [1.0, 2.5, 0.5, 4.0]
    forward, _ = reduce_all(parts_for(values, weights), 10_001)
    backward, _ = reduce_all(list(reversed(parts_for(values, weights))), 10_001)
    np.testing.assert_allclose(forward, reference(values, weights), rtol=1e-6, atol=1e-6)
    assert forward.tobytes() == backward.tobytes()


def test_a_non_finite_part_is_excluded_from_every_chunk_even_those_already_reduced() -> None:
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(5_000).astype(np.float32) for _ in range(3)]
    values[1][4_321] = np.inf  # in the last chunk: chunks 0-3 were reduced with it
    out, reducer = reduce_all(parts_for(values, [1.0, 1.0, 1.0]), 5_000)
    assert set(reducer.excluded) == {PEERS[1]}
    assert reducer.included == (PEERS[0], PEERS[2])
    assert reducer.total_weight == 2.0
    np.testing.assert_allclose(out, reference([values[0], values[2]], [1.0, 1.0]), rtol=1e-6, atol=1e-6)


def test_exclude_then_recompute_drops_a_part() -> None:
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(3_000).astype(np.float32) for _ in range(3)]
    out, reducer = reduce_all(parts_for(values, [1.0, 2.0, 3.0]), 3_000)
    reducer.exclude(PEERS[2], "excluded by another owner")
    reducer.recompute()
    np.testing.assert_allclose(out, reference(values[:2], [1.0, 2.0]), rtol=1e-6, atol=1e-6)


def test_huge_finite_values_are_not_mistaken_for_bad_ones() -> None:
    big = np.full(2_000, np.finfo(np.float32).max, dtype=np.float32)
    out, reducer = reduce_all(parts_for([big, big.copy()], [1.0, 1.0]), 2_000)
    assert not reducer.excluded
    assert np.isfinite(out).all()


def test_nothing_valid_leaves_zero_weight() -> None:
    bad = np.full(100, np.nan, dtype=np.float32)
    _, reducer = reduce_all(parts_for([bad], [1.0]), 100)
    assert reducer.total_weight == 0.0


def test_chunks_must_come_in_order() -> None:
    out = np.empty(3_000, dtype=np.float32)
    reducer = ShardReducer(parts_for([np.ones(3_000, dtype=np.float32)], [1.0]), out, chunk_elements=1000)
    with pytest.raises(ValueError):
        reducer.reduce_chunk(1)


def test_bfloat16_rounds_to_nearest_and_keeps_nan() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.standard_normal(10_000).astype(np.float32) * 1e3,
            np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -0.0, np.inf, -np.inf], dtype=np.float32),
            np.array([0x7FC00000, 0xFFFFFFFF, 0xFFFF8001], dtype=np.uint32).view(np.float32),
        ]
    )
    wire = np.empty(len(values), dtype=np.uint16)
    encode(values, wire, WireDtype.BFLOAT16)
    back = np.empty(len(values), dtype=np.float32)
    decode(wire, back, WireDtype.BFLOAT16)
    finite = np.isfinite(values)
    np.testing.assert_allclose(back[finite], values[finite], rtol=2**-8)
    assert np.isnan(back[-3:]).all()  # no NaN turns into a number on the wire
    assert back[10_000] == 1.0 + 2**-7  # a tie rounds away from zero
    assert back[10_001] == 1.0 + 2**-6
    assert np.array_equal(back[10_003:10_005], [np.inf, -np.inf])


def test_float16_out_of_range_becomes_infinite_and_is_then_excluded() -> None:
    values = np.array([1.0, 1e6], dtype=np.float32)
    wire = np.empty(2, dtype=np.float16)
    encode(values, wire, WireDtype.FLOAT16)
    assert np.isinf(wire[1])
    out = np.empty(2, dtype=np.float32)
    reducer = ShardReducer(
        [Part(peer=PEERS[0], weight=1.0, values=wire, wire=WireDtype.FLOAT16)], out, chunk_elements=64
    )
    reducer.reduce_chunk(0)
    assert PEERS[0] in reducer.excluded


def test_opposite_infinities_in_two_parts_exclude_both_quietly() -> None:
    values = [np.ones(500, dtype=np.float32) for _ in range(3)]
    values[0][7] = np.inf
    values[1][7] = -np.inf
    out, reducer = reduce_all(parts_for(values, [1.0, 1.0, 1.0]), 500, chunk=128)
    assert set(reducer.excluded) == {PEERS[0], PEERS[1]}
    assert np.array_equal(out, values[2])


def test_chunks_larger_than_a_cache_block_are_reduced_and_checked_block_by_block() -> None:
    rng = np.random.default_rng(4)
    values = [rng.standard_normal(300_000).astype(np.float32) for _ in range(3)]
    values[2][250_001] = np.nan  # in a later block of the second chunk
    out, reducer = reduce_all(parts_for(values, [1.0, 2.0, 3.0]), 300_000, chunk=200_000)
    assert set(reducer.excluded) == {PEERS[2]}
    np.testing.assert_allclose(out, reference(values[:2], [1.0, 2.0]), rtol=1e-6, atol=1e-6)
