"""Per-peer training services: the averager, the collaboration protocol, snapshots for newcomers.

A peer may take part in several runs; each has one collaboration
(:class:`~chaosp2p.training.collaboration.AsyncCollaboration`). The protocols they need are
registered here when the peer is built -- before it accepts connections, because a connection's
HELLO advertises the protocols the peer speaks -- and requests are routed to the collaboration of
the run they name (seen here as a :class:`Collaborator`). A request for a run this peer does not train is refused with
a reason, never an error that would close the connection.

Members only (``protocols/collab.md`` §4.4): a snapshot request is served to members of the run's
configuration and to newcomers holding a member's ticket, an update is fetched by members only, and
observing a member makes it the newcomer's sponsor (a ticket, at most ``max_newcomers`` at once,
for at most ``join_timeout_s``). These checks come before any work for the request.
"""

from __future__ import annotations

import logging
from typing import Protocol

import anyio
import numpy as np

from chaosp2p.errors import LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.collab.messages import (
    PROTOCOL_ID,
    FetchUpdate,
    ObserveAccepted,
    ObserveRequest,
    Refused,
    SnapshotReply,
    SnapshotRequest,
    Ticket,
    UpdateHeader,
    codec,
)
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.training.averager import Averager
from chaosp2p.training.config import CollaborationConfig
from chaosp2p.training.feed import Observer, UpdateFeed
from chaosp2p.training.port import TrainingPort
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")

SNAPSHOTS_KEPT = 2
"""Snapshots a training peer keeps for newcomers (the store it serves from)."""


class Collaborator(Protocol):
    """What the service routes collab requests to: one run's collaboration on this peer."""

    run: str
    layout: bytes
    """Digest of its model's parameter names, shapes and dtypes."""
    step_index: int
    """The next step it runs."""
    feed: UpdateFeed
    """Its averaged updates, streamed to observing newcomers."""
    config: CollaborationConfig

    @property
    def numel(self) -> int:
        """Elements of its flat parameter buffer."""
        ...

    def is_member(self, peer: PeerID) -> bool:
        """Whether ``peer`` is a member of the run's configuration."""
        ...

    def may_fetch(self, peer: PeerID, step: int, config_digest: bytes) -> bool:
        """Whether ``peer`` may fetch the averaged update of ``step`` under ``config_digest``."""
        ...

    def snapshot_refusal(self, request: SnapshotRequest, asker: PeerID) -> str | None:
        """Why ``asker`` may not have this snapshot (None: serve it)."""
        ...

    def may_load(self, peer: PeerID) -> bool:
        """Whether ``peer`` may load this member's snapshots over ``/chaos/transfer/1``."""
        ...

    def sponsor(self, stream: Stream) -> tuple[Ticket, Observer] | str:
        """Sponsor the newcomer observing on ``stream`` (its ticket and feed slot), or why not."""
        ...

    async def handle_snapshot_request(self, request: SnapshotRequest) -> SnapshotReply:
        """Answer a newcomer's snapshot request once the step is served."""
        ...

    def applied_update(self, step: int, config_digest: bytes) -> tuple[int, np.ndarray] | None:
        """(epoch, update) it applied at ``step`` under ``config_digest``, if kept."""
        ...

    async def leave(self, *, timeout_s: float = ...) -> None:
        """Leave the run gracefully."""
        ...


class TrainingService:
    """Everything a peer needs to train with others; ``peer.training``.

    ``averager`` is the peer's averaging engine and ``store`` the snapshots it serves to
    newcomers; the service registers the collab protocol through ``port``.
    """

    def __init__(self, port: TrainingPort, *, averager: Averager, store: SnapshotStore) -> None:
        self.port = port
        self.averager = averager
        self.store = store
        self._collaborations: dict[str, Collaborator] = {}
        # No idle timeout: an observe stream is quiet while training pauses, and a snapshot request
        # waits for its step; both end with the newcomer's stream (or the peer).
        port.serve_streams(PROTOCOL_ID, self._serve, idle_timeout_s=None)

    def register(self, collaboration: Collaborator) -> None:
        """Route requests about ``collaboration.run`` to it."""
        if collaboration.run in self._collaborations:
            raise LocalProtocolError(f"this peer already trains run {collaboration.run!r}")
        self._collaborations[collaboration.run] = collaboration

    def unregister(self, collaboration: Collaborator) -> None:
        """Stop routing requests to ``collaboration`` and free what the averager kept for its run."""
        if self._collaborations.get(collaboration.run) is collaboration:
            del self._collaborations[collaboration.run]
            try:
                self.averager.forget_run(collaboration.run)
            except LocalProtocolError:  # a round still runs (a step() racing leave()): it frees nothing
                log.debug("run %r: kept the averager's memory, a round is still in progress", collaboration.run)

    def collaborations(self) -> list[Collaborator]:
        """The runs this peer trains."""
        return list(self._collaborations.values())

    def may_load(self, peer: PeerID) -> bool:
        """Whether ``peer`` may load the snapshots this peer serves for its runs: a member of one of
        them, or a newcomer one of them admitted (the store is the peer's, shared by its runs)."""
        return any(collaboration.may_load(peer) for collaboration in self._collaborations.values())

    async def _serve(self, stream: Stream) -> None:
        request = await stream.receive_message(codec)
        if isinstance(request, SnapshotRequest):
            collaboration = self._collaborations.get(request.run)
            if collaboration is None:
                await stream.send_message(codec, Refused(reason="this peer does not train that run"), eof=True)
                return
            refusal = collaboration.snapshot_refusal(request, stream.remote_peer)
            if refusal is not None:  # before anything is waited for or published
                log.info("run %r: refused a snapshot request from %s: %s", request.run, stream.remote_peer, refusal)
                await stream.send_message(codec, Refused(reason=refusal), eof=True)
                return
            # If the newcomer observes us, it replays from this step on: the updates before are useless to it.
            collaboration.feed.skip_through(stream.remote_peer, request.step)
            reply = await collaboration.handle_snapshot_request(request)
            await stream.send_message(codec, reply, eof=True)
        elif isinstance(request, ObserveRequest):
            collaboration = self._collaborations.get(request.run)
            if collaboration is None or collaboration.layout != request.layout:
                reason = "this peer does not train that run" if collaboration is None else "different model"
                await stream.send_message(codec, Refused(reason=reason), eof=True)
                return
            granted = collaboration.sponsor(stream)
            if isinstance(granted, str):
                await stream.send_message(codec, Refused(reason=granted), eof=True)
                return
            ticket, observer = granted
            # The newest update already published: the observer gets every one after it. Not
            # step_index - 1: while a completed step's update is applied, step_index still names
            # that step, its update is already out, and the newcomer would wait for it forever.
            published = collaboration.feed.last_published
            completed = published if published is not None else max(collaboration.step_index - 1, 0)
            accepted = ObserveAccepted(completed=completed, numel=collaboration.numel, ticket=ticket)
            try:
                await stream.send_message(codec, accepted)
                log.info("newcomer %s observes run %r from step %d", stream.remote_peer, request.run, completed)
                # A sponsorship lasts as long as a join may: an observer that never joins frees its slot.
                with anyio.move_on_after(collaboration.config.join_timeout_s) as scope:
                    await collaboration.feed.serve(observer)
                if scope.cancelled_caught:
                    log.info("newcomer %s observed run %r for too long: cut off", stream.remote_peer, request.run)
                    stream.reset()
            finally:
                collaboration.feed.forget(observer)
        elif isinstance(request, FetchUpdate):
            collaboration = self._collaborations.get(request.run)
            if collaboration is not None and not collaboration.may_fetch(
                stream.remote_peer, request.step, request.config_digest
            ):
                await stream.send_message(codec, Refused(reason="this member serves updates to members only"), eof=True)
                return
            found = None if collaboration is None else collaboration.applied_update(request.step, request.config_digest)
            if collaboration is None or found is None:
                await stream.send_message(codec, Refused(reason="no such update here"), eof=True)
                return
            epoch, update = found
            header = UpdateHeader(
                step=request.step, epoch=epoch, config_digest=request.config_digest, numel=update.size
            )
            await stream.send_message(codec, header)
            await stream.send(update.data.cast("B"), eof=True)
        elif request is not None:
            raise RemoteProtocolError(f"{type(request).__name__} cannot open a collab stream")
