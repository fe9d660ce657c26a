"""The host: listeners, dialing, connection reuse and protocol dispatch.

A :class:`Host` belongs to a task group (entered with :func:`open_host`); every accept loop,
handshake and connection runs in it, so leaving the ``async with`` block stops all of them.
Protocols are registered before the first connection because each side's Hello advertises them.

Admission. Inbound connections that are still handshaking sit in a bounded table
(``max_pending_handshakes``, and ``max_pending_handshakes_per_address`` from one IP). A newcomer
never finds the door shut: when the table (or its address's share) is full, it *evicts* the oldest
entry, preferring connections that have not yet sent their first handshake message. A real dialer
sends that message at once, so it is past that stage within a round trip, while a flood of idle or
constantly refreshed connections only ever evicts itself. An entry must deliver its first message
within ``first_message_timeout_s`` and finish within ``handshake_timeout_s``. So an attacker holding
or recycling hundreds of idle connections costs a legitimate peer nothing but a place in the
accept queue.

Under a swarm key a first handshake message counts only if it is fresh (a
:class:`~chaosp2p.protocols.channel.replay.ReplayGuard` shared by every inbound handshake): a copy
of a real dialer's message is refused before any work and never "speaks". Once a handshake names
the remote identity, an identity already holding ``max_connections_per_peer`` inbound connections
is closed before its connection (and its buffers) exist.
"""

from __future__ import annotations

import enum
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from chaosp2p._version import __version__
from chaosp2p.clock import Clock, MonotonicClock
from chaosp2p.errors import (
    AdmissionDenied,
    ChaosError,
    ConfigError,
    ConnectionClosed,
    PeerUnreachable,
    RemoteProtocolError,
)
from chaosp2p.protocols.channel.handshake import HandshakeState, NoiseHandshake, SessionKeys, psk_for
from chaosp2p.protocols.channel.hello import MAX_LISTEN_ADDRS, Hello
from chaosp2p.protocols.channel.replay import ReplayGuard
from chaosp2p.protocols.relay import RelayConfig
from chaosp2p.transport.budget import ReceiveBudget
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection, ReplyStatus
from chaosp2p.transport.groups import chaos_errors_beside_cancellation, unwrap_single_error
from chaosp2p.transport.host_statistics import HostStatistics
from chaosp2p.transport.interfaces import announceable, interface_addresses
from chaosp2p.transport.observed import ObservedAddrs
from chaosp2p.transport.quiet_log import QuietLog
from chaosp2p.transport.relay import RelayService
from chaosp2p.transport.shaper import LinkShaper, TokenBucket
from chaosp2p.transport.sockets import Listener, close_socket, connect_tcp, receive_some, send_all
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable, is_circuit
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr
from chaosp2p.wire.protocol_ids import ProtocolId

log = logging.getLogger("chaosp2p.transport")

StreamProtocolHandler = Callable[[Stream], Awaitable[None]]
RequestHandler = Callable[[Connection, Any], Awaitable[Any]]
MessageProtocolHandler = Callable[[Connection, bytes], None]
ConnectionCallback = Callable[[Connection, bool], None]


@dataclass(slots=True, eq=False)
class _PendingHandshake:
    """One inbound connection in the admission table."""

    address: str
    scope: anyio.CancelScope
    first_message_deadline: float
    """anyio clock time by which the first handshake message must have arrived."""
    spoke: bool = False
    """The first handshake message arrived (so this is a dialer speaking our protocol)."""


class IdleTimeout(enum.Enum):
    """Marker for :meth:`Host.set_stream_handler`: use the config's ``handler_idle_timeout_s``."""

    CONFIG = "config"


class Host:
    """A peer's network presence: its identity, listeners and connections. Use :func:`open_host`."""

    def __init__(
        self,
        *,
        identity: Identity,
        config: TransportConfig,
        task_group: anyio.abc.TaskGroup,
        swarm_key: bytes | None = None,
        clock: Clock | None = None,
        agent: str = f"chaosp2p/{__version__}",
        relay: RelayConfig | None = None,
    ) -> None:
        self.identity = identity
        self.config = config
        self.clock = clock or MonotonicClock()
        self.agent = agent
        self.started_wall_s = time.time()
        self._started = self.clock.now()
        self._task_group = task_group
        self._psk = psk_for(swarm_key)
        # In an open swarm anyone can make a fresh first message, so refusing copies buys nothing
        # there and would only make every dialer's clock matter.
        self._replay_guard = (
            None
            if swarm_key is None
            else ReplayGuard(
                max_clock_skew_s=config.handshake_max_clock_skew_s, max_entries=config.max_handshake_replay_entries
            )
        )
        self._inbound: dict[PeerID, int] = {}
        """Inbound connections per identity, from the end of their handshake until they close."""
        self._refused_per_peer = 0
        self._static_key = X25519PrivateKey.generate()
        self._listeners: list[Listener] = []
        self._accepting = False
        self._listen_addrs: list[Multiaddr] = []
        self._stream_handlers: dict[ProtocolId, StreamProtocolHandler] = {}
        self._message_handlers: dict[str, MessageProtocolHandler] = {}
        self._connections: dict[PeerID, list[Connection]] = {}
        self._dialing: dict[str, anyio.Event] = {}
        self._callbacks: list[ConnectionCallback] = []
        self._pending: dict[_PendingHandshake, None] = {}  # insertion order = age
        self._handshakes_evicted = 0
        self._handshakes_completed = 0
        self._quiet = QuietLog()
        self._handshakes_failed = 0
        self._handshakes_timed_out = 0
        self._refused_at_capacity = 0
        self._protocol_errors = 0
        self.address_book: OrderedDict[PeerID, list[Multiaddr]] = OrderedDict()
        """Known addresses per peer, least recently learned first; at most ``max_tracked_peers``."""
        self.observed = ObservedAddrs()
        """Where direct peers saw this host's end of their connections (behind NAT: the router's)."""
        self.receive_budget = ReceiveBudget(
            max_streams_per_peer=config.max_streams_per_peer,
            max_bytes_per_peer=config.max_buffered_bytes_per_peer,
            max_bytes_total=config.max_buffered_bytes_total,
        )
        """Stream slots and receive windows granted to remote peers over all connections."""
        self._handler_timeouts: dict[ProtocolId, float | None] = {}
        self._shaper = (
            None
            if config.max_upload_bytes_per_s is None
            else TokenBucket(
                config.max_upload_bytes_per_s,
                burst_bytes=max(config.max_record_bytes * 2, config.max_upload_bytes_per_s / 50),
                clock=self.clock,
            )
        )
        self.links = LinkShaper.from_environment(self.clock)
        """Per-link shaping, only when the cluster harness asked for it (``CHAOSP2P_LINK_RULES``)."""
        self._relayed: dict[PeerID, list[Connection]] = {}
        self.relay = RelayService(self, relay or RelayConfig())
        """Relaying for others and connecting through relays (``/chaos/relay/1``)."""

    # ------------------------------------------------------------------ identity and addresses
    @property
    def peer_id(self) -> PeerID:
        """This host's PeerID."""
        return self.identity.peer_id

    @property
    def listen_addrs(self) -> list[Multiaddr]:
        """Advertised listen addresses without ``/p2p``."""
        return list(self._listen_addrs)

    @property
    def addrs(self) -> list[Multiaddr]:
        """Addresses others can dial, each ending in ``/p2p/<our id>``."""
        return [addr.with_peer(self.peer_id) for addr in self._listen_addrs]

    def uptime_s(self) -> float:
        """Seconds since the host started."""
        return self.clock.now() - self._started

    # ------------------------------------------------------------------ protocol registration
    def set_stream_handler(
        self,
        protocol: ProtocolId | str,
        handler: StreamProtocolHandler,
        *,
        idle_timeout_s: float | IdleTimeout | None = IdleTimeout.CONFIG,
    ) -> None:
        """Serve inbound streams of ``protocol`` with ``handler(stream)``.

        The handler is cancelled (and its stream reset) once no byte moved on the stream for
        ``idle_timeout_s`` (default: the config's ``handler_idle_timeout_s``; ``None``: never).
        """
        parsed = _protocol(protocol)
        self._stream_handlers[parsed] = handler
        timeout = self.config.handler_idle_timeout_s if idle_timeout_s is IdleTimeout.CONFIG else idle_timeout_s
        assert not isinstance(timeout, IdleTimeout)
        self._handler_timeouts[parsed] = timeout

    def set_request_handler(self, protocol: ProtocolId | str, handler: RequestHandler) -> None:
        """Serve one-request-one-response streams: ``handler(connection, request) -> response``.

        A :class:`ChaosError` from the handler is returned to the caller as an error response;
        anything else is logged and returned as an internal error, without details.
        """

        async def serve(stream: Stream) -> None:
            request = await stream.receive_frame()
            if request is None:
                return
            connection = stream.connection
            assert isinstance(connection, Connection)  # the only carrier of streams
            try:
                response = [ReplyStatus.OK, await handler(connection, request)]
            except RemoteProtocolError as exc:
                response = [ReplyStatus.ERROR, f"bad request: {exc}"]
            except ChaosError as exc:
                response = [ReplyStatus.ERROR, str(exc)]
            except Exception:
                log.exception("request handler for %s failed", protocol)
                response = [ReplyStatus.ERROR, "internal error"]
            await stream.send_frame(response, eof=True)

        self.set_stream_handler(protocol, serve)

    def set_message_handler(self, protocol: ProtocolId | str, handler: MessageProtocolHandler) -> None:
        """Deliver datagram messages of ``protocol`` to ``handler(connection, body)``.

        The handler runs on the connection's reader and must not block; it should hand the message
        to a protocol machine and return.
        """
        parsed = _protocol(protocol)
        self._message_handlers[parsed.name] = handler
        self._stream_handlers.setdefault(parsed, _refuse_stream)

    def on_connection_change(self, callback: ConnectionCallback) -> None:
        """Call ``callback(connection, opened)`` when a connection opens or closes."""
        self._callbacks.append(callback)

    def protocols(self) -> tuple[ProtocolId, ...]:
        """Protocols this host serves, in the order its Hello advertises them."""
        return tuple(sorted(self._stream_handlers))

    # ------------------------------------------------------------------ listening
    async def listen(self, addr: Multiaddr | str) -> Multiaddr:
        """Bind ``addr`` (port 0 picks a free port) and return the real address.

        Connections are accepted once :meth:`start` has been called (:func:`open_host` does).
        """
        address = Multiaddr.parse(addr) if isinstance(addr, str) else addr
        if address.host_kind not in ("ip4", "ip6"):
            raise ConfigError("listen on an /ip4 or /ip6 address")
        listener = Listener(address.host, address.port, buffer_bytes=self.config.socket_buffer_bytes)
        self._listeners.append(listener)
        host, port = listener.address
        bound = Multiaddr.from_socket_address(host, port)
        self._listen_addrs.extend(_advertised(bound))
        if self._accepting:
            self._start_accepting(listener)
        return bound.with_peer(self.peer_id)

    def start(self) -> None:
        """Start accepting on every listener (and on later ones at once).

        Separate from :meth:`listen` so that a peer can learn its own addresses, build the
        services that need them and register their protocols before the first inbound connection.
        """
        if not self._accepting:
            self._accepting = True
            if self.links is not None:
                self._task_group.start_soon(self.links.watch, name="chaosp2p link rules")
            for listener in self._listeners:
                self._start_accepting(listener)

    def _start_accepting(self, listener: Listener) -> None:
        bound = Multiaddr.from_socket_address(*listener.address)
        self._task_group.start_soon(self._accept_loop, listener, name=f"chaosp2p accept {bound}")
        log.info("listening on %s", bound.with_peer(self.peer_id))

    async def _accept_loop(self, listener: Listener) -> None:
        try:
            while True:
                sock, address = await listener.accept()
                if self.connection_count() >= self.config.max_connections:
                    self._refused_at_capacity += 1
                    self._quiet.warning("capacity", "refusing connection from %s:%s: at max_connections", *address)
                    close_socket(sock)
                    continue
                entry = self._admit(address[0])
                self._task_group.start_soon(self._handle_inbound, sock, address, entry)
        except anyio.ClosedResourceError:
            return

    def _admit(self, ip: str) -> _PendingHandshake:
        """Put a new inbound connection in the admission table, evicting to make room if needed."""
        config = self.config
        same_address = [entry for entry in self._pending if entry.address == ip]
        if len(same_address) >= min(config.max_pending_handshakes_per_address, config.max_pending_handshakes):
            self._evict(same_address)
        elif len(self._pending) >= config.max_pending_handshakes:
            self._evict(list(self._pending))
        deadline = anyio.current_time() + min(config.first_message_timeout_s, config.handshake_timeout_s)
        entry = _PendingHandshake(address=ip, scope=anyio.CancelScope(), first_message_deadline=deadline)
        self._pending[entry] = None
        return entry

    def _evict(self, candidates: list[_PendingHandshake]) -> None:
        """Close the oldest candidate that has not spoken yet, else the oldest one (list is oldest first)."""
        victim = next((entry for entry in candidates if not entry.spoke), candidates[0])
        del self._pending[victim]
        victim.scope.cancel()
        self._handshakes_evicted += 1
        self._quiet.warning(
            "evict",
            "admission table full: closed a pending handshake from %s (%s) for a newer connection",
            victim.address,
            "idle" if not victim.spoke else "mid-handshake",
        )

    async def _handle_inbound(self, sock: socket.socket, address: tuple[str, int], entry: _PendingHandshake) -> None:
        try:
            try:
                with entry.scope, anyio.fail_after(self.config.handshake_timeout_s):
                    keys, leftover = await self._handshake(sock, initiator=False, expected=None, pending=entry)
            finally:
                self._pending.pop(entry, None)
            if entry.scope.cancelled_caught:  # evicted for a newer connection (counted and logged there)
                close_socket(sock)
                return
        except TimeoutError:
            self._handshakes_timed_out += 1
            self._quiet.warning(
                "stalled",
                "dropping %s:%s: stalled mid-handshake (%s)",
                *address,
                "no first message" if not entry.spoke else f"not done in {self.config.handshake_timeout_s:g} s",
            )
            close_socket(sock)
            return
        except (RemoteProtocolError, AdmissionDenied, ConnectionClosed, anyio.ClosedResourceError) as exc:
            self._handshakes_failed += 1
            self._quiet.warning("failed", "handshake with %s:%s failed: %s", *address, exc)
            close_socket(sock)
            return
        except BaseException:  # cancelled (host shutting down) or a bug: never leak the socket
            close_socket(sock)
            raise
        self._handshakes_completed += 1
        peer = keys.remote_peer_id
        if self.links is not None and self.links.is_cut(peer):
            close_socket(sock)  # the harness cut this link: the dialer sees its connection fail
            return
        if self._inbound.get(peer, 0) >= self.config.max_connections_per_peer:
            # Checked before the connection (and its record buffers) exists: one identity cannot
            # multiply what a connection costs us by opening many.
            self._refused_per_peer += 1
            self._quiet.warning(
                "per-peer", "refusing a connection from %s (%s:%s): it holds max_connections_per_peer", peer, *address
            )
            close_socket(sock)
            return
        self._inbound[peer] = self._inbound.get(peer, 0) + 1
        try:
            connection = self._make_connection(sock, keys, leftover, is_dialer=False, address=address)
            await self._run_connection(connection)
        except ChaosError:
            pass  # logged by _run_connection; an inbound connection has nobody else to tell
        finally:
            left = self._inbound[peer] - 1
            if left:
                self._inbound[peer] = left
            else:
                del self._inbound[peer]

    # ------------------------------------------------------------------ dialing
    async def connect(self, addr: Multiaddr | CircuitAddr | str) -> Connection:
        """Connect to ``addr`` (reusing an open connection to its peer when the address names one;
        a relay address ``…/p2p-circuit/p2p/<id>`` gives a relayed connection through that relay).

        Raises :class:`PeerIdMismatch` if ``/p2p/<id>`` is given and someone else answers,
        :class:`AdmissionDenied` if the swarm keys differ, :class:`PeerUnreachable` otherwise.
        """
        if isinstance(addr, CircuitAddr) or (isinstance(addr, str) and is_circuit(addr)):
            return await self.relay.connect_addr(addr)
        address = Multiaddr.parse(addr) if isinstance(addr, str) else addr
        if address.peer_id == self.peer_id:
            raise ConfigError("refusing to dial ourselves")
        if address.peer_id is not None:
            existing = self.connection(address.peer_id)
            if existing is not None:
                return existing
        key = str(address)
        while key in self._dialing:
            await self._dialing[key].wait()
            if address.peer_id is not None and (existing := self.connection(address.peer_id)) is not None:
                return existing
        done = self._dialing[key] = anyio.Event()
        try:
            return await self._dial(address)
        finally:
            del self._dialing[key]
            done.set()

    async def _dial(self, address: Multiaddr) -> Connection:
        if self.links is not None and address.peer_id is not None and self.links.is_cut(address.peer_id):
            # A cut link (cluster harness): the SYN goes nowhere, so the dial times out.
            await anyio.sleep(self.config.connect_timeout_s)
            raise PeerUnreachable(f"connecting to {address} timed out after {self.config.connect_timeout_s:g} s")
        with anyio.move_on_after(self.config.connect_timeout_s) as scope:
            sock = await connect_tcp(address.host, address.port, buffer_bytes=self.config.socket_buffer_bytes)
        if scope.cancelled_caught:
            raise PeerUnreachable(f"connecting to {address} timed out after {self.config.connect_timeout_s:g} s")
        keys, leftover = await self._timed_handshake(sock, expected=address.peer_id, what=f"with {address}")
        if keys.remote_peer_id == self.peer_id:
            close_socket(sock)
            raise ConfigError(f"{address} is this peer itself")
        if self.links is not None and self.links.is_cut(keys.remote_peer_id):
            close_socket(sock)
            raise PeerUnreachable(f"{address}: the link to {keys.remote_peer_id} is cut")
        try:
            peer_host, peer_port = sock.getpeername()[:2]
        except OSError as exc:  # the remote hung up right after the handshake
            close_socket(sock)
            raise PeerUnreachable(f"{address} closed the connection after the handshake: {exc}") from None
        connection = self._make_connection(sock, keys, leftover, is_dialer=True, address=(peer_host, peer_port))
        self._remember(keys.remote_peer_id, [address.without_peer()])
        try:
            await self._task_group.start(self._run_connection, connection)
        except ConnectionClosed as exc:
            raise PeerUnreachable(f"{address}: {exc}") from None
        except RemoteProtocolError as exc:
            raise PeerUnreachable(f"{address} misbehaved right after the handshake: {exc}") from None
        return connection

    async def connection_to(self, peer: PeerID, addrs: Sequence[Dialable] = (), *, relay: bool = False) -> Connection:
        """An open connection to ``peer``: reuse one, or dial ``addrs`` / the address book in turn;
        with ``relay``, then through the peers this host is connected to (:meth:`RelayService.connect`)."""
        existing = self.connection(peer)
        if existing is not None:
            return existing
        if relay:
            try:
                return await self.connection_to(peer, addrs)
            except PeerUnreachable as direct:
                try:
                    return await self.relay.connect(peer)
                except PeerUnreachable as exc:
                    raise PeerUnreachable(f"{direct}; {exc}") from None
        candidates: list[Dialable] = [*addrs, *(a for a in self.address_book.get(peer, []) if a not in addrs)]
        # An address we listen on ourselves reaches us, never ``peer``: another host's announced
        # 127.0.0.1:4001 (its own loopback) is ours too when we use the same port. Dialling it cost a
        # handshake with ourselves per try (issue 21: 22 per peer in 4 minutes behind NAT).
        own = {str(a.without_peer()) for a in self._listen_addrs}
        usable = [a for a in candidates if str(a.without_peer()) not in own]
        if not usable:
            detail = " (only addresses this peer listens on itself)" if candidates else ""
            raise PeerUnreachable(f"no known address for {peer}{detail}")
        candidates = usable
        errors = []
        for address in candidates:
            try:
                return await self.connect(address.with_peer(peer))
            except PeerUnreachable as exc:
                errors.append(str(exc))
        raise PeerUnreachable(f"cannot reach {peer}: " + "; ".join(errors))

    async def _timed_handshake(
        self, sock: socket.socket, *, expected: PeerID | None, what: str, initiator: bool = True
    ) -> tuple[SessionKeys, bytes]:
        """:meth:`_handshake` within ``handshake_timeout_s``; ``sock`` is closed if it fails."""
        try:
            with anyio.fail_after(self.config.handshake_timeout_s):
                return await self._handshake(sock, initiator=initiator, expected=expected)
        except TimeoutError:
            close_socket(sock)
            raise PeerUnreachable(f"handshake {what} timed out") from None
        except BaseException:
            close_socket(sock)
            raise

    async def _handshake(
        self,
        sock: socket.socket,
        *,
        initiator: bool,
        expected: PeerID | None,
        pending: _PendingHandshake | None = None,
    ) -> tuple[SessionKeys, bytes]:
        handshake = NoiseHandshake(
            initiator=initiator,
            identity=self.identity,
            psk=self._psk,
            expected_peer=expected,
            static_key=self._static_key,
            wall_time_ms=int(time.time() * 1000),
            replay_guard=None if initiator else self._replay_guard,
        )
        while True:
            outgoing = handshake.data_to_send()
            if outgoing:
                await send_all(sock, [outgoing])
            if handshake.complete:
                return handshake.session(), handshake.leftover()
            try:
                if pending is not None and not pending.spoke:
                    with anyio.fail_after(max(0.0, pending.first_message_deadline - anyio.current_time())):
                        data = await receive_some(sock, 4096)
                else:
                    data = await receive_some(sock, 4096)
            except ConnectionClosed:
                raise handshake.connection_lost() from None
            handshake.receive_data(data)
            if pending is not None and handshake.state is not HandshakeState.AWAIT_MESSAGE_1:
                pending.spoke = True

    # ------------------------------------------------------------------ relayed connections
    async def secure_relayed(self, sock: socket.socket, *, via: Connection, expected: PeerID | None) -> Connection:
        """The end-to-end handshake over ``sock`` (our end of a circuit through ``via``'s peer): the
        dialer names the ``expected`` peer, the answerer ``None``. The connection (marked ``relayed``;
        the harness's link cuts do not apply to it) is not yet running: :meth:`start_connection`."""
        return await self.secure_socket(sock, expected=expected, initiator=expected is not None, via=via)

    async def secure_socket(
        self, sock: socket.socket, *, expected: PeerID | None, initiator: bool, via: Connection | None = None
    ) -> Connection:
        """The handshake over a socket someone else opened (a circuit's end through ``via``, a hole
        punch's or a dial-back's socket without it), in the role given; not yet running."""
        what = f"through {via.remote_peer.short()}" if via else "on a punched or dial-back socket"
        keys, leftover = await self._timed_handshake(sock, initiator=initiator, expected=expected, what=what)
        if keys.remote_peer_id == self.peer_id:
            close_socket(sock)
            raise PeerUnreachable(f"a handshake {what} reached this peer itself")
        address = via.remote_address if via else sock.getpeername()[:2]
        return self._make_connection(sock, keys, leftover, is_dialer=initiator, address=address, relayed=bool(via))

    async def start_connection(self, connection: Connection) -> None:
        """Run ``connection`` in the host's task group; return once its Hellos are exchanged."""
        try:
            await self._task_group.start(self._run_connection, connection)
        except (ConnectionClosed, RemoteProtocolError) as exc:
            raise PeerUnreachable(f"{connection.remote_peer.short()}: {exc}") from None

    async def serve_connection(self, connection: Connection) -> None:
        """Run ``connection`` in the caller's task until it closes."""
        await self._run_connection(connection)

    def spawn(self, function: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        """Run ``function()`` in the host's task group (it ends with the host)."""
        self._task_group.start_soon(function, name=name)

    def relayed_connection(self, peer: PeerID) -> Connection | None:
        """An open relayed connection to ``peer``, if there is one (:meth:`connection` gives direct ones)."""
        return next((c for c in self._relayed.get(peer, []) if not c.closed), None)

    def relayed_connections(self) -> list[Connection]:
        """Every open relayed connection."""
        return [c for conns in self._relayed.values() for c in conns if not c.closed]

    # ------------------------------------------------------------------ connections
    def _make_connection(
        self,
        sock: socket.socket,
        keys: SessionKeys,
        leftover: bytes,
        *,
        is_dialer: bool,
        address: tuple[str, int],
        relayed: bool = False,
    ) -> Connection:
        observed = "" if relayed else str(Multiaddr.from_socket_address(*address))
        hello = Hello(
            agent=self.agent[:64],
            protocols=tuple(str(p) for p in self.protocols()),
            listen_addrs=tuple(str(a) for a in self._listen_addrs[:MAX_LISTEN_ADDRS]),
            observed_addr=observed,
        )
        connection = Connection(
            sock,
            remote_peer=keys.remote_peer_id,
            send_key=keys.send_key,
            receive_key=keys.receive_key,
            is_dialer=is_dialer,
            config=self.config,
            clock=self.clock,
            local_hello=hello,
            local_protocols=self.protocols(),
            stream_handler=self._dispatch_stream,
            message_handler=self._dispatch_message,
            remote_address=address,
            initial_bytes=leftover,
            shaper=self._shaper,
            links=None if relayed else self.links,
            budget=self.receive_budget,
            handler_idle_timeout=self._handler_idle_timeout,
        )
        connection.relayed = relayed
        return connection

    def _handler_idle_timeout(self, protocol: ProtocolId) -> float | None:
        return self._handler_timeouts.get(protocol, self.config.handler_idle_timeout_s)

    async def _run_connection(
        self, connection: Connection, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        peer = connection.remote_peer
        registered = False
        # Relayed connections are kept apart and announced to nobody: elsewhere "connected" means
        # the direct link (membership's connection-loss hint, the DHT's contacts, PeerConnected).
        table = self._relayed if connection.relayed else self._connections

        def started() -> None:
            nonlocal registered
            registered = True
            table.setdefault(peer, []).append(connection)
            if connection.remote_hello is not None:
                listen = []
                for text in connection.remote_hello.listen_addrs:
                    listen.append(Multiaddr.parse(text))
                self._remember(peer, listen)
                if not connection.relayed:
                    self.observed.add(peer, connection.remote_hello.observed_addr, local_port=connection.outbound_port)
            log.debug(
                "connected %s %s (%s:%s)", "to" if connection.is_dialer else "from", peer, *connection.remote_address
            )
            if not connection.relayed:
                self._notify(connection, True)

        class _Status:
            def started(self, value: None = None) -> None:
                started()
                task_status.started()

        try:
            with chaos_errors_beside_cancellation() as late_errors:
                # A write failing while the host shuts down arrives together with the cancellation;
                # the cancellation goes on, the error is only logged.
                await connection.run(task_status=_Status())
            for error in late_errors:
                log.debug("connection with %s ended during shutdown: %s", peer, error)
        except RemoteProtocolError as exc:
            self._protocol_errors += 1
            log.warning("connection with %s failed: %s", peer, exc)
            if not registered:
                raise
        except ChaosError as exc:
            log.info("connection with %s ended: %s", peer, exc)
            if not registered:
                raise
        except Exception:
            log.exception("connection with %s crashed", peer)
            if not registered:
                raise
        finally:
            if registered:
                conns = table.get(peer, [])
                if connection in conns:
                    conns.remove(connection)
                if not conns:
                    table.pop(peer, None)
                if connection.close_reason.startswith("protocol error"):
                    self._protocol_errors += 1
                log.debug("disconnected %s: %s", peer, connection.close_reason)
                if not connection.relayed:
                    self._notify(connection, False)

    def _notify(self, connection: Connection, opened: bool) -> None:
        for callback in list(self._callbacks):
            try:
                callback(connection, opened)
            except Exception:
                log.exception("connection callback failed")

    def _remember(self, peer: PeerID, addrs: Sequence[Multiaddr]) -> None:
        book = self.address_book.setdefault(peer, [])
        self.address_book.move_to_end(peer)
        for addr in addrs:
            plain = addr.without_peer()
            if plain not in book:
                book.append(plain)
        del book[:-MAX_LISTEN_ADDRS]
        while len(self.address_book) > self.config.max_tracked_peers:  # every identity ever seen would grow it
            self.address_book.popitem(last=False)

    def connection(self, peer: PeerID) -> Connection | None:
        """An open connection to ``peer``, if there is one."""
        for connection in self._connections.get(peer, []):
            if not connection.closed:
                return connection
        return None

    def connections_to(self, peer: PeerID) -> list[Connection]:
        """Every open connection to ``peer`` (usually one; two when both sides dialed at once)."""
        return [c for c in self._connections.get(peer, []) if not c.closed]

    def connections(self) -> list[Connection]:
        """Every open connection."""
        return [c for conns in self._connections.values() for c in conns if not c.closed]

    def connected_peers(self) -> list[PeerID]:
        """Peers with at least one open connection."""
        return [peer for peer in self._connections if self.connection(peer) is not None]

    def connection_count(self) -> int:
        """Open connections."""
        return sum(len(conns) for conns in self._connections.values())

    def statistics(self) -> HostStatistics:
        """Counters of refused and failed connections."""
        return HostStatistics(
            connections=self.connection_count(),
            pending_handshakes=len(self._pending),
            handshakes_failed=self._handshakes_failed,
            handshakes_timed_out=self._handshakes_timed_out,
            connections_refused_at_capacity=self._refused_at_capacity,
            protocol_errors=self._protocol_errors,
            handshakes_evicted=self._handshakes_evicted,
            handshakes_completed=self._handshakes_completed,
            handshakes_replayed=self._replays_refused(),
            connections_refused_per_peer=self._refused_per_peer,
        )

    def _replays_refused(self) -> int:
        if self._replay_guard is None:
            return 0
        stats = self._replay_guard.statistics()
        return stats.replays_refused + stats.stale_refused

    # ------------------------------------------------------------------ dispatch
    async def _dispatch_stream(self, stream: Stream) -> None:
        handler = self._stream_handlers.get(stream.protocol)
        if handler is None:  # cannot happen: the mux only opens advertised protocols
            raise RemoteProtocolError(f"no handler for {stream.protocol}")
        await handler(stream)

    def _dispatch_message(self, connection: Connection, protocol_name: str, body: bytes) -> None:
        handler = self._message_handlers.get(protocol_name)
        if handler is None:
            raise RemoteProtocolError(f"no message handler for {protocol_name}")
        handler(connection, body)

    async def aclose(self) -> None:
        """Stop listening and close every connection with a goodbye."""
        for listener in self._listeners:
            listener.close()
        with anyio.move_on_after(1.0):
            async with anyio.create_task_group() as tg:
                for connection in [*self.connections(), *self.relayed_connections()]:
                    tg.start_soon(connection.aclose, "peer shutting down")


async def _refuse_stream(stream: Stream) -> None:
    raise RemoteProtocolError(f"{stream.protocol} takes messages, not streams")


def _protocol(protocol: ProtocolId | str) -> ProtocolId:
    return protocol if isinstance(protocol, ProtocolId) else ProtocolId.parse(protocol)


def _advertised(bound: Multiaddr) -> list[Multiaddr]:
    """Concrete addresses for a listener: a wildcard bind is announced as the host's interface
    addresses, routable first, loopback only if there is nothing else (never 0.0.0.0 or ::)."""
    if bound.host not in ("0.0.0.0", "::"):
        return [bound]
    family = socket.AF_INET if bound.host == "0.0.0.0" else socket.AF_INET6
    return [Multiaddr.from_socket_address(ip, bound.port) for ip in announceable(interface_addresses(family))]


@asynccontextmanager
async def open_host(
    identity: Identity,
    config: TransportConfig,
    *,
    swarm_key: bytes | None = None,
    clock: Clock | None = None,
    relay: RelayConfig | None = None,
) -> AsyncIterator[Host]:
    """Run a :class:`Host` for the duration of the block; every task it started ends with it."""
    with unwrap_single_error():
        async with anyio.create_task_group() as tg:
            host = Host(identity=identity, config=config, task_group=tg, swarm_key=swarm_key, clock=clock, relay=relay)
            host.start()
            try:
                yield host
            finally:
                with anyio.CancelScope(shield=True):
                    await host.aclose()
                tg.cancel_scope.cancel()
