"""Runs a sans-I/O message machine over real connections.

Theory of operation
-------------------
The driver is deliberately thin: it decodes incoming datagrams with the protocol's codec, calls
``machine.receive``, and after every call to the machine drains ``take_outgoing()`` and
``take_events()``. A timer task sleeps until ``machine.next_deadline()`` (woken early whenever a
call may have moved the deadline) and then calls ``handle_timeout``. It makes no protocol decisions.

A message to a peer with an open connection that nothing else is writing to goes to the kernel at
once, from the calling task. Otherwise it goes to a small queue per destination, drained by one
sender task per peer, so a slow or unreachable peer never blocks the machine or the other peers.
A queue that is full drops the message (datagram semantics: the protocols above tolerate loss).
A failure to connect or send is reported to the machine with ``peer_unreachable``.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError
from chaosp2p.protocols.base import MessageMachine, Outgoing
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host
from chaosp2p.transport.reach import reach
from chaosp2p.wire.circuit_addr import Dialable
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import MessageCodec
from chaosp2p.wire.protocol_ids import ProtocolId

log = logging.getLogger("chaosp2p.runtime")

T = TypeVar("T")
AddressResolver = Callable[[PeerID], Sequence[Dialable]]
EventSink = Callable[[Any], None]

MAX_QUEUED_PER_PEER = 256
MAX_SENDERS = 4096


class MachineDriver:
    """Feeds one protocol machine from a :class:`Host` and carries out what it asks for."""

    def __init__(
        self,
        *,
        host: Host,
        machine: MessageMachine,
        codecs: Mapping[str, MessageCodec],
        clock: Clock,
        task_group: anyio.abc.TaskGroup,
        resolve: AddressResolver | None = None,
        on_event: EventSink | None = None,
        after_flush: Callable[[], None] | None = None,
        name: str = "machine",
        relay: bool = False,
        any_relay: bool = True,
    ) -> None:
        self.host = host
        self.machine = machine
        self.name = name
        self._relay = relay
        """Reach a peer that cannot be dialled through a relay (:func:`~chaosp2p.transport.reach.reach`)."""
        self._any_relay = any_relay
        """With ``relay``: also through relays the peer did not announce (``reach(any_relay=...)``)."""
        self._codecs = dict(codecs)
        self._clock = clock
        self._task_group = task_group
        self._resolve = resolve or (lambda peer: ())
        self._on_event = on_event or (lambda event: None)
        self._after_flush = after_flush
        self._wake = anyio.Event()
        self._armed = -math.inf
        """The deadline the timer task sleeps until (inf: none; -inf: not sleeping)."""
        self._queues: dict[PeerID, deque[tuple[str, bytes]]] = {}
        self._senders: set[PeerID] = set()
        self._progress = anyio.Event()
        self.dropped_outgoing = 0
        self.rejected_incoming = 0
        for protocol in self._codecs:
            host.set_message_handler(ProtocolId(protocol, 1), self._handler_for(protocol))

    def start(self) -> None:
        """Start the timer task in the peer's task group."""
        self._task_group.start_soon(self._timer_loop, name=f"chaosp2p {self.name} timers")

    # ------------------------------------------------------------------ input from the network
    def _handler_for(self, protocol: str) -> Callable[[Connection, bytes], None]:
        codec = self._codecs[protocol]

        def handle(connection: Connection, body: bytes) -> None:
            # Runs on the connection's reader: a decode error propagates and closes that connection.
            message = codec.decode(body, max_bytes=self.host.config.max_record_bytes)
            self.call(lambda now: self.machine.receive(now, connection.remote_peer, protocol, message))

        return handle

    def call(self, action: Callable[..., T], *args: Any) -> T:
        """Run ``action(now, *args)`` on the machine, carry out its output, and return its result."""
        result = action(self._clock.now(), *args)
        self.flush()
        return result

    def flush(self) -> None:
        """Send queued messages, forward events, and re-arm the timer."""
        encoded: dict[tuple[int, int], bytes] = {}  # one message sent to many peers is encoded once
        for outgoing in self.machine.take_outgoing():
            self._enqueue(outgoing, encoded)
        take_events = getattr(self.machine, "take_events", None)
        if take_events is not None:
            for event in take_events():
                try:
                    self._on_event(event)
                except Exception:
                    log.exception("%s event handler failed", self.name)
        if self._after_flush is not None:
            self._after_flush()
        # Wake the timer task only if the machine now wants it earlier than it sleeps: a deadline
        # that moved later just costs the task one early look (most calls change no timer, and
        # waking it on each would cost a task switch per message and per reported step).
        deadline = self.machine.next_deadline()
        if deadline is not None and deadline < self._armed:
            self._wake.set()

    # ------------------------------------------------------------------ timers
    async def _timer_loop(self) -> None:
        while True:
            self._wake = anyio.Event()
            deadline = self.machine.next_deadline()
            now = self._clock.now()
            if deadline is not None and deadline <= now:
                self._armed = -math.inf  # running the timeout now: nothing needs to wake us
                self.call(self.machine.handle_timeout)
                await anyio.lowlevel.checkpoint()
                continue
            self._armed = math.inf if deadline is None else deadline
            with anyio.move_on_after(None if deadline is None else deadline - now):
                await self._wake.wait()

    # ------------------------------------------------------------------ output to the network
    def _enqueue(self, outgoing: Outgoing, encoded: dict[tuple[int, int], bytes] | None = None) -> None:
        codec = self._codecs.get(outgoing.protocol)
        if codec is None:
            raise ChaosError(f"{self.name} sent on unregistered protocol {outgoing.protocol!r}")
        if outgoing.to == self.host.peer_id:
            return
        queue = self._queues.get(outgoing.to)
        body = self._encode(codec, outgoing.message, encoded)
        if queue is None:  # nothing waits to go to this peer, so nothing can be overtaken
            if self._send_now(outgoing.to, outgoing.protocol, body):
                return
            # Every queue has a sender draining it, so wait_sent() can count on progress: a peer
            # that would need a sender beyond the cap gets no queue at all (its message is dropped).
            if len(self._senders) >= MAX_SENDERS:
                self.dropped_outgoing += 1
                return
            queue = self._queues[outgoing.to] = deque()
        elif len(queue) >= MAX_QUEUED_PER_PEER:
            self.dropped_outgoing += 1
            return
        queue.append((outgoing.protocol, body))
        if outgoing.to in self._senders:
            return  # its sender task drains the queue until empty
        self._senders.add(outgoing.to)
        self._task_group.start_soon(self._sender, outgoing.to, name=f"chaosp2p {self.name} sender")

    @staticmethod
    def _encode(codec: MessageCodec, message: Any, encoded: dict[tuple[int, int], bytes] | None) -> bytes:
        if encoded is None:
            return codec.encode(message)
        # The message objects outlive the flush, so their ids stay unique; the codec is in the key
        # in case one message object goes out on two protocols.
        key = (id(codec), id(message))
        body = encoded.get(key)
        if body is None:
            body = encoded[key] = codec.encode(message)
        return body

    def _send_now(self, peer: PeerID, protocol: str, body: bytes) -> bool:
        """Hand ``body`` to an open, idle connection from the calling task (no sender task, no wait
        for the event loop to schedule one: each protocol hop costs a scheduling round otherwise)."""
        connection = self.host.connection(peer) or (self.host.relayed_connection(peer) if self._relay else None)
        if connection is None:
            return False
        try:
            return connection.try_send_message_nowait(protocol, body)
        except ChaosError:
            return False  # e.g. the remote does not serve the protocol: the sender task reports it

    async def _sender(self, peer: PeerID) -> None:
        queue = self._queues[peer]
        try:
            while queue:
                try:
                    addrs = self._resolve(peer)
                    if self._relay:
                        connection = await reach(self.host, peer, addrs, any_relay=self._any_relay)
                    else:
                        connection = await self.host.connection_to(peer, addrs)
                    while queue:
                        protocol, body = queue[0]
                        await connection.send_message(protocol, body)
                        queue.popleft()
                        self._progress.set()
                except ChaosError as exc:
                    self.dropped_outgoing += len(queue)
                    queue.clear()
                    log.debug("%s: %s unreachable: %s", self.name, peer, exc)
                    self.call(lambda now: self.machine.peer_unreachable(now, peer))
                    return
        finally:
            self._senders.discard(peer)
            if not queue:
                self._queues.pop(peer, None)
            self._progress.set()

    async def wait_sent(self) -> None:
        """Return once every queued message was sent or given up on (bound it with a timeout)."""
        while self._queues:
            self._progress = anyio.Event()
            await self._progress.wait()
