"""protocols/holepunch.md: its msgpack vectors match the codec both ways; bad messages are refused.

Run ``python tests/unit/test_holepunch_vectors.py`` to print the vectors block for the spec.
"""

from __future__ import annotations

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.holepunch import MAX_PUNCH_ADDRS, Connect, Outcome, Result, Sync, codec
from chaosp2p.wire.framing import pack
from chaosp2p.wire.messages import Message
from tests.spec_blocks import named_lines

SPEC = "holepunch.md"


def vector_messages() -> dict[str, Message]:
    """Every message vector by name."""
    return {
        "Connect": Connect(addrs=("/ip4/198.18.0.11/tcp/4001", "/ip4/198.19.1.10/tcp/4001")),
        "Sync": Sync(),
        "ResultConnected": Result(outcome=Outcome.CONNECTED),
        "ResultRefused": Result(outcome=Outcome.REFUSED),
    }


def test_spec_lists_exactly_the_known_vectors() -> None:
    assert set(named_lines(SPEC, "vectors")) == set(vector_messages())


def test_every_message_type_has_a_vector() -> None:
    assert {m.TYPE for m in vector_messages().values()} == set(codec.message_classes())


@pytest.mark.parametrize("name", sorted(vector_messages()))
def test_vector_encodes_and_decodes(name: str) -> None:
    expected = vector_messages()[name]
    data = bytes.fromhex(named_lines(SPEC, "vectors")[name])
    assert codec.encode(expected) == data
    assert codec.decode(data, max_bytes=1 << 16) == expected


@pytest.mark.parametrize(
    "obj",
    [
        [1, ["/ip4/1.2.3.4/tcp/1"] * (MAX_PUNCH_ADDRS + 1)],  # too many addresses
        [1, ["/ip4/1.2.3.4/tcp/" + "1" * 300]],  # an address too long
        [3, 99],  # unknown outcome
        [9],  # unknown message type
    ],
)
def test_bad_messages_are_refused(obj: list[object]) -> None:
    with pytest.raises(RemoteProtocolError):
        codec.decode(pack(obj), max_bytes=1 << 16)


if __name__ == "__main__":
    for vector_name, message in vector_messages().items():
        print(vector_name, codec.encode(message).hex())
