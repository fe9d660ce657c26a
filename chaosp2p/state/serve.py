"""Source side of ``/chaos/transfer/1``: serve snapshots to newcomers over streams.

Theory of operation: each newcomer opens one stream per pull. A *reader* task decodes request
frames (with the transfer protocol's tight limits) into a bounded
:class:`~chaosp2p.protocols.transfer.RequestQueue`; a *writer* task takes them in order and hands
each to the :class:`~chaosp2p.protocols.transfer.SourceSession` machine, which validates it against
the catalog (version known, range inside the snapshot, lease held) and says what to send: a header
message, and for data a read-only slice of the immutable snapshot that goes straight from snapshot
memory into the encrypted records -- no copy of the state is made per request. Reading ahead lets
a ``CancelRequest`` reach a queued request before the writer starts on it. When the stream ends,
every lease that newcomer held is released, so retired snapshots can be freed.

An offer may name who is served (``allow``, a predicate on the asker's authenticated PeerID): a
training peer serves its run's snapshots to the run's members and the newcomers they admitted only.
Anyone else is answered as if no state were offered (``UNKNOWN_RUN``), before the request is looked at.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError, RemoteProtocolError
from chaosp2p.protocols.transfer import (
    OutgoingPayload,
    RequestQueue,
    SkippedRequest,
    SnapshotCatalog,
    SourceSession,
)
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import (
    PROTOCOL_ID,
    ErrorReply,
    GetChunks,
    GetManifest,
    GetRange,
    GetVersions,
    TransferErrorCode,
)
from chaosp2p.protocols.transfer.messages import codec as TRANSFER_CODEC
from chaosp2p.state.frames import receive_transfer_message
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.transport.host import Host
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message

log = logging.getLogger("chaosp2p.state")


class _StreamState:
    """What the reader and the writer of one stream share."""

    def __init__(self, limit: int) -> None:
        self.queue = RequestQueue(limit)
        self.ended = False
        self.payload_bytes = 0
        self.sending_s = 0.0  # time spent handing payloads to the stream (the uplink's pace)
        self.has_work = anyio.Event()
        self.has_room = anyio.Event()


class StateServer:
    """Answers transfer requests from one snapshot catalog (set with :meth:`offer`)."""

    def __init__(
        self,
        *,
        host: Host,
        clock: Clock,
        config: TransferConfig,
        task_group: anyio.abc.TaskGroup,
        busy: Callable[[], AbstractContextManager[object]] = nullcontext,
        record_sent: Callable[[PeerID, int, float], None] | None = None,
    ) -> None:
        """``busy`` is held while a stream is served (the node pauses its bandwidth probes, which
        would share the uplink); ``record_sent(peer, bytes, seconds)`` gets each served stream's
        payload bytes and the time spent sending them (the upload rate to ``peer``, measured)."""
        self._busy = busy
        self._record_sent = record_sent
        self._clock = clock
        self._config = config
        self._task_group = task_group
        self.session: SourceSession | None = None
        self._allow: Callable[[PeerID], bool] | None = None
        self._wake = anyio.Event()
        host.set_stream_handler(PROTOCOL_ID, self._serve_stream)

    def offer(self, catalog: SnapshotCatalog, *, allow: Callable[[PeerID], bool] | None = None) -> None:
        """Serve ``catalog`` from now on (replacing any earlier one; its leases are released), to the
        peers ``allow`` accepts (everyone if None)."""
        self._allow = allow
        if self.session is not None:
            self.session.close()
        else:
            self._task_group.start_soon(self._lease_timer, name="chaosp2p transfer leases")
        self.session = SourceSession(catalog, self._config)

    async def _serve_stream(self, stream: Stream) -> None:
        peer = stream.remote_peer
        shared = _StreamState(self._config.max_queued_requests)
        try:
            with self._busy(), unwrap_single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read_requests, stream, shared)
                    await self._write_answers(stream, shared)
                    tg.cancel_scope.cancel()
        except RemoteProtocolError as exc:
            log.warning("transfer request from %s rejected: %s", peer, exc)
            raise
        except ChaosError as exc:
            log.info("transfer stream from %s ended: %s", peer, exc)
        finally:
            if self.session is not None:
                self.session.peer_unreachable(self._clock.now(), peer)
            if self._record_sent is not None and shared.payload_bytes:
                self._record_sent(peer, shared.payload_bytes, shared.sending_s)

    async def _read_requests(self, stream: Stream, shared: _StreamState) -> None:
        try:
            while True:
                while shared.queue.full:
                    shared.has_room = anyio.Event()
                    await shared.has_room.wait()
                message = await receive_transfer_message(stream)
                if message is None:
                    return
                shared.queue.push(message)
                shared.has_work.set()
        finally:
            shared.ended = True
            shared.has_work.set()

    async def _write_answers(self, stream: Stream, shared: _StreamState) -> None:
        peer = stream.remote_peer
        while True:
            item = shared.queue.pop()
            if item is None:
                if shared.ended:
                    return
                shared.has_work = anyio.Event()
                await shared.has_work.wait()
                continue
            shared.has_room.set()
            session = self.session
            if session is None or (self._allow is not None and not self._allow(peer)):
                if isinstance(item, (*_REQUESTS, SkippedRequest)):  # a lease release needs no answer
                    await stream.send_message(TRANSFER_CODEC, _no_state(item))
                continue
            for out in session.respond(self._clock.now(), peer, item):
                await stream.send_message(TRANSFER_CODEC, out.message)
                if isinstance(out, OutgoingPayload):
                    began = self._clock.now()
                    await stream.send(out.payload)
                    shared.sending_s += self._clock.now() - began
                    shared.payload_bytes += out.payload.nbytes
            self._wake.set()

    async def _lease_timer(self) -> None:
        while True:
            self._wake = anyio.Event()
            session = self.session
            deadline = None if session is None else session.next_deadline()
            now = self._clock.now()
            if session is not None and deadline is not None and deadline <= now:
                session.handle_timeout(now)
                continue
            with anyio.move_on_after(None if deadline is None else deadline - now):
                await self._wake.wait()


_REQUESTS = (GetVersions, GetManifest, GetChunks, GetRange)


def _no_state(message: Message | SkippedRequest) -> ErrorReply:
    request_id = getattr(message, "request_id", 0)
    return ErrorReply(request_id=request_id, code=TransferErrorCode.UNKNOWN_RUN, detail="this peer serves no state")
