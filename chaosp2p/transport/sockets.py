"""Non-blocking TCP sockets driven by anyio readiness waits.

Why not anyio's socket streams: they hand out freshly allocated ``bytes`` per read (64 KiB at a
time) and, on asyncio, hide the raw socket. Owning the stdlib socket lets the connection
``recv_into`` a preallocated buffer -- and, for bulk transfers, decrypt straight into the
destination -- on both trio and asyncio (measured 2.2-2.45 GB/s vs 0.6-1.1 GB/s, see BENCHMARKS.md).

Every loop here passes a cancellation checkpoint at least once per call, so a peer that keeps the
socket busy cannot starve the other tasks of the event loop.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

import anyio
import anyio.lowlevel

from chaosp2p.errors import ConnectionClosed, PeerUnreachable


def _tune(sock: socket.socket, buffer_bytes: int) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
        except OSError:  # some kernels cap buffer sizes; the default still works
            pass


async def connect_tcp(host: str, port: int, *, buffer_bytes: int) -> socket.socket:
    """Open a TCP connection to ``host:port`` (names resolved through anyio)."""
    try:
        infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise PeerUnreachable(f"cannot resolve {host}: {exc}") from None
    last_error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            _tune(sock, buffer_bytes)
            code = sock.connect_ex(address)
            if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise OSError(code, errno.errorcode.get(code, "connect failed"))
            if code != 0:
                await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code != 0:
                    raise OSError(code, errno.errorcode.get(code, "connect failed"))
            return sock
        except OSError as exc:
            last_error = exc
            sock.close()
        except BaseException:
            sock.close()
            raise
    raise PeerUnreachable(f"cannot connect to {host}:{port}: {last_error}")


def bound_socket(family: socket.AddressFamily, port: int, *, buffer_bytes: int) -> socket.socket:
    """A tuned, non-blocking TCP socket bound to ``port`` on every address, sharing the port with
    this peer's listener (SO_REUSEADDR and SO_REUSEPORT): hole punching connects out from the port
    that others know as ours, so that a NAT maps it as it maps the listener's."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        _tune(sock, buffer_bytes)
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    except OSError as exc:
        sock.close()
        raise PeerUnreachable(f"cannot bind an outgoing socket to port {port}: {exc}") from None
    return sock


async def receive_into(sock: socket.socket, view: memoryview, *, checkpoint: bool = True) -> None:
    """Fill ``view`` completely from ``sock``; :class:`ConnectionClosed` on EOF or reset.

    ``checkpoint=False`` skips the checkpoint when the bytes are there already: for a read that
    directly follows one that passed it (a record's body after its header).
    """
    if checkpoint:
        await anyio.lowlevel.checkpoint()
    while view:
        try:
            count = sock.recv_into(view)
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        except OSError as exc:
            raise ConnectionClosed(f"connection lost: {exc}") from None
        if count == 0:
            raise ConnectionClosed("connection closed by the remote peer")
        view = view[count:]


async def receive_some(sock: socket.socket, max_bytes: int) -> bytes:
    """Read at least one byte (at most ``max_bytes``); :class:`ConnectionClosed` on EOF."""
    while True:
        try:
            data = sock.recv(max_bytes)
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        except OSError as exc:
            raise ConnectionClosed(f"connection lost: {exc}") from None
        if not data:
            raise ConnectionClosed("connection closed by the remote peer")
        await anyio.lowlevel.checkpoint()
        return data


async def send_all(sock: socket.socket, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
    """Write every byte of ``buffers`` in order (gathered into as few syscalls as the kernel allows)."""
    await anyio.lowlevel.checkpoint()
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    while pending:
        pending = send_nowait(sock, pending)
        if pending:
            await anyio.wait_writable(sock)


def send_nowait(sock: socket.socket, buffers: Sequence[bytes | bytearray | memoryview]) -> list[memoryview]:
    """Write what the kernel takes of ``buffers`` now, without waiting; returns the unsent rest.

    One gathered syscall: on a bulk transfer the socket buffer usually has room for a whole
    record, and then the writer needs no wait (nor the cancel scopes that bound one).
    """
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    if not pending:
        return pending
    try:
        sent = sock.sendmsg(pending) if len(pending) > 1 else sock.send(pending[0])
    except BlockingIOError:
        return pending
    except OSError as exc:
        raise ConnectionClosed(f"connection lost: {exc}") from None
    while sent:
        head = pending[0]
        if sent >= len(head):
            sent -= len(head)
            pending.pop(0)
        else:
            pending[0] = head[sent:]
            sent = 0
    return pending


def close_socket(sock: socket.socket) -> None:
    """Wake any task waiting on ``sock`` with ClosedResourceError, then close it."""
    if sock.fileno() == -1:
        return
    try:
        anyio.notify_closing(sock)
    except RuntimeError:  # no event loop: nothing can be waiting
        pass
    sock.close()


class Listener:
    """A listening TCP socket that yields accepted, tuned, non-blocking sockets."""

    def __init__(self, host: str, port: int, *, buffer_bytes: int, backlog: int = 512) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._buffer_bytes = buffer_bytes
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            # Set after the bind, so a port someone else holds still fails the bind as before; from
            # now on our own hole-punching sockets (bound_socket) may share the port to connect out.
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self._sock.listen(backlog)
            self._sock.setblocking(False)
        except OSError as exc:
            self._sock.close()
            raise PeerUnreachable(f"cannot listen on {host}:{port}: {exc}") from None

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        host, port = self._sock.getsockname()[:2]
        return host, port

    async def accept(self) -> tuple[socket.socket, tuple[str, int]]:
        """Wait for and return the next inbound connection."""
        while True:
            if self._sock.fileno() == -1:
                raise anyio.ClosedResourceError
            try:
                sock, address = self._sock.accept()
            except BlockingIOError:
                await anyio.wait_readable(self._sock)
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: back off instead of spinning, as trio's serve_listeners does.
                    await anyio.sleep(0.1)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                if exc.errno == errno.EBADF:  # closed by close() while we were between waits
                    raise anyio.ClosedResourceError from None
                raise
            _tune(sock, self._buffer_bytes)
            await anyio.lowlevel.checkpoint()
            return sock, (address[0], address[1])

    def close(self) -> None:
        """Stop listening."""
        close_socket(self._sock)
