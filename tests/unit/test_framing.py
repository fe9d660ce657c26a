"""Frame codec: round trips, limits checked before allocation, and hostile bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.framing import FrameDecoder, encode_frame, unpack


def test_round_trip_in_arbitrary_splits() -> None:
    objects = [[1, "x"], {"a": b"\x00\x01"}, 7, [[], {}, None, 1.5, True]]
    stream = b"".join(encode_frame(o) for o in objects)
    decoder = FrameDecoder(max_frame_bytes=1024)
    out = []
    for i in range(len(stream)):  # one byte at a time: the worst split
        decoder.feed(stream[i : i + 1])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == objects
    decoder.close()


def test_oversized_length_is_rejected_before_the_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    decoder.feed(struct.pack(">I", 1001))  # only the prefix: nothing to allocate from yet
    with pytest.raises(RemoteProtocolError, match="exceeds max_frame_bytes"):
        decoder.next_frame()


def test_huge_length_claim_does_not_allocate() -> None:
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    decoder.feed(b"\xff\xff\xff\xff")
    with pytest.raises(RemoteProtocolError):
        decoder.next_frame()
    assert decoder.pending_bytes <= 8


def test_truncated_frame_is_an_error_at_end_of_input() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame([1, 2, 3])[:-1])
    assert decoder.next_frame() is None
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        decoder.close()


def test_empty_frame_is_rejected() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\0\0\0\0")
    with pytest.raises(RemoteProtocolError, match="empty frame"):
        decoder.next_frame()


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # never-used msgpack byte
        b"\x92\x01",  # array of 2 with one item
        b"\x91\x01\x02",  # trailing data
        b"\xd6\xff\x00\x00\x00\x00",  # timestamp ext
        b"\xc7\x01\x05x",  # ext type 5
        b"\xa3\xff\xfe\xfd",  # invalid UTF-8 str
        b"\x81\x90\x01",  # map with an array key
        b"\x91" * 5000,  # nesting bomb
        b"\xdd\xff\xff\xff\xff",  # array claiming 4 billion items
    ],
)
def test_hostile_bodies_are_remote_protocol_errors(body: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        unpack(body, max_bytes=10_000)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2048), st.integers(min_value=1, max_value=64))
def test_any_bytes_yield_frames_or_remote_protocol_error(data: bytes, chunk: int) -> None:
    decoder = FrameDecoder(max_frame_bytes=4096)
    try:
        for i in range(0, len(data), chunk):
            decoder.feed(data[i : i + chunk])
            while decoder.next_frame() is not None:
                pass
    except RemoteProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=False)
        | st.text()
        | st.binary(),
        lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
        max_leaves=20,
    )
)
def test_every_encodable_object_round_trips(obj: object) -> None:
    decoder = FrameDecoder(max_frame_bytes=1 << 20)
    decoder.feed(encode_frame(obj))
    assert decoder.next_frame() == obj
