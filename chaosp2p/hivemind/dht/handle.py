"""``hivemind.DHT`` for the drop-in: a handle on one running chaosp2p peer.

hivemind runs its DHT node in a child process and every optimizer talks to it through pipes; here
the handle owns a :class:`chaosp2p.Peer` (the blocking facade: one background event loop in this
process), which already carries the DHT, membership and negotiation that a collaboration needs.
``hivemind.Optimizer`` objects built on this handle train through that peer.

``store``/``get`` follow hivemind's semantics on chaosp2p's signed-record DHT (see
:mod:`chaosp2p.hivemind.dht.keyvalue`); with ``return_future=True`` they run on a worker thread and
return a :class:`concurrent.futures.Future` (hivemind: an ``MPFuture``, the same interface).

An initial peer that does not answer is an error at once (hivemind: the daemon fails to start),
unless ``ensure_bootstrap_success=False``.

hivemind's DHT process is a daemon by default, so a script that never calls ``shutdown()`` still
exits. The drop-in keeps that promise: with ``daemon=True`` (the default) the peer is shut down --
optimizers first, so the runs see graceful leaves -- when the interpreter exits, before it waits
for threads. With ``daemon=False`` the program waits for ``shutdown()``, as hivemind's does.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from chaosp2p.errors import ChaosError, ConfigError, LocalProtocolError, PeerUnreachable
from chaosp2p.hivemind.arguments import (
    DHT_ARGUMENTS,
    check_arguments,
    dht_peer_config,
    ignored_warning,
    udp_listen_addresses,
)
from chaosp2p.hivemind.dht.keyvalue import KeyValueStore
from chaosp2p.hivemind.dht.validation import CompositeValidator, RecordValidatorBase
from chaosp2p.hivemind.p2p import PeerID
from chaosp2p.hivemind.utils.multiaddr import Multiaddr
from chaosp2p.hivemind.utils.timed_storage import ValueWithExpiration
from chaosp2p.runtime.config import PeerConfig

if TYPE_CHECKING:
    from chaosp2p.api.async_peer import AsyncPeer
    from chaosp2p.api.blocking_peer import Peer

T = TypeVar("T")

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
    ``host_maddrs``: TCP multiaddrs to listen on (hivemind's default: ``/ip4/127.0.0.1/tcp/0``);
    QUIC addresses beside them are dropped with a warning.
    ``identity_path``: key file, as in hivemind (a chaosp2p Ed25519 key; created if missing).
    ``record_validators``: hivemind validators, applied to ``store`` and ``get``.
    ``ensure_bootstrap_success``: an unreachable set of initial peers is an error (default).
    ``startup_timeout``: how long reaching an initial peer may take.
    ``peer_config``: chaosp2p only -- a :class:`PeerConfig` to start from instead of the profile
    chosen from ``host_maddrs``. Other hivemind arguments: see :mod:`chaosp2p.hivemind.arguments`.
    """

    def __init__(
        self,
        initial_peers: Sequence[Any] | None = None,
        *,
        start: bool,
        daemon: bool = True,
        num_workers: int = 4,
        record_validators: Iterable[RecordValidatorBase] = (),
        shutdown_timeout: float = 3,
        await_ready: bool = True,
        host_maddrs: Sequence[Any] | None = None,
        identity_path: str | None = None,
        ensure_bootstrap_success: bool = True,
        startup_timeout: float = 15,
        peer_config: PeerConfig | None = None,
        **kwargs: Any,
    ) -> None:
        ignored = list(check_arguments("DHT", {**kwargs, "num_workers": num_workers}, DHT_ARGUMENTS))
        ignored += [f"host_maddrs {text} (chaosp2p listens on TCP only)" for text in udp_listen_addresses(host_maddrs)]
        if ignored:
            log.warning("%s", ignored_warning("DHT", ignored))
        if shutdown_timeout <= 0:
            raise ConfigError(f"shutdown_timeout must be positive (got {shutdown_timeout!r})")
        if startup_timeout <= 0:
            raise ConfigError(f"startup_timeout must be positive (got {startup_timeout!r})")
        self.config = dht_peer_config(
            initial_peers=initial_peers, host_maddrs=host_maddrs, identity_path=identity_path, base=peer_config
        )
        """The chaosp2p configuration this handle starts its peer with."""
        self.initial_peers = list(self.config.bootstrap)
        self.daemon = bool(daemon)
        self.shutdown_timeout = float(shutdown_timeout)
        self.num_workers = num_workers
        self.ensure_bootstrap_success = bool(ensure_bootstrap_success)
        self.startup_timeout = float(startup_timeout)
        self._validator = CompositeValidator(record_validators)
        self._peer: Peer | None = None
        self._store: KeyValueStore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._shutdown_hooks: list[Callable[[], None]] = []
        self._exit_hook_registered = False
        if start:
            self.run_in_background(await_ready=await_ready)

    # ------------------------------------------------------------------ lifecycle
    def run_in_background(self, await_ready: bool = True, timeout: float | None = None) -> None:
        """Start the peer (listening, reaching an initial peer, bootstrapping). It is ready when this returns."""
        from chaosp2p.api.blocking_peer import Peer

        if self._peer is not None:
            raise LocalProtocolError("this DHT is already running")
        peer = Peer(config=self.config)
        if self.config.bootstrap and self.ensure_bootstrap_success:
            try:
                peer.call(_reach_one, peer.async_peer, self.config.bootstrap, timeout or self.startup_timeout)
            except BaseException:
                peer.shutdown()
                raise
        self._peer = peer
        self._store = KeyValueStore(peer.async_peer, self._validator)
        log.debug("DHT peer %s listening on %s", peer.peer_id, peer.addrs)
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
        """Leave every run gracefully (optimizers first), finish pending stores, stop the peer. Idempotent."""
        hooks, self._shutdown_hooks = self._shutdown_hooks, []
        for hook in reversed(hooks):
            try:
                hook()
            except Exception:  # one optimizer failing to leave must not keep the peer running
                log.exception("an optimizer failed to shut down")
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        peer, self._peer, self._store = self._peer, None, None
        if peer is not None:
            peer.shutdown()

    def is_alive(self) -> bool:
        """Whether the peer is running."""
        return self._peer is not None

    def on_shutdown(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the start of :meth:`shutdown` (optimizers register their leave)."""
        self._shutdown_hooks.append(callback)

    # ------------------------------------------------------------------ store and get
    def store(
        self,
        key: Any,
        value: Any,
        expiration_time: float,
        subkey: Any = None,
        return_future: bool = False,
        **kwargs: Any,
    ) -> bool | concurrent.futures.Future[bool]:
        """Store ``value`` under ``key`` (and ``subkey``) until ``expiration_time`` on the DHT's clock.

        True if stored; False if already expired, if this peer holds a later entry for the same
        key (and subkey), or if the record validators refuse it. Values are msgpack-serializable,
        as in hivemind. ``kwargs`` (hivemind: replica tuning) are accepted without effect.
        """
        store = self._key_values()
        return self._run(partial(store.store, key, value, expiration_time, subkey), return_future)

    def get(
        self, key: Any, latest: bool = False, return_future: bool = False, **kwargs: Any
    ) -> ValueWithExpiration[Any] | concurrent.futures.Future[ValueWithExpiration[Any] | None] | None:
        """The unexpired value of ``key``, or None: a ``ValueWithExpiration`` of the value, or of a dict
        ``{subkey: ValueWithExpiration(value, expiration)}`` for a key stored with subkeys.

        Every writer's entries are read and merged (the latest expiration wins per subkey), so the
        answer is always the latest (``latest=True`` asks for nothing more).
        """
        store = self._key_values()
        return self._run(partial(store.get, key), return_future)

    def add_validators(self, record_validators: Iterable[RecordValidatorBase]) -> None:
        """Add record validators to those given at creation."""
        self._validator.extend(record_validators)

    def _key_values(self) -> KeyValueStore:
        if self._store is None:
            raise LocalProtocolError("the DHT is not running (start=True, or run_in_background())")
        return self._store

    def _run(self, call: Callable[[], Awaitable[T]], return_future: bool) -> T | concurrent.futures.Future[T]:
        peer = self.peer
        if not return_future:
            return peer.call(call)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(1, self.num_workers), thread_name_prefix="hivemind-dht"
            )
        return self._executor.submit(peer.call, call)

    # ------------------------------------------------------------------ identity and addresses
    @property
    def peer(self) -> Peer:
        """The running :class:`chaosp2p.Peer` (chaosp2p only)."""
        if self._peer is None:
            raise LocalProtocolError("the DHT is not running (start=True, or run_in_background())")
        return self._peer

    @property
    def peer_id(self) -> PeerID:
        """This peer's id (``to_base58()`` gives ``12D3KooW...``)."""
        return PeerID.from_base58(self.peer.peer_id)

    @property
    def client_mode(self) -> bool:
        """Always ``False``: every chaosp2p peer accepts connections."""
        return False

    def get_visible_maddrs(self, latest: bool = False) -> list[Multiaddr]:
        """Multiaddrs another peer can pass as ``initial_peers`` (each ends in ``/p2p/<peer id>``).

        A wildcard listen address (``0.0.0.0``) is advertised as loopback plus this host's
        addresses. ``latest`` is accepted for compatibility: the list is always current.
        """
        return [Multiaddr(text) for text in self.peer.addrs]

    def __repr__(self) -> str:
        state = f"peer_id={self._peer.peer_id}" if self._peer is not None else "not running"
        return f"chaosp2p.hivemind.DHT({state})"


async def _reach_one(peer: AsyncPeer, addrs: Sequence[str], timeout_s: float) -> None:
    """Connect to at least one of ``addrs`` within ``timeout_s``, or raise :class:`PeerUnreachable`.

    hivemind's daemon refuses to start when no initial peer answers; a chaosp2p peer would keep
    retrying in the background, which hides a mistyped address behind a later, vaguer failure.
    """
    errors: list[str] = []
    reached = anyio.Event()

    async def attempt(addr: str, scope: anyio.CancelScope) -> None:
        try:
            await peer.connect(addr)
        except ChaosError as exc:
            errors.append(f"{addr}: {exc}")
            return
        reached.set()
        scope.cancel()  # one is enough

    with anyio.move_on_after(timeout_s):
        async with anyio.create_task_group() as tg:
            for addr in addrs:
                tg.start_soon(attempt, addr, tg.cancel_scope)
    if not reached.is_set():
        detail = "; ".join(errors) or f"no answer within {timeout_s:g} s"
        raise PeerUnreachable(f"none of the {len(addrs)} initial_peers could be reached ({detail})")
