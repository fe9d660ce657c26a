"""Decoding a configuration checks its member columns whole (the fast path a newcomer takes for
runs of ~1000 members) and still refuses every bad entry with the precise reason."""

from __future__ import annotations

from typing import Any

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.run_configuration import RunParams, make_configuration
from chaosp2p.wire.framing import pack, unpack
from chaosp2p.wire.identity import Identity, PeerID

PEERS = sorted((Identity.from_seed(bytes([i + 40]) * 32).peer_id for i in range(5)), key=lambda p: p.raw)
MAX_STEP = (1 << 53) - 1


def encoded() -> list[Any]:
    config = make_configuration(
        run="r",
        epoch=2,
        activation_step=7,
        peers=PEERS,
        incarnations=[0, 1, 2, 3, 4],
        throughputs=[1.0, 2.0, 3.0, 4.0, 5.0],
        links=(),
        params=RunParams(global_batch=64),
        seed=5,
        since_steps=[0, 1, 2, 3, 7],
    )
    decoded = decode_configuration(config.encode(), max_members=16, max_links=16)
    assert decoded == config and decoded.ids() == tuple(p.raw for p in PEERS)
    obj = unpack(config.encode(), max_bytes=1 << 20)
    assert isinstance(obj, list)
    return obj


def refused(obj: list[Any], match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_configuration(pack(obj), max_members=16, max_links=16)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (b"\x00" * 38, "not a PeerID"),
        (PEERS[1].raw[:-1], "not a PeerID"),
        ("text", "not a PeerID"),
        (7, "not a PeerID"),
    ],
)
def test_a_member_that_is_not_a_peer_id_is_refused(bad: object, match: str) -> None:
    obj = encoded()
    obj[3][2] = bad
    refused(obj, match)


def test_members_out_of_order_or_repeated_are_refused() -> None:
    obj = encoded()
    obj[3][1], obj[3][2] = obj[3][2], obj[3][1]
    refused(obj, "sorted and distinct")
    obj = encoded()
    obj[3][2] = obj[3][1]
    refused(obj, "sorted and distinct")


@pytest.mark.parametrize(
    ("column", "bad", "match"),
    [
        (4, True, "incarnation must be an int"),
        (4, 1.0, "incarnation must be an int"),
        (4, -1, "incarnation out of range"),
        (4, MAX_STEP + 1, "incarnation out of range"),
        (5, 1, "throughput must be a float"),
        (5, float("nan"), "throughput out of range"),
        (5, float("inf"), "throughput out of range"),
        (5, -1.0, "throughput out of range"),
        (5, 1e13, "throughput out of range"),
        (6, False, "since step must be an int"),
        (6, -2, "since step out of range"),
    ],
)
def test_a_bad_column_value_is_refused_with_its_reason(column: int, bad: object, match: str) -> None:
    obj = encoded()
    obj[column][3] = bad
    refused(obj, match)


def test_from_raws_matches_the_constructor_and_refuses_what_it_refuses() -> None:
    raws = [p.raw for p in PEERS]
    made = PeerID.from_raws(raws)
    assert made == tuple(PeerID(r) for r in raws)
    assert [hash(p) for p in made] == [hash(PeerID(r)) for r in raws]
    assert PeerID.from_raws([]) == ()
    for bad in (raws[0][:-1], b"\x01" + raws[0][1:], raws[0][:5] + b"\x21" + raws[0][6:]):
        with pytest.raises(ValueError):
            PeerID(bad)
        with pytest.raises(ValueError):
            PeerID.from_raws([raws[1], bad])
    with pytest.raises(ValueError):  # only bytes, as a decoded configuration holds
        PeerID.from_raws([raws[1], bytearray(raws[0])])


def test_a_refusal_from_a_member_without_progress_crosses_the_wire() -> None:
    # A newcomer (completed -1) refuses a value that falsely FAILs it; the refusal must decode,
    # or the receiver drops the connection and the proposer never hears why.
    from chaosp2p.protocols.negotiation import codec
    from chaosp2p.protocols.negotiation.messages import Ballot, RefusePast

    message = RefusePast(run="r", epoch=3, ballot=Ballot(round=1, proposer=PEERS[0]), completed=-1)
    assert codec.decode(codec.encode(message), max_bytes=1 << 16) == message
    with pytest.raises(RemoteProtocolError, match="completed"):
        codec.decode(codec.encode(RefusePast(run="r", epoch=3, ballot=message.ballot, completed=-2)), max_bytes=1 << 16)
