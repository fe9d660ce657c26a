"""Inbound streams: admitting a stream the remote opened, running its handler, bounding its life.

Theory of operation
-------------------
When the reader sees a SYN the mux accepted, :meth:`InboundStreams._accept_stream` maps the SYN's
protocol index into this side's advertised list (an index out of range is the remote's protocol
error), reserves the stream's initial window from the remote peer's receive budget -- a stream
over budget is refused with RST like any excess stream -- and starts the protocol's handler in the
connection's task group.

Each handler runs in its own cancel scope: a reset from the remote cancels it, since nobody is left
to read its answer. A handler that returns closes its direction with FIN; if the remote's direction
is still open with nothing unread, the stream stays *orphaned* (half-closed) until the remote's FIN,
so a remote that reads the answer and only then closes does not see a reset. Unread bytes, the
remote's next DATA, or the idle sweep end an orphan with a reset. The sweep
(:meth:`InboundStreams._cancel_idle_handlers`, run by the keepalive) also cancels a handler whose
stream moved no byte for its protocol's idle timeout.

A handler's failure never ends the connection: a :class:`RemoteProtocolError` or other
:class:`ChaosError` resets its stream with a log line, and so does an unexpected exception (logged
with its traceback).
"""

from __future__ import annotations

import logging

import anyio

from chaosp2p.errors import ChaosError, ConnectionClosed, RemoteProtocolError, StreamReset
from chaosp2p.protocols.channel.record_layer import RecordHeader
from chaosp2p.transport.connection.flow import StreamFlow
from chaosp2p.transport.stream import Stream

log = logging.getLogger("chaosp2p.transport")


class InboundStreams(StreamFlow):
    """Streams the remote opens and the handlers that serve them."""

    def _accept_stream(self, header: RecordHeader) -> Stream | None:
        if header.value >= len(self._local_protocols):
            raise RemoteProtocolError(f"unknown protocol index {header.value} on stream {header.stream_id}")
        protocol = self._local_protocols[header.value]
        window = self.config.initial_window_bytes
        if self._budget is not None and not self._budget.open_stream(self.remote_peer, window):
            return None  # over this peer's (or everyone's) budget: refused with RST like any excess stream
        stream = self._make_stream(header.stream_id, protocol, outbound=False)
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
