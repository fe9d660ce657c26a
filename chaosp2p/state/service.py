"""Serving and loading training state through the swarm (the state layer's part of a peer).

A peer that serves state offers a :class:`~chaosp2p.state.snapshot.SnapshotStore` over
``/chaos/transfer/1`` and announces itself in the DHT as a provider of each run it serves. A
newcomer finds a run's providers in the DHT, asks them which steps they hold, and pulls the newest
step they have in common from all of them at once; nothing it already had changes unless every
byte of the new state verified.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from chaosp2p.errors import ChaosError, ConfigError, TransferError
from chaosp2p.protocols.membership import MemberState
from chaosp2p.protocols.transfer import Completed, ShardPlanner, SnapshotCatalog, TransferProgress
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.runtime.node import Node
from chaosp2p.state.download import ProgressCallback, PullResult, SourceAddress, StagingFactory, pull_state
from chaosp2p.state.manifest import FlatState
from chaosp2p.state.serve import StateServer
from chaosp2p.transport.reach import reach
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.state")

DISCOVERY_TIMEOUT_S = 15.0
DISCOVERY_RETRY_MIN_S = 0.2
DISCOVERY_RETRY_MAX_S = 2.0
ANNOUNCE_RETRY_MIN_S = 0.5
ANNOUNCE_RETRY_MAX_S = 30.0


def run_provider_key(run: str) -> bytes:
    """The DHT provider key under which the holders of training run ``run`` announce themselves."""
    if not run or "/" in run or len(run) > 256:
        raise ConfigError("a run id is 1-256 characters without '/'")
    return f"/prov/state/{run}".encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadTimings:
    """Where the time of one :meth:`StateService.load` went (seconds, on the node's clock)."""

    discovery_s: float = 0.0
    """Finding the sources: the DHT lookup (retried while none answer), or dialling given ones."""
    setup_s: float = 0.0
    """The version vote, the leases, the manifest and allocating staging, before the first data request."""
    data_s: float = 0.0
    """From the first data request to the last chunk verified (:attr:`Completed.elapsed_s`)."""
    verify_s: float = 0.0
    """Hashing and checking the received chunks: part of ``data_s``, since each chunk is verified
    as it arrives (:attr:`PullResult.verify_s`)."""
    commit_s: float = 0.0
    """Turning the verified staging buffer into the returned state (copying it with ``into``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedState:
    """A committed state: the run, step and arrays, and how the pull went."""

    run: str
    step: int
    state: FlatState
    completed: Completed
    result: PullResult
    timings: LoadTimings = LoadTimings()

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The loaded named arrays."""
        return dict(self.state.arrays)


class StateService:
    """``serve_state`` / ``load_state`` for one node."""

    def __init__(self, node: Node, config: TransferConfig) -> None:
        self._node = node
        self.config = config
        self.server = StateServer(
            host=node.host,
            clock=node.clock,
            config=config,
            task_group=node.task_group,
            busy=node.bulk_transfer,
            record_sent=node.record_upload,
        )
        self.store: SnapshotCatalog | None = None
        self._announced: dict[str, anyio.Event] = {}
        self._pulls: dict[int, TransferProgress | None] = {}  # latest progress of each load in flight
        self._next_pull = 0

    async def serve(
        self, store: SnapshotCatalog, *, runs: Iterable[str] = (), allow: Callable[[PeerID], bool] | None = None
    ) -> None:
        """Offer ``store``'s snapshots (to the peers ``allow`` accepts; everyone if None) and
        announce this peer as a provider of ``runs``.

        Announcing happens in the background (the DHT may still be bootstrapping) and is retried
        until at least one DHT peer holds the provider record; :meth:`wait_announced` waits for it.
        """
        self.store = store
        self.server.offer(store, allow=allow)
        for run in runs:
            key = run_provider_key(run)  # validates the run id before anything starts
            if run not in self._announced:
                self._announced[run] = anyio.Event()
                self._node.task_group.start_soon(self._announce_until_heard, run, key, name=f"announce {run}")

    def transfers_in_progress(self) -> tuple[TransferProgress, ...]:
        """The latest progress of every load in flight (read-only; the dashboard shows it)."""
        return tuple(p for p in self._pulls.values() if p is not None)

    async def wait_announced(self, run: str) -> None:
        """Return once the swarm's DHT holds this peer's provider record for ``run``."""
        await self._announced[run].wait()

    async def _announce_until_heard(self, run: str, key: bytes) -> None:
        delay = ANNOUNCE_RETRY_MIN_S
        while True:
            await self._node.dht.wait_ready()
            result = await self._node.dht.add_provider(key)
            if result.ok:
                log.info("announced run %r to %d DHT peers", run, result.accepted)
                self._announced[run].set()
                return
            log.warning("announcing run %r reached no DHT peer; retrying in %.1f s", run, delay)
            await anyio.sleep(delay)
            delay = min(delay * 2, ANNOUNCE_RETRY_MAX_S)

    async def find_sources(self, run: str, *, limit: int) -> list[SourceAddress]:
        """Providers of ``run`` from the DHT (ourselves excluded), best links first."""
        with anyio.move_on_after(self._node.config.transport.connect_timeout_s * 4):
            await self._node.dht.wait_ready()
        if not self._node.dht.ready:
            raise TransferError("cannot look up sources: this peer reached no DHT peer (check --bootstrap)")
        providers = await self._node.dht.get_providers(run_provider_key(run))
        sources = []
        for record in providers:
            if record.provider == self._node.peer_id:
                continue
            if self._node.membership.state_of(record.provider) in (MemberState.FAILED, MemberState.LEFT):
                continue  # the DHT still remembers it, but membership knows it is gone
            # A private provider's relay addresses after its own: the pull reaches it through them.
            direct: list[Dialable] = [Multiaddr.parse(a) for a in record.addrs]
            relayed = [CircuitAddr.parse(a) for a in record.relay_addrs]
            sources.append(self._estimate(record.provider, (*direct, *relayed)))
        sources.sort(key=lambda s: -(s.bytes_per_s or 0.0))
        return sources[:limit]

    def _estimate(self, peer: PeerID, addrs: tuple[Dialable, ...]) -> SourceAddress:
        # The cluster monitor's estimate when it has one; otherwise the pull measures the link.
        bandwidth, latency = self._node.link_estimate(peer)
        return SourceAddress(
            peer=peer,
            addrs=addrs,
            bytes_per_s=bandwidth or None,
            latency_s=latency if latency is not None else 0.001,
        )

    async def load(
        self,
        run: str,
        *,
        into: Mapping[str, np.ndarray] | None = None,
        step: int | None = None,
        sources: Sequence[Multiaddr | str | SourceAddress] | None = None,
        max_sources: int = 8,
        progress: ProgressCallback | None = None,
        resume_path: str | Path | None = None,
        make_staging: StagingFactory | None = None,
        config: TransferConfig | None = None,
        planner: ShardPlanner | None = None,
        work_stealing: bool = True,
        digest: bytes | None = None,
        trusted: Sequence[PeerID] = (),
    ) -> LoadedState:
        """Pull ``run`` from several sources in parallel and commit it (see :meth:`AsyncPeer.load_state`).

        The snapshot pulled is the ``(step, digest)`` most sources agree on; ``step``, ``digest``
        (SHA-256 of the manifest, as :attr:`SnapshotInfo.digest`) and ``trusted`` (sources whose
        word decides) pin it. Sources found in the DHT while the pull runs join it.
        """
        trust = frozenset(trusted)
        clock = self._node.clock
        began = clock.now()
        chosen = await self._sources(run, sources, max(max_sources, 64) if trust else max_sources)
        if trust:  # trusted sources are never the ones cut by max_sources
            chosen = sorted(chosen, key=lambda s: s.peer not in trust)[:max_sources]
        if not chosen:
            raise TransferError(
                f"no peer serves run {run!r}: no provider records in the DHT after {DISCOVERY_TIMEOUT_S:g} s"
            )
        log.info("loading run %r from %d sources", run, len(chosen))
        discovered = clock.now()
        pull_id, self._next_pull = self._next_pull, self._next_pull + 1
        self._pulls[pull_id] = None

        def track(update: TransferProgress) -> None:
            self._pulls[pull_id] = update
            if progress is not None:
                progress(update)

        try:
            with self._node.bulk_transfer():  # no bandwidth probe shares the links with the pull
                result = await pull_state(
                    self._node.host,
                    run=run,
                    sources=chosen,
                    config=config or self.config,
                    clock=self._node.clock,
                    step=step,
                    make_staging=make_staging,
                    progress=track,
                    resume_path=resume_path,
                    planner=planner,
                    work_stealing=work_stealing,
                    digest=digest,
                    trusted=trust,
                    rediscover=(lambda: self.find_sources(run, limit=max_sources)) if sources is None else None,
                )
        finally:
            del self._pulls[pull_id]
        pulled = clock.now()
        completed = result.completed
        for peer, count in completed.bytes_by_source:
            if count and completed.elapsed_s > 0:
                self._node.record_transfer(peer, count, completed.elapsed_s)
        if into is not None:
            result.staging.commit_into(completed, into)
            state = FlatState.from_arrays(into)
        else:
            state = result.staging.commit(completed)
        timings = LoadTimings(
            discovery_s=discovered - began,
            setup_s=max(0.0, pulled - discovered - completed.elapsed_s),
            data_s=completed.elapsed_s,
            verify_s=result.verify_s,
            commit_s=clock.now() - pulled,
        )
        return LoadedState(
            run=run, step=completed.step, state=state, completed=completed, result=result, timings=timings
        )

    async def discover_sources(
        self, run: str, *, limit: int, timeout_s: float = DISCOVERY_TIMEOUT_S
    ) -> list[SourceAddress]:
        """:meth:`find_sources`, retried with backoff for up to ``timeout_s`` while none are found.

        A newcomer often arrives before the run's holders have announced themselves to the part of
        the DHT it can reach (in a small swarm, announcing needs the newcomer itself), so an empty
        answer right after joining is not yet a reason to give up.
        """
        delay = DISCOVERY_RETRY_MIN_S
        with anyio.move_on_after(timeout_s):
            while not (found := await self.find_sources(run, limit=limit)):
                log.info("no provider of run %r found yet; looking again in %.1f s", run, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, DISCOVERY_RETRY_MAX_S)
            return found
        return []

    async def _sources(
        self, run: str, explicit: Sequence[Multiaddr | str | SourceAddress] | None, limit: int
    ) -> list[SourceAddress]:
        if explicit is None:
            return await self.discover_sources(run, limit=limit)
        chosen: list[SourceAddress | None] = [None] * len(explicit)

        async def resolve(index: int, addr: Multiaddr) -> None:
            host = self._node.host
            try:
                # A source named by PeerID may sit behind NAT: reached through a relay if need be.
                connection = await (host.connect(addr) if addr.peer_id is None else reach(host, addr.peer_id, [addr]))
            except ChaosError as exc:
                log.warning("state source %s unreachable: %s", addr, exc)
                return
            chosen[index] = self._estimate(connection.remote_peer, (addr.without_peer(),))

        # All at once: one source that times out must not hold up the others.
        async with anyio.create_task_group() as tg:
            for index, item in enumerate(explicit):
                if isinstance(item, SourceAddress):  # the caller knows the link already
                    chosen[index] = item
                else:
                    tg.start_soon(resolve, index, Multiaddr.parse(item) if isinstance(item, str) else item)
        return [source for source in chosen if source is not None][:limit]


def load_into_torch(loaded: LoadedState, model: Any, optimizer: Any = None) -> None:
    """Load a committed state into ``model`` (and ``optimizer``), checking every tensor first."""
    from chaosp2p.state.torch_adapter import load_torch

    load_torch(loaded.state, model, optimizer)
