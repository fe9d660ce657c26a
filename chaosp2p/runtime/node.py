"""The ``Node``: one process's membership in a chaosp2p swarm, below the state layer.

A node composes the transport host with the overlay's protocol drivers (DHT, membership) and
serves the status protocol. All of its background work runs in one task group, entered with
:func:`open_node`. Applications use :func:`chaosp2p.open_peer`, whose :class:`chaosp2p.AsyncPeer`
is a node that can also serve and load training state::

    async with open_node(PeerConfig.local(bootstrap=[addr])) as node:
        print(node.peer_id, node.addrs)

Leaving the block says goodbye to every connected peer (bounded to about a second) and stops
every task the node started.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc

from chaosp2p.clock import Clock, MonotonicClock
from chaosp2p.dht import DHTMachine
from chaosp2p.errors import AdmissionDenied, ChaosError, PeerIdMismatch
from chaosp2p.protocols.membership import LinkDirection, Member, Topology
from chaosp2p.protocols.reachability import Reachability
from chaosp2p.runtime.allocator import keep_large_buffers_mapped
from chaosp2p.runtime.announced_addrs import AnnouncedAddrs
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.runtime.dht_service import DHTService
from chaosp2p.runtime.events import EventHub, Subscription
from chaosp2p.runtime.membership_service import MembershipService
from chaosp2p.runtime.negotiation_service import LINK_SETTLE_INTERVALS, NegotiationService
from chaosp2p.runtime.status import (
    STATUS_CODEC,
    ConnectionInfo,
    LinkInfo,
    MemberInfo,
    PendingInfo,
    ReachabilityInfo,
    RunStatusInfo,
    StatusReport,
    StatusRequest,
    report_for,
)
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.transport.holepunch import HolePunchService
from chaosp2p.transport.host import Host
from chaosp2p.transport.keyfile import load_or_create_identity, load_swarm_key
from chaosp2p.transport.reachability import ReachabilityService
from chaosp2p.transport.relay_reservations import RelayReservations
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.peer")
N = TypeVar("N", bound="Node")


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerConnected:
    """A connection to ``peer_id`` opened (event)."""

    peer_id: PeerID
    outbound: bool
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerDisconnected:
    """The last connection to ``peer_id`` closed (event)."""

    peer_id: PeerID
    reason: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BootstrapFailed:
    """No bootstrap peer could be reached; the peer retries after ``retry_in_s`` (event)."""

    errors: tuple[str, ...]
    retry_in_s: float
    at: float


class Node:
    """A running peer without the state layer. Create it with :func:`open_node`."""

    def __init__(
        self, *, config: PeerConfig, host: Host, task_group: anyio.abc.TaskGroup, clock: Clock, rng: random.Random
    ) -> None:
        self.config = config
        self.host = host
        self.clock = clock
        self.random = rng
        self.task_group = task_group
        """The node's task group: services built on the node start their background tasks in it."""
        self._events = EventHub()
        self._connected_event = anyio.Event()
        self._bandwidth: OrderedDict[PeerID, float] = OrderedDict()  # LRU, at most max_tracked_peers
        host.on_connection_change(self._on_connection_change)
        host.set_request_handler("/chaos/status/1", self._serve_status)
        self.dht = DHTService(
            machine=DHTMachine(
                host.identity,
                rng=random.Random(rng.random()),
                config=config.dht,
                now=clock.now(),
                wall_offset_s=time.time() - clock.now(),  # records carry their signed wall-clock issue time
            ),
            host=host,
            clock=clock,
            task_group=task_group,
            publish=self.publish,
        )
        self.membership = MembershipService(
            host=host,
            clock=clock,
            config=config.membership,
            rng=random.Random(rng.random()),
            task_group=task_group,
            publish=self.publish,
            dht_contacts=self._dht_contacts,
        )
        self.negotiation = NegotiationService(
            host=host,
            clock=clock,
            config=config.negotiation,
            rng=random.Random(rng.random()),
            task_group=task_group,
            publish=self._events.publish,
            resolve=self._dial_addrs,
            link_settle_s=LINK_SETTLE_INTERVALS * config.membership.heartbeat_interval_s,
            trusted=[a.peer_id for a in config.bootstrap_addrs() if a.peer_id is not None],
        )
        self.reachability = ReachabilityService(host, config.reachability)
        """Dial-back checks of this peer's reachability (``protocols/reachability.md``)."""
        self.holepunch = HolePunchService(host, config.holepunch)
        """Upgrading relayed connections to direct ones: ``await node.holepunch.punch(peer)``."""
        host.relay.opened.append(self.holepunch.upgrade_soon)
        host.relay.own_reachability = lambda: self.reachability.reachability  # slots only while public
        self.reservations = RelayReservations(
            host, clock, config.reservations, is_private=lambda: self.reachability.reachability is Reachability.PRIVATE
        )
        """Relay slots this peer holds while private; their relay addresses go into its membership info."""
        self.reservations.changed.append(self._announce_relay_addrs)
        self.announced = AnnouncedAddrs(
            listen=lambda: [str(a) for a in host.listen_addrs],
            working=self.reachability.machine.working_addrs,
            announce=self._announce_addrs,
            max_addrs=min(config.membership.max_addrs_per_member, config.dht.max_addrs_per_peer),
        )
        """The addresses this peer announces: listen addresses, after those dial-back proved from outside."""
        self.reachability.checked.append(self.announced.refresh)

    def start(self) -> None:
        """Start the overlay: DHT bootstrap, membership, and the bootstrap connections."""
        keep_large_buffers_mapped(self.config.mmap_threshold_bytes)
        self.dht.start(self.config.bootstrap_addrs())
        self.membership.start()
        self.negotiation.start()
        self.task_group.start_soon(self._bootstrap_loop, name="chaosp2p bootstrap")
        self.task_group.start_soon(self.reachability.run, name="chaosp2p reachability")
        self.task_group.start_soon(self.reservations.run, name="chaosp2p relay reservations")

    def _announce_relay_addrs(self, addrs: tuple[CircuitAddr, ...]) -> None:
        self.dht.set_relay_addrs(addrs)
        machine = self.membership.machine
        if not machine.has_left:  # after leaving there is nobody to tell
            self.membership.driver.call(machine.set_local_relay_addrs, [str(a) for a in addrs])

    def _announce_addrs(self, addrs: list[str]) -> None:
        self.dht.machine.set_listen_addrs(addrs)  # read when the next contact is sent
        machine = self.membership.machine
        if not machine.has_left:
            self.membership.driver.call(machine.set_local_addrs, addrs)

    def _dial_addrs(self, peer: PeerID) -> list[Dialable]:
        return self.membership.reach_addrs(peer)  # with its announced relay addresses

    def _dht_contacts(self) -> list[tuple[PeerID, tuple[str, ...]]]:
        return [(entry.peer_id, tuple(entry.contact.addrs)) for entry in self.dht.machine.routing_table]

    # ------------------------------------------------------------------ identity
    @property
    def peer_id(self) -> PeerID:
        """This peer's PeerID."""
        return self.host.peer_id

    @property
    def addrs(self) -> list[Multiaddr]:
        """Multiaddrs to hand to others (each ends in ``/p2p/<peer id>``)."""
        return self.host.addrs

    # ------------------------------------------------------------------ events and waiting
    def events(self) -> Subscription:
        """Typed events from now on: connections, joins, failures, links, negotiated operations.

        The subscription is registered when this returns (not at the first ``__anext__``), and
        ``subscription.dropped`` counts events lost because the caller read too slowly.
        """
        return self._events.subscribe()

    def subscribe_with_view(self) -> tuple[tuple[Member, ...], Subscription]:
        """The membership view and a subscription to every event after it, taken atomically."""
        return self.members(), self._events.subscribe()

    @property
    def events_dropped(self) -> int:
        """Events lost by slow ``events()`` subscribers since the node started."""
        return self._events.dropped

    def publish(self, event: Any) -> None:
        """Hand an event to every ``events()`` subscriber (used by the protocol drivers).

        Membership events also reach negotiation: a member that fails or leaves, or a link that
        goes up or down, may change the configuration of a training run.
        """
        self.negotiation.observe(event)
        self._events.publish(event)

    def connected_peers(self) -> list[PeerID]:
        """Peers with an open connection to us."""
        return self.host.connected_peers()

    async def wait_connected(self, count: int = 1) -> None:
        """Return once at least ``count`` peers are connected (bound it with ``anyio.fail_after``)."""
        while len(self.connected_peers()) < count:
            self._connected_event = anyio.Event()
            await self._connected_event.wait()

    # ------------------------------------------------------------------ bootstrap
    async def connect(self, addr: Multiaddr | str) -> Connection:
        """Connect to a peer by multiaddr."""
        return await self.host.connect(addr)

    async def _bootstrap_loop(self) -> None:
        """Keep trying the bootstrap peers, with jittered exponential backoff, until one answers."""
        addrs = self.config.bootstrap_addrs()
        if not addrs:
            return
        delay = self.config.bootstrap_retry_min_s
        while True:
            errors: list[str] = []
            connected = 0
            for addr in addrs:
                try:
                    connection = await self.host.connect(addr)
                    connected += 1
                    self.membership.join(connection.remote_peer, [addr])
                except PeerIdMismatch as exc:
                    errors.append(str(exc))
                    log.error("bootstrap %s: %s", addr, exc)
                except AdmissionDenied as exc:
                    errors.append(str(exc))
                    log.error("bootstrap %s refused us: %s", addr, exc)
                except ChaosError as exc:
                    errors.append(f"{addr}: {exc}")
            if connected:
                log.info("bootstrapped through %d of %d peers", connected, len(addrs))
                return
            retry = delay * (0.5 + self.random.random())
            log.warning("no bootstrap peer reachable (%s); retrying in %.1f s", "; ".join(errors), retry)
            self.publish(BootstrapFailed(errors=tuple(errors), retry_in_s=retry, at=self.clock.now()))
            await anyio.sleep(retry)
            delay = min(delay * 2, self.config.bootstrap_retry_max_s)

    # ------------------------------------------------------------------ cluster monitor
    def members(self) -> tuple[Member, ...]:
        """The membership view: every known peer with state, incarnation, addresses, resources."""
        return self.membership.members()

    def topology(self) -> Topology:
        """Members plus overlay links with RTT and bandwidth estimates."""
        return self.membership.topology()

    def report_throughput(self, samples_per_s: float) -> None:
        """Tell the cluster monitor how fast this peer trains (shown to every peer)."""
        self.membership.report_throughput(samples_per_s)

    def link_estimate(self, peer: PeerID) -> tuple[float | None, float | None]:
        """(download bandwidth bytes/s from ``peer``, one-way latency s) as far as this node knows.

        The download direction -- ``peer``'s upload to us, measured by earlier pulls from it --
        is what a pull is planned with; our own probes of ``peer`` measure our upload, which a
        capped uplink on either side makes a different number.
        """
        bandwidth, rtt = self.membership.link_estimate(peer, LinkDirection.RECEIVE)
        if bandwidth is None:
            bandwidth = self._bandwidth.get(peer)
        if rtt is None and (connection := self.host.connection(peer)) is not None:
            rtt = connection.rtt_s
        return bandwidth, None if rtt is None else rtt / 2

    def record_transfer(self, peer: PeerID, byte_count: int, seconds: float) -> None:
        """Fold a finished pull's rate from ``peer`` into the download estimate for ``peer``."""
        if byte_count <= 0 or seconds <= 0:
            return
        self._bandwidth[peer] = byte_count / seconds
        self._bandwidth.move_to_end(peer)
        while len(self._bandwidth) > self.config.transport.max_tracked_peers:
            self._bandwidth.popitem(last=False)
        self.membership.record_transfer(peer, byte_count, seconds, LinkDirection.RECEIVE)

    def record_upload(self, peer: PeerID, byte_count: int, seconds: float) -> None:
        """Fold what this node served to ``peer`` into the upload estimate for ``peer`` (what the
        bandwidth probes would have measured)."""
        if byte_count > 0 and seconds > 0:
            self.membership.record_transfer(peer, byte_count, seconds, LinkDirection.SEND)

    def bulk_transfer(self) -> AbstractContextManager[None]:
        """Hold while a bulk transfer runs (pulling or serving state): bandwidth probes, which
        would share its links, wait until it ends."""
        return self.membership.bulk_transfer()

    # ------------------------------------------------------------------ status
    def status_report(self) -> StatusReport:
        """What this peer sees, in full (the local dashboard shows it); a remote asker of
        ``chaosp2p status`` gets it filtered by ``config.status`` (:func:`report_for`)."""
        connections = []
        for connection in [*self.host.connections(), *self.host.relayed_connections()]:
            stats = connection.statistics()
            connections.append(
                ConnectionInfo(
                    peer_id=str(connection.remote_peer),
                    address=str(Multiaddr.from_socket_address(*connection.remote_address)),
                    direction="outbound" if connection.is_dialer else "inbound",
                    rtt_ms=None if stats.rtt_s is None else round(stats.rtt_s * 1e3, 3),
                    open_streams=stats.open_streams,
                    relayed=connection.relayed,
                )
            )
        members = tuple(
            MemberInfo(peer_id=str(m.peer_id), state=m.state.value, incarnation=m.incarnation, addrs=m.addrs)
            for m in self.members()
        )
        links = tuple(
            LinkInfo(
                peer_id=str(link.target),
                state="up" if link.up else "down",
                rtt_ms=None if link.rtt_s is None else round(link.rtt_s * 1e3, 3),
                bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
            )
            for link in self.membership.machine.links()
        )
        runs = tuple(
            RunStatusInfo(
                run=run.run,
                epoch=run.epoch,
                step=run.step,
                activation_step=run.activation_step,
                config_digest=run.config_digest,
                members=tuple(str(p) for p in run.members),
                pending=tuple(
                    PendingInfo(kind=op.kind.name.lower(), subject=str(op.subject), origin=str(op.origin))
                    for op in run.pending
                ),
            )
            for run in self.negotiation.run_status()
        )
        return StatusReport(
            peer_id=str(self.peer_id),
            addrs=tuple(str(a) for a in self.addrs),
            agent=self.host.agent,
            uptime_s=self.host.uptime_s(),
            connections=tuple(connections),
            members=members,
            links=links,
            runs=runs,
            reachability=self._reachability_info(),
        )

    def _reachability_info(self) -> ReachabilityInfo:
        machine = self.reachability.machine
        answers = machine.answers()
        reached = sum(1 for a in answers if a.reached)
        return ReachabilityInfo(
            status=machine.reachability.value,
            addrs=tuple(machine.confirmed_addrs()),
            reached=reached,
            not_reached=len(answers) - reached,
            checked_s_ago=None if machine.last_check_at is None else self.clock.now() - machine.last_check_at,
            relay_addrs=tuple(str(a) for a in self.reservations.addrs),
        )

    async def _serve_status(self, connection: Connection, request: Any) -> Any:
        STATUS_CODEC.from_obj(request)
        # The runs are shown to their members (and the configured observers) only.
        return STATUS_CODEC.to_obj(report_for(self.status_report(), connection.remote_peer, self.config.status))

    # ------------------------------------------------------------------ internals
    def _on_connection_change(self, connection: Connection, opened: bool) -> None:
        peer = connection.remote_peer
        now = self.clock.now()
        if opened:
            if len(self.host.connections_to(peer)) == 1:  # the first one: the peer just became reachable
                log.info("peer %s connected (%s)", peer, "outbound" if connection.is_dialer else "inbound")
                self.publish(PeerConnected(peer_id=peer, outbound=connection.is_dialer, at=now))
            self._connected_event.set()
        elif self.host.connection(peer) is None:
            log.info("peer %s disconnected: %s", peer, connection.close_reason)
            self.publish(PeerDisconnected(peer_id=peer, reason=connection.close_reason, at=now))
            if connection.closed_by_remote_host:
                # Its host closed our last connection without a goodbye (a killed process's kernel
                # does): membership checks the peer at once instead of at its next probe.
                self.membership.connection_lost(peer)

    async def aclose(self) -> None:
        """Leave the swarm, say goodbye to every peer and stop (also done when ``open_node`` ends)."""
        await self.membership.leave()
        await self.host.aclose()


def _identity_for(config: PeerConfig) -> Identity:
    if config.identity_path is None:
        return Identity.generate()
    return load_or_create_identity(config.identity_path)


@asynccontextmanager
async def open_node(
    config: PeerConfig | None = None,
    *,
    identity: Identity | None = None,
    clock: Clock | None = None,
    seed: int | None = None,
    node_class: type[N] = Node,  # type: ignore[assignment]
) -> AsyncIterator[N]:
    """Start a node (listen, bootstrap, serve) for the duration of the block.

    ``node_class`` lets a higher layer add services: it is constructed after the listeners are
    bound but before they accept, so it knows its addresses and every protocol it registers is
    advertised from the first connection on.
    """
    config = config or PeerConfig.local()
    identity = identity or _identity_for(config)
    swarm_key = load_swarm_key(config.swarm_key_path) if config.swarm_key_path else None
    clock = clock or MonotonicClock()
    rng = random.Random(seed)
    with unwrap_single_error():
        async with anyio.create_task_group() as tg:
            host = Host(
                identity=identity,
                config=config.transport,
                task_group=tg,
                swarm_key=swarm_key,
                clock=clock,
                relay=config.relay,
            )
            for addr in config.listen_addrs():
                await host.listen(addr)  # bound, not yet accepting: the services need the addresses
            peer = node_class(config=config, host=host, task_group=tg, clock=clock, rng=rng)
            try:
                host.start()
                peer.start()
                yield peer
            finally:
                with anyio.CancelScope(shield=True):
                    await peer.aclose()
                tg.cancel_scope.cancel()


async def request_status(
    addr: Multiaddr | str,
    *,
    swarm_key: bytes | None = None,
    timeout_s: float = 5.0,
    identity: Identity | None = None,
) -> StatusReport:
    """Connect to ``addr`` and ask for its :class:`StatusReport`.

    The asker is ``identity``, or a throwaway one: a peer lists its training runs only to their
    members and to the observers its ``[status]`` config names, so an operator who wants to see
    runs asks with an identity listed there.
    """
    from chaosp2p.transport.config import TransportConfig
    from chaosp2p.transport.host import open_host

    config = TransportConfig.local()
    with anyio.fail_after(timeout_s):
        async with open_host(identity or Identity.generate(), config, swarm_key=swarm_key) as host:
            connection = await host.connect(addr)
            reply = await connection.request("status", STATUS_CODEC.to_obj(StatusRequest()), timeout_s=timeout_s)
            report = STATUS_CODEC.from_obj(reply)
            if not isinstance(report, StatusReport):
                raise AdmissionDenied("the peer answered status with the wrong message type")
            await connection.aclose("status done")
            return report
