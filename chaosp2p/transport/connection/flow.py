"""Stream data and flow control: opening streams, sending within the window, granting it back.

Theory of operation
-------------------
An outbound stream exists locally before it exists on the wire: :meth:`StreamFlow.open_stream`
returns a stream with no id, and the id is taken from the mux only when its first record (the SYN,
carrying the protocol's index in the remote's Hello) is written, under the send lock -- so ids
reach the wire in increasing order however many streams are opened concurrently, and the SYN
travels with the first bytes, saving a round trip.

:meth:`StreamFlow.send_stream_data` cuts the caller's bytes into records no larger than the send
window the :class:`~chaosp2p.protocols.channel.mux.Mux` allows right now, and waits for a WINDOW
record when it is exhausted. Everything that decides one record (SYN, FIN, the window it uses)
happens under the send lock, so concurrent senders cannot both claim a SYN or overrun the window.

The receive side gives window back as the application consumes bytes (``consumed``) or raises it
for a bulk transfer (``set_receive_window``, bounded by the remote peer's receive budget on a
stream the remote opened); grants and resets are queued for the control writer, never written by
the task that noticed them. A stream is forgotten once the mux has forgotten it and its reader
has seen the end.
"""

from __future__ import annotations

from chaosp2p.errors import ConnectionClosed, LocalProtocolError, StreamReset
from chaosp2p.protocols.channel.record_layer import Flag, FrameType
from chaosp2p.transport.connection.core import UNASSIGNED_STREAM_ID
from chaosp2p.transport.connection.writer import RecordWriter
from chaosp2p.transport.stream import Stream


class StreamFlow(RecordWriter):
    """The stream table and its flow control, over the record writer."""

    def open_stream(self, protocol_name: str, majors: tuple[int, ...] = (1,)) -> Stream:
        """Open a stream speaking the highest of ``majors`` of ``protocol_name`` the remote serves.

        The SYN travels with the first bytes sent (or on the first receive), saving a round trip.
        The stream id is assigned only then, under the send lock, so ids reach the wire in
        increasing order however many streams are opened concurrently.
        """
        if self.closed:
            raise ConnectionClosed(f"connection to {self.remote_peer.short()} is closed: {self._close_reason}")
        return self._make_stream(UNASSIGNED_STREAM_ID, self._choose(protocol_name, majors), outbound=True)

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
            self._queue_reset(stream.stream_id)

    # ------------------------------------------------------------------ bookkeeping
    def _forget_stream(self, stream: Stream) -> None:
        if self._mux.state(stream.stream_id) is None:
            self._drop_stream(stream.stream_id)

    def _maybe_forget(self, stream: Stream) -> None:
        if self._mux.state(stream.stream_id) is None and stream._eof:
            self._drop_stream(stream.stream_id)

    def _queue_window(self, stream_id: int, grant: int) -> None:
        self._pending_windows[stream_id] = self._pending_windows.get(stream_id, 0) + grant
        self._control_event.set()

    def _queue_reset(self, stream_id: int) -> None:
        self._pending_resets.add(stream_id)
        self._control_event.set()
