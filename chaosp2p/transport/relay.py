"""The circuit relay's driver: relaying for others, and reaching a peer through a relay.

Theory of operation
-------------------
Three roles, one stream handler (``/chaos/relay/1``, ``protocols/relay.md``):

* **Relay** (R, on HOP from A naming B): admitted by R's :class:`CircuitTable`, R opens a stream to
  B over a connection *it already has* -- it never dials for anyone, so it cannot be made to reach
  third parties -- sends STOP(A), waits for B's STATUS, answers A, then :func:`splice` copies bytes
  both ways unchanged until either end closes, the circuit's byte budget is spent or its deadline
  passes (then both streams are reset).
* **Source** (A, :meth:`RelayService.connect_via`): after R's OK, the stream is bridged to one end of
  a ``socket.socketpair()`` by :func:`bridge`; the other end goes through the host's normal
  handshake as a dialer expecting B. The Noise handshake authenticates B end to end, so a relay
  that alters a byte or answers as B itself makes it fail; what R copies is ciphertext.
* **Target** (B, on STOP from R naming A): admitted by B's own table of relayed connections,
  answers OK, bridges the stream and answers the handshake, then checks that the peer it
  authenticated is the A that R named. The connection lives as long as the STOP stream's handler.

A relayed connection is an ordinary :class:`~chaosp2p.transport.connection.Connection` marked
``relayed``; the host keeps it apart from direct ones (:meth:`Host.connection` never returns it,
:meth:`Host.relayed_connection` does), because "connected" elsewhere means the direct link.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import AdmissionDenied, ChaosError, ConnectionClosed, PeerUnreachable, RemoteProtocolError
from chaosp2p.protocols.reachability.machine import Reachability
from chaosp2p.protocols.relay import (
    PROTOCOL,
    PROTOCOL_ID,
    Circuit,
    CircuitTable,
    Hop,
    Refusal,
    RelayConfig,
    Status,
    Stop,
)
from chaosp2p.protocols.relay import codec as relay_codec
from chaosp2p.protocols.relay.messages import MAX_RESERVATION_ADDRS, Reservation, Reserve, StatusCode, refusal
from chaosp2p.protocols.relay.reservations import ReservationTable
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.transport.sockets import close_socket, receive_some, send_all
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.transport")

COPY_BYTES = 1 << 20
"""Largest piece moved per read by a bridge or a splice."""


class RelayHost(Protocol):
    """What the relay needs from its :class:`~chaosp2p.transport.host.Host` (which owns the service)."""

    config: TransportConfig
    clock: Clock

    @property
    def peer_id(self) -> PeerID:
        """This host's PeerID."""
        ...

    @property
    def addrs(self) -> list[Multiaddr]:
        """This host's addresses, each ending in ``/p2p/<its id>``."""
        ...

    async def connect(self, addr: Multiaddr) -> Connection:
        """A direct connection to ``addr``: reuse or dial."""
        ...

    def set_stream_handler(self, protocol: Any, handler: Callable[[Stream], Awaitable[None]]) -> None:
        """Serve inbound streams of ``protocol``."""
        ...

    def on_connection_change(self, callback: Callable[[Connection, bool], None]) -> None:
        """Call ``callback(connection, opened)`` when a direct connection opens or closes."""
        ...

    def connection(self, peer: PeerID) -> Connection | None:
        """An open direct connection."""
        ...

    def relayed_connection(self, peer: PeerID) -> Connection | None:
        """An open relayed connection."""
        ...

    def connected_peers(self) -> list[PeerID]:
        """Peers with an open direct connection."""
        ...

    async def connection_to(self, peer: PeerID) -> Connection:
        """A direct connection: reuse or dial."""
        ...

    async def secure_relayed(self, sock: socket.socket, *, via: Connection, expected: PeerID | None) -> Connection:
        """The end-to-end handshake over one end of a circuit."""
        ...

    async def start_connection(self, connection: Connection) -> None:
        """Run a connection in the host's task group."""
        ...

    async def serve_connection(self, connection: Connection) -> None:
        """Run a connection in the caller's task."""
        ...

    def spawn(self, function: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        """Run a task in the host's task group."""
        ...


class RelayService:
    """A host's relay roles (see the module docstring). The host makes one: ``host.relay``."""

    def __init__(self, host: RelayHost, config: RelayConfig) -> None:
        self.host = host
        self.config = config
        self.circuits = CircuitTable(config, enabled=config.enabled)
        """Circuits this peer relays for others."""
        self.accepted = CircuitTable(config, enabled=config.accept_relayed, count_target=False)
        """Connections this peer accepted through relays (as the target)."""
        self.reservations = ReservationTable(config, enabled=config.enabled)
        """Slots this peer keeps for peers nobody can dial (as a relay)."""
        self.own_reachability: Callable[[], Reachability] | None = None
        """This peer's reachability by its dial-back checks (the node sets it); reservations are
        granted only while it is public (``reserve_only_when_public``). None: no checks, grant."""
        host.on_connection_change(self._connection_changed)
        self.opened: list[Callable[[Connection], None]] = []
        """Called with each relayed connection this host opens as the source (the node's hole
        punching starts its upgrade to a direct connection there)."""
        host.set_stream_handler(PROTOCOL_ID, self._serve)

    # ------------------------------------------------------------------ source
    async def connect(self, peer: PeerID, relays: Sequence[PeerID] | None = None) -> Connection:
        """A relayed connection to ``peer``: reuse one, else try ``relays`` in turn.

        ``None`` means every peer this host is directly connected to that speaks the relay
        protocol, in PeerID order (so every caller tries them in the same order).
        """
        existing = self.host.relayed_connection(peer)
        if existing is not None:
            return existing
        if relays is None:
            relays = sorted(
                (p for p in self.host.connected_peers() if p != peer and self._speaks_relay(p)), key=lambda p: p.raw
            )
        errors = []
        for relay in relays:
            if relay in (peer, self.host.peer_id):
                continue
            try:
                return await self.connect_via(relay, peer)
            except PeerUnreachable as exc:
                errors.append(str(exc))
        raise PeerUnreachable(f"no relay reached {peer.short()}: " + ("; ".join(errors) or "no relay to try"))

    def _speaks_relay(self, peer: PeerID) -> bool:
        connection = self.host.connection(peer)
        return connection is not None and connection.supports(PROTOCOL)

    async def connect_via(self, relay: PeerID, peer: PeerID) -> Connection:
        """A new connection to ``peer`` through a circuit at ``relay`` (a peer this host reaches directly).

        Raises :class:`PeerUnreachable` if the relay refuses or the end-to-end handshake fails
        (a relay that altered a byte or answered as ``peer`` itself), naming the relay.
        """
        via = await self.host.connection_to(relay)
        name = f"{peer.short()} through {relay.short()}"
        try:
            stream = via.open_stream(PROTOCOL)
            await stream.send_message(relay_codec, Hop(target=peer))
            answer = await _answer(stream, self.config.answer_timeout_s)
        except ChaosError as exc:
            raise PeerUnreachable(f"{name}: {exc}") from None
        if not answer.ok:
            stream.reset()
            raise PeerUnreachable(f"{name}: refused ({StatusCode(answer.code).name}: {answer.reason})")
        stream.set_receive_window(self.config.window_bytes)
        inner, outer = _socket_pair(self.host.config.socket_buffer_bytes)
        self.host.spawn(functools.partial(bridge, stream, outer), name=f"chaosp2p relay bridge to {peer.short()}")
        try:
            connection = await self.host.secure_relayed(inner, via=via, expected=peer)
            await self.host.start_connection(connection)
        except (RemoteProtocolError, AdmissionDenied, PeerUnreachable) as exc:
            raise PeerUnreachable(f"{name}: end-to-end handshake failed: {exc}") from None
        log.debug("relayed connection to %s", name)
        for callback in list(self.opened):
            callback(connection)
        return connection

    async def connect_addr(self, addr: CircuitAddr | str) -> Connection:
        """A relayed connection to ``addr``'s target through its relay, dialing the relay if needed."""
        addr = CircuitAddr.parse(addr) if isinstance(addr, str) else addr
        existing = self.host.relayed_connection(addr.target)
        if existing is not None:
            return existing
        await self.host.connect(addr.relay)
        return await self.connect_via(addr.relay_peer, addr.target)

    async def reserve(self, relay: PeerID) -> Reservation:
        """Reserve (or renew) a slot at ``relay``, a peer this host reaches directly; the answer
        says for how long and the relay addresses to hand out. :class:`PeerUnreachable` if refused."""
        via = await self.host.connection_to(relay)
        try:
            async with via.open_stream(PROTOCOL) as stream:
                await stream.send_message(relay_codec, Reserve(), eof=True)
                answer = None
                with anyio.move_on_after(self.config.answer_timeout_s):
                    answer = await stream.receive_message(relay_codec)
        except ChaosError as exc:
            raise PeerUnreachable(f"reservation at {relay.short()}: {exc}") from None
        if isinstance(answer, Reservation):
            return answer
        if isinstance(answer, Status) and not answer.ok:
            raise PeerUnreachable(
                f"reservation at {relay.short()} refused ({StatusCode(answer.code).name}: {answer.reason})"
            )
        raise PeerUnreachable(f"reservation at {relay.short()}: no answer within {self.config.answer_timeout_s:g} s")

    # ------------------------------------------------------------------ relay and target
    async def _serve(self, stream: Stream) -> None:
        message = None
        with anyio.move_on_after(self.config.answer_timeout_s):
            message = await stream.receive_message(relay_codec)
        if isinstance(message, Hop):
            await self._hop(stream, message.target)
        elif isinstance(message, Stop):
            await self._stop(stream, message.source)
        elif isinstance(message, Reserve):
            await self._reserve(stream)
        elif message is not None:
            raise RemoteProtocolError(f"relay: expected HOP, STOP or RESERVE, got {type(message).__name__}")

    def _connection_changed(self, connection: Connection, opened: bool) -> None:
        peer = connection.remote_peer
        if not opened and self.host.connection(peer) is None:
            self.reservations.release(peer)  # a slot is for a peer we can reach: it must reserve again

    async def _reserve(self, stream: Stream) -> None:
        peer = stream.remote_peer
        via = stream.connection
        if isinstance(via, Connection) and via.relayed:
            answer: Status | Reservation = refusal(StatusCode.MALFORMED, "reserve over a direct connection")
        else:
            now = self.host.clock.now()
            own = None if self.own_reachability is None else self.own_reachability()
            granted = self.reservations.reserve(peer, now, own=own)
            if isinstance(granted, Refusal):
                answer = refusal(granted.code, granted.reason)
            else:
                addrs = tuple(str(CircuitAddr(a, peer)) for a in self.host.addrs[:MAX_RESERVATION_ADDRS])
                answer = Reservation(ttl_s=granted - now, addrs=addrs)
                log.debug("relay: reservation for %s until +%.0f s", peer.short(), granted - now)
        await stream.send_message(relay_codec, answer, eof=True)

    async def _hop(self, stream: Stream, target: PeerID) -> None:
        source = stream.remote_peer
        if target == self.host.peer_id:
            await stream.send_message(relay_codec, refusal(StatusCode.MALFORMED, "a circuit to the relay itself"))
            return
        if self.config.require_reservation and not self.reservations.holds(target, self.host.clock.now()):
            reason = f"{target.short()} holds no reservation at this relay"
            await stream.send_message(relay_codec, refusal(StatusCode.NO_RESERVATION, reason), eof=True)
            return
        circuit = self.circuits.admit(source, target, self.host.clock.now())
        if isinstance(circuit, Refusal):
            await stream.send_message(relay_codec, refusal(circuit.code, circuit.reason), eof=True)
            return
        onward: Stream | None = None
        try:
            onward = await self._open_onward(stream, source, target)
            if onward is None:
                return
            await stream.send_message(relay_codec, Status(code=StatusCode.OK))
            for end in (stream, onward):
                end.set_receive_window(self.config.window_bytes)
            with anyio.move_on_after(max(0.0, circuit.deadline - self.host.clock.now())) as scope:
                clean = await splice(self.circuits, circuit, stream, onward)
            if scope.cancelled_caught or not clean:
                log.info("relay: closed the circuit %s -> %s (byte or time cap)", source.short(), target.short())
                for end in (stream, onward):
                    end.reset()
        finally:
            self.circuits.close(circuit)

    async def _open_onward(self, stream: Stream, source: PeerID, target: PeerID) -> Stream | None:
        """The stream to ``target`` with its OK to our STOP, or None (``stream`` told why)."""
        connection = self.host.connection(target)  # never a dial: only a connection we already have
        if connection is None:
            status = refusal(StatusCode.NO_CONNECTION, f"the relay has no connection to {target.short()}")
        elif not connection.supports(PROTOCOL):
            status = refusal(StatusCode.TARGET_REFUSED, f"{target.short()} does not speak {PROTOCOL_ID}")
        else:
            onward = connection.open_stream(PROTOCOL)
            try:
                await onward.send_message(relay_codec, Stop(source=source))
                answer = await _answer(onward, self.config.answer_timeout_s)
            except ChaosError as exc:
                onward.reset()
                answer = refusal(StatusCode.TARGET_REFUSED, f"{target.short()}: {exc}")
            if answer.ok:
                return onward
            onward.reset()
            status = refusal(StatusCode.TARGET_REFUSED, f"{target.short()}: {answer.reason or 'refused'}")
        await stream.send_message(relay_codec, status, eof=True)
        return None

    async def _stop(self, stream: Stream, source: PeerID) -> None:
        via = stream.connection
        me = self.host.peer_id
        accepted = self.accepted.admit(source, me, self.host.clock.now())
        if isinstance(accepted, Refusal):
            await stream.send_message(relay_codec, refusal(accepted.code, accepted.reason), eof=True)
            return
        try:
            await stream.send_message(relay_codec, Status(code=StatusCode.OK))
            stream.set_receive_window(self.config.window_bytes)
            inner, outer = _socket_pair(self.host.config.socket_buffer_bytes)
            with unwrap_single_error():
                async with anyio.create_task_group() as tg:
                    tg.start_soon(bridge, stream, outer)
                    try:
                        assert isinstance(via, Connection)  # the only carrier of streams
                        connection = await self.host.secure_relayed(inner, via=via, expected=None)
                    except (RemoteProtocolError, AdmissionDenied, PeerUnreachable) as exc:
                        log.warning("relayed connection from %s via %s failed: %s", source, via.remote_peer, exc)
                        tg.cancel_scope.cancel()
                        return
                    if connection.remote_peer != source:
                        # The relay named one peer and another answered the handshake: a lying relay.
                        log.warning(
                            "relay %s announced %s but %s answered the handshake: closed",
                            via.remote_peer,
                            source,
                            connection.remote_peer,
                        )
                        close_socket(inner)
                        tg.cancel_scope.cancel()
                        return
                    await self.host.serve_connection(connection)
                    tg.cancel_scope.cancel()
        finally:
            self.accepted.close(accepted)


async def _answer(stream: Stream, timeout_s: float) -> Status:
    """The STATUS that answers our HOP or STOP, within ``timeout_s``."""
    answer = None
    with anyio.move_on_after(timeout_s):
        answer = await stream.receive_message(relay_codec)
    if answer is None:
        return refusal(StatusCode.TARGET_REFUSED, f"no answer within {timeout_s:g} s")
    if not isinstance(answer, Status):
        raise RemoteProtocolError(f"relay: expected a STATUS, got {type(answer).__name__}")
    return answer


def _socket_pair(buffer_bytes: int) -> tuple[socket.socket, socket.socket]:
    """Two connected non-blocking sockets: the connection's end and the bridge's end."""
    inner, outer = socket.socketpair()
    for sock in (inner, outer):
        sock.setblocking(False)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
            except OSError:  # some kernels cap buffer sizes; the default still works
                pass
    return inner, outer


async def bridge(stream: Stream, sock: socket.socket) -> None:
    """Move bytes between a relay stream and ``sock`` (the bridge's end of a socket pair) until
    the local connection closes its end; the stream's end half-closes the socket.

    Any failure on either side closes both (the connection on the other end then ends too).
    """
    failed = False

    async def stream_to_socket() -> None:
        while data := await stream.receive_some(COPY_BYTES):
            await send_all(sock, [data])
        sock.shutdown(socket.SHUT_WR)  # the far end finished: the local connection reads EOF

    async def socket_to_stream() -> None:
        while True:
            try:
                data = await receive_some(sock, COPY_BYTES)
            except ConnectionClosed:
                await stream.send_eof()
                return
            await stream.send(data)

    async def run(work: Callable[[], Awaitable[None]], tg: anyio.abc.TaskGroup, *, last: bool) -> None:
        nonlocal failed
        try:
            await work()
        except (ChaosError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            log.debug("relay bridge ended: %s", exc)
            failed = True
            tg.cancel_scope.cancel()
        if last:  # the local connection is gone: nothing more to deliver
            tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(run, stream_to_socket, tg, last=False))
            tg.start_soon(functools.partial(run, socket_to_stream, tg, last=True))
    finally:
        if failed:
            stream.reset()
        close_socket(sock)


async def splice(table: CircuitTable, circuit: Circuit, a: Stream, b: Stream) -> bool:
    """Copy bytes both ways between ``a`` and ``b`` until both directions ended (True) or the
    circuit's byte budget ran out or a stream failed (False)."""
    within = True

    async def copy(src: Stream, dst: Stream, tg: anyio.abc.TaskGroup) -> None:
        nonlocal within
        try:
            while data := await src.receive_some(COPY_BYTES):
                if not table.charge(circuit, len(data)):
                    within = False
                    tg.cancel_scope.cancel()
                    return
                await dst.send(data)
            await dst.send_eof()
        except ChaosError:
            within = False
            tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(copy, a, b, tg)
        tg.start_soon(copy, b, a, tg)
    return within


__all__ = ["COPY_BYTES", "RelayService", "bridge", "splice"]
