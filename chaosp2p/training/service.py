"""Per-peer training services: the averager, the collaboration protocol, snapshots for newcomers.

A peer may take part in several runs; each has one :class:`AsyncCollaboration`. The protocols they
need are registered here when the peer is built -- before it accepts connections, because a
connection's HELLO advertises the protocols the peer speaks -- and requests are routed to the
collaboration of the run they name. A request for a run this peer does not train is refused with
a reason, never an error that would close the connection.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.collab.messages import (
    PROTOCOL_ID,
    FetchUpdate,
    ObserveAccepted,
    ObserveRequest,
    Refused,
    SnapshotRequest,
    UpdateHeader,
    codec,
)
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.training.averager import Averager
from chaosp2p.transport.stream import Stream

if TYPE_CHECKING:
    from chaosp2p.runtime.node import Node
    from chaosp2p.training.collaboration import AsyncCollaboration

log = logging.getLogger("chaosp2p.training")

SNAPSHOTS_KEPT = 2


class TrainingService:
    """Everything a peer needs to train with others; ``peer.training``."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.averager = Averager(node.host, node.clock)
        self.store = SnapshotStore(node.config.transfer, keep_latest=SNAPSHOTS_KEPT)
        self._collaborations: dict[str, AsyncCollaboration] = {}
        # No idle timeout: an observe stream is quiet while training pauses, and a snapshot request
        # waits for its step; both end with the newcomer's stream (or the peer).
        node.host.set_stream_handler(PROTOCOL_ID, self._serve, idle_timeout_s=None)

    def register(self, collaboration: AsyncCollaboration) -> None:
        """Route requests about ``collaboration.run`` to it."""
        if collaboration.run in self._collaborations:
            raise RemoteProtocolError(f"this peer already trains run {collaboration.run!r}")
        self._collaborations[collaboration.run] = collaboration

    def unregister(self, collaboration: AsyncCollaboration) -> None:
        """Stop routing requests to ``collaboration``."""
        if self._collaborations.get(collaboration.run) is collaboration:
            del self._collaborations[collaboration.run]

    def collaborations(self) -> list[AsyncCollaboration]:
        """The runs this peer trains."""
        return list(self._collaborations.values())

    async def _serve(self, stream: Stream) -> None:
        request = await stream.receive_message(codec)
        if isinstance(request, SnapshotRequest):
            collaboration = self._collaborations.get(request.run)
            if collaboration is None:
                await stream.send_message(codec, Refused(reason="this peer does not train that run"), eof=True)
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
            accepted = ObserveAccepted(completed=max(collaboration.step_index - 1, 0), numel=collaboration.flat.numel)
            await stream.send_message(codec, accepted)
            log.info("newcomer %s observes run %r from step %d", stream.remote_peer, request.run, accepted.completed)
            await collaboration.feed.serve(stream)
        elif isinstance(request, FetchUpdate):
            collaboration = self._collaborations.get(request.run)
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
