"""The training port: everything a collaboration needs from the peer it runs on, and nothing more.

Theory of operation
-------------------
Training sits above the runtime and the state layer, but it must not reach into them: a
collaboration that walks ``peer.negotiation.machine`` or ``peer.membership.machine`` breaks as soon
as either changes shape, and cannot be tested without a whole peer. So training names what it needs
here, as :class:`typing.Protocol` classes, in four groups:

* **gates** (:class:`RunGates`): the run's agreed configurations and the step gates around them,
  served by the runtime's negotiation service (``chaosp2p.runtime.negotiation_service``);
* **addresses**: where a member can be dialled, which peers may know about a run, this peer's own
  incarnation (the membership and DHT services);
* **streams**: opening a stream of a protocol to a peer, and serving one (the transport host);
* **providers**: offering state snapshots to newcomers and loading them from several sources
  (the state service).

:class:`chaosp2p.AsyncPeer` serves the port (``AsyncPeer.training_port``) by delegating to those
services; the unit tests serve it with a fake. Nothing in ``chaosp2p.training`` imports the API or
the runtime.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, Protocol

from chaosp2p.clock import Clock
from chaosp2p.protocols.negotiation import Configuration, NegotiationConfig, RunInfo, RunParams
from chaosp2p.state.service import LoadedState
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr
from chaosp2p.wire.protocol_ids import ProtocolId


class RunGates(Protocol):
    """The agreed configurations of the runs this peer takes part in, and the gates between steps.

    Every member switches configuration at the same step because :meth:`configuration_for_step`
    waits while a pending change gates that step.
    """

    @property
    def config(self) -> NegotiationConfig:
        """The negotiation limits (a newcomer checks vouches against ``max_members``/``max_links``)."""
        ...

    def create_run(self, run: str, params: RunParams) -> Configuration:
        """Found ``run`` with this peer as its only member."""
        ...

    def configuration(self, run: str) -> Configuration | None:
        """The newest configuration of ``run`` this peer knows, if it takes part."""
        ...

    def governing(self, run: str, step: int) -> Configuration | None:
        """The configuration governing ``step`` now, or None while a pending change gates it."""
        ...

    async def configuration_for_step(self, run: str, step: int) -> Configuration:
        """The configuration governing ``step``; waits while a change gates it (raises ``RunRemoved``)."""
        ...

    def report_step(self, run: str, *, entered: int | None = None, completed: int | None = None) -> None:
        """Tell the run which step this peer began or finished."""
        ...

    def set_throughput(self, run: str, samples_per_s: float) -> None:
        """Report measured training speed (the run rebalances batch shares)."""
        ...

    def evict(self, run: str, peer: PeerID) -> bool:
        """Sign an eviction of ``peer``; True if a signature was added."""
        ...

    def stall(self, run: str, peer: PeerID) -> bool:
        """Sign a STALL of ``peer`` (it contributed nothing to our round); True if one was added."""
        ...

    def announce_leave(self, run: str) -> bool:
        """Tell the run this peer leaves; False if it is no member anyway."""
        ...

    def removed_from_step(self, run: str) -> int | None:
        """The first step this peer no longer takes part in, if it was removed."""
        ...

    def removed_reason(self, run: str) -> str | None:
        """Why this peer was removed from ``run``, if it was."""
        ...

    def forget_removal(self, run: str) -> None:
        """Clear a removal before rejoining as a newcomer."""
        ...

    def take_resync(self, run: str) -> int | None:
        """The step from which this peer's state is known wrong, once."""
        ...

    async def query_run(self, run: str, peer: PeerID, *, timeout_s: float) -> RunInfo:
        """Ask ``peer`` for its view of ``run``."""
        ...

    async def join(
        self, run: str, sponsor: PeerID, *, incarnation: int, throughput: float, timeout_s: float
    ) -> Configuration:
        """Have ``sponsor`` get this peer admitted; the configuration that admits it."""
        ...

    def link_failed(self, run: str, peer: PeerID) -> bool:
        """A round of ``run`` could not exchange with ``peer`` first-hand: declare the link down (True if raised)."""
        ...

    async def wait_changed(self) -> None:
        """Return at the next negotiation event."""
        ...


class EventQueue(Protocol):
    """A subscription to the peer's events, read without waiting."""

    def drain(self) -> list[Any]:
        """The events queued since the last call."""
        ...


StreamHandler = Callable[[Stream], Awaitable[None]]


class TrainingPort(Protocol):
    """What training needs from a running peer (see the module docstring)."""

    peer_id: PeerID
    identity: Identity
    """This peer's key (a member signs its vouches for snapshots with it)."""
    clock: Clock
    """The peer's clock (step timing, round timeouts)."""
    profile: str
    """The peer's profile name, which picks a collaboration's default timings."""
    runs: RunGates
    """The runs' agreed configurations and step gates."""

    def subscribe(self) -> EventQueue:
        """Every peer event from now on (the collaboration reports committed operations)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on :attr:`clock`: what a task spawned here waits between its looks (the
        idle watcher). A peer's clock is real time; a test's fake steps its virtual clock instead, so
        it drives such a task look by look rather than pausing in real time."""
        ...

    def spawn(self, function: Callable[[], Coroutine[Any, Any, None]], *, name: str) -> None:
        """Run ``function()`` in the peer's task group (structured concurrency: it ends when the peer
        closes, or earlier through a cancel scope of its own). A collaboration is driven by its
        caller's ``step()``; what must happen between calls runs here (its idle watcher,
        :mod:`~chaosp2p.training.stepping_aside`, cancelled by ``leave()``)."""
        ...

    # ------------------------------------------------------------------ addresses
    def dial_addrs(self, peer: PeerID) -> Sequence[Multiaddr]:
        """Where ``peer`` can be dialled (best first; empty if unknown)."""
        ...

    def run_contacts(self) -> list[PeerID]:
        """Peers that may know about a run, most likely first: live members, connected peers,
        then DHT contacts (a newcomer's membership view may still be nearly empty)."""
        ...

    def own_incarnation(self) -> int:
        """This peer's membership incarnation."""
        ...

    # ------------------------------------------------------------------ streams
    async def open_stream(self, peer: PeerID, protocol: str) -> Stream:
        """A new stream of ``protocol`` to ``peer`` (connecting first if needed)."""
        ...

    def serve_streams(
        self, protocol: ProtocolId | str, handler: StreamHandler, *, idle_timeout_s: float | None
    ) -> None:
        """Hand every inbound stream of ``protocol`` to ``handler``."""
        ...

    # ------------------------------------------------------------------ providers
    async def serve_state(
        self, store: SnapshotStore, *, runs: Iterable[str], allow: Callable[[PeerID], bool] | None = None
    ) -> None:
        """Offer ``store``'s snapshots to the peers ``allow`` accepts (everyone if None) and announce
        this peer for ``runs``."""
        ...

    async def load_state(self, run: str, *, step: int, sources: Sequence[str], digest: bytes | None) -> LoadedState:
        """Pull the snapshot of ``run`` at ``step`` (pinned to ``digest``) from ``sources`` in parallel."""
        ...
