"""Records in: the reader task, decryption (in place when it can) and what each record means.

Theory of operation
-------------------
The reader reads a 16-byte record header, checks its length against ``max_record_bytes`` before
reading anything else, reads the body into the connection's receive buffer (which starts small and
doubles only as a larger record's bytes arrive, see :meth:`RecordReader._read_growing`), and
dispatches on the record's type. A record is authenticated and decrypted before anything acts on it:

* DATA, the bulk path, is decrypted straight into a stream's waiting ``receive_into`` buffer when
  the whole record fits (no copy), otherwise into a fresh buffer the stream queues; only then does
  the :class:`~chaosp2p.protocols.channel.mux.Mux` say what it means -- data (maybe opening or
  ending a stream), a refusal, a reset, or a late record for a stream already gone -- and the
  matching ``_STREAM_EVENTS`` entry acts on it;
* every other type is a connection-level record with a handler in ``_CONNECTION_RECORDS``: WINDOW
  (more send window for a stream), PING (:mod:`.keepalive`), MESSAGE (a datagram for the host's
  message handler), HELLO (the remote's self-description, exactly once and first) and GOAWAY.

The reader never waits on the socket's send side: what it must send (window grants, pongs, resets)
it queues for the control writer. Anything the remote does wrong is a :class:`RemoteProtocolError`:
the reader sends GOAWAY(PROTOCOL_ERROR) with the reason (bounded), logs it and closes the
connection; the peer keeps serving its other connections.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from chaosp2p.errors import ChaosError, ConnectionClosed, RemoteProtocolError, StreamReset
from chaosp2p.protocols.channel.hello import HELLO_CODEC, Hello
from chaosp2p.protocols.channel.mux import DataReceived, Ignored, StreamRefused, StreamWasReset, WindowGranted
from chaosp2p.protocols.channel.record_layer import (
    HEADER_BYTES,
    TAG_BYTES,
    Flag,
    FrameType,
    GoAwayCode,
    RecordHeader,
    parse_header,
)
from chaosp2p.transport.connection.keepalive import Keepalive
from chaosp2p.transport.sockets import receive_into
from chaosp2p.wire.framing import unpack
from chaosp2p.wire.protocol_ids import ProtocolId

log = logging.getLogger("chaosp2p.transport")


class RecordReader(Keepalive):
    """The receiving half of a connection: the reader task and the record handlers."""

    async def _read_loop(self) -> None:
        header_buffer = bytearray(HEADER_BYTES)
        header_view = memoryview(header_buffer)
        body = memoryview(self._receive_buffer)
        try:
            while True:
                await self._read_exact(header_view)
                header = parse_header(header_buffer, max_record_bytes=self.config.max_record_bytes)
                if header.body_bytes > len(body):
                    body = await self._read_growing(header.body_bytes)
                    ciphertext = body[: header.body_bytes]
                else:
                    ciphertext = body[: header.body_bytes]
                    await self._read_exact(ciphertext, checkpoint=False)  # the header's read passed one
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

    async def _read_exact(self, view: memoryview, *, checkpoint: bool = True) -> None:
        if self._initial:
            count = min(len(view), len(self._initial))
            view[:count] = self._initial[:count]
            del self._initial[:count]
            view = view[count:]
        if view:
            try:
                await receive_into(self._sock, view, checkpoint=checkpoint)
            except ConnectionClosed as exc:  # EOF or a reset: the remote host closed it
                self._mark_lost(str(exc))
                raise

    async def _read_growing(self, total: int) -> memoryview:
        """Read a record body larger than the receive buffer, doubling the buffer as bytes arrive.

        The header's length (checked against ``max_record_bytes``) is the remote's claim: the
        buffer only doubles once the bytes already received fill it, so the claim alone never
        takes more than twice what actually came. The grown buffer is kept for later records.
        """
        buffer = self._receive_buffer
        limit = self.config.max_record_bytes + TAG_BYTES
        filled = 0
        while filled < total:
            if filled == len(buffer):
                grown = bytearray(min(2 * len(buffer), limit))
                grown[:filled] = buffer
                buffer = self._receive_buffer = grown
            end = min(len(buffer), total)
            await self._read_exact(memoryview(buffer)[filled:end])
            filled = end
        return memoryview(buffer)

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
        if kind is FrameType.DATA:  # the bulk path: checked before the table, decrypted in place
            self._on_data(header, raw_header, ciphertext)
            return
        _CONNECTION_RECORDS[kind](self, header, self._decrypt(raw_header, ciphertext, header.length))

    # ------------------------------------------------------------------ stream records
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
        if not isinstance(event, DataReceived):
            _STREAM_EVENTS[type(event)](self, header)
            return
        if event.opened:
            stream = self._accept_stream(header)
            if stream is None:
                log.debug("refusing stream %d from %s: over its receive budget", header.stream_id, self.remote_peer)
                self._mux.reset(header.stream_id)
                self._queue_reset(header.stream_id)
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

    def _on_refused(self, header: RecordHeader) -> None:
        log.info("refusing stream %d from %s: too many open streams", header.stream_id, self.remote_peer)
        self._queue_reset(header.stream_id)

    def _on_reset(self, header: RecordHeader) -> None:
        gone = self._drop_stream(header.stream_id)
        if gone is not None:
            gone._fail(StreamReset(f"stream {header.stream_id} reset by {self.remote_peer.short()}"))
            if gone._handler_scope is not None:
                gone._handler_scope.cancel()

    def _on_ignored(self, header: RecordHeader) -> None:
        """A record for a stream already gone (a race with our own RST): its payload is dropped."""

    # ------------------------------------------------------------------ connection records
    def _on_window(self, header: RecordHeader, payload: memoryview) -> None:
        event = self._mux.record_received(header)
        if isinstance(event, WindowGranted):
            stream = self._streams.get(header.stream_id)
            if stream is not None:
                stream._window_opened()

    def _on_message(self, header: RecordHeader, payload: memoryview) -> None:
        obj = unpack(payload, max_bytes=self.config.max_record_bytes)
        if not (isinstance(obj, list) and len(obj) == 2 and type(obj[0]) is str and type(obj[1]) is bytes):
            raise RemoteProtocolError("MESSAGE record must be [protocol id, bytes]")
        protocol = ProtocolId.parse(obj[0])
        if protocol not in self._local_protocols:
            raise RemoteProtocolError(f"message for unknown protocol {protocol}")
        self.last_activity = self.last_received
        self._message_handler(self, protocol.name, obj[1])

    def _on_hello(self, header: RecordHeader, payload: memoryview) -> None:
        if self.remote_hello is not None:
            raise RemoteProtocolError("second Hello on one connection")
        hello = HELLO_CODEC.decode(payload, max_bytes=self.config.max_record_bytes)
        assert isinstance(hello, Hello)
        self.remote_hello = hello
        self._remote_protocols = hello.protocol_ids()
        self._ready.set()

    def _on_goaway(self, header: RecordHeader, payload: memoryview) -> None:
        reason = bytes(payload[:256]).decode("utf-8", "replace")
        log.info("%s closed the connection (code %d): %s", self.remote_peer, header.value, reason)
        self._mark_closed(f"remote said goodbye: {reason or header.value}")
        raise ConnectionClosed("remote sent GOAWAY")


_CONNECTION_RECORDS: dict[FrameType, Callable[[RecordReader, RecordHeader, memoryview], None]] = {
    FrameType.WINDOW: RecordReader._on_window,
    FrameType.PING: RecordReader._on_ping,
    FrameType.MESSAGE: RecordReader._on_message,
    FrameType.HELLO: RecordReader._on_hello,
    FrameType.GOAWAY: RecordReader._on_goaway,
}
"""What each record type other than DATA does, given its header and decrypted payload."""

_STREAM_EVENTS: dict[type, Callable[[RecordReader, RecordHeader], None]] = {
    StreamRefused: RecordReader._on_refused,
    StreamWasReset: RecordReader._on_reset,
    Ignored: RecordReader._on_ignored,
}
"""What the reader does with each mux verdict on a DATA record other than :class:`DataReceived`."""
