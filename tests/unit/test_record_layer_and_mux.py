"""Record sealing and the stream multiplexer, as pure machines."""

from __future__ import annotations

import pytest

from chaosp2p.errors import LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.channel.mux import (
    DataReceived,
    Ignored,
    Mux,
    MuxLimits,
    StreamRefused,
    StreamState,
    StreamWasReset,
    WindowGranted,
)
from chaosp2p.protocols.channel.record_layer import (
    HEADER_BYTES,
    TAG_BYTES,
    Flag,
    FrameType,
    RecordHeader,
    RecordOpener,
    RecordSealer,
    parse_header,
)

KEY = b"\x11" * 32
LIMITS = MuxLimits(max_record_bytes=1024, initial_window_bytes=100, max_window_bytes=10_000, max_streams=2)


def seal(sealer: RecordSealer, header: RecordHeader, payload: bytes) -> tuple[bytes, bytearray]:
    raw = header.pack()
    out = bytearray(len(payload) + TAG_BYTES)
    sealer.seal_into(raw, payload, memoryview(out))
    return raw, out


def test_records_round_trip_and_counters_advance() -> None:
    sealer, opener = RecordSealer(KEY), RecordOpener(KEY)
    for payload in (b"", b"hello", bytes(1000)):
        header = RecordHeader(len(payload), FrameType.DATA, Flag.NONE, 1, 0)
        raw, sealed = seal(sealer, header, payload)
        out = bytearray(len(payload))
        opener.open_into(raw, sealed, memoryview(out))
        assert out == payload


def test_altered_header_fails_authentication() -> None:
    sealer, opener = RecordSealer(KEY), RecordOpener(KEY)
    _raw, sealed = seal(sealer, RecordHeader(3, FrameType.DATA, Flag.NONE, 1, 0), b"abc")
    forged = RecordHeader(3, FrameType.DATA, Flag.FIN, 1, 0).pack()
    with pytest.raises(RemoteProtocolError, match="authentication"):
        opener.open_into(forged, sealed, memoryview(bytearray(3)))


def test_replayed_record_fails_authentication() -> None:
    sealer, opener = RecordSealer(KEY), RecordOpener(KEY)
    raw, sealed = seal(sealer, RecordHeader(1, FrameType.DATA, Flag.NONE, 1, 0), b"x")
    opener.open_into(raw, sealed, memoryview(bytearray(1)))
    with pytest.raises(RemoteProtocolError):
        opener.open_into(raw, sealed, memoryview(bytearray(1)))


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (RecordHeader(2000, FrameType.DATA, Flag.NONE, 1, 0).pack(), "exceeds max_record_bytes"),
        (bytes([0, 0, 0, 0, 9, 0, 0, 0]) + bytes(8), "unknown record type"),
        (bytes([0, 0, 0, 0, 0, 0x80, 0, 0]) + bytes(8), "unknown record flags"),
        (bytes([0, 0, 0, 0, 0, 0, 0, 1]) + bytes(8), "reserved"),
    ],
)
def test_bad_headers_are_rejected_before_any_body_is_read(raw: bytes, match: str) -> None:
    assert len(raw) == HEADER_BYTES
    with pytest.raises(RemoteProtocolError, match=match):
        parse_header(raw, max_record_bytes=1024)


def data(stream_id: int, length: int, flags: Flag = Flag.NONE, value: int = 0) -> RecordHeader:
    return RecordHeader(length, FrameType.DATA, flags, stream_id, value)


def window(stream_id: int, increment: int) -> RecordHeader:
    return RecordHeader(0, FrameType.WINDOW, Flag.NONE, stream_id, increment)


def test_stream_lifecycle_open_data_fin_both_ways() -> None:
    dialer, listener = Mux(is_dialer=True, limits=LIMITS), Mux(is_dialer=False, limits=LIMITS)
    sid = dialer.open_stream()
    assert sid == 1
    dialer.data_sent(sid, 10, fin=True)
    assert dialer.state(sid) is StreamState.LOCAL_CLOSED
    event = listener.record_received(data(sid, 10, Flag.SYN | Flag.FIN))
    assert event == DataReceived(sid, 10, True, True)
    assert listener.state(sid) is StreamState.REMOTE_CLOSED
    listener.data_sent(sid, 5, fin=True)
    assert listener.state(sid) is None  # closed both ways: forgotten
    assert dialer.record_received(data(sid, 5, Flag.FIN)) == DataReceived(sid, 5, True, False)
    assert dialer.state(sid) is None
    assert dialer.open_streams == 0


def test_send_window_blocks_and_grants_reopen_it() -> None:
    mux = Mux(is_dialer=True, limits=LIMITS)
    sid = mux.open_stream()
    assert mux.sendable(sid) == 100
    mux.data_sent(sid, 100, fin=False)
    assert mux.sendable(sid) == 0
    with pytest.raises(LocalProtocolError):
        mux.data_sent(sid, 1, fin=False)
    assert mux.record_received(window(sid, 50)) == WindowGranted(sid)
    assert mux.sendable(sid) == 50


def test_data_beyond_the_receive_window_is_a_remote_error() -> None:
    mux = Mux(is_dialer=False, limits=LIMITS)
    mux.record_received(data(1, 60, Flag.SYN))
    with pytest.raises(RemoteProtocolError, match="window"):
        mux.record_received(data(1, 41))


def test_consumption_grants_window_back_at_half() -> None:
    mux = Mux(is_dialer=False, limits=LIMITS)
    mux.record_received(data(1, 100, Flag.SYN))
    assert mux.consumed(1, 40) == 0
    assert mux.consumed(1, 10) == 50
    mux.record_received(data(1, 50))  # fits again after the grant


def test_raising_the_window_grants_the_difference_immediately() -> None:
    mux = Mux(is_dialer=False, limits=LIMITS)
    mux.record_received(data(1, 0, Flag.SYN))
    assert mux.set_receive_window(1, 5000) == 4900
    mux.record_received(data(1, 1024))
    with pytest.raises(LocalProtocolError):
        mux.set_receive_window(1, 10_001)


def test_streams_over_the_limit_are_refused_not_fatal() -> None:
    mux = Mux(is_dialer=False, limits=LIMITS)
    mux.record_received(data(1, 0, Flag.SYN))
    mux.record_received(data(3, 0, Flag.SYN))
    assert mux.record_received(data(5, 0, Flag.SYN)) == StreamRefused(5)
    assert mux.record_received(data(5, 3)) == Ignored(5)  # in flight before our RST arrived


@pytest.mark.parametrize(
    ("records", "match"),
    [
        ([data(2, 0, Flag.SYN)], "parity"),
        ([data(0, 0, Flag.SYN)], "parity or id 0"),
        ([data(3, 0, Flag.SYN), data(1, 0, Flag.SYN)], "went back"),
        ([data(1, 0, Flag.SYN), data(1, 0, Flag.SYN)], "reused"),
        ([data(7, 3)], "never opened"),
        ([window(9, 10)], "never opened"),
        ([data(1, 0, Flag.SYN | Flag.FIN), data(1, 1)], "after the remote's FIN"),
        ([data(1, 1, Flag.RST)], "RST record with a payload"),
        ([data(1, 0, Flag.SYN), window(1, 0)], "absurd window"),
        ([data(1, 0, Flag.SYN), window(1, 1 << 31)], "absurd window"),
        ([data(1, 0, Flag.SYN | Flag.ACK)], "ACK"),
    ],
)
def test_protocol_violations(records: list[RecordHeader], match: str) -> None:
    mux = Mux(is_dialer=False, limits=LIMITS)
    with pytest.raises(RemoteProtocolError, match=match):
        for record in records:
            mux.record_received(record)


def test_reset_frees_the_stream_and_late_records_are_ignored() -> None:
    mux = Mux(is_dialer=False, limits=LIMITS)
    mux.record_received(data(1, 0, Flag.SYN))
    assert mux.record_received(data(1, 0, Flag.RST)) == StreamWasReset(1)
    assert mux.record_received(data(1, 0, Flag.RST)) == Ignored(1)
    assert mux.record_received(window(1, 5)) == Ignored(1)
    sid = Mux(is_dialer=True, limits=LIMITS).open_stream()
    assert sid == 1


def test_local_reset_and_illegal_local_sends() -> None:
    mux = Mux(is_dialer=True, limits=LIMITS)
    sid = mux.open_stream()
    mux.data_sent(sid, 1, fin=True)
    with pytest.raises(LocalProtocolError):
        mux.data_sent(sid, 1, fin=False)
    assert mux.reset(sid)
    assert not mux.reset(sid)
    with pytest.raises(LocalProtocolError):
        mux.sendable(sid)
