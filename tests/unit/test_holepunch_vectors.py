"""protocols/holepunch.md: its msgpack vectors match the codec both ways; bad messages are refused.

Run ``python tests/unit/test_holepunch_vectors.py`` to print the vectors block for the spec.
"""

from __future__ import annotations

from chaosp2p.protocols.holepunch import MAX_PUNCH_ADDRS, Connect, Outcome, Refusal, Result, Sync, codec
from chaosp2p.wire.messages import Message
from tests.spec_blocks import message_vector_tests, print_vectors

SPEC = "holepunch.md"


def vector_messages() -> dict[str, Message]:
    """Every message vector by name."""
    return {
        "Connect": Connect(addrs=("/ip4/198.18.0.11/tcp/4001", "/ip4/198.19.1.10/tcp/4001")),
        "Sync": Sync(),
        "ResultConnected": Result(outcome=Outcome.CONNECTED),
        "ResultRefused": Result(outcome=Outcome.REFUSED),
        "ResultRefusedPortsChanged": Result(outcome=Outcome.REFUSED, reason=Refusal.PORTS_CHANGED),
    }


BAD: list[list[object]] = [
    [1, ["/ip4/1.2.3.4/tcp/1"] * (MAX_PUNCH_ADDRS + 1)],  # too many addresses
    [1, ["/ip4/1.2.3.4/tcp/" + "1" * 300]],  # an address too long
    [3, 99],  # unknown outcome
    [3, 3, -1],  # a refusal reason out of range
    [3, 3, 2**16],
    [9],  # unknown message type
]
"""Messages (as msgpack arrays) the codec must refuse."""

globals().update(message_vector_tests(SPEC, codec, vector_messages, BAD))


def test_an_older_peers_result_without_a_reason_still_decodes() -> None:
    """``Result.reason`` was appended: the two-item form of earlier versions reads as UNSPECIFIED."""
    assert codec.decode(bytes.fromhex("920303"), max_bytes=64) == Result(outcome=Outcome.REFUSED)
    assert codec.decode(bytes.fromhex("920303"), max_bytes=64).reason == Refusal.UNSPECIFIED


if __name__ == "__main__":
    print_vectors(codec, vector_messages())
