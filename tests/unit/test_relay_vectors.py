"""protocols/relay.md: its msgpack vectors match the codec both ways; bad messages are refused.

Run ``python tests/unit/test_relay_vectors.py`` to print the vectors block for the spec.
"""

from __future__ import annotations

from chaosp2p.protocols.relay import MAX_REASON_CHARS, Hop, Reservation, Reserve, Status, StatusCode, Stop, codec
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.messages import Message
from tests.spec_blocks import message_vector_tests, print_vectors

SPEC = "relay.md"

IA, IB = (Identity.from_seed(bytes([seed]) * 32) for seed in (1, 2))


def vector_messages() -> dict[str, Message]:
    """Every message vector by name."""
    return {
        "Hop": Hop(target=IB.peer_id),
        "Stop": Stop(source=IA.peer_id),
        "StatusOk": Status(code=StatusCode.OK),
        "StatusNoConnection": Status(code=StatusCode.NO_CONNECTION, reason="the relay has no connection to the target"),
        "Reserve": Reserve(),
        "Reservation": Reservation(
            ttl_s=3600.0, addrs=(f"/ip4/198.18.0.1/tcp/4001/p2p/{IA.peer_id}/p2p-circuit/p2p/{IB.peer_id}",)
        ),
    }


BAD: list[list[object]] = [
    [3, 99, ""],  # unknown status code
    [3, 0, "x" * (MAX_REASON_CHARS + 1)],  # reason too long
    [1, b"not a peer id"],
    [9, b""],  # unknown message type
    [5, 0.0, []],  # a reservation without a lifetime
    [5, float("inf"), []],
    [5, 60.0, ["x"] * 9],  # too many addresses
    [3, 6, "x" * 300],  # reason too long (the new code itself is fine)
]
"""Messages (as msgpack arrays) the codec must refuse."""

globals().update(message_vector_tests(SPEC, codec, vector_messages, BAD))


if __name__ == "__main__":
    print_vectors(codec, vector_messages())
