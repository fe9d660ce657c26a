"""A blocking facade for plain training scripts: no ``async`` anywhere in the caller's code.

::

    import chaosp2p

    peer = chaosp2p.Peer(initial_peers=["/ip4/10.0.0.5/tcp/4001/p2p/12D3KooW..."], run="resnet-a")
    step = peer.load_state_from_peers(model, optimizer)   # newcomer: fetch the swarm's state
    for step in range(step, steps):
        train_one_step(model, optimizer)
        if step % 100 == 0:
            peer.publish_state(model, optimizer, step=step)  # serve it to the next newcomer
    peer.shutdown()

The peer runs on its own event loop in a background thread (anyio's blocking portal, trio
backend); every method here is a thread-safe call into it. This is the peer to hold in synchronous
code; async code holds the :class:`chaosp2p.AsyncPeer` it wraps.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import anyio.from_thread

from chaosp2p.api.async_peer import AsyncPeer, open_peer
from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.membership import Member, Topology
from chaosp2p.protocols.transfer import TransferProgress
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.state.service import LoadedState, load_into_torch
from chaosp2p.state.snapshot import SnapshotStore

T = TypeVar("T")


class Peer:
    """A swarm peer for synchronous code (see the module docstring)."""

    def __init__(
        self,
        initial_peers: Sequence[str] = (),
        *,
        run: str = "default",
        config: PeerConfig | None = None,
        start: bool = True,
        keep_snapshots: int = 1,
    ) -> None:
        # Default: reachable from other hosts (all interfaces, a free port, LAN timings).
        # Pass PeerConfig.local() for everything on one machine (the tests do).
        base = config or PeerConfig.lan(listen=("/ip4/0.0.0.0/tcp/0",))
        if initial_peers:
            base = base.replace(bootstrap=tuple(initial_peers))
        self.config = base
        self.run = run
        self.store = SnapshotStore(base.transfer, keep_latest=keep_snapshots)
        self._stack: ExitStack | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._peer: AsyncPeer | None = None
        self._serving = False
        if start:
            self.start()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the background event loop and the peer (listen, bootstrap)."""
        if self._stack is not None:
            raise LocalProtocolError("this peer is already running")
        stack = ExitStack()
        try:
            portal = stack.enter_context(anyio.from_thread.start_blocking_portal(backend="trio"))
            manager: AbstractContextManager[AsyncPeer] = portal.wrap_async_context_manager(open_peer(self.config))
            self._peer = stack.enter_context(manager)
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal = stack, portal

    def shutdown(self) -> None:
        """Leave the swarm (goodbye to every peer) and stop the background loop."""
        stack, self._stack, self._peer, self._portal = self._stack, None, None, None
        if stack is not None:
            stack.close()

    def __enter__(self) -> Peer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.shutdown()

    def call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await function(*args)`` on the peer's event loop and return its result.

        For blocking facades built on this peer (:class:`chaosp2p.Collaboration` is one).
        """
        if self._portal is None or self._peer is None:
            raise LocalProtocolError("the peer is not running (call start())")
        return self._portal.call(function, *args)

    @property
    def async_peer(self) -> AsyncPeer:
        """The :class:`AsyncPeer` this facade runs; use it only from code on its event loop (:meth:`call`)."""
        if self._peer is None:
            raise LocalProtocolError("the peer is not running (call start())")
        return self._peer

    # ------------------------------------------------------------------ who and where
    @property
    def peer_id(self) -> str:
        """This peer's PeerID (``12D3KooW...``)."""
        return str(self.async_peer.peer_id)

    @property
    def addrs(self) -> list[str]:
        """Multiaddrs other peers can bootstrap from."""
        return [str(a) for a in self.async_peer.addrs]

    def members(self) -> tuple[Member, ...]:
        """The membership view (thread-safe snapshot)."""
        return self.call(_on_loop, self.async_peer.members)

    def topology(self) -> Topology:
        """Members and links with RTT and bandwidth (thread-safe snapshot)."""
        return self.call(_on_loop, self.async_peer.topology)  # type: ignore[no-any-return]

    def report_throughput(self, samples_per_s: float) -> None:
        """Tell the cluster monitor how fast this peer trains."""
        self.call(_on_loop, self.async_peer.report_throughput, samples_per_s)

    # ------------------------------------------------------------------ state
    def publish_state(self, model: Any, optimizer: Any = None, *, step: int) -> None:
        """Snapshot ``model`` (+ ``optimizer``) as ``step`` and serve it; training may go on at once."""
        from chaosp2p.state.torch_adapter import publish_torch

        publish_torch(self.store, self.run, step, model, optimizer)
        if not self._serving:
            self.call(partial(self.async_peer.serve_state, self.store, runs=[self.run]))
            self._serving = True

    def publish_arrays(self, arrays: dict[str, Any], *, step: int) -> None:
        """Like :meth:`publish_state` for plain numpy arrays (no torch needed)."""
        self.store.publish(self.run, step, arrays)
        if not self._serving:
            self.call(partial(self.async_peer.serve_state, self.store, runs=[self.run]))
            self._serving = True

    def load_state_from_peers(
        self,
        model: Any,
        optimizer: Any = None,
        *,
        timeout: float | None = 600.0,
        progress: Callable[[TransferProgress], None] | None = None,
    ) -> int:
        """Download the run's newest state from several peers at once into ``model``/``optimizer``.

        Returns the step loaded. Nothing in ``model`` or ``optimizer`` changes unless the whole
        state arrived and verified (and matches their tensors' names, shapes and dtypes).
        """
        loaded = self._load(timeout, progress)
        load_into_torch(loaded, model, optimizer)
        return loaded.step

    def load_arrays_from_peers(
        self, *, timeout: float | None = 600.0, progress: Callable[[TransferProgress], None] | None = None
    ) -> LoadedState:
        """Download the run's newest state as numpy arrays (``.arrays``, ``.step``)."""
        return self._load(timeout, progress)

    def _load(self, timeout: float | None, progress: Callable[[TransferProgress], None] | None) -> LoadedState:
        if timeout is not None and timeout <= 0:
            raise ConfigError("timeout must be positive (or None)")
        return self.call(_load_with_deadline, self.async_peer, self.run, timeout, progress)


async def _on_loop(function: Callable[..., T], *args: Any) -> T:
    """Call a plain function on the peer's event loop (its state is only touched from there)."""
    return function(*args)


async def _load_with_deadline(
    peer: AsyncPeer, run: str, limit_s: float | None, progress: Callable[[TransferProgress], None] | None
) -> LoadedState:
    with anyio.fail_after(limit_s):
        return await peer.load_state(run, progress=progress)
