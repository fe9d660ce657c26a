"""protocols/averaging.md: its msgpack vectors match the codec both ways, and its reduce-plan,
wire-format and shard-arithmetic vectors match the code bit for bit.

Run ``python tests/unit/test_averaging_vectors.py`` to print the blocks for the spec.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from chaosp2p.protocols.averaging import (
    Contribution,
    Exclusion,
    Part,
    Result,
    ResultStatus,
    RoundPhase,
    RoundTag,
    ShardReducer,
    WireDtype,
    codec,
    decode,
    encode,
    plan_shards,
    storage_dtype,
)
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message
from tests.spec_blocks import named_lines

SPEC = "averaging.md"

PEERS = {name: Identity.from_seed(bytes([seed]) * 32).peer_id for name, seed in (("A", 1), ("B", 2), ("C", 3))}
A, B, C = PEERS["A"], PEERS["B"], PEERS["C"]
NAMES = {peer: name for name, peer in PEERS.items()}
TAG = RoundTag(run="run-a", epoch=3, config_digest=bytes(range(32)), step=42)
NON_FINITE = "non-finite values (NaN or infinity)"


def answer(start: int, stop: int, total_weight: float, included: tuple[PeerID, ...], **rest: Any) -> Result:
    """An OK answer for the float32 shard ``start..stop``."""
    return Result(
        status=ResultStatus.OK,
        start=start,
        stop=stop,
        wire_dtype=WireDtype.FLOAT32,
        payload_bytes=4 * (stop - start),
        total_weight=total_weight,
        included=included,
        **rest,
    )


def vector_messages() -> dict[str, Message]:
    """Every message vector by name."""
    contribution = Contribution(
        tag=TAG, total_elements=1000, start=0, stop=512, wire_dtype=WireDtype.FLOAT32, weight=32.0, payload_bytes=2048
    )
    observer = dataclasses.replace(
        contribution,
        tag=dataclasses.replace(TAG, phase=RoundPhase.OUTER, attempt=1),
        start=512,
        stop=1000,
        wire_dtype=WireDtype.BFLOAT16,
        weight=0.0,
        payload_bytes=0,
    )
    return {
        "Contribution": contribution,
        "ContributionObserver": observer,
        "ResultOk": answer(0, 512, 96.0, (B, A, C)),
        "ResultExcluded": answer(512, 1000, 64.0, (B, A), excluded=(Exclusion(peer=C, reason=NON_FINITE),)),
        "ResultRevision": answer(0, 512, 64.0, (B, A), revision=1),
        "ResultRefused": Result(status=ResultStatus.REFUSED, detail="payload of 100 bytes, expected 2048"),
        "ResultMismatch": Result(status=ResultStatus.MISMATCH, detail=f"round {TAG} already completed here"),
        "ResultAborted": Result(status=ResultStatus.ABORTED, detail="timed out", missing=(C,)),
    }


# ---------------------------------------------------------------------- messages
def test_spec_lists_exactly_the_known_message_vectors() -> None:
    assert set(named_lines(SPEC, "vectors")) == set(vector_messages())


def test_every_message_type_and_status_has_a_vector() -> None:
    messages = vector_messages().values()
    assert {m.TYPE for m in messages} == set(codec.message_classes())
    assert {m.status for m in messages if isinstance(m, Result)} == set(ResultStatus)
    assert {m.wire_dtype for m in messages if isinstance(m, Contribution)} >= {WireDtype.FLOAT32, WireDtype.BFLOAT16}


@pytest.mark.parametrize("name", sorted(vector_messages()))
def test_message_vector_encodes_and_decodes(name: str) -> None:
    expected = vector_messages()[name]
    data = bytes.fromhex(named_lines(SPEC, "vectors")[name])
    assert codec.encode(expected) == data
    assert codec.decode(data, max_bytes=1 << 20) == expected


# ---------------------------------------------------------------------- the reduce plan
def plan_cases() -> dict[str, dict[str, Any]]:
    """The plan vectors of the spec, parsed (members are named A, B, C)."""
    return {name: json.loads(rest) for name, rest in named_lines(SPEC, "plan-vectors").items()}


def compute_plan(case: dict[str, Any]) -> list[list[int]]:
    bandwidth = {PEERS[name]: value for name, value in case["bandwidth"].items()}
    plan = plan_shards([PEERS[m] for m in case["members"]], case["length"], bandwidth, align_elements=case["align"])
    assert [NAMES[s.owner] for s in plan.shards] == case["members"]
    return [[s.start, s.stop] for s in plan.shards]


@pytest.mark.parametrize("name", sorted(plan_cases()))
def test_plan_vector(name: str) -> None:
    case = plan_cases()[name]
    assert compute_plan(case) == case["shards"]


# ---------------------------------------------------------------------- wire formats
def bits(values: np.ndarray) -> list[str]:
    """Bit patterns of ``values`` as hex (8 digits for 4-byte elements, 4 for 2-byte ones)."""
    width = values.itemsize
    raw = values.view(np.uint32 if width == 4 else np.uint16)
    return [f"{int(v):0{2 * width}x}" for v in raw]


def from_bits(patterns: list[str], wire: WireDtype) -> np.ndarray:
    raw = np.array([int(p, 16) for p in patterns], dtype=np.uint32 if wire is WireDtype.FLOAT32 else np.uint16)
    return raw.view(storage_dtype(wire))


def dtype_cases() -> dict[str, dict[str, Any]]:
    """The wire-format vectors of the spec, parsed."""
    return {name: json.loads(rest) for name, rest in named_lines(SPEC, "dtype-vectors").items()}


@pytest.mark.parametrize("name", sorted(dtype_cases()))
def test_wire_format_vector(name: str) -> None:
    case = dtype_cases()[name]
    wire = WireDtype.from_name(case["wire"])
    source = from_bits(case["float32"], WireDtype.FLOAT32)
    encoded = np.empty(len(source), dtype=storage_dtype(wire))
    with np.errstate(over="ignore", invalid="ignore"):
        encode(source, encoded, wire)
    assert bits(encoded) == case["encoded"]
    decoded = np.empty(len(source), dtype=np.float32)
    decode(encoded, decoded, wire)
    assert bits(decoded) == case["decoded"]


# ---------------------------------------------------------------------- the owner's arithmetic
def reduce_cases() -> dict[str, dict[str, Any]]:
    """The shard-arithmetic vectors of the spec, parsed."""
    return {name: json.loads(rest) for name, rest in named_lines(SPEC, "reduce-vectors").items()}


def run_reduce(case: dict[str, Any], *, reverse: bool = False) -> tuple[np.ndarray, ShardReducer]:
    parts = []
    for item in case["parts"]:
        wire = WireDtype.from_name(item.get("wire", "float32"))
        parts.append(
            Part(peer=PEERS[item["peer"]], weight=item["weight"], values=from_bits(item["values"], wire), wire=wire)
        )
    out = np.empty(len(case["out"]), dtype=np.float32)
    reducer = ShardReducer(parts[::-1] if reverse else parts, out, chunk_elements=case["chunk_elements"])
    for index in range(reducer.chunk_count):
        reducer.reduce_chunk(index)
    return out, reducer


@pytest.mark.parametrize("name", sorted(reduce_cases()))
def test_reduce_vector(name: str) -> None:
    case = reduce_cases()[name]
    out, reducer = run_reduce(case)
    assert bits(out) == case["out"]
    assert [NAMES[p] for p in reducer.included] == case["included"]
    assert sorted(NAMES[p] for p in reducer.excluded) == case["excluded"]
    assert reducer.total_weight == case["total_weight"]
    # The order the parts are given in does not matter: the owner sorts them by peer id.
    assert bits(run_reduce(case, reverse=True)[0]) == case["out"]


def test_the_order_vector_pins_the_order_of_operations() -> None:
    """Summed in another order than by peer id, the ``order`` vector gives other bits: the spec's
    order is what makes the result reproducible, not an accident of the values."""
    case = reduce_cases()["order"]
    values = {item["peer"]: from_bits(item["values"], WireDtype.FLOAT32) for item in case["parts"]}
    weights = {item["peer"]: item["weight"] for item in case["parts"]}
    total = sum(weights[name] for name in sorted(weights, key=lambda n: PEERS[n]))
    other_order = sorted(values, key=lambda n: PEERS[n], reverse=True)
    acc = np.zeros(len(case["out"]), dtype=np.float32)
    for name in other_order:
        acc = acc + values[name] * np.float32(weights[name] / total)
    assert bits(acc) != case["out"]


def test_peer_order_is_by_raw_bytes() -> None:
    """The vectors rely on B < A < C (PeerIDs compare by their 38 raw bytes)."""
    assert sorted([A, B, C]) == [B, A, C]
    assert all(isinstance(p, PeerID) for p in (A, B, C))


if __name__ == "__main__":
    print("```vectors")
    for vector_name, message in vector_messages().items():
        print(vector_name, codec.encode(message).hex())
    print("```")
