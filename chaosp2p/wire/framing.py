"""Length-prefixed msgpack frames.

A frame is a 4-byte big-endian unsigned length followed by exactly that many bytes of one msgpack
object. The length is checked against ``max_frame_bytes`` *before* any buffer for the body is
taken, and the body is unpacked with per-container limits no larger than the frame itself, so a
hostile peer cannot make us allocate more than a frame's worth of memory. Any undecodable input
becomes a :class:`RemoteProtocolError`; no other exception escapes the decoder.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from chaosp2p.errors import RemoteProtocolError

LENGTH_PREFIX = struct.Struct(">I")
DEFAULT_MAX_FRAME_BYTES = 1 << 20


def pack(obj: Any) -> bytes:
    """msgpack-encode ``obj`` the one way chaosp2p does (bin for bytes, str for text)."""
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(body: bytes | memoryview, *, max_bytes: int) -> Any:
    """Decode one msgpack object that must fill ``body`` exactly.

    Containers are capped by ``max_bytes`` (a container cannot have more items than the frame has
    bytes), ext types are refused, maps need str/int/bytes keys.
    """
    if len(body) > max_bytes:
        raise RemoteProtocolError(f"msgpack body of {len(body)} bytes exceeds the {max_bytes}-byte limit")
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=max_bytes,
            max_map_len=max_bytes,
            max_ext_len=0,
            ext_hook=_refuse_ext,
            timestamp=0,
        )
    except RemoteProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types (ValueError, StackError, ExtraData, …)
        raise RemoteProtocolError(f"undecodable msgpack: {type(exc).__name__}: {exc}") from None


def _refuse_ext(code: int, data: bytes) -> Any:
    raise RemoteProtocolError(f"msgpack ext type {code} is not allowed")


def encode_frame(obj: Any, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """Length-prefix the msgpack encoding of ``obj``; refuse to build a frame the peer would reject."""
    body = pack(obj)
    if len(body) > max_frame_bytes:
        raise ValueError(f"frame of {len(body)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    return LENGTH_PREFIX.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed bytes in any split, take whole decoded frames out.

    Sans-I/O: it never reads a socket. ``feed`` buffers at most one partial frame (bounded by
    ``max_frame_bytes`` + 4), and ``next_frame`` returns ``None`` until a whole frame has arrived.
    """

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._expected: int | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        self._buffer += data

    def next_frame(self) -> Any | None:
        """Decode and return the next whole frame's object, or ``None`` if more bytes are needed."""
        if self._expected is None:
            if len(self._buffer) < LENGTH_PREFIX.size:
                return None
            (length,) = LENGTH_PREFIX.unpack_from(self._buffer)
            if length > self.max_frame_bytes:
                raise RemoteProtocolError(f"frame length {length} exceeds max_frame_bytes={self.max_frame_bytes}")
            if length == 0:
                raise RemoteProtocolError("empty frame")
            del self._buffer[: LENGTH_PREFIX.size]
            self._expected = length
        if len(self._buffer) < self._expected:
            return None
        body = bytes(self._buffer[: self._expected])
        del self._buffer[: self._expected]
        self._expected = None
        return unpack(body, max_bytes=self.max_frame_bytes)

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held; non-zero at end of input means a truncated frame."""
        return len(self._buffer) + (LENGTH_PREFIX.size if self._expected is not None else 0)

    def close(self) -> None:
        """Declare end of input: a partial frame left over is a truncation error."""
        if self.pending_bytes:
            raise RemoteProtocolError(f"stream ended inside a frame ({self.pending_bytes} bytes pending)")
