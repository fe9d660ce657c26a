"""The peer's side of the training port: :class:`~chaosp2p.training.port.TrainingPort` served by its services.

Each group of the port is answered by the service that owns it, never by a protocol machine:
gates by the negotiation service, addresses by the membership and DHT services, streams by the
transport host, providers by the state service. This adapter only routes; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

import anyio

from chaosp2p.clock import Clock
from chaosp2p.protocols.membership import MemberState
from chaosp2p.runtime.node import Node
from chaosp2p.state.service import LoadedState, StateService
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.training.port import EventQueue, RunGates, StreamHandler
from chaosp2p.transport.reach import reach
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr
from chaosp2p.wire.protocol_ids import ProtocolId

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)


class PeerTrainingPort:
    """The training port of one running peer (``AsyncPeer.training_port``)."""

    def __init__(self, node: Node, state: StateService) -> None:
        self._node = node
        self._state = state
        # Fixed for the peer's lifetime, so plain attributes.
        self.peer_id: PeerID = node.peer_id
        self.identity: Identity = node.host.identity
        self.clock: Clock = node.clock
        self.profile: str = node.config.profile
        self.runs: RunGates = node.negotiation
        """The negotiation service: the runs' configurations and step gates."""

    def subscribe(self) -> EventQueue:
        """Every peer event from now on."""
        return self._node.events()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of real time (the peer's clock is monotonic time)."""
        await anyio.sleep(seconds)

    def spawn(self, function: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        """Run ``function()`` in the peer's task group (it ends with the peer)."""
        self._node.task_group.start_soon(function, name=name)

    def dial_addrs(self, peer: PeerID) -> Sequence[Multiaddr]:
        """Where ``peer`` can be dialled, from the membership view."""
        return self._node.membership.dial_addrs(peer)

    def run_contacts(self) -> list[PeerID]:
        """Live members, then connected peers, then DHT contacts; each once."""
        live = [m.peer_id for m in self._node.members() if m.state in _LIVE]
        ordered = dict.fromkeys([*live, *self._node.connected_peers(), *self._node.dht.contacts()])
        return list(ordered)

    def own_incarnation(self) -> int:
        """This peer's membership incarnation."""
        return self._node.membership.own_incarnation()

    async def open_stream(self, peer: PeerID, protocol: str) -> Stream:
        """A new stream of ``protocol`` to ``peer``: over an open connection, else dialled directly or,
        when that does not work within the profile's ``relay_after_s``, through a relay
        (:func:`~chaosp2p.transport.reach.reach`).

        The relay is the way to a member behind NAT or a firewall (issue 21): a newcomer that can
        dial only some members still asks all of them to vouch for its snapshot, and a quorum of
        vouches is what admits it.
        """
        connection = await reach(self._node.host, peer, self._node.membership.reach_addrs(peer))
        return connection.open_stream(protocol)

    def serve_streams(
        self, protocol: ProtocolId | str, handler: StreamHandler, *, idle_timeout_s: float | None
    ) -> None:
        """Hand inbound streams of ``protocol`` to ``handler``."""
        self._node.host.set_stream_handler(protocol, handler, idle_timeout_s=idle_timeout_s)

    async def serve_state(
        self, store: SnapshotStore, *, runs: Iterable[str], allow: Callable[[PeerID], bool] | None = None
    ) -> None:
        """Offer ``store`` to the peers ``allow`` accepts and announce this peer as a provider of ``runs``."""
        await self._state.serve(store, runs=runs, allow=allow)

    async def load_state(self, run: str, *, step: int, sources: Sequence[str], digest: bytes | None) -> LoadedState:
        """Pull ``run`` at ``step`` from ``sources`` in parallel, pinned to ``digest``."""
        return await self._state.load(run, step=step, sources=sources, digest=digest)
