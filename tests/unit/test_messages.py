"""Typed messages: strict schema checks on decode, forward-compatible trailing fields."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message, MessageCodec


class Kind(enum.IntEnum):
    PING = 1
    CONTACTS = 2


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


CODEC = MessageCodec("test", Kind)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contact:
    peer: PeerID
    addrs: tuple[str, ...] = ()


@CODEC.register(Kind.PING)
@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    seq: int
    ok: bool
    weight: float
    color: Color = Color.RED
    note: str | None = None

    def validate(self) -> None:
        if self.seq < 0:
            raise RemoteProtocolError("negative seq")


@CODEC.register(Kind.CONTACTS)
@dataclass(frozen=True, slots=True, kw_only=True)
class Contacts(Message):
    contacts: tuple[Contact, ...]
    table: dict[str, int]


PEER = Identity.from_seed(b"\x07" * 32).peer_id


def decode(obj: object) -> Message:
    return CODEC.decode(pack(obj), max_bytes=1 << 16)


def test_round_trip_with_nested_records_and_peer_ids() -> None:
    message = Contacts(contacts=(Contact(peer=PEER, addrs=("/ip4/127.0.0.1/tcp/1",)),), table={"a": 1})
    assert CODEC.decode(CODEC.encode(message), max_bytes=1 << 16) == message


def test_defaults_fill_missing_trailing_fields_and_extra_fields_are_ignored() -> None:
    assert decode([1, 5, True, 1.0]) == Ping(seq=5, ok=True, weight=1.0)
    assert decode([1, 5, True, 1.0, 2, "n", "future field"]) == Ping(
        seq=5, ok=True, weight=1.0, color=Color.BLUE, note="n"
    )


def test_int_is_accepted_for_float_but_bool_is_not_int() -> None:
    assert decode([1, 5, False, 3]) == Ping(seq=5, ok=False, weight=3.0)
    with pytest.raises(RemoteProtocolError, match=r"Ping\.seq"):
        decode([1, True, False, 1.0])


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ({}, "non-empty array"),
        ([], "non-empty array"),
        (["1"], "must be an integer"),
        ([99], "unknown message type"),
        ([1, 5], "missing field 'ok'"),
        ([1, 5, "yes", 1.0], "Ping.ok"),
        ([1, 5, True, 1.0, 7], "not a valid Color"),
        ([1, -1, True, 1.0], "negative seq"),
        ([2, [[b"short"]], {}], "not a valid PeerID"),
        ([2, [["not bytes"]], {}], "PeerID bytes"),
        ([2, "x", {}], "expected array"),
        ([2, [], {"a": "b"}], "expected int"),
        ([2, [], {1: 1}], "map key"),
    ],
)
def test_schema_violations_are_remote_protocol_errors(obj: object, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode(obj)


def test_registering_twice_is_refused() -> None:
    with pytest.raises(TypeError):
        CODEC.register(Kind.PING)(Ping)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        json_like,
        st.lists(json_like, max_size=5).map(lambda rest: [2, *rest]),
        st.lists(json_like, max_size=6).map(lambda rest: [1, *rest]),
    )
)
def test_any_msgpack_object_decodes_or_raises_remote_protocol_error(obj: object) -> None:
    try:
        message = CODEC.from_obj(obj)
    except RemoteProtocolError:
        return
    assert isinstance(message, (Ping, Contacts))
