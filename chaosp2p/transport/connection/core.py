"""State every part of a :class:`~chaosp2p.transport.connection.Connection` shares.

Theory of operation
-------------------
A connection is one class assembled from role modules, the way :mod:`chaosp2p.protocols.negotiation`
assembles its machine: this core holds the state (socket, record sealer and opener, the
:class:`~chaosp2p.protocols.channel.mux.Mux`, the stream table, counters, the queues the control
writer drains) and the bookkeeping every role needs -- closing and failing every stream, forgetting
a stream and returning its receive budget, choosing a protocol version from the remote's Hello,
statistics. The roles build on it: :mod:`.writer` (records out), :mod:`.flow` (stream data and
windows), :mod:`.handlers` (inbound streams), :mod:`.keepalive` (liveness and RTT), :mod:`.reader`
(records in), :mod:`.rpc` (request/response). Roles are base classes rather than helper objects so
that the per-record path stays plain method calls on one object, as fast as one class.

Closing is one-way: :meth:`ConnectionCore._mark_closed` records the first reason, fails every
stream with :class:`ConnectionClosed` and cancels the connection's task group; later calls are
no-ops.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import ConnectionClosed, ProtocolNotSupported
from chaosp2p.protocols.channel.hello import Hello
from chaosp2p.protocols.channel.mux import Mux
from chaosp2p.protocols.channel.record_layer import TAG_BYTES, RecordOpener, RecordSealer
from chaosp2p.transport.budget import ReceiveBudget
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.shaper import LinkShaper, TokenBucket
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.protocol_ids import ProtocolId, choose_version

UNASSIGNED_STREAM_ID = 0
"""An outbound stream's id until its SYN is sent (0 is never a valid stream id)."""

INITIAL_RECORD_BUFFER_BYTES = 16 * 1024
"""Size the send and receive record buffers start at; each grows to the largest record it met.

A connection that never moves a large record costs tens of KiB, not two records of
``max_record_bytes``: memory follows the bytes that actually crossed, not a connection count."""


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


class ConnectionCore:
    """State and bookkeeping shared by the parts of :class:`~chaosp2p.transport.connection.Connection`."""

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
        message_handler: Callable[[Any, str, bytes], None],
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
        self.relayed = False
        """True for a connection through a relay's circuit (``/chaos/relay/1``), not a direct link."""
        self._sock = sock
        self.outbound_port = _local_port(sock) if is_dialer else None
        """Our socket's port on a TCP connection this side dialled (None for an accepted one or a
        relayed one's socket pair): compared with where the peer saw us, it shows our NAT's mapping."""
        self._clock = clock
        self._shaper = shaper
        self._links = links
        # Records held by the link shaper's delay line (release time, bytes); only used with ``links``.
        self._delayed: deque[tuple[float, bytes]] = deque()
        self._delayed_event = anyio.Event()
        self._delay_drained = anyio.Event()
        self._sealer = RecordSealer(send_key)
        self._opener = RecordOpener(receive_key)
        self._mux = Mux(is_dialer=is_dialer, limits=config.mux_limits)
        self._local_hello = local_hello
        self._local_protocols = local_protocols
        self._remote_protocols: tuple[ProtocolId, ...] = ()
        self._stream_handler = stream_handler
        # Called with the Connection itself first; typed Any here because the assembled class is
        # defined above this module (``MessageHandler`` in the package gives the precise type).
        self._message_handler = message_handler
        self._streams: dict[int, Stream] = {}
        self._send_lock = anyio.Lock()
        self._unsent: bytes | None = None
        """The tail of a record :meth:`try_send_message_nowait` could not hand to the kernel at
        once; the next writer sends it first (under the send lock), so records never interleave."""
        start = min(config.max_record_bytes, INITIAL_RECORD_BUFFER_BYTES) + TAG_BYTES
        self._send_buffer = bytearray(start)
        self._receive_buffer = bytearray(start)
        self._initial = bytearray(initial_bytes)
        self._ready = anyio.Event()
        self._closed = anyio.Event()
        self._close_reason = ""
        self._lost = False
        self._control_event = anyio.Event()
        self._pending_windows: dict[int, int] = {}
        self._pending_resets: set[int] = set()
        self._pending_pong: int | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._created = clock.now()
        self.last_received = self._created
        self.last_sent = self._created
        self.last_activity = self._created
        self.keepalive_wakeups = 0
        """Times the keepalive task woke up (its cost on an idle swarm; tests count it)."""
        self._ping_sent_at: dict[int, float] = {}
        self._ping_waiters: dict[int, anyio.Event] = {}
        self._ping_counter = 0
        self.rtt_s: float | None = None
        self._bytes_sent = 0
        self._bytes_received = 0
        self._records_sent = 0
        self._records_received = 0
        self._records_in_place = 0

    # ------------------------------------------------------------------ provided by the assembled class
    def _make_stream(self, stream_id: int, protocol: ProtocolId, *, outbound: bool) -> Stream:
        """A :class:`Stream` on this connection (the assembled class is the type a stream holds)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    @property
    def closed(self) -> bool:
        """True once the connection is closed or closing."""
        return self._closed.is_set()

    @property
    def close_reason(self) -> str:
        """Why the connection closed (empty while open)."""
        return self._close_reason

    @property
    def closed_by_remote_host(self) -> bool:
        """True if it closed because the socket reported EOF or a reset while it was open: the
        remote host closed it (as a killed process's kernel does), without a GOAWAY, and not on
        our side. The membership service takes that as a reason to check the peer at once."""
        return self._lost

    @property
    def remote_protocols(self) -> tuple[ProtocolId, ...]:
        """Protocols the remote advertised in its Hello."""
        return self._remote_protocols

    async def wait_closed(self) -> None:
        """Return once the connection has closed."""
        await self._closed.wait()

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

    def _mark_lost(self, reason: str) -> None:
        """Close because the socket reported EOF or a reset (see :attr:`closed_by_remote_host`)."""
        if not self._closed.is_set():
            self._lost = True
        self._mark_closed(reason)

    def _drop_stream(self, stream_id: int) -> Stream | None:
        """Forget a stream and give back what it reserved from the receive budget."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None and stream._budget_bytes and self._budget is not None:
            self._budget.close_stream(self.remote_peer, stream._budget_bytes)
            stream._budget_bytes = 0
        return stream

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

    # ------------------------------------------------------------------ protocol choice
    def supports(self, protocol_name: str, majors: tuple[int, ...] = (1,)) -> bool:
        """True if the remote speaks one of the ``majors`` of ``protocol_name``."""
        try:
            self._choose(protocol_name, majors)
        except ProtocolNotSupported:
            return False
        return True

    def _choose(self, protocol_name: str, majors: tuple[int, ...]) -> ProtocolId:
        return choose_version(protocol_name, (ProtocolId(protocol_name, m) for m in majors), self._remote_protocols)


def _local_port(sock: socket.socket) -> int | None:
    try:
        name = sock.getsockname()
    except OSError:
        return None
    return name[1] if isinstance(name, tuple) and len(name) >= 2 else None
