"""``hivemind.DHT`` for the drop-in: a handle on one running chaosp2p peer.

hivemind runs its DHT node in a child process and every optimizer talks to it through pipes; here
the handle owns a :class:`chaosp2p.Peer` (the blocking facade: one background event loop in this
process), which already carries the DHT, membership and negotiation that a collaboration needs.
``hivemind.Optimizer`` objects built on this handle train through that peer.

hivemind's DHT process is a daemon by default, so a script that never calls ``shutdown()`` still
exits. The drop-in keeps that promise: with ``daemon=True`` (the default) the peer is shut down --
optimizers first, so the runs see graceful leaves -- when the interpreter exits, before it waits
for threads. With ``daemon=False`` the program waits for ``shutdown()``, as hivemind's does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.hivemind.arguments import DHT_DEFAULT_ONLY, dht_peer_config, refuse_unsupported
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

if TYPE_CHECKING:
    from chaosp2p.api.blocking_peer import Peer

log = logging.getLogger("chaosp2p.hivemind")


def _register_before_thread_join(callback: Callable[[], None]) -> None:
    """Run ``callback`` at interpreter exit *before* non-daemon threads are joined.

    ``atexit`` runs too late: the interpreter first waits for every non-daemon thread, including the
    peer's event-loop thread, which only stops once the peer is shut down. ``threading`` keeps a
    private hook for exactly this (``concurrent.futures`` uses it); without it, fall back to atexit.
    """
    hook = getattr(threading, "_register_atexit", None)
    if hook is not None:
        try:
            hook(callback)
            return
        except RuntimeError:  # the interpreter is already shutting down
            return
    import atexit

    atexit.register(callback)


class DHT:
    """A chaosp2p peer behind hivemind's ``DHT`` interface (see the module docstring).

    ``initial_peers``: multiaddrs of peers of the swarm (strings or multiaddr objects).
    ``host_maddrs``: TCP multiaddrs to listen on (hivemind's default: ``/ip4/127.0.0.1/tcp/0``).
    ``identity_path``: key file, as in hivemind (a chaosp2p Ed25519 key; created if missing).
    ``peer_config``: chaosp2p only -- a :class:`PeerConfig` to start from instead of the profile
    chosen from ``host_maddrs``. Any other hivemind argument must keep hivemind's default value;
    see :mod:`chaosp2p.hivemind.arguments`.
    """

    def __init__(
        self,
        initial_peers: Sequence[Any] | None = None,
        *,
        start: bool,
        daemon: bool = True,
        shutdown_timeout: float = 3,
        await_ready: bool = True,
        host_maddrs: Sequence[Any] | None = None,
        identity_path: str | None = None,
        peer_config: PeerConfig | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_unsupported("DHT", kwargs, DHT_DEFAULT_ONLY)
        if shutdown_timeout <= 0:
            raise ConfigError(f"shutdown_timeout must be positive (got {shutdown_timeout!r})")
        self.config = dht_peer_config(
            initial_peers=initial_peers, host_maddrs=host_maddrs, identity_path=identity_path, base=peer_config
        )
        """The chaosp2p configuration this handle starts its peer with."""
        self.initial_peers = list(self.config.bootstrap)
        self.daemon = bool(daemon)
        self.shutdown_timeout = float(shutdown_timeout)
        self._peer: Peer | None = None
        self._shutdown_hooks: list[Callable[[], None]] = []
        self._exit_hook_registered = False
        if start:
            self.run_in_background(await_ready=await_ready)

    # ------------------------------------------------------------------ lifecycle
    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        """Start the peer (listening and bootstrapping). It is ready when this returns."""
        from chaosp2p.api.blocking_peer import Peer

        if self._peer is not None:
            raise LocalProtocolError("this DHT is already running")
        self._peer = Peer(config=self.config)
        log.debug("DHT peer %s listening on %s", self._peer.peer_id, self._peer.addrs)
        if self.daemon and not self._exit_hook_registered:
            self._exit_hook_registered = True
            _register_before_thread_join(self.shutdown)

    def start(self) -> None:
        """Start the peer (for ``DHT(start=False)``; hivemind's DHT is a process with ``start()``)."""
        self.run_in_background()

    def wait_until_ready(self, timeout: float | None = None) -> None:
        """Return once the peer runs (at once: starting is synchronous here)."""
        if self._peer is None:
            raise LocalProtocolError("the DHT was not started (call run_in_background())")

    def shutdown(self) -> None:
        """Leave every run gracefully (optimizers first), then stop the peer. Idempotent."""
        hooks, self._shutdown_hooks = self._shutdown_hooks, []
        for hook in reversed(hooks):
            try:
                hook()
            except Exception:  # one optimizer failing to leave must not keep the peer running
                log.exception("an optimizer failed to shut down")
        peer, self._peer = self._peer, None
        if peer is not None:
            peer.shutdown()

    def is_alive(self) -> bool:
        """Whether the peer is running."""
        return self._peer is not None

    def on_shutdown(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the start of :meth:`shutdown` (optimizers register their leave)."""
        self._shutdown_hooks.append(callback)

    # ------------------------------------------------------------------ identity and addresses
    @property
    def peer(self) -> Peer:
        """The running :class:`chaosp2p.Peer` (chaosp2p only)."""
        if self._peer is None:
            raise LocalProtocolError("the DHT is not running (start=True, or run_in_background())")
        return self._peer

    @property
    def peer_id(self) -> PeerID:
        """This peer's PeerID (``str()`` gives ``12D3KooW...``)."""
        return PeerID.parse(self.peer.peer_id)

    @property
    def client_mode(self) -> bool:
        """Always ``False``: every chaosp2p peer accepts connections."""
        return False

    def get_visible_maddrs(self, latest: bool = False) -> list[Multiaddr]:
        """Multiaddrs another peer can pass as ``initial_peers`` (each ends in ``/p2p/<peer id>``).

        A wildcard listen address (``0.0.0.0``) is advertised as loopback plus this host's
        addresses. ``latest`` is accepted for compatibility: the list is always current.
        """
        return [Multiaddr.parse(text) for text in self.peer.addrs]

    def __repr__(self) -> str:
        state = f"peer_id={self._peer.peer_id}" if self._peer is not None else "not running"
        return f"chaosp2p.hivemind.DHT({state})"
