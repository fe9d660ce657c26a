"""Records out: sealing, the send lock, the control writer and the link shaper's delay line.

Theory of operation
-------------------
Every record leaves through :meth:`RecordWriter._write_record_locked` under one fair lock: the
payload is encrypted into one reused send buffer (grown to the largest record sent), its 16-byte
header goes in the AEAD's associated data, and both are sent with a single gathered write.
Sealing uses the next nonce, so from that moment the record must reach the wire whole or the
connection must close: the write is
shielded from cancellation (a torn record would desynchronize the stream for every user of the
connection) and bounded instead by ``dead_connection_timeout_s``.

Two paths skip the lock's wait. :meth:`RecordWriter.try_send_message_nowait` seals and sends a
datagram from the calling task when nobody else is writing; if the kernel takes only part of it,
the tail waits in ``_unsent`` and the next writer sends it first. The *control writer* task sends
what the reader must never block on -- window grants, pongs, resets -- queued in the core's
``_pending_*`` fields, so two peers with full send buffers cannot deadlock on each other's reader.

With link shaping (the cluster harness's per-link delay, pacing and cuts) a sealed record may be
held in a FIFO delay line that :meth:`RecordWriter._delay_loop` drains when due; once anything is
held, every later record queues behind it, because the receiver's nonces must arrive in order.
"""

from __future__ import annotations

import anyio

from chaosp2p.errors import ChaosError, ConnectionClosed
from chaosp2p.protocols.channel.record_layer import HEADER_BYTES, TAG_BYTES, Flag, FrameType, GoAwayCode, RecordHeader
from chaosp2p.transport.connection.core import ConnectionCore
from chaosp2p.transport.sockets import send_all, send_nowait
from chaosp2p.wire.framing import pack


class RecordWriter(ConnectionCore):
    """The sending half of a connection: every record goes out through here."""

    # ------------------------------------------------------------------ datagram messages
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
            self._mark_lost(f"connection lost: {exc}")
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
        if length + TAG_BYTES > len(self._send_buffer):  # grows once per size class, then stays
            self._send_buffer = bytearray(
                min(max(length + TAG_BYTES, 2 * len(self._send_buffer)), self.config.max_record_bytes + TAG_BYTES)
            )
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
        # Most records fit the socket buffer at once: sent without a wait, they need no scopes (two
        # cancel scopes per record were most of a bulk sender's Python time). The send lock's
        # acquisition already let the other tasks run.
        try:
            rest = send_nowait(self._sock, buffers)
        except ConnectionClosed as exc:
            self._mark_lost(str(exc))
            raise
        if not rest:
            return
        buffers = tuple(rest)
        # A record is all or nothing: cancelling the writer halfway would leave a torn record that
        # desynchronizes the stream for every other user of the connection. So the write is
        # shielded from cancellation, bounded instead by the dead-connection timeout.
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.config.dead_connection_timeout_s) as stalled:
                    await send_all(self._sock, buffers)
            except ConnectionClosed as exc:  # a reset or a broken pipe: the remote host closed it
                self._mark_lost(str(exc))
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

    # ------------------------------------------------------------------ control records
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

    # ------------------------------------------------------------------ link shaping's delay line
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
