"""Wire messages of /chaos/average/1: round trips, limits, strictness."""

from __future__ import annotations

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.averaging import Contribution, Exclusion, Result, ResultStatus, RoundPhase, RoundTag, WireDtype
from chaosp2p.protocols.averaging.messages import WIRE_MAX_ELEMENTS, codec
from chaosp2p.wire.identity import Identity

PEER = Identity.from_seed(b"\x07" * 32).peer_id
TAG = RoundTag(run="run", epoch=3, config_digest=b"\x01" * 32, step=17, phase=RoundPhase.OUTER)


def roundtrip(message: object) -> object:
    return codec.decode(codec.encode(message), max_bytes=1 << 20)  # type: ignore[arg-type]


def test_messages_survive_the_wire() -> None:
    contribution = Contribution(
        tag=TAG, total_elements=1000, start=64, stop=128, wire_dtype=WireDtype.BFLOAT16, weight=2.5, payload_bytes=128
    )
    result = Result(
        status=ResultStatus.OK,
        start=64,
        stop=128,
        wire_dtype=WireDtype.FLOAT16,
        payload_bytes=128,
        total_weight=7.0,
        excluded=(Exclusion(peer=PEER, reason="non-finite values"),),
        included=(PEER,),
        revision=1,
    )
    assert roundtrip(contribution) == contribution
    assert roundtrip(result) == result
    assert roundtrip(Result(status=ResultStatus.ABORTED, missing=(PEER,))) == Result(
        status=ResultStatus.ABORTED, missing=(PEER,)
    )


def test_round_tags_order_by_epoch_step_and_phase() -> None:
    later = RoundTag(run="run", epoch=3, config_digest=b"x", step=18, phase=RoundPhase.GRADIENTS)
    assert later.order > TAG.order
    assert RoundTag(run="r", epoch=0, config_digest=b"", step=0, phase=1).phase is RoundPhase.PARAMETERS  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "obj",
    [
        [1, ["", 0, b"", 0, 0], 10, 0, 10, 1, 1.0, 40],  # empty run id
        [1, ["r", 0, b"d" * 65, 0, 0], 10, 0, 10, 1, 1.0, 40],  # digest too long
        [1, ["r", 0, b"d", 0, 0], 10, 5, 4, 1, 1.0, 0],  # stop before start
        [1, ["r", 0, b"d", 0, 0], WIRE_MAX_ELEMENTS + 1, 0, 10, 1, 1.0, 40],  # absurd length
        [1, ["r", 0, b"d", 0, 9], 10, 0, 10, 1, 1.0, 40],  # unknown phase
        [1, ["r", 0, b"d", 0, 0], 10, 0, 10, 7, 1.0, 40],  # unknown wire dtype
        [1, ["r", -1, b"d", 0, 0], 10, 0, 10, 1, 1.0, 40],  # negative epoch
        [2, 0, "", 0, 0, 1, 4, 0.0, [], [], [], 2],  # revision out of range
        [2, 1, "", 0, 0, 1, 4, 0.0, [], [], [], 0],  # a refusal with a payload
        [2, 0, "x" * 1025],  # detail too long
    ],
)
def test_malformed_messages_are_remote_protocol_errors(obj: list[object]) -> None:
    with pytest.raises(RemoteProtocolError):
        codec.from_obj(obj)
