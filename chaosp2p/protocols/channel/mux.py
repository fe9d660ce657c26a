"""Stream multiplexing and flow control over one secure connection (sans-I/O).

Theory of operation
-------------------
Many logical streams share one connection, in the manner of yamux: the dialer opens odd stream
ids, the listener even ones, ids only grow. A stream opens with a DATA record flagged SYN, may
half-close each direction with FIN, and either side may abort it with RST. Each direction of each
stream has a receive window: the receiver grants bytes with WINDOW records as its application
consumes them, and a sender may never have more unacknowledged bytes in flight than it was granted.
So a bulk stream that nobody reads cannot make the receiver buffer more than its window, and a
bulk stream does not starve a control stream: every stream is cut into records of bounded size
that interleave on the connection.

A receiver can raise one stream's window (``set_receive_window``) when it is about to pull a large
chunk into a preallocated buffer; windows are otherwise small, which bounds the memory a peer can
make us hold to ``max_streams * initial_window_bytes``.

This module decides what every incoming record means -- or that it is a protocol violation -- and
keeps the window accounting. It never touches a socket: the connection driver calls it with
decoded headers and does what the returned events say.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.channel.record_layer import Flag, FrameType, RecordHeader

MAX_STREAM_ID = (1 << 32) - 1
_ABSURD_WINDOW_BYTES = 1 << 31  # no sane peer grants more than 2 GiB unacknowledged


@dataclass(frozen=True, slots=True, kw_only=True)
class MuxLimits:
    """The bounds a connection enforces on its peer (from ``TransportConfig``)."""

    max_record_bytes: int = 1 << 20
    initial_window_bytes: int = 256 * 1024
    max_window_bytes: int = 64 << 20
    max_streams: int = 256


class StreamState(enum.Enum):
    """Lifecycle of one stream as seen from this side."""

    OPEN = "open"
    LOCAL_CLOSED = "local closed"  # we sent FIN; the remote may still send
    REMOTE_CLOSED = "remote closed"  # the remote sent FIN; we may still send
    CLOSED = "closed"
    RESET = "reset"


class StreamEvent(enum.Enum):
    """Inputs that move a stream between states."""

    SEND_FIN = "send fin"
    RECEIVE_FIN = "receive fin"
    RESET = "reset"


_TRANSITIONS: dict[tuple[StreamState, StreamEvent], StreamState] = {
    (StreamState.OPEN, StreamEvent.SEND_FIN): StreamState.LOCAL_CLOSED,
    (StreamState.OPEN, StreamEvent.RECEIVE_FIN): StreamState.REMOTE_CLOSED,
    (StreamState.LOCAL_CLOSED, StreamEvent.RECEIVE_FIN): StreamState.CLOSED,
    (StreamState.REMOTE_CLOSED, StreamEvent.SEND_FIN): StreamState.CLOSED,
    (StreamState.OPEN, StreamEvent.RESET): StreamState.RESET,
    (StreamState.LOCAL_CLOSED, StreamEvent.RESET): StreamState.RESET,
    (StreamState.REMOTE_CLOSED, StreamEvent.RESET): StreamState.RESET,
    (StreamState.CLOSED, StreamEvent.RESET): StreamState.RESET,
}
_CAN_RECEIVE = {StreamState.OPEN, StreamState.LOCAL_CLOSED}
_CAN_SEND = {StreamState.OPEN, StreamState.REMOTE_CLOSED}


@dataclass(slots=True)
class _Stream:
    state: StreamState
    send_window: int
    receive_window: int  # bytes the remote may still send before our next grant
    receive_target: int  # window we aim to keep granted
    unacknowledged: int = 0  # bytes consumed by the application but not yet granted back


# ---------------------------------------------------------------------------- events to the driver
@dataclass(frozen=True, slots=True)
class StreamRefused:
    """The remote opened a stream beyond our limit; the driver must send the returned RST."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class DataReceived:
    """``length`` payload bytes for ``stream_id`` follow; ``fin`` ends the remote's direction.

    ``opened`` is true on the record that opened the stream (SYN), so the driver creates the stream
    object and starts the protocol handler before delivering the payload.
    """

    stream_id: int
    length: int
    fin: bool
    opened: bool = False


@dataclass(frozen=True, slots=True)
class StreamWasReset:
    """The remote aborted ``stream_id``."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class WindowGranted:
    """The remote granted more send window on ``stream_id``."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class Ignored:
    """A record for a stream that is already gone (a race with our own RST); drop its payload."""

    stream_id: int


class Mux:
    """Stream table and flow-control accounting for one connection."""

    def __init__(self, *, is_dialer: bool, limits: MuxLimits) -> None:
        self.limits = limits
        self._streams: dict[int, _Stream] = {}
        self._next_local_id = 1 if is_dialer else 2
        self._remote_parity = 0 if is_dialer else 1
        self._highest_remote_id = 0
        self._remote_open_count = 0

    # ------------------------------------------------------------------ local actions
    def open_stream(self) -> int:
        """Allocate a new outbound stream id (the driver sends the SYN with the first payload)."""
        stream_id = self._next_local_id
        if stream_id > MAX_STREAM_ID:
            raise LocalProtocolError("stream ids exhausted on this connection; open a new one")
        self._next_local_id += 2
        self._streams[stream_id] = self._new_stream()
        return stream_id

    def sendable(self, stream_id: int) -> int:
        """How many bytes may be sent on ``stream_id`` right now (0: wait for a window grant)."""
        stream = self._require(stream_id)
        if stream.state not in _CAN_SEND:
            raise LocalProtocolError(f"stream {stream_id} cannot send in state {stream.state.value!r}")
        return min(stream.send_window, self.limits.max_record_bytes)

    def data_sent(self, stream_id: int, length: int, *, fin: bool) -> None:
        """Account for a DATA record of ``length`` bytes the driver is about to write."""
        stream = self._require(stream_id)
        if stream.state not in _CAN_SEND:
            raise LocalProtocolError(f"stream {stream_id} cannot send in state {stream.state.value!r}")
        if length > stream.send_window:
            raise LocalProtocolError(f"stream {stream_id}: {length} bytes exceed the send window")
        stream.send_window -= length
        if fin:
            self._transition(stream_id, stream, StreamEvent.SEND_FIN)

    def reset(self, stream_id: int) -> bool:
        """Abort a stream locally; True if the driver should send an RST record."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return False
        self._forget(stream_id)
        return True

    def consumed(self, stream_id: int, length: int) -> int:
        """The application took ``length`` bytes; returns a window increment to send (or 0)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.state not in _CAN_RECEIVE:
            return 0
        stream.unacknowledged += length
        if stream.unacknowledged * 2 < stream.receive_target:
            return 0
        grant, stream.unacknowledged = stream.unacknowledged, 0
        stream.receive_window += grant
        return grant

    def set_receive_window(self, stream_id: int, target_bytes: int) -> int:
        """Raise the window this side keeps granted; returns the increment to send now (or 0)."""
        if not 0 < target_bytes <= self.limits.max_window_bytes:
            raise LocalProtocolError(f"receive window must be in (0, {self.limits.max_window_bytes}]")
        stream = self._streams.get(stream_id)
        if stream is None or stream.state not in _CAN_RECEIVE or target_bytes <= stream.receive_target:
            return 0
        grant = target_bytes - stream.receive_target
        stream.receive_target = target_bytes
        stream.receive_window += grant
        return grant

    def state(self, stream_id: int) -> StreamState | None:
        """The stream's state, or ``None`` once it is forgotten."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.state

    @property
    def open_streams(self) -> int:
        """Streams not yet closed or reset."""
        return len(self._streams)

    # ------------------------------------------------------------------ remote records
    def record_received(self, header: RecordHeader) -> object:
        """Interpret one stream-level record (DATA or WINDOW) and return what the driver must do."""
        if header.type is FrameType.WINDOW:
            return self._window_received(header)
        if header.type is not FrameType.DATA:
            raise LocalProtocolError(f"{header.type.name} is not a stream record")
        stream_id = header.stream_id
        flags = header.flags
        if flags & Flag.ACK:
            raise RemoteProtocolError("ACK flag on a DATA record")
        if flags & Flag.RST:
            if header.length:
                raise RemoteProtocolError("RST record with a payload")
            if self._streams.pop(stream_id, None) is None:
                return Ignored(stream_id)
            self._stream_gone(stream_id)
            return StreamWasReset(stream_id)
        if flags & Flag.SYN:
            refused = self._remote_open(stream_id)
            if refused is not None:
                return refused
            return self._data(stream_id, header, opened=True)
        return self._data(stream_id, header)

    # ------------------------------------------------------------------ internals
    def _new_stream(self) -> _Stream:
        window = self.limits.initial_window_bytes
        return _Stream(StreamState.OPEN, window, window, window)

    def _require(self, stream_id: int) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"stream {stream_id} is not open")
        return stream

    def _transition(self, stream_id: int, stream: _Stream, event: StreamEvent) -> None:
        new_state = _TRANSITIONS.get((stream.state, event))
        if new_state is None:
            raise LocalProtocolError(f"stream {stream_id}: {event.value!r} in state {stream.state.value!r}")
        stream.state = new_state
        if new_state in (StreamState.CLOSED, StreamState.RESET):
            self._forget(stream_id)

    def _forget(self, stream_id: int) -> None:
        if self._streams.pop(stream_id, None) is not None:
            self._stream_gone(stream_id)

    def _stream_gone(self, stream_id: int) -> None:
        if stream_id % 2 == self._remote_parity:
            self._remote_open_count -= 1

    def _remote_open(self, stream_id: int) -> StreamRefused | None:
        if stream_id == 0 or stream_id % 2 != self._remote_parity:
            raise RemoteProtocolError(f"remote opened stream {stream_id} with our parity or id 0")
        if stream_id <= self._highest_remote_id:
            raise RemoteProtocolError(f"remote reused or went back to stream id {stream_id}")
        self._highest_remote_id = stream_id
        if self._remote_open_count >= self.limits.max_streams:
            return StreamRefused(stream_id)
        self._remote_open_count += 1
        self._streams[stream_id] = self._new_stream()
        return None

    def _data(self, stream_id: int, header: RecordHeader, *, opened: bool = False) -> object:
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._known_gone(stream_id):
                return Ignored(stream_id)
            raise RemoteProtocolError(f"DATA for stream {stream_id} that was never opened")
        if stream.state not in _CAN_RECEIVE:
            raise RemoteProtocolError(f"DATA on stream {stream_id} after the remote's FIN")
        if header.length > stream.receive_window:
            raise RemoteProtocolError(
                f"stream {stream_id}: {header.length} bytes exceed the {stream.receive_window}-byte window"
            )
        stream.receive_window -= header.length
        fin = bool(header.flags & Flag.FIN)
        if fin:
            self._transition(stream_id, stream, StreamEvent.RECEIVE_FIN)
        return DataReceived(stream_id, header.length, fin, opened)

    def _window_received(self, header: RecordHeader) -> object:
        if header.length:
            raise RemoteProtocolError("WINDOW record with a payload")
        stream = self._streams.get(header.stream_id)
        if stream is None:
            if self._known_gone(header.stream_id):
                return Ignored(header.stream_id)
            raise RemoteProtocolError(f"WINDOW for stream {header.stream_id} that was never opened")
        if header.value == 0 or stream.send_window + header.value > _ABSURD_WINDOW_BYTES:
            raise RemoteProtocolError(f"stream {header.stream_id}: absurd window increment {header.value}")
        stream.send_window += header.value
        return WindowGranted(header.stream_id)

    def _known_gone(self, stream_id: int) -> bool:
        if stream_id == 0:
            return False
        if stream_id % 2 == self._remote_parity:
            return stream_id <= self._highest_remote_id
        return stream_id < self._next_local_id
