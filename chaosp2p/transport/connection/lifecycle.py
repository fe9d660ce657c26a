"""A secure, multiplexed connection to one authenticated peer (the I/O driver), from start to end.

Theory of operation
-------------------
The connection owns one non-blocking socket and runs three tasks in its own task group:

* the *reader* (:mod:`.reader`) reads a 16-byte record header, checks its length against the
  limit, reads the body into its receive buffer (grown only as bytes arrive), authenticates and
  decrypts it -- straight into a stream's waiting buffer when one fits -- and only then lets the
  :class:`~chaosp2p.protocols.channel.mux.Mux` interpret it;
* the *control writer* (:mod:`.writer`) sends what the reader must never block on (window grants,
  pongs, resets), so a reader never waits for the socket's send side: two peers with full send
  buffers cannot deadlock;
* the *keepalive* (:mod:`.keepalive`) pings a quiet connection and closes one that stopped
  answering.

Application tasks write records directly under a fair lock (:mod:`.writer`, :mod:`.flow`); each
record is encrypted into one reused send buffer and sent with a single gathered write. Decisions
about what a record means live in the mux and record-layer machines; this class only moves bytes
and wakes tasks. :class:`Connection` assembles those parts (and :mod:`.handlers`, :mod:`.rpc`) on
:class:`~.core.ConnectionCore`, and owns the lifecycle: :meth:`Connection.run` starts the tasks,
sends this side's HELLO and reports the connection started once the remote's HELLO arrived (within
``handshake_timeout_s``); it returns when the connection closes.

Anything the remote peer does wrong is a :class:`RemoteProtocolError`: the connection sends GOAWAY
with the reason, logs it, closes, and every stream on it fails with :class:`ConnectionClosed`. The
peer itself keeps serving its other connections.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc

from chaosp2p.errors import ConnectionClosed, RemoteProtocolError
from chaosp2p.protocols.channel.hello import HELLO_CODEC
from chaosp2p.protocols.channel.record_layer import Flag, FrameType
from chaosp2p.transport.connection.reader import RecordReader
from chaosp2p.transport.connection.rpc import RequestClient
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.transport.sockets import close_socket
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.protocol_ids import ProtocolId

MessageHandler = Callable[["Connection", str, bytes], None]
"""Receives each datagram: the connection it came on, the protocol's name, the message body."""


class Connection(RecordReader, RequestClient):
    """An authenticated, encrypted, multiplexed connection. Create through :class:`Host`."""

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

    def _make_stream(self, stream_id: int, protocol: ProtocolId, *, outbound: bool) -> Stream:
        return Stream(self, stream_id, protocol, outbound=outbound)
