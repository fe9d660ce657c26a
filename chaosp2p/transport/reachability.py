"""The dial-back driver: checking this peer's reachability, and dialing others back.

Theory of operation
-------------------
One request handler (``/chaos/dialback/1``, ``protocols/reachability.md``) and one background loop:

* **Server** (on a :class:`DialRequest` from A over a direct connection): the
  :class:`~chaosp2p.protocols.reachability.DialBackGate` admits it (A's rate, dials under way) and
  keeps only the addresses at A's *observed* IP, the one A's connection comes from. For each, in
  order, the server opens a fresh TCP connection and runs the handshake as the dialer expecting A's
  PeerID, then closes the socket: a finished handshake proves that A itself listens there. The
  answer names the first address that worked (``OK``) or says none did (``DIAL_FAILED``).
* **Requester** (:meth:`ReachabilityService.check`, and the loop at the machine's deadlines): asks up
  to ``probe_peers`` peers it is directly connected to, naming its listen addresses and, first,
  those ports at the IP each server observed it at (a peer behind a port-forwarding NAT learns that
  its public address works). The :class:`~chaosp2p.protocols.reachability.ReachabilityMachine`
  turns the answers into public / private / unknown.

A dial-back's connection never carries a HELLO: the requester's host sees an inbound connection
close right after its handshake (logged at info) and registers nothing.

Use::

    service = ReachabilityService(host, ReachabilityConfig.local())
    host.spawn(service.run, name="reachability")    # background checks
    await service.check()                           # or one check now -> Reachability
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError, RemoteProtocolError
from chaosp2p.protocols.reachability import (
    MAX_REQUEST_ADDRS,
    PROTOCOL,
    PROTOCOL_ID,
    DialBackCode,
    DialBackGate,
    DialRequest,
    DialResponse,
    Reachability,
    ReachabilityConfig,
    ReachabilityMachine,
    answer,
    codec,
)
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.sockets import close_socket, connect_tcp
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.transport")


class DialBackHost(Protocol):
    """What the dial-back driver needs from its :class:`~chaosp2p.transport.host.Host`."""

    config: TransportConfig
    clock: Clock

    @property
    def listen_addrs(self) -> list[Multiaddr]:
        """Advertised listen addresses."""
        ...

    def set_request_handler(self, protocol: Any, handler: Any) -> None:
        """Serve one-request-one-response streams."""
        ...

    def connection(self, peer: PeerID) -> Connection | None:
        """An open direct connection."""
        ...

    def connected_peers(self) -> list[PeerID]:
        """Peers with an open direct connection."""
        ...

    async def secure_socket(
        self, sock: socket.socket, *, expected: PeerID | None, initiator: bool, via: Connection | None = None
    ) -> Connection:
        """The handshake over an opened socket."""
        ...


class ReachabilityService:
    """A host's dial-back roles (see the module docstring). The node makes one: ``node.reachability``."""

    def __init__(self, host: DialBackHost, config: ReachabilityConfig) -> None:
        self.host = host
        self.config = config
        self.gate = DialBackGate(config)
        """Admission of others' requests."""
        self.machine = ReachabilityMachine(config, now=host.clock.now())
        """This peer's checks and classification."""
        self.checked: list[Callable[[], object]] = []
        """Called after each check that asked someone (the node re-announces proven addresses)."""
        host.set_request_handler(PROTOCOL_ID, self._serve)

    @property
    def reachability(self) -> Reachability:
        """The current classification."""
        return self.machine.reachability

    # ------------------------------------------------------------------ requester
    async def run(self) -> None:
        """Check at the machine's deadlines until cancelled (runs in the node's task group)."""
        while True:
            deadline = self.machine.next_deadline()
            if deadline is None:
                return  # background checks are off
            await anyio.sleep(max(0.0, deadline - self.host.clock.now()))
            servers = self.machine.handle_timeout(self.host.clock.now(), self.servers())
            await self._ask_all(servers)

    async def check(self, servers: Sequence[PeerID] | None = None) -> Reachability:
        """One check now (of ``servers``, default: the peers the machine picks); the classification
        after it. :class:`LocalProtocolError` while another check (the background one) is under way."""
        chosen = self.machine.start_check(self.host.clock.now(), self.servers() if servers is None else servers)
        await self._ask_all(chosen)
        return self.machine.reachability

    def servers(self) -> list[PeerID]:
        """Peers this host could ask: directly connected, speaking the protocol."""
        return [p for p in self.host.connected_peers() if self._speaks(p)]

    def _speaks(self, peer: PeerID) -> bool:
        connection = self.host.connection(peer)
        return connection is not None and connection.supports(PROTOCOL)

    async def _ask_all(self, servers: Sequence[PeerID]) -> None:
        async with anyio.create_task_group() as tg:
            for server in servers:
                tg.start_soon(self._ask_and_record, server)
        if servers:
            log.info(
                "reachability: %s after asking %d peer(s) (%s)",
                self.machine.reachability.value,
                len(servers),
                ", ".join(self.machine.confirmed_addrs()) or "no address confirmed",
            )
            for callback in self.checked:
                callback()

    async def _ask_and_record(self, server: PeerID) -> None:
        response = None
        try:
            response = await self.ask(server)
        except ChaosError as exc:
            log.debug("reachability: %s did not answer: %s", server.short(), exc)
        self.machine.record(server, response, self.host.clock.now())

    async def ask(self, server: PeerID, addrs: Sequence[str] | None = None) -> DialResponse:
        """Ask ``server`` (directly connected) to dial this peer back at ``addrs`` (default: :meth:`addrs_for`)."""
        connection = self.host.connection(server)
        if connection is None:
            raise RemoteProtocolError(f"reachability: no direct connection to {server.short()}")
        request = DialRequest(addrs=tuple(self.addrs_for(connection) if addrs is None else addrs))
        reply = await connection.request(PROTOCOL, codec.to_obj(request), timeout_s=self.config.answer_timeout_s)
        response = codec.from_obj(reply)
        if not isinstance(response, DialResponse):
            raise RemoteProtocolError(f"reachability: expected a response, got {type(response).__name__}")
        if response.code == DialBackCode.OK and response.addr not in request.addrs:
            # Its word decides what we may announce (announced_addrs.py): only an address we named counts.
            raise RemoteProtocolError(
                f"reachability: {server.short()} says it reached us at {response.addr!r}, an address we did not name"
            )
        return response

    def addrs_for(self, connection: Connection) -> list[str]:
        """What to ask ``connection``'s peer to dial: our listen ports at the IP it observed us at,
        then our listen addresses (the server dials only those at our observed IP)."""
        listen = self.host.listen_addrs
        addrs: list[str] = []
        observed = connection.remote_hello.observed_addr if connection.remote_hello is not None else ""
        if observed:
            try:
                seen = Multiaddr.parse(observed)
                addrs += [str(Multiaddr(seen.host_kind, seen.host, a.port)) for a in listen]
            except ChaosError:
                pass  # the peer sent nonsense about us: ask about our own addresses only
        addrs += [str(a) for a in listen]
        return list(dict.fromkeys(addrs))[:MAX_REQUEST_ADDRS]

    # ------------------------------------------------------------------ server
    async def _serve(self, connection: Connection, request: Any) -> Any:
        message = codec.from_obj(request)
        if not isinstance(message, DialRequest):
            raise RemoteProtocolError(f"reachability: expected a request, got {type(message).__name__}")
        requester = connection.remote_peer
        if connection.relayed:  # its observed address is the relay's: nothing of the requester's own
            return codec.to_obj(answer(DialBackCode.BAD_REQUEST, "ask over a direct connection"))
        admitted = self.gate.admit(requester, connection.remote_address[0], message.addrs, self.host.clock.now())
        if isinstance(admitted, DialResponse):
            log.debug("reachability: refused %s's request: %s", requester.short(), admitted.reason)
            return codec.to_obj(admitted)
        try:
            for addr in admitted:
                if await self._dial_back(requester, addr):
                    return codec.to_obj(answer(DialBackCode.OK, addr=str(addr)))
        finally:
            self.gate.release()
        tried = ", ".join(str(a) for a in admitted)
        return codec.to_obj(answer(DialBackCode.DIAL_FAILED, f"no answer as {requester.short()} at {tried}"))

    async def _dial_back(self, requester: PeerID, addr: Multiaddr) -> bool:
        """Whether ``requester`` answered a handshake at ``addr`` within ``dial_timeout_s``."""
        sock: socket.socket | None = None
        with anyio.move_on_after(self.config.dial_timeout_s):
            try:
                sock = await connect_tcp(addr.host, addr.port, buffer_bytes=self.host.config.socket_buffer_bytes)
                await self.host.secure_socket(sock, expected=requester, initiator=True)
                return True
            except (ChaosError, OSError) as exc:
                log.debug("reachability: dial-back to %s at %s failed: %s", requester.short(), addr, exc)
            finally:
                if sock is not None:
                    close_socket(sock)  # the proof is the handshake; the connection is never used
        return False


__all__ = ["DialBackHost", "ReachabilityService"]
