"""Hole punching's driver: from a relayed connection to a direct one (``/chaos/holepunch/1``).

Use::

    connection = await punch(host, peer)       # a direct Connection, or PeerUnreachable
    node.holepunch.punch(peer)                 # the same through the node's service

``peer`` must already have a relayed connection with ``host`` (``host.relay.connect(peer)``), and
its host must serve ``/chaos/holepunch/1`` (a :class:`HolePunchService`, which every node has). On
success the host holds a direct connection to ``peer`` (:meth:`Host.connection` returns it, so
``connection_to`` and everything above use it from then on); the relayed connection stays open.
On failure -- the other side refused, a NAT that maps each destination to a new port (symmetric),
a closed port, a cut link -- :class:`PeerUnreachable` names the reason, one line is logged at info,
and the relayed connection stays as it was. A peer whose own NAT changes source ports (by its
observers' reports, :meth:`~chaosp2p.transport.observed.ObservedAddrs.port_mapping`) fails at once
as initiator and refuses as responder, saying why (``Refusal.PORTS_CHANGED``): its SYN would leave
from a port the other side was not told, so waiting ``connect_timeout_s`` could only end in failure.

Theory of operation
-------------------
The coordination is :class:`~chaosp2p.protocols.holepunch.PunchMachine` (read its docstring); this
module moves its messages over a stream of the relayed connection, waits its deadlines, and does
the socket work: :func:`simultaneous_open` connects from this peer's listen port (shared with the
listener through SO_REUSEPORT, :func:`~chaosp2p.transport.sockets.bound_socket`) to each candidate
address of the other side at once; the first socket that connects wins, and a connect that finds
its connection taken (EADDRNOTAVAIL: the other side's SYN already reached our listener, and our host
accepted it) reports ``TAKEN``. The agreed :class:`~chaosp2p.protocols.holepunch.Role` then runs the
handshake over our socket, as the dialer or the answerer, or waits for the inbound connection our
host accepted.

Nothing the other side names is dialed blindly: at most ``max_dial_addrs`` TCP addresses, no DNS
names, no unspecified or multicast addresses, and loopback only when the relay itself is reached
over loopback (everything on one machine). A responder takes part in few punches per peer (a token
bucket) and few at once.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError, PeerUnreachable
from chaosp2p.protocols.holepunch import (
    MAX_PUNCH_ADDRS,
    PROTOCOL,
    PROTOCOL_ID,
    HolePunchConfig,
    Outcome,
    PunchMachine,
    Refusal,
    Result,
    Role,
    codec,
)
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.observed import ObservedAddrs, PortMapping
from chaosp2p.transport.shaper import LinkShaper
from chaosp2p.transport.sockets import bound_socket, close_socket
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.transport")

_TAKEN_ERRORS = (errno.EADDRNOTAVAIL, errno.EADDRINUSE)
"""What connect() says when the 4-tuple already belongs to a connection our listener accepted."""


class PunchHost(Protocol):
    """What hole punching needs from a :class:`~chaosp2p.transport.host.Host`."""

    config: TransportConfig
    clock: Clock
    links: LinkShaper | None
    observed: ObservedAddrs

    @property
    def peer_id(self) -> PeerID:
        """This host's PeerID."""
        ...

    @property
    def listen_addrs(self) -> list[Multiaddr]:
        """Advertised listen addresses."""
        ...

    def set_stream_handler(self, protocol: Any, handler: Callable[[Stream], Awaitable[None]]) -> None:
        """Serve inbound streams of ``protocol``."""
        ...

    def connection(self, peer: PeerID) -> Connection | None:
        """An open direct connection."""
        ...

    def connections(self) -> list[Connection]:
        """Every open direct connection."""
        ...

    def relayed_connection(self, peer: PeerID) -> Connection | None:
        """An open relayed connection."""
        ...

    async def secure_socket(
        self, sock: socket.socket, *, expected: PeerID | None, initiator: bool, via: Connection | None = None
    ) -> Connection:
        """The handshake over an opened socket."""
        ...

    async def start_connection(self, connection: Connection) -> None:
        """Run a connection in the host's task group."""
        ...

    def spawn(self, function: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        """Run a task in the host's task group."""
        ...


async def punch(host: PunchHost, peer: PeerID, config: HolePunchConfig | None = None) -> Connection:
    """A direct connection to ``peer`` punched through our relayed connection to it (module docstring).

    Returns an existing direct connection at once; raises :class:`PeerUnreachable` (and keeps the
    relayed connection) when no direct connection results.
    """
    config = config or HolePunchConfig()
    existing = host.connection(peer)
    if existing is not None:
        return existing
    if host.links is not None and host.links.is_cut(peer):
        raise PeerUnreachable(f"hole punch with {peer.short()}: the link is cut")
    relayed = host.relayed_connection(peer)
    if relayed is None:
        raise PeerUnreachable(f"hole punch with {peer.short()}: no relayed connection to punch through")
    if not relayed.supports(PROTOCOL):
        raise PeerUnreachable(f"hole punch with {peer.short()}: it does not speak {PROTOCOL_ID}")
    if ports_changed(host, config):
        reason = "our NAT changes source ports (symmetric): a punch cannot work"
        log.info("hole punch with %s not tried (%s); the relayed connection stays", peer.short(), reason)
        raise PeerUnreachable(f"hole punch with {peer.short()} failed: {reason}")
    machine = PunchMachine(
        initiator=True,
        local_peer=host.peer_id,
        remote_peer=peer,
        local_addrs=candidate_addrs(host),
        config=config,
        now=host.clock.now(),
    )
    async with relayed.open_stream(PROTOCOL) as stream:  # reset if the punch fails, else closed
        return await _run(host, machine, stream, via=relayed)


class HolePunchService:
    """A host's responder role (and :meth:`punch` for the initiator's). The node makes one."""

    def __init__(self, host: PunchHost, config: HolePunchConfig) -> None:
        self.host = host
        self.config = config
        self._rate = RateLimiter(
            rate_per_s=config.punches_per_peer_per_s, burst=config.punch_burst, max_senders=config.max_tracked_peers
        )
        self._active = 0
        self.punched = 0
        """Punches (either role) that ended with a direct connection."""
        self.failed = 0
        """Punches (either role) that ended without one."""
        self.refused = 0
        """Punches asked of us that we refused (disabled, rate, busy, not over a relayed connection)."""
        host.set_stream_handler(PROTOCOL_ID, self._serve)

    async def punch(self, peer: PeerID) -> Connection:
        """:func:`punch` with this service's config, counted."""
        try:
            connection = await punch(self.host, peer, self.config)
        except PeerUnreachable:
            self.failed += 1
            raise
        self.punched += 1
        return connection

    def upgrade_soon(self, relayed: Connection) -> None:
        """Punch in the background towards the peer of a relayed connection we just opened (with
        ``auto_upgrade``; a failure is logged and the relayed connection stays)."""
        if not self.config.auto_upgrade or not relayed.supports(PROTOCOL):
            return
        peer = relayed.remote_peer

        async def upgrade() -> None:
            with contextlib.suppress(PeerUnreachable):  # said in the log by punch()
                await self.punch(peer)

        self.host.spawn(upgrade, name=f"chaosp2p hole punch with {peer.short()}")

    async def _serve(self, stream: Stream) -> None:
        peer = stream.remote_peer
        via = stream.connection
        assert isinstance(via, Connection)  # the only carrier of streams
        refusal, code = self._refusal(via, peer)
        if refusal:
            self.refused += 1
            log.debug("hole punch asked by %s refused: %s", peer.short(), refusal)
            await stream.send_message(codec, Result(outcome=int(Outcome.REFUSED), reason=int(code)), eof=True)
            return
        self._active += 1
        machine = PunchMachine(
            initiator=False,
            local_peer=self.host.peer_id,
            remote_peer=peer,
            local_addrs=candidate_addrs(self.host),
            config=self.config,
            now=self.host.clock.now(),
        )
        try:
            await _run(self.host, machine, stream, via=via)
            self.punched += 1
        except PeerUnreachable:
            self.failed += 1  # logged by _run
        finally:
            self._active -= 1

    def _refusal(self, via: Connection, peer: PeerID) -> tuple[str, Refusal]:
        """Why we will not punch with ``peer`` now ("" if we will) and the code we tell it; cheap
        checks first, and the rate last (a refusal for another reason spends no token)."""
        if not self.config.enabled:
            return "hole punching is off", Refusal.UNSPECIFIED
        if not via.relayed:
            return "not over a relayed connection", Refusal.UNSPECIFIED
        if self.host.connection(peer) is not None:
            return "already connected directly", Refusal.UNSPECIFIED
        if self.host.links is not None and self.host.links.is_cut(peer):
            return "the link is cut", Refusal.UNSPECIFIED
        if ports_changed(self.host, self.config):
            return "our NAT changes source ports", Refusal.PORTS_CHANGED
        if self._active >= self.config.max_concurrent:
            return "too many punches under way", Refusal.UNSPECIFIED
        if not self._rate.allow(peer, self.host.clock.now()):
            return "rate limit", Refusal.UNSPECIFIED
        return "", Refusal.UNSPECIFIED


def ports_changed(host: PunchHost, config: HolePunchConfig) -> bool:
    """Whether this host's observers say its NAT changes source ports (a punch cannot work)."""
    return host.observed.port_mapping(config.min_mapping_observers) is PortMapping.CHANGED


async def _run(host: PunchHost, machine: PunchMachine, stream: Stream, *, via: Connection) -> Connection:
    """Drive one side's punch to its end: the direct connection, or PeerUnreachable (logged)."""
    peer = machine.remote_peer
    sock: socket.socket | None = None
    try:
        sock = await _coordinate(host, machine, stream, via)
        role = machine.role
        assert role is not None
        connection = await _finish(host, peer, role, sock)
        sock = None  # the connection owns it now
    except (ChaosError, OSError) as exc:
        reason = machine.failure or str(exc) or type(exc).__name__
        if (direct := host.connection(peer)) is not None:
            return direct  # another way won (the other side's attempt reached our listener)
        log.info("hole punch with %s failed (%s); the relayed connection stays", peer.short(), reason)
        raise PeerUnreachable(f"hole punch with {peer.short()} failed: {reason}") from None
    finally:
        if sock is not None:
            close_socket(sock)
    log.info("hole punch with %s: direct connection (%s, %s:%s)", peer.short(), role.value, *connection.remote_address)
    return connection


async def _coordinate(host: PunchHost, machine: PunchMachine, stream: Stream, via: Connection) -> socket.socket | None:
    """Exchange the messages and make the attempt; our socket if it connected."""
    clock = host.clock
    sock: socket.socket | None = None
    try:
        if machine.initiator:
            await stream.send_message(codec, machine.start(clock.now()))
        while machine.role is None:
            if machine.dial_due(clock.now()):
                targets = dialable(
                    machine.remote_addrs, loopback=_is_loopback(via), limit=machine.config.max_dial_addrs
                )
                outcome, sock = await simultaneous_open(
                    _listen_ports(host),
                    targets,
                    timeout_s=machine.config.connect_timeout_s,
                    buffer_bytes=host.config.socket_buffer_bytes,
                )
                await stream.send_message(codec, machine.dialed(outcome, clock.now()))
                continue
            deadline = machine.next_deadline()
            assert deadline is not None  # not finished
            message = None
            with anyio.move_on_after(max(0.0, deadline - clock.now())):
                message = await stream.receive_message(codec)
                if message is None:
                    machine.failure = "the other side closed the coordination stream"
                    raise PeerUnreachable(machine.failure)
            if message is None:
                machine.handle_timeout(clock.now())
                continue
            for reply in machine.receive(message, clock.now()):
                await stream.send_message(codec, reply)
        if machine.role is Role.FAIL and not machine.failure:
            machine.failure = f"outcomes: ours {_name(machine.local_outcome)}, theirs {_name(machine.remote_outcome)}"
    except BaseException:
        if sock is not None:
            close_socket(sock)
        raise
    if machine.role is Role.FAIL:
        if sock is not None:
            close_socket(sock)
        raise PeerUnreachable(machine.failure)
    return sock


async def _finish(host: PunchHost, peer: PeerID, role: Role, sock: socket.socket | None) -> Connection:
    """The direct connection the agreed ``role`` leads to."""
    if role is Role.AWAIT_INBOUND:
        with anyio.move_on_after(host.config.handshake_timeout_s):
            while (direct := host.connection(peer)) is None:  # noqa: ASYNC110 - the host has no event per peer
                await anyio.sleep(0.01)
            return direct
        raise PeerUnreachable("our listener accepted the connection but its handshake did not finish")
    assert sock is not None and role in (Role.INITIATE, Role.RESPOND)
    initiator = role is Role.INITIATE
    connection = await host.secure_socket(sock, expected=peer if initiator else None, initiator=initiator)
    if connection.remote_peer != peer:
        raise PeerUnreachable(f"{connection.remote_peer.short()} answered the punched connection, not {peer.short()}")
    await host.start_connection(connection)
    return connection


async def simultaneous_open(
    ports: Mapping[str, int], targets: Sequence[Multiaddr], *, timeout_s: float, buffer_bytes: int
) -> tuple[Outcome, socket.socket | None]:
    """Connect to every target at once from our listen port of its family (``ports``: ``ip4``/``ip6``
    to port; a family without one is skipped), within ``timeout_s``.

    ``CONNECTED`` with the first socket that connected (the others are closed), ``TAKEN`` when a
    connect found its connection already accepted by our listener, else ``FAILED``.
    """
    winner: socket.socket | None = None
    taken = False

    async def attempt(target: Multiaddr, tg: anyio.abc.TaskGroup) -> None:
        nonlocal winner, taken
        family = socket.AF_INET6 if target.host_kind == "ip6" else socket.AF_INET
        try:
            sock = bound_socket(family, ports[target.host_kind], buffer_bytes=buffer_bytes)
        except PeerUnreachable as exc:
            log.debug("hole punch: %s", exc)
            return
        try:
            code = sock.connect_ex((target.host, target.port))
            if code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code in _TAKEN_ERRORS:
                taken = True
                tg.cancel_scope.cancel()
            elif code == 0 and winner is None:
                winner = sock
                tg.cancel_scope.cancel()
            else:
                log.debug("hole punch: connect to %s: %s", target, errno.errorcode.get(code, code))
        except (OSError, ValueError) as exc:  # an address this stack cannot use
            log.debug("hole punch: connect to %s: %s", target, exc)
        finally:
            if sock is not winner:
                close_socket(sock)

    usable = [t for t in targets if ports.get(t.host_kind)]
    if not usable:
        return Outcome.FAILED, None
    with anyio.move_on_after(timeout_s):
        async with anyio.create_task_group() as tg:
            for target in usable:
                tg.start_soon(attempt, target, tg)
    if taken:
        if winner is not None:
            close_socket(winner)
        return Outcome.TAKEN, None
    return (Outcome.CONNECTED, winner) if winner is not None else (Outcome.FAILED, None)


def candidate_addrs(host: PunchHost) -> list[str]:
    """Where the other side should connect to: our listen ports at every IP peers observed us at
    (a NAT that keeps the port maps our listen port there), then our listen addresses."""
    listen = host.listen_addrs
    observed: list[Multiaddr] = []
    for connection in host.connections():
        seen = connection.remote_hello.observed_addr if connection.remote_hello is not None else ""
        if not seen:
            continue
        try:
            addr = Multiaddr.parse(seen)
        except ChaosError:
            continue  # what a peer says about us is a hint; nonsense is ignored
        observed += [Multiaddr(addr.host_kind, addr.host, a.port) for a in listen if a.host_kind == addr.host_kind]
    return list(dict.fromkeys(str(a) for a in [*observed, *listen]))[:MAX_PUNCH_ADDRS]


def dialable(addrs: Sequence[str], *, loopback: bool, limit: int) -> list[Multiaddr]:
    """The addresses of ``addrs`` we agree to connect to (module docstring), deduplicated, in order."""
    chosen: list[Multiaddr] = []
    for text in addrs:
        try:
            addr = Multiaddr.parse(text).without_peer()
            ip = ipaddress.ip_address(addr.host)
        except (ChaosError, ValueError):
            continue  # DNS names and nonsense
        if addr.port == 0 or ip.is_unspecified or ip.is_multicast or (ip.is_loopback and not loopback):
            continue
        if addr not in chosen:
            chosen.append(addr)
    return chosen[:limit]


def _is_loopback(via: Connection) -> bool:
    try:
        return ipaddress.ip_address(via.remote_address[0]).is_loopback
    except ValueError:
        return False


def _listen_ports(host: PunchHost) -> dict[str, int]:
    """Our listen port per address family (``ip4``, ``ip6``): where our punches connect from."""
    ports: dict[str, int] = {}
    for addr in host.listen_addrs:
        ports.setdefault(addr.host_kind, addr.port)
    return ports


def _name(outcome: Outcome | None) -> str:
    return "none" if outcome is None else outcome.name.lower()


__all__ = [
    "HolePunchService",
    "PunchHost",
    "candidate_addrs",
    "dialable",
    "ports_changed",
    "punch",
    "simultaneous_open",
]
