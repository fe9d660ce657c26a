"""The public async API: :func:`open_peer` and :class:`AsyncPeer`.

An :class:`AsyncPeer` is the peer to hold in async code (plain scripts hold the blocking
:class:`chaosp2p.Peer`). It is a :class:`~chaosp2p.runtime.node.Node` (transport, DHT, membership,
negotiation, status) that can also serve and load training state and train with others::

    async with chaosp2p.open_peer(chaosp2p.PeerConfig.local(bootstrap=[addr])) as peer:
        await peer.serve_state(store, runs=["run-a"])           # as a source
        loaded = await peer.load_state("run-a", progress=print)   # as a newcomer
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio.abc
import numpy as np

from chaosp2p.api.training_port import PeerTrainingPort
from chaosp2p.clock import Clock
from chaosp2p.protocols.transfer import SnapshotCatalog
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.runtime.node import Node, open_node
from chaosp2p.runtime.status import StatusReport, WaitingInfo
from chaosp2p.state.download import ProgressCallback
from chaosp2p.state.service import LoadedState, StateService, load_into_torch
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.training.averager import Averager
from chaosp2p.training.collaboration import AsyncCollaboration
from chaosp2p.training.config import CollaborationConfig
from chaosp2p.training.service import SNAPSHOTS_KEPT, TrainingService
from chaosp2p.transport.host import Host
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr


class AsyncPeer(Node):
    """A running peer of a swarm, for async code. Create it with :func:`open_peer`.

    Plain (synchronous) training scripts hold a :class:`chaosp2p.Peer` instead, which runs one of
    these on a background event loop.
    """

    def __init__(
        self, *, config: PeerConfig, host: Host, task_group: anyio.abc.TaskGroup, clock: Clock, rng: random.Random
    ) -> None:
        super().__init__(config=config, host=host, task_group=task_group, clock=clock, rng=rng)
        self.state = StateService(self, config.transfer)
        self.training_port = PeerTrainingPort(self, self.state)
        """What training needs from this peer (:class:`~chaosp2p.training.port.TrainingPort`)."""
        self.training = TrainingService(
            self.training_port,
            averager=Averager(host, clock),
            store=SnapshotStore(config.transfer, keep_latest=SNAPSHOTS_KEPT),
        )
        """The averager and the collaboration protocol (registered before the peer accepts)."""

    async def collaborate(
        self,
        run: str,
        model: Any,
        optimizer: Any,
        *,
        found: bool,
        config: CollaborationConfig | None = None,
        timeout_s: float | None = None,
    ) -> AsyncCollaboration:
        """Found (``found=True``) or join ``run`` and return the started collaboration.

        ``await collab.step(samples)`` after each ``backward()`` averages the gradients among the
        run's agreed members and steps ``optimizer``; ``await collab.leave()`` leaves gracefully
        (also done when the peer shuts down).
        """
        chosen = config or CollaborationConfig.profile_named(self.config.profile)
        collaboration = AsyncCollaboration(
            self.training_port, self.training, run=run, model=model, optimizer=optimizer, config=chosen
        )
        await collaboration.start(found=found, timeout_s=timeout_s)
        return collaboration

    def status_report(self) -> StatusReport:
        """The node's report, with what each run's round in progress waits for (``waiting_for``)."""
        report = super().status_report()
        runs = []
        for run in report.runs:
            waiting = self.training.averager.waiting(run.run)
            if waiting is not None and waiting.peers:
                info = WaitingInfo(
                    step=waiting.step,
                    attempt=waiting.attempt,
                    waited_s=max(0.0, self.clock.now() - waiting.since),
                    what=waiting.what,
                    peers=tuple(str(p) for p in waiting.peers),
                    contributions_from=tuple(str(p) for p in waiting.contributions_from),
                    results_from=tuple(str(p) for p in waiting.results_from),
                    links=waiting.links(),
                )
                run = dataclasses.replace(run, waiting_for=info)
            runs.append(run)
        return dataclasses.replace(report, runs=tuple(runs))

    async def aclose(self) -> None:
        """Leave every training run and the swarm, then stop (also done when ``open_peer`` ends)."""
        for collaboration in self.training.collaborations():
            await collaboration.leave(timeout_s=5.0)
        await super().aclose()

    async def serve_state(self, store: SnapshotCatalog, *, runs: Iterable[str] = ()) -> None:
        """Offer the snapshots in ``store`` to newcomers and announce this peer for ``runs``.

        Keep training while serving: publish new steps with ``store.publish(run, step, arrays)``
        (or :func:`chaosp2p.state.torch_adapter.publish_torch`); a snapshot being served stays
        immutable until every transfer that uses it has finished.
        """
        await self.state.serve(store, runs=runs)

    async def load_state(
        self,
        run: str,
        *,
        into: Mapping[str, np.ndarray] | None = None,
        step: int | None = None,
        sources: Sequence[Multiaddr | str] | None = None,
        max_sources: int = 8,
        progress: ProgressCallback | None = None,
        resume_path: str | Path | None = None,
    ) -> LoadedState:
        """Download the newest state of ``run`` (or ``step``) from several peers in parallel.

        Sources are the run's providers in the DHT unless ``sources`` names them. Every chunk is
        hash-verified; nothing is committed until all of it verified, and then either copied into
        ``into`` (existing arrays, checked first) or returned as new arrays. ``progress`` receives
        :class:`~chaosp2p.state.TransferProgress` updates. With ``resume_path`` an interrupted
        load continues from the verified chunks next time.
        """
        return await self.state.load(
            run,
            into=into,
            step=step,
            sources=sources,
            max_sources=max_sources,
            progress=progress,
            resume_path=resume_path,
        )

    async def load_torch_state(self, run: str, model: Any, optimizer: Any = None, **options: Any) -> LoadedState:
        """:meth:`load_state`, then load the result into ``model`` and ``optimizer`` (checked first)."""
        loaded = await self.load_state(run, **options)
        load_into_torch(loaded, model, optimizer)
        return loaded


@asynccontextmanager
async def open_peer(
    config: PeerConfig | None = None,
    *,
    identity: Identity | None = None,
    clock: Clock | None = None,
    seed: int | None = None,
) -> AsyncIterator[AsyncPeer]:
    """Run a peer for the duration of the block (listen, bootstrap, serve; goodbye on exit)."""
    async with open_node(config, identity=identity, clock=clock, seed=seed, node_class=AsyncPeer) as peer:
        yield peer
