"""One logical stream on a secure connection: bytes, frames and messages, with flow control.

The connection's reader task hands decrypted payload to the stream; application tasks read and
write. ``receive_into`` lets the reader decrypt straight into the caller's buffer when a record fits
(the bulk path of state transfer), so large payloads are never copied through Python objects.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from chaosp2p.errors import ConnectionClosed, RemoteProtocolError, StreamReset
from chaosp2p.wire.framing import LENGTH_PREFIX, pack, unpack
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.protocol_ids import ProtocolId

if TYPE_CHECKING:
    from chaosp2p.transport.config import TransportConfig
    from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.transport")


class StreamCarrier(Protocol):
    """What a stream needs from the connection it is multiplexed on.

    :class:`~chaosp2p.transport.connection.Connection` is the one carrier; naming its part here
    keeps the stream below the connection (the connection creates streams, never the reverse).
    """

    remote_peer: PeerID
    config: TransportConfig
    last_received: float

    async def send_stream_data(self, stream: Stream, data: memoryview, *, eof: bool) -> None:
        """Send ``data`` on ``stream`` within the remote's window."""
        ...

    def consumed(self, stream: Stream, length: int) -> None:
        """The application took ``length`` bytes from ``stream``."""
        ...

    def set_receive_window(self, stream: Stream, target_bytes: int) -> None:
        """Raise ``stream``'s receive window."""
        ...

    def reset_stream(self, stream: Stream) -> None:
        """Abort ``stream`` (RST to the remote)."""
        ...


class Stream:
    """A bidirectional byte stream multiplexed on a connection (its :class:`StreamCarrier`)."""

    def __init__(self, connection: StreamCarrier, stream_id: int, protocol: ProtocolId, *, outbound: bool) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.protocol = protocol
        self.outbound = outbound
        self._syn_pending = outbound
        self._sent_eof = False
        self._chunks: deque[memoryview] = deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._data_event = anyio.Event()
        self._window_event = anyio.Event()
        self._direct: memoryview | None = None
        self._direct_filled = 0
        self._on_progress: Callable[[int], None] | None = None
        self._progress_base = 0
        """Bytes of the current ``receive_into`` target filled before ``_direct`` was posted."""
        self._handler_scope: anyio.CancelScope | None = None
        self._window_target = 0
        self._budget_bytes = 0
        """Receive window this stream holds from the host's budget (remote-opened streams only)."""
        self._idle_timeout_s: float | None = None
        """Its handler is cancelled when no byte moved for this long (inbound streams)."""
        self._orphaned_at: float | None = None
        """When its handler returned with the remote's direction still open and nothing unread: the
        stream stays half-closed until the remote's FIN, its next DATA (then it is reset), or the
        idle timeout."""
        self.last_activity = connection.last_received
        """When a byte last moved on this stream (connection clock), for the handler idle timeout."""

    @property
    def remote_peer(self) -> PeerID:
        """The authenticated peer at the other end."""
        return self.connection.remote_peer

    # ------------------------------------------------------------------ sending
    async def send(self, data: bytes | bytearray | memoryview, *, eof: bool = False) -> None:
        """Send all of ``data`` (waiting for window as needed); ``eof`` half-closes after it."""
        await self.connection.send_stream_data(self, memoryview(data).cast("B"), eof=eof)

    async def send_eof(self) -> None:
        """Half-close: tell the remote we will send nothing more."""
        if not self._sent_eof:
            await self.connection.send_stream_data(self, memoryview(b""), eof=True)

    async def send_frame(self, obj: Any, *, eof: bool = False) -> None:
        """Send one length-prefixed msgpack frame."""
        body = pack(obj)
        limit = self.connection.config.max_frame_bytes
        if len(body) > limit:
            raise ValueError(f"frame of {len(body)} bytes exceeds max_frame_bytes={limit}")
        await self.send(LENGTH_PREFIX.pack(len(body)) + body, eof=eof)

    async def send_message(self, codec: MessageCodec, message: Message, *, eof: bool = False) -> None:
        """Send one typed message as a frame."""
        await self.send_frame(codec.to_obj(message), eof=eof)

    # ------------------------------------------------------------------ receiving
    async def receive_some(self, max_bytes: int = 1 << 20) -> bytes:
        """Return up to ``max_bytes`` bytes as soon as any are available; ``b""`` at end of stream."""
        while not self._chunks:
            if self._eof:  # a clean end wins over a later reset: everything sent has arrived
                return b""
            if self._error is not None:
                raise self._error
            await self._wait_data()
        head = self._chunks[0]
        if len(head) <= max_bytes:
            self._chunks.popleft()
            out = bytes(head)
        else:
            out = bytes(head[:max_bytes])
            self._chunks[0] = head[max_bytes:]
        self._take(len(out))
        return out

    async def receive_into(
        self, view: memoryview | bytearray, *, on_progress: Callable[[int], None] | None = None
    ) -> None:
        """Fill ``view`` exactly; raises if the stream ends or resets first.

        While waiting, the connection decrypts records that fit straight into ``view``. If the
        connection fails authentication mid-way, ``view`` may hold garbage and this raises.

        ``on_progress(filled)`` is called with the number of leading bytes of ``view`` filled so
        far each time that grows; it runs in the connection's reader task, so it must neither
        block nor raise. It lets a consumer start on the first part of a large ``view`` while the
        rest arrives, with the whole remainder still posted for in-place decryption (between
        piece-by-piece waits a record can find no posted buffer and take a detour through a fresh
        buffer and a copy).
        """
        target = memoryview(view).cast("B")
        filled = self._drain_into(target)
        if filled and on_progress is not None:
            on_progress(filled)
        while filled < len(target):
            if self._error is not None:
                raise self._error
            if self._eof:
                raise RemoteProtocolError(f"stream ended after {filled} of {len(target)} expected bytes")
            self._direct = target[filled:]
            self._direct_filled = 0
            self._on_progress = on_progress
            self._progress_base = filled
            try:
                await self._wait_data()
            finally:
                filled += self._direct_filled
                self._direct = None
                self._direct_filled = 0
                self._on_progress = None
            drained = self._drain_into(target[filled:])
            filled += drained
            if drained and on_progress is not None:
                on_progress(filled)

    async def receive_exactly(self, count: int) -> bytearray:
        """Read exactly ``count`` bytes into a new buffer, which grows as the bytes arrive.

        ``count`` is usually what the remote announced (a frame's length prefix), so it is never
        allocated up front: a prefix claiming 1 MiB followed by silence costs what was received,
        not 1 MiB per stream. (For bulk bytes into a buffer of the caller's, use
        :meth:`receive_into`.)
        """
        out = bytearray()
        while len(out) < count:
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                if self._eof:
                    raise RemoteProtocolError(f"stream ended after {len(out)} of {count} expected bytes")
                await self._wait_data()
                continue
            head = self._chunks[0]
            need = count - len(out)
            if len(head) <= need:
                self._chunks.popleft()
                out += head
                taken = len(head)
            else:
                out += head[:need]
                self._chunks[0] = head[need:]
                taken = need
            self._take(taken)
        return out

    async def receive_frame(self) -> Any | None:
        """Read one length-prefixed msgpack frame; ``None`` if the stream ended cleanly before it."""
        header = bytearray(LENGTH_PREFIX.size)
        first = await self.receive_some(LENGTH_PREFIX.size)
        if not first:
            return None
        header[: len(first)] = first
        if len(first) < LENGTH_PREFIX.size:
            await self.receive_into(memoryview(header)[len(first) :])
        (length,) = LENGTH_PREFIX.unpack(header)
        limit = self.connection.config.max_frame_bytes
        if length > limit or length == 0:
            raise RemoteProtocolError(f"frame length {length} outside 1..{limit}")
        body = await self.receive_exactly(length)
        return unpack(memoryview(body), max_bytes=limit)

    async def receive_message(self, codec: MessageCodec) -> Message | None:
        """Read one typed message; ``None`` at a clean end of stream."""
        obj = await self.receive_frame()
        return None if obj is None else codec.from_obj(obj)

    def set_receive_window(self, target_bytes: int) -> None:
        """Let the remote send up to ``target_bytes`` ahead of our reads (for bulk transfers)."""
        self.connection.set_receive_window(self, target_bytes)

    # ------------------------------------------------------------------ closing
    async def aclose(self) -> None:
        """Finish our direction (FIN) if not done; the remote may still be sending."""
        if self._error is None and not self._sent_eof:
            try:
                await self.send_eof()
            except (ConnectionClosed, StreamReset):
                pass

    def reset(self) -> None:
        """Abort the stream in both directions (the remote sees :class:`StreamReset`)."""
        if self._error is None:
            self._fail(StreamReset(f"stream {self.stream_id} reset locally"))
        self.connection.reset_stream(self)

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            await self.aclose()
        else:
            self.reset()

    # ------------------------------------------------------------------ called by the connection
    def _direct_space(self, length: int) -> memoryview | None:
        """Where the reader may decrypt ``length`` bytes directly, if a waiting reader has room."""
        direct = self._direct
        if direct is None or self._chunks or len(direct) - self._direct_filled < length:
            return None
        return direct[self._direct_filled : self._direct_filled + length]

    def _direct_written(self, length: int) -> None:
        self.last_activity = self.connection.last_received
        self._direct_filled += length
        self.connection.consumed(self, length)
        if self._on_progress is not None:
            self._on_progress(self._progress_base + self._direct_filled)
        if self._direct is not None and self._direct_filled == len(self._direct):
            self._wake_data()

    def _deliver(self, payload: memoryview) -> None:
        self.last_activity = self.connection.last_received
        if len(payload):
            self._chunks.append(payload)
            self._buffered += len(payload)
            self._wake_data()

    def _deliver_eof(self) -> None:
        self.last_activity = self.connection.last_received
        self._eof = True
        self._wake_data()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake_data()
        self._window_event.set()

    def _window_opened(self) -> None:
        self._window_event.set()

    async def _wait_window(self) -> None:
        event = self._window_event = anyio.Event()
        await event.wait()
        if self._error is not None:
            raise self._error

    def _take(self, length: int) -> None:
        self._buffered -= length
        self.connection.consumed(self, length)

    def _drain_into(self, target: memoryview) -> int:
        filled = 0
        while self._chunks and filled < len(target):
            head = self._chunks[0]
            count = min(len(head), len(target) - filled)
            target[filled : filled + count] = head[:count]
            filled += count
            if count == len(head):
                self._chunks.popleft()
            else:
                self._chunks[0] = head[count:]
        if filled:
            self._take(filled)
        return filled

    async def _wait_data(self) -> None:
        if self._syn_pending:
            # Nothing sent yet: the remote cannot know this stream exists until the SYN goes out.
            # Callers re-check their condition after every wait, so returning here is always safe.
            await self.connection.send_stream_data(self, memoryview(b""), eof=False)
            return
        event = self._data_event = anyio.Event()
        await event.wait()

    def _wake_data(self) -> None:
        self._data_event.set()
