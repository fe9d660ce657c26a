"""A secure, multiplexed connection to one authenticated peer (the I/O driver).

Theory of operation
-------------------
The connection owns one non-blocking socket and runs three tasks in its own task group:

* the *reader* reads a 16-byte record header, checks its length against the limit, reads the body
  into a preallocated buffer, authenticates and decrypts it -- straight into a stream's waiting
  buffer when one fits -- and only then lets the :class:`~chaosp2p.protocols.channel.mux.Mux` interpret it;
* the *control writer* sends what the reader must never block on (window grants, pongs, resets), so
  a reader never waits for the socket's send side: two peers with full send buffers cannot deadlock;
* the *keepalive* pings a quiet connection and closes one that stopped answering.

Application tasks write records directly under a fair lock; each record is encrypted into one
preallocated buffer and sent with a single gathered write. Decisions about what a record means live
in the mux and records machines; this class only moves bytes and wakes tasks.

Anything the remote peer does wrong is a :class:`RemoteProtocolError`: the connection sends GOAWAY
with the reason, logs it, closes, and every stream on it fails with :class:`ConnectionClosed`. The
peer itself keeps serving its other connections.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import (
    ChaosError,
    ConnectionClosed,
    LocalProtocolError,
    ProtocolNotSupported,
    RemoteProtocolError,
    RequestTimeout,
    StreamReset,
)
from chaosp2p.protocols.channel import mux as muxp
from chaosp2p.protocols.channel.hello import HELLO_CODEC, Hello
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
from chaosp2p.transport.budget import ReceiveBudget
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.transport.shaper import LinkShaper, TokenBucket
from chaosp2p.transport.sockets import close_socket, receive_into, send_all
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.framing import pack, unpack
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.protocol_ids import ProtocolId, choose_version

log = logging.getLogger("chaosp2p.transport")

UNASSIGNED_STREAM_ID = 0
"""An outbound stream's id until its SYN is sent (0 is never a valid stream id)."""

MessageHandler = Callable[["Connection", str, bytes], None]


class GoAwayCode:
    """Error codes carried in GOAWAY's value field."""

    NORMAL = 0
    PROTOCOL_ERROR = 1
    IDLE = 2
    SHUTDOWN = 3
    DEAD = 4


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """Counters of one connection."""

    remote_peer: PeerID
    is_dialer: bool
    open_streams: int
    bytes_sent: int
    bytes_received: int
    records_sent: int
    records_received: int
    rtt_s: float | None
    age_s: float
    records_decrypted_in_place: int
    """DATA records decrypted straight into a waiting reader's buffer (no copy)."""


class Connection:
    """An authenticated, encrypted, multiplexed connection. Create through :class:`Host`."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        remote_peer: PeerID,
        send_key: bytes,
        receive_key: bytes,
        is_dialer: bool,
        config: TransportConfig,
        clock: Clock,
        local_hello: Hello,
        local_protocols: tuple[ProtocolId, ...],
        stream_handler: Callable[[Stream], Awaitable[None]],
        message_handler: MessageHandler,
        remote_address: tuple[str, int],
        initial_bytes: bytes = b"",
        shaper: TokenBucket | None = None,
        budget: ReceiveBudget | None = None,
        handler_idle_timeout: Callable[[ProtocolId], float | None] | None = None,
        links: LinkShaper | None = None,
    ) -> None:
        self.remote_peer = remote_peer
        self._budget = budget
        self._handler_idle_timeout = handler_idle_timeout or (lambda protocol: config.handler_idle_timeout_s)
        self.is_dialer = is_dialer
        self.config = config
        self.remote_address = remote_address
        self.remote_hello: Hello | None = None
        self._sock = sock
        self._clock = clock
        self._shaper = shaper
        self._links = links
        # Records held by the link shaper's delay line (release time, bytes); only used with ``links``.
        self._delayed: deque[tuple[float, bytes]] = deque()
        self._delayed_event = anyio.Event()
        self._delay_drained = anyio.Event()
        self._sealer = RecordSealer(send_key)
        self._opener = RecordOpener(receive_key)
        self._mux = muxp.Mux(is_dialer=is_dialer, limits=config.mux_limits)
        self._local_hello = local_hello
        self._local_protocols = local_protocols
        self._remote_protocols: tuple[ProtocolId, ...] = ()
        self._stream_handler = stream_handler
        self._message_handler = message_handler
        self._streams: dict[int, Stream] = {}
        self._send_lock = anyio.Lock()
        self._unsent: bytes | None = None
        """The tail of a record :meth:`try_send_message_nowait` could not hand to the kernel at
        once; the next writer sends it first (under the send lock), so records never interleave."""
        self._send_buffer = bytearray(config.max_record_bytes + TAG_BYTES)
        self._receive_buffer = bytearray(config.max_record_bytes + TAG_BYTES)
        self._initial = bytearray(initial_bytes)
        self._ready = anyio.Event()
        self._closed = anyio.Event()
        self._close_reason = ""
        self._control_event = anyio.Event()
        self._pending_windows: dict[int, int] = {}
        self._pending_resets: set[int] = set()
        self._pending_pong: int | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._created = clock.now()
        self.last_received = self._created
        self.last_sent = self._created
        self.last_activity = self._created
        self._ping_sent_at: dict[int, float] = {}
        self._ping_waiters: dict[int, anyio.Event] = {}
        self._ping_counter = 0
        self.rtt_s: float | None = None
        self._bytes_sent = 0
        self._bytes_received = 0
        self._records_sent = 0
        self._records_received = 0
        self._records_in_place = 0

    # ------------------------------------------------------------------ lifecycle
    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the connection until it closes; ``task_status.started()`` once Hellos are exchanged."""
        started = False
        try:
            with unwrap_single_error():
                async with anyio.create_task_group() as tg:
                    self._task_group = tg
                    tg.start_soon(self._read_loop)
                    tg.start_soon(self._control_loop)
                    if self._links is not None:
                        tg.start_soon(self._delay_loop)
                    await self._send_record(FrameType.HELLO, Flag.NONE, 0, 0, HELLO_CODEC.encode(self._local_hello))
                    with anyio.fail_after(self.config.handshake_timeout_s):
                        await self._ready.wait()
                    task_status.started()
                    started = True
                    tg.start_soon(self._keepalive_loop)
                    await self._closed.wait()
                    tg.cancel_scope.cancel()
            if not started:  # closed (and its tasks cancelled) before the remote's Hello arrived
                raise ConnectionClosed(f"connection to {self.remote_peer.short()} closed: {self._close_reason}")
        except TimeoutError:
            self._mark_closed("no Hello within the handshake timeout")
            raise RemoteProtocolError(f"{self.remote_peer}: no Hello within the handshake timeout") from None
        finally:
            self._mark_closed(self._close_reason or "connection task ended")
            close_socket(self._sock)

    @property
    def closed(self) -> bool:
        """True once the connection is closed or closing."""
        return self._closed.is_set()

    @property
    def close_reason(self) -> str:
        """Why the connection closed (empty while open)."""
        return self._close_reason

    @property
    def remote_protocols(self) -> tuple[ProtocolId, ...]:
        """Protocols the remote advertised in its Hello."""
        return self._remote_protocols

    async def wait_closed(self) -> None:
        """Return once the connection has closed."""
        await self._closed.wait()

    async def aclose(self, reason: str = "closed locally", code: int = GoAwayCode.NORMAL) -> None:
        """Send GOAWAY (best effort, bounded) and close."""
        if self.closed:
            return
        with anyio.move_on_after(1.0):
            try:
                await self._send_record(FrameType.GOAWAY, Flag.NONE, 0, code, reason.encode()[:256])
            except ChaosError:
                pass
            if self._delayed and not self.closed:  # link shaping: let the goodbye leave the delay line
                self._delay_drained = anyio.Event()
                await self._delay_drained.wait()
        self._mark_closed(reason)

    def _mark_closed(self, reason: str) -> None:
        if self._closed.is_set():
            return
        self._close_reason = reason
        self._closed.set()
        error = ConnectionClosed(f"connection to {self.remote_peer.short()} closed: {reason}")
        for stream in list(self._streams.values()):
            stream._fail(error)
        for stream_id in list(self._streams):
            self._drop_stream(stream_id)
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()

    def statistics(self) -> ConnectionStatistics:
        """A snapshot of this connection's counters."""
        return ConnectionStatistics(
            remote_peer=self.remote_peer,
            is_dialer=self.is_dialer,
            open_streams=len(self._streams),
            bytes_sent=self._bytes_sent,
            bytes_received=self._bytes_received,
            records_sent=self._records_sent,
            records_received=self._records_received,
            rtt_s=self.rtt_s,
            age_s=self._clock.now() - self._created,
            records_decrypted_in_place=self._records_in_place,
        )

    # ------------------------------------------------------------------ opening streams and RPC
    def supports(self, protocol_name: str, majors: tuple[int, ...] = (1,)) -> bool:
        """True if the remote speaks one of the ``majors`` of ``protocol_name``."""
        try:
            self._choose(protocol_name, majors)
        except ProtocolNotSupported:
            return False
        return True

    def _choose(self, protocol_name: str, majors: tuple[int, ...]) -> ProtocolId:
        return choose_version(protocol_name, (ProtocolId(protocol_name, m) for m in majors), self._remote_protocols)

    def open_stream(self, protocol_name: str, majors: tuple[int, ...] = (1,)) -> Stream:
        """Open a stream speaking the highest of ``majors`` of ``protocol_name`` the remote serves.

        The SYN travels with the first bytes sent (or on the first receive), saving a round trip.
        The stream id is assigned only then, under the send lock, so ids reach the wire in
        increasing order however many streams are opened concurrently.
        """
        if self.closed:
            raise ConnectionClosed(f"connection to {self.remote_peer.short()} is closed: {self._close_reason}")
        return Stream(self, UNASSIGNED_STREAM_ID, self._choose(protocol_name, majors), outbound=True)

    async def request(self, protocol_name: str, request: Any, *, timeout_s: float | None = None) -> Any:
        """Send one msgpack request on a new stream and return the decoded response.

        The response envelope is ``[0, result]`` or ``[1, error text]``; an error response raises
        :class:`RemoteProtocolError`. On timeout or cancellation the stream is reset, which cancels
        the handler on the remote side too.
        """
        timeout = self.config.request_timeout_s if timeout_s is None else timeout_s
        stream = self.open_stream(protocol_name)
        try:
            with anyio.fail_after(timeout):
                await stream.send_frame(request, eof=True)
                reply = await stream.receive_frame()
        except TimeoutError:
            stream.reset()
            raise RequestTimeout(
                f"{protocol_name} request to {self.remote_peer.short()} got no answer within {timeout:g} s"
            ) from None
        except BaseException:
            stream.reset()
            raise
        self._forget_stream(stream)
        if reply is None:
            raise RemoteProtocolError(f"{protocol_name}: the remote closed the stream without answering")
        if not (isinstance(reply, list) and len(reply) == 2 and reply[0] in (0, 1)):
            raise RemoteProtocolError(f"{protocol_name}: malformed response envelope")
        if reply[0] == 1:
            raise RemoteProtocolError(f"{protocol_name} request failed on {self.remote_peer.short()}: {reply[1]}")
        return reply[1]

    async def send_message(self, protocol_name: str, body: bytes, majors: tuple[int, ...] = (1,)) -> None:
        """Send a datagram-style message (one record, no stream) on ``protocol_name``."""
        payload = self._message_payload(protocol_name, body, majors)
        await self._send_record(FrameType.MESSAGE, Flag.NONE, 0, 0, payload)

    def _message_payload(self, protocol_name: str, body: bytes, majors: tuple[int, ...]) -> bytes:
        """The record payload of a datagram-style message: [negotiated protocol, body]."""
        protocol = self._choose(protocol_name, majors)
        payload = pack([str(protocol), body])
        if len(payload) > self.config.max_record_bytes:
            raise ValueError("message larger than one record")
        return payload

    def try_send_message_nowait(self, protocol_name: str, body: bytes, majors: tuple[int, ...] = (1,)) -> bool:
        """Send a datagram-style message now, from the calling task, if nothing else is writing.

        True if the record went to the kernel (if the socket buffer took only part of it, the rest
        goes first in the next write, so records never interleave). False if the caller must use
        :meth:`send_message` instead: the connection is closed or not started, another record is
        being written, or link shaping is on. Small latency-critical protocols (negotiation) save
        a task switch and a wait for the event loop per message this way.
        """
        if (
            self.closed
            or self.remote_hello is None
            or self._task_group is None
            or self._unsent is not None
            or self._send_lock.locked()
            or self._shaper is not None
            or self._links is not None
        ):
            return False
        payload = self._message_payload(protocol_name, body, majors)
        header, sealed = self._seal_record(FrameType.MESSAGE, Flag.NONE, 0, 0, memoryview(payload))
        # From here the record is sealed (its nonce used): it must reach the wire whole or the
        # connection must close.
        try:
            sent = self._sock.sendmsg([header, sealed])
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._mark_closed(f"connection lost: {exc}")
            return False
        if sent < len(header) + len(sealed):
            self._unsent = (header + bytes(sealed))[sent:]
            self._task_group.start_soon(self._flush_unsent)
        self._count_sent(FrameType.MESSAGE, len(payload))
        return True

    async def _flush_unsent(self) -> None:
        try:
            async with self._send_lock:
                await self._send_locked(())
        except ChaosError:
            pass  # the connection is closed (and says why); the record's sender treats it as lost

    async def ping(self) -> float:
        """Measure one round trip at the connection level (seconds)."""
        self._ping_counter = (self._ping_counter + 1) & 0xFFFFFFFF
        value = self._ping_counter
        waiter = anyio.Event()
        self._ping_waiters[value] = waiter
        started = self._clock.now()
        self._ping_sent_at[value] = started
        try:
            await self._send_record(FrameType.PING, Flag.NONE, 0, value, b"")
            await waiter.wait()
        finally:
            self._ping_waiters.pop(value, None)
            self._ping_sent_at.pop(value, None)
        return self._clock.now() - started

    # ------------------------------------------------------------------ called by streams
    async def send_stream_data(self, stream: Stream, data: memoryview, *, eof: bool) -> None:
        """Send ``data`` on ``stream`` in records, respecting the remote's window."""
        if stream._error is not None:
            raise stream._error
        if stream._sent_eof:
            raise LocalProtocolError(f"stream {stream.stream_id}: send after EOF")
        offset = 0
        while True:
            remaining = len(data) - offset
            if remaining == 0 and not (eof or stream._syn_pending):
                return
            async with self._send_lock:
                # Everything that decides this record happens under the lock: concurrent senders
                # on one stream (or a reader sending the SYN) cannot both claim the SYN.
                if stream._error is not None:
                    raise stream._error
                flags = Flag.NONE
                value = 0
                if stream._syn_pending:
                    self._assign_stream_id(stream)
                    flags |= Flag.SYN
                    value = self._remote_protocols.index(stream.protocol)
                allowed = self._sendable(stream)
                if allowed > 0 or remaining == 0:
                    count = min(allowed, remaining)
                    last = offset + count == len(data)
                    if last and eof:
                        flags |= Flag.FIN
                    self._mux.data_sent(stream.stream_id, count, fin=bool(flags & Flag.FIN))
                    if flags & Flag.FIN:
                        stream._sent_eof = True
                    await self._write_record_locked(
                        FrameType.DATA, flags, stream.stream_id, value, data[offset : offset + count]
                    )
                    stream.last_activity = self.last_sent
                    offset += count
                    if last:
                        if stream._sent_eof:
                            self._maybe_forget(stream)
                        return
                    continue
            await stream._wait_window()

    def _assign_stream_id(self, stream: Stream) -> None:
        stream.stream_id = self._mux.open_stream()
        stream._syn_pending = False
        self._streams[stream.stream_id] = stream
        if stream._window_target:
            self.set_receive_window(stream, stream._window_target)

    def _sendable(self, stream: Stream) -> int:
        try:
            return self._mux.sendable(stream.stream_id)
        except LocalProtocolError:
            raise stream._error or StreamReset(f"stream {stream.stream_id} can no longer send") from None

    def consumed(self, stream: Stream, length: int) -> None:
        """The application took ``length`` bytes from ``stream``: grant window back when due."""
        grant = self._mux.consumed(stream.stream_id, length)
        if grant:
            self._queue_window(stream.stream_id, grant)

    def set_receive_window(self, stream: Stream, target_bytes: int) -> None:
        """Raise ``stream``'s receive window (bounded by ``max_window_bytes``)."""
        if stream._syn_pending:  # not on the wire yet: applied when the SYN goes out
            stream._window_target = target_bytes
            return
        target = min(target_bytes, self.config.max_window_bytes)
        if stream._budget_bytes and self._budget is not None and target > stream._budget_bytes:
            # A stream the remote opened: a bigger window is memory the remote may fill, so it
            # comes out of that peer's (and the global) receive budget -- as much as is left.
            target = stream._budget_bytes + self._budget.grow(self.remote_peer, target - stream._budget_bytes)
            stream._budget_bytes = max(stream._budget_bytes, target)
        grant = self._mux.set_receive_window(stream.stream_id, target)
        if grant:
            self._queue_window(stream.stream_id, grant)

    def reset_stream(self, stream: Stream) -> None:
        """Abort ``stream``: forget it locally and tell the remote with RST."""
        self._drop_stream(stream.stream_id)
        if self._mux.reset(stream.stream_id) and not stream._syn_pending and not self.closed:
            self._pending_resets.add(stream.stream_id)
            self._control_event.set()

    def _forget_stream(self, stream: Stream) -> None:
        if self._mux.state(stream.stream_id) is None:
            self._drop_stream(stream.stream_id)

    def _maybe_forget(self, stream: Stream) -> None:
        if self._mux.state(stream.stream_id) is None and stream._eof:
            self._drop_stream(stream.stream_id)

    def _drop_stream(self, stream_id: int) -> Stream | None:
        """Forget a stream and give back what it reserved from the receive budget."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None and stream._budget_bytes and self._budget is not None:
            self._budget.close_stream(self.remote_peer, stream._budget_bytes)
            stream._budget_bytes = 0
        return stream

    def _queue_window(self, stream_id: int, grant: int) -> None:
        self._pending_windows[stream_id] = self._pending_windows.get(stream_id, 0) + grant
        self._control_event.set()

    # ------------------------------------------------------------------ writing records
    async def _send_record(self, kind: FrameType, flags: Flag, stream_id: int, value: int, payload: bytes) -> None:
        async with self._send_lock:
            await self._write_record_locked(kind, flags, stream_id, value, memoryview(payload))

    async def _write_record_locked(
        self, kind: FrameType, flags: Flag, stream_id: int, value: int, payload: memoryview
    ) -> None:
        if self.closed:
            raise ConnectionClosed(f"connection to {self.remote_peer.short()} is closed: {self._close_reason}")
        length = len(payload)
        if self._shaper is not None and length:
            await self._shaper.acquire(HEADER_BYTES + length + TAG_BYTES)
        delay = None
        if self._links is not None:
            if length:
                await self._links.pace(self.remote_peer, HEADER_BYTES + length + TAG_BYTES)
            delay = self._links.delay_for(self.remote_peer)
            if delay is None and self._delayed:
                delay = 0.0  # never overtake held records: the receiver's nonces must arrive in order
        header, sealed = self._seal_record(kind, flags, stream_id, value, payload)
        if delay is not None:
            self._hold(header, sealed, delay)
            self._count_sent(kind, length)
            return
        await self._send_locked((header, sealed))
        self._count_sent(kind, length)

    def _seal_record(
        self, kind: FrameType, flags: Flag, stream_id: int, value: int, payload: memoryview
    ) -> tuple[bytes, memoryview]:
        """The record's header and its sealed payload, in the send buffer (valid until the next
        record is sealed; the caller holds the send lock or writes it before yielding)."""
        length = len(payload)
        header = RecordHeader(length, kind, flags, stream_id, value).pack()
        sealed = memoryview(self._send_buffer)[: length + TAG_BYTES]
        self._sealer.seal_into(header, payload, sealed)
        return header, sealed

    async def _send_locked(self, buffers: tuple[bytes | memoryview, ...]) -> None:
        """Write ``buffers`` after any unsent tail of a record (the send lock is held)."""
        if self._unsent is not None:
            buffers = (self._unsent, *buffers)
            self._unsent = None
        if not buffers:
            return
        # A record is all or nothing: cancelling the writer halfway would leave a torn record that
        # desynchronizes the stream for every other user of the connection. So the write is
        # shielded from cancellation, bounded instead by the dead-connection timeout.
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.config.dead_connection_timeout_s) as stalled:
                    await send_all(self._sock, buffers)
            except ConnectionClosed as exc:
                self._mark_closed(str(exc))
                raise
            except anyio.ClosedResourceError:
                raise ConnectionClosed(f"connection to {self.remote_peer.short()} closed") from None
        if stalled.cancelled_caught:
            self._mark_closed("the remote stopped reading")
            raise ConnectionClosed(f"connection to {self.remote_peer.short()}: the remote stopped reading")

    def _count_sent(self, kind: FrameType, length: int) -> None:
        now = self._clock.now()
        self.last_sent = now
        if kind in (FrameType.DATA, FrameType.MESSAGE):
            self.last_activity = now
        self._bytes_sent += HEADER_BYTES + length + TAG_BYTES
        self._records_sent += 1

    def _hold(self, header: bytes, sealed: memoryview, delay: float) -> None:
        """Put a sealed record in the delay line (FIFO: a late record holds up those behind it)."""
        release = self._clock.now() + delay
        if self._delayed:
            release = max(release, self._delayed[-1][0])
        self._delayed.append((release, header + bytes(sealed)))
        self._delayed_event.set()

    async def _delay_loop(self) -> None:
        """Send held records when due and while their link is not cut (link shaping only)."""
        assert self._links is not None
        try:
            while True:
                if not self._delayed:
                    self._delayed_event = anyio.Event()
                    await self._delayed_event.wait()
                    continue
                release, data = self._delayed[0]
                wait = release - self._clock.now()
                if wait > 0 or self._links.is_cut(self.remote_peer):
                    await anyio.sleep(wait if wait > 0 else 0.05)
                    continue
                with anyio.move_on_after(self.config.dead_connection_timeout_s) as stalled:
                    await send_all(self._sock, (data,))
                # Popped only once sent: while the line is not empty no record bypasses it.
                self._delayed.popleft()
                if not self._delayed:
                    self._delay_drained.set()
                if stalled.cancelled_caught:
                    self._mark_closed("the remote stopped reading")
                    return
        except ConnectionClosed as exc:
            self._mark_closed(str(exc))
        except anyio.ClosedResourceError:
            self._mark_closed(self._close_reason or "socket closed")

    async def _control_loop(self) -> None:
        """Send window grants, pongs and resets queued by tasks that must not block on the socket."""
        try:
            await self._send_control_records()
        except ChaosError as exc:  # the connection failed: _mark_closed already told every stream
            self._mark_closed(self._close_reason or str(exc))

    async def _send_control_records(self) -> None:
        while True:
            await self._control_event.wait()
            self._control_event = anyio.Event()
            async with self._send_lock:
                while self._pending_windows or self._pending_resets or self._pending_pong is not None:
                    if self._pending_pong is not None:
                        value, self._pending_pong = self._pending_pong, None
                        await self._write_record_locked(FrameType.PING, Flag.ACK, 0, value, memoryview(b""))
                    while self._pending_windows:
                        stream_id, grant = self._pending_windows.popitem()
                        if self._mux.state(stream_id) is not None:
                            await self._write_record_locked(
                                FrameType.WINDOW, Flag.NONE, stream_id, grant, memoryview(b"")
                            )
                    while self._pending_resets:
                        stream_id = self._pending_resets.pop()
                        await self._write_record_locked(FrameType.DATA, Flag.RST, stream_id, 0, memoryview(b""))

    # ------------------------------------------------------------------ reading records
    async def _read_loop(self) -> None:
        header_buffer = bytearray(HEADER_BYTES)
        header_view = memoryview(header_buffer)
        body = memoryview(self._receive_buffer)
        try:
            while True:
                await self._read_exact(header_view)
                header = parse_header(header_buffer, max_record_bytes=self.config.max_record_bytes)
                ciphertext = body[: header.body_bytes]
                await self._read_exact(ciphertext)
                self._bytes_received += HEADER_BYTES + header.body_bytes
                self._records_received += 1
                self.last_received = self._clock.now()
                self._dispatch(header, bytes(header_buffer), ciphertext)
        except RemoteProtocolError as exc:
            log.warning("closing connection to %s (%s:%s): %s", self.remote_peer, *self.remote_address, exc)
            with anyio.move_on_after(0.5):
                try:
                    await self._send_record(
                        FrameType.GOAWAY, Flag.NONE, 0, GoAwayCode.PROTOCOL_ERROR, str(exc).encode()[:256]
                    )
                except ChaosError:
                    pass
            self._mark_closed(f"protocol error: {exc}")
        except ConnectionClosed as exc:
            self._mark_closed(str(exc))
        except anyio.ClosedResourceError:
            self._mark_closed(self._close_reason or "socket closed")

    async def _read_exact(self, view: memoryview) -> None:
        if self._initial:
            count = min(len(view), len(self._initial))
            view[:count] = self._initial[:count]
            del self._initial[:count]
            view = view[count:]
        if view:
            await receive_into(self._sock, view)

    def _open(self, header: bytes, ciphertext: memoryview, out: memoryview) -> None:
        self._opener.open_into(header, ciphertext, out)

    def _decrypt(self, header: bytes, ciphertext: memoryview, length: int) -> memoryview:
        out = memoryview(bytearray(length))
        self._open(header, ciphertext, out)
        return out

    def _dispatch(self, header: RecordHeader, raw_header: bytes, ciphertext: memoryview) -> None:
        kind = header.type
        if self.remote_hello is None and kind is not FrameType.HELLO:
            raise RemoteProtocolError(f"{kind.name} record before Hello")
        if kind is FrameType.DATA:
            self._on_data(header, raw_header, ciphertext)
            return
        payload = self._decrypt(raw_header, ciphertext, header.length)
        if kind is FrameType.WINDOW:
            event = self._mux.record_received(header)
            if isinstance(event, muxp.WindowGranted):
                stream = self._streams.get(header.stream_id)
                if stream is not None:
                    stream._window_opened()
        elif kind is FrameType.PING:
            self._on_ping(header)
        elif kind is FrameType.MESSAGE:
            self._on_message(payload)
        elif kind is FrameType.HELLO:
            self._on_hello(payload)
        elif kind is FrameType.GOAWAY:
            reason = bytes(payload[:256]).decode("utf-8", "replace")
            log.info("%s closed the connection (code %d): %s", self.remote_peer, header.value, reason)
            self._mark_closed(f"remote said goodbye: {reason or header.value}")
            raise ConnectionClosed("remote sent GOAWAY")

    def _on_data(self, header: RecordHeader, raw_header: bytes, ciphertext: memoryview) -> None:
        stream = self._streams.get(header.stream_id)
        direct = stream._direct_space(header.length) if stream is not None and header.length else None
        if direct is not None:
            self._open(raw_header, ciphertext, direct)
            self._records_in_place += 1
            payload = None
        else:
            payload = self._decrypt(raw_header, ciphertext, header.length)
        event = self._mux.record_received(header)
        if isinstance(event, muxp.DataReceived):
            if event.opened:
                stream = self._accept_stream(header)
                if stream is None:
                    log.debug("refusing stream %d from %s: over its receive budget", header.stream_id, self.remote_peer)
                    self._mux.reset(header.stream_id)
                    self._pending_resets.add(header.stream_id)
                    self._control_event.set()
                    return
            if stream is None:
                raise RemoteProtocolError(f"DATA for unknown stream {header.stream_id}")
            self.last_activity = self.last_received
            if stream._orphaned_at is not None and header.length:
                stream.reset()  # its handler is gone: nobody will read these bytes
                return
            if direct is not None:
                stream._direct_written(header.length)
            elif payload is not None:
                stream._deliver(payload)
            if event.fin:
                stream._deliver_eof()
                self._maybe_forget(stream)
        elif isinstance(event, muxp.StreamRefused):
            log.info("refusing stream %d from %s: too many open streams", header.stream_id, self.remote_peer)
            self._pending_resets.add(header.stream_id)
            self._control_event.set()
        elif isinstance(event, muxp.StreamWasReset):
            gone = self._drop_stream(header.stream_id)
            if gone is not None:
                gone._fail(StreamReset(f"stream {header.stream_id} reset by {self.remote_peer.short()}"))
                if gone._handler_scope is not None:
                    gone._handler_scope.cancel()

    def _accept_stream(self, header: RecordHeader) -> Stream | None:
        if header.value >= len(self._local_protocols):
            raise RemoteProtocolError(f"unknown protocol index {header.value} on stream {header.stream_id}")
        protocol = self._local_protocols[header.value]
        window = self.config.initial_window_bytes
        if self._budget is not None and not self._budget.open_stream(self.remote_peer, window):
            return None  # over this peer's (or everyone's) budget: refused with RST like any excess stream
        stream = Stream(self, header.stream_id, protocol, outbound=False)
        stream._budget_bytes = window if self._budget is not None else 0
        stream._idle_timeout_s = self._handler_idle_timeout(protocol)
        self._streams[header.stream_id] = stream
        assert self._task_group is not None
        self._task_group.start_soon(self._run_handler, stream, name=f"chaosp2p {protocol} handler")
        return stream

    async def _run_handler(self, stream: Stream) -> None:
        try:
            with anyio.CancelScope() as scope:
                # A reset from the remote cancels the handler: nobody is left to read its answer.
                stream._handler_scope = scope
                await self._stream_handler(stream)
            if scope.cancelled_caught:
                return
        except (ConnectionClosed, StreamReset):
            pass
        except RemoteProtocolError as exc:
            log.warning("%s on %s from %s: %s", type(exc).__name__, stream.protocol, self.remote_peer, exc)
            stream.reset()
        except ChaosError as exc:
            log.info("%s handler for %s ended: %s", stream.protocol, self.remote_peer, exc)
            stream.reset()
        except Exception:
            log.exception("%s handler for %s crashed", stream.protocol, self.remote_peer)
            stream.reset()
        else:
            await stream.aclose()
            if self._mux.state(stream.stream_id) is not None:
                if stream._buffered or stream._chunks:
                    # The handler is done but the remote sent bytes nobody will read: free the
                    # stream (and its window) instead of letting it count against the limit.
                    stream.reset()
                else:
                    # Half-closed: a remote that read our answer and only then sends its FIN (the
                    # usual request/response close) must not see a reset. Bounded: its next DATA
                    # resets the stream, and so does the idle sweep.
                    stream._orphaned_at = self._clock.now()
            self._maybe_forget(stream)

    def _cancel_idle_handlers(self, now: float) -> None:
        """Stream handlers have a default bound: one whose stream moved no byte for its idle timeout ends."""
        for stream in list(self._streams.values()):
            timeout = stream._idle_timeout_s
            if stream._orphaned_at is not None:
                # No handler left to cancel; a half-closed stream waits for its FIN this long at most.
                if now - stream._orphaned_at > (timeout or self.config.handler_idle_timeout_s):
                    stream.reset()
                continue
            if timeout is None or stream._handler_scope is None or now - stream.last_activity <= timeout:
                continue
            log.info("%s handler for %s idle for %.0f s: cancelled", stream.protocol, self.remote_peer, timeout)
            stream._handler_scope.cancel()
            stream.reset()

    def _on_ping(self, header: RecordHeader) -> None:
        if header.flags & Flag.ACK:
            sent = self._ping_sent_at.pop(header.value, None)
            if sent is not None:
                self.rtt_s = self._clock.now() - sent
            waiter = self._ping_waiters.pop(header.value, None)
            if waiter is not None:
                waiter.set()
            return
        self._pending_pong = header.value
        self._control_event.set()

    def _on_message(self, payload: memoryview) -> None:
        obj = unpack(payload, max_bytes=self.config.max_record_bytes)
        if not (isinstance(obj, list) and len(obj) == 2 and type(obj[0]) is str and type(obj[1]) is bytes):
            raise RemoteProtocolError("MESSAGE record must be [protocol id, bytes]")
        protocol = ProtocolId.parse(obj[0])
        if protocol not in self._local_protocols:
            raise RemoteProtocolError(f"message for unknown protocol {protocol}")
        self.last_activity = self.last_received
        self._message_handler(self, protocol.name, obj[1])

    def _on_hello(self, payload: memoryview) -> None:
        if self.remote_hello is not None:
            raise RemoteProtocolError("second Hello on one connection")
        hello = HELLO_CODEC.decode(payload, max_bytes=self.config.max_record_bytes)
        assert isinstance(hello, Hello)
        self.remote_hello = hello
        self._remote_protocols = hello.protocol_ids()
        self._ready.set()

    # ------------------------------------------------------------------ liveness
    async def _keepalive_loop(self) -> None:
        try:
            await self._keep_alive()
        except ChaosError as exc:  # a failed ping write: the connection is gone, nothing to report
            self._mark_closed(self._close_reason or str(exc))

    async def _keep_alive(self) -> None:
        interval = self.config.keepalive_interval_s
        while True:
            await anyio.sleep(interval / 2)
            now = self._clock.now()
            if now - self.last_received > self.config.dead_connection_timeout_s:
                log.info(
                    "closing connection to %s: nothing received for %.1f s", self.remote_peer, now - self.last_received
                )
                self._mark_closed("remote stopped answering")
                return
            self._cancel_idle_handlers(now)
            if not self._streams and now - self.last_activity > self.config.idle_connection_timeout_s:
                await self.aclose("idle", GoAwayCode.IDLE)
                return
            if now - max(self.last_sent, self.last_received) >= interval or (now - self.last_received >= interval):
                self._ping_counter = (self._ping_counter + 1) & 0xFFFFFFFF
                self._ping_sent_at[self._ping_counter] = now
                if len(self._ping_sent_at) > 8:
                    self._ping_sent_at.pop(next(iter(self._ping_sent_at)))
                await self._send_record(FrameType.PING, Flag.NONE, 0, self._ping_counter, b"")
