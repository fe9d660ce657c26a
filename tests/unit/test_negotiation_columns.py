"""A configuration's packed body is spliced from its predecessor's (``configuration_body``): the
result must be exactly msgpack's encoding of the new body, so digests never depend on history."""

from __future__ import annotations

import hashlib
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.protocols.negotiation.configuration_body import DELETE, INSERT, SET, Edit, pack_ids, splice_column
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.operations import Operation, OpKind, op_id, sign_operation
from chaosp2p.protocols.negotiation.run_configuration import Configuration, LinkEntry, RunParams, make_configuration
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity

IDENTITIES = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(40)]
BY_PEER = {i.peer_id: i for i in IDENTITIES}

numbers = st.one_of(
    st.integers(min_value=0, max_value=127),
    st.integers(min_value=0, max_value=(1 << 53) - 1),
    st.floats(min_value=0.0, max_value=1e12, allow_nan=False),
)


def apply(values: list[Any], edits: list[Edit]) -> list[Any]:
    out = list(values)
    for kind, i, value in edits:
        if kind == DELETE:
            del out[i]
        elif kind == INSERT:
            out.insert(i, value)
        else:
            out[i] = value
    return out


@st.composite
def column_and_edits(draw: st.DrawFn, element: st.SearchStrategy[Any]) -> tuple[list[Any], list[Edit]]:
    # Mostly uniform columns (the case splicing serves), sometimes mixed.
    uniform = draw(st.booleans())
    first = draw(element)
    size = draw(st.integers(min_value=0, max_value=40))
    values = [first] * size if uniform else draw(st.lists(element, max_size=40))
    current = list(values)
    edits: list[Edit] = []
    for _ in range(draw(st.integers(min_value=0, max_value=10))):
        kind = draw(st.sampled_from([DELETE, INSERT, SET]))
        if kind != INSERT and not current:
            kind = INSERT
        i = draw(st.integers(min_value=0, max_value=len(current) - (0 if kind == INSERT else 1)))
        value = None if kind == DELETE else (draw(element) if not uniform or draw(st.booleans()) else first)
        edits.append((kind, i, value))
        current = apply(current, [(kind, i, value)])
    return values, edits


@settings(max_examples=300, deadline=None)
@given(column_and_edits(numbers))
def test_a_spliced_numeric_column_is_msgpacks_encoding(case: tuple[list[Any], list[Edit]]) -> None:
    values, edits = case
    new = apply(values, edits)
    assert splice_column(pack(values), len(values), edits, new, numeric=True) == pack(new)


@settings(max_examples=200, deadline=None)
@given(column_and_edits(st.sampled_from([i.peer_id.raw for i in IDENTITIES])))
def test_a_spliced_id_column_is_msgpacks_encoding(case: tuple[list[Any], list[Edit]]) -> None:
    values, edits = case
    new = apply(values, edits)
    assert pack_ids(values) == pack(values)
    assert splice_column(pack_ids(values), len(values), edits, new, numeric=False) == pack(new)


def from_scratch(config: Configuration) -> Configuration:
    return make_configuration(
        run=config.run,
        epoch=config.epoch,
        activation_step=config.activation_step,
        peers=config.peers,
        incarnations=config.incarnations,
        throughputs=config.throughputs,
        links=config.links,
        params=config.params,
        seed=config.seed,
        since_steps=config.since_steps,
        departed=config.departed,
    )


def check(config: Configuration) -> None:
    assert config.packed_body() == pack(config.body())[1:]
    domain = pack(["chaosp2p/negotiation/config/1", *config.body()])
    assert config.digest == hashlib.sha256(domain).digest()
    assert from_scratch(config).digest == config.digest


def random_ops(rng: random.Random, config: Configuration, step: int) -> list[Operation]:
    ops = []
    members = list(config.peers)
    outsiders = [i.peer_id for i in IDENTITIES if not config.has_member(i.peer_id)]
    for _ in range(rng.choice([1, 1, 2, 3, 12])):
        kind = rng.choice(list(OpKind))
        origin = rng.choice(members)
        subject = origin
        extra: dict[str, Any] = {}
        incarnation = config.incarnation_of(origin) or 0
        if kind is OpKind.JOIN:
            subject = rng.choice(outsiders + members[:2])
            origin = subject
            gone = config.departed_incarnation(subject)
            held = config.incarnation_of(subject)
            incarnation = max(-1 if gone is None else gone, -1 if held is None else held) + rng.choice([1, 1, 300])
            extra["throughput_samples_per_s"] = rng.choice([1.0, 2.5, 1e6])
        elif kind in (OpKind.FAIL, OpKind.EVICT):
            subject = rng.choice(members)
            incarnation = config.incarnation_of(subject) or 0
            origin = rng.choice([p for p in members if p != subject] or [subject])
        elif kind is OpKind.THROUGHPUT:
            extra["throughput_samples_per_s"] = rng.choice([1.0, 3.0, 7.5])
        elif kind in (OpKind.LINK_UP, OpKind.LINK_DOWN):
            other = rng.choice(members)
            if other == origin:
                continue
            subject, extra["other"] = (origin, other) if origin.raw < other.raw else (other, origin)
            extra.update(bandwidth_bytes_per_s=1e9, rtt_s=0.001)
        if origin not in BY_PEER:
            continue
        ops.append(
            sign_operation(
                BY_PEER[origin],
                kind=kind,
                run=config.run,
                epoch=config.epoch,
                subject=subject,
                incarnation=incarnation,
                detected_at=float(step),
                **extra,
            )
        )
    return ops


def test_configurations_chained_by_commits_have_the_digests_of_their_content() -> None:
    rng = random.Random(7)
    peers = sorted((i.peer_id for i in IDENTITIES[:20]), key=lambda p: p.raw)
    config = make_configuration(
        run="r",
        epoch=0,
        activation_step=0,
        peers=peers,
        incarnations=[rng.choice([0, 1, 200]) for _ in peers],
        throughputs=[1.0] * len(peers),
        links=(LinkEntry(a=peers[0], b=peers[1], up=True, bandwidth_bytes_per_s=1e9, rtt_s=0.001),),
        params=RunParams(global_batch=256),
        seed=3,
        since_steps=[0] * len(peers),
    )
    check(config)
    step = 0
    spliced = 0
    for _ in range(150):
        step += rng.choice([1, 5, 150, 70000])
        ops = random_ops(rng, config, step)
        new, _ = next_configuration(config, [(op_id(op), op) for op in ops], step)
        check(new)
        spliced += new.packed_columns()[1] is not config.packed_columns()[1]
        config = new
        if len(config) < 6:
            break
    assert spliced >= 5  # the member set changed often enough to exercise the splice
