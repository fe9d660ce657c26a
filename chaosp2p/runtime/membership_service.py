"""The membership machine over real connections: who is in the swarm, which links are alive.

The driver feeds the SWIM machine (:mod:`chaosp2p.protocols.membership`) and adds the pieces only
the runtime can provide: this host's resources, link candidates from the DHT's routing table,
bounded active bandwidth probes when a link has no estimate yet, and a goodbye (LEAVE) before the
peer shuts down. Membership events are forwarded to ``peer.events()`` and logged.
"""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError, LocalProtocolError
from chaosp2p.protocols.membership import (
    PROTOCOL,
    LinkDirection,
    LinkDown,
    LinkUp,
    Member,
    MembershipConfig,
    MembershipMachine,
    MemberState,
    PeerFailed,
    PeerJoined,
    PeerLeft,
    Topology,
)
from chaosp2p.protocols.membership import codec as MEMBERSHIP_CODEC
from chaosp2p.runtime.driver import MachineDriver
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.circuit_addr import Dialable
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr
from chaosp2p.wire.protocol_ids import ProtocolId

log = logging.getLogger("chaosp2p.membership")

PROBE_PROTOCOL = "/chaos/probe/1"
MAX_PROBE_BYTES = 64 << 20
CANDIDATE_INTERVAL_S = 2.0
LEAVE_FLUSH_S = 0.5


class MembershipService:
    """``peer.members()``, ``peer.topology()`` and membership events for one node."""

    def __init__(
        self,
        *,
        host: Host,
        clock: Clock,
        config: MembershipConfig,
        rng: random.Random,
        task_group: anyio.abc.TaskGroup,
        publish: Callable[[Any], None],
        dht_contacts: Callable[[], Sequence[tuple[PeerID, Sequence[str]]]],
    ) -> None:
        self._host = host
        self._clock = clock
        self._task_group = task_group
        self._publish = publish
        self._dht_contacts = dht_contacts
        self._failures_on_loss = 0
        self._probe_scopes: set[anyio.CancelScope] = set()  # probes sent or served right now
        self.machine = MembershipMachine(
            identity=host.identity,
            addrs=tuple(str(a) for a in host.listen_addrs),
            config=config,
            rng=rng,
            now=clock.now(),
        )
        self.driver = MachineDriver(
            host=host,
            machine=self.machine,
            codecs={"membership": MEMBERSHIP_CODEC},
            clock=clock,
            task_group=task_group,
            resolve=self.reach_addrs,
            on_event=self._on_event,
            name="membership",
        )
        # Replaces the handler the driver registered, which decodes every datagram first: here the
        # machine's cheap checks (the sender's message and byte budgets, the size cap of the type)
        # come before decoding, which costs about 0.1 s of CPU per MiB.
        host.set_message_handler(ProtocolId(PROTOCOL, 1), self._on_message)
        host.set_stream_handler(PROBE_PROTOCOL, self._serve_probe)

    def _on_message(self, connection: Connection, body: bytes) -> None:
        # Runs on the connection's reader: a decode error propagates and closes that connection.
        sender = connection.remote_peer
        if not self.machine.admit(self._clock.now(), sender, body):
            return
        message = MEMBERSHIP_CODEC.decode(body, max_bytes=self._host.config.max_record_bytes)
        self.driver.call(self.machine.receive_admitted, sender, message)

    def start(self) -> None:
        """Publish resources and start the timers and background loops."""
        self.driver.call(lambda now: self.machine.set_local_resources(now, **local_resources()))
        self.driver.start()
        self._task_group.start_soon(self._candidates_loop, name="chaosp2p link candidates")
        self._task_group.start_soon(self._probe_loop, name="chaosp2p bandwidth probes")

    def join(self, peer: PeerID, addrs: Sequence[Multiaddr]) -> None:
        """Join the swarm through ``peer`` (a bootstrap peer we just reached)."""
        texts = tuple(str(a.without_peer()) for a in addrs)
        if texts and not self.machine.has_left:
            self.driver.call(self.machine.add_contact, peer, texts)

    async def leave(self) -> None:
        """Tell the swarm we are leaving, and give the goodbye a moment to go out."""
        if self.machine.has_left:
            return
        self.driver.call(self.machine.leave)
        with anyio.move_on_after(LEAVE_FLUSH_S):
            await self.driver.wait_sent()

    def connection_lost(self, peer: PeerID) -> None:
        """``peer``'s host closed our last connection to it (EOF or reset, no goodbye): check it now."""
        if self.machine.has_left:
            return
        log.info("connection to %s closed by its host: checking it now", peer)
        self.driver.call(self.machine.connection_lost, peer)

    # ------------------------------------------------------------------ reading the view
    def members(self) -> tuple[Member, ...]:
        """Every member this peer knows, itself included."""
        return self.machine.members()

    def topology(self) -> Topology:
        """Members with their resources and the overlay links with RTT and bandwidth."""
        return self.machine.topology()

    def state_of(self, peer: PeerID) -> MemberState | None:
        """What this peer believes about ``peer``."""
        return self.machine.state_of(peer)

    def dial_addrs(self, peer: PeerID) -> list[Multiaddr]:
        """Where ``peer`` can be dialled, as far as this peer's view knows (best first)."""
        return list(self.machine.dial_addrs(peer))

    def reach_addrs(self, peer: PeerID) -> list[Dialable]:
        """:meth:`dial_addrs`, then the relay addresses ``peer`` announced (when nobody can dial it)."""
        return [*self.machine.dial_addrs(peer), *self.machine.relay_addrs(peer)]

    def own_incarnation(self) -> int:
        """This peer's current incarnation (a newcomer's JOIN names it)."""
        for member in self.machine.members():
            if member.peer_id == self._host.peer_id:
                return member.incarnation
        raise LocalProtocolError("this peer is missing from its own membership view")

    def advertise_observer(self) -> None:
        """Publish zero resources: an observer (the dashboard) offers no compute, so no scheduler
        counts on it."""
        self.driver.call(
            lambda now: self.machine.set_local_resources(
                now, cpu_cores=0, memory_bytes=0, gpus=0, gpu_memory_bytes=0, train_samples_per_s=0.0
            )
        )

    def link_estimate(
        self, peer: PeerID, direction: LinkDirection = LinkDirection.SEND
    ) -> tuple[float | None, float | None]:
        """(bandwidth bytes/s in ``direction``, RTT s) of our link to ``peer``.

        ``SEND`` is our upload to it (our probes, only on one of our overlay links); ``RECEIVE`` its
        upload to us, as what we pulled from it measured it (any member, while fresh).
        """
        if direction is LinkDirection.RECEIVE:
            rtt = next((link.rtt_s for link in self.machine.links() if link.target == peer), None)
            return self.machine.receive_estimate(self._clock.now(), peer), rtt
        for link in self.machine.links():
            if link.target == peer:
                return link.bandwidth_bytes_per_s, link.rtt_s
        return None, None

    def record_transfer(
        self, peer: PeerID, byte_count: int, seconds: float, direction: LinkDirection = LinkDirection.SEND
    ) -> None:
        """Feed a finished bulk transfer into the link's bandwidth estimate for ``direction``."""
        if self.machine.has_left:  # shutting down: the view is no longer maintained
            return
        self.driver.call(self.machine.record_transfer, peer, byte_count, seconds, direction)

    @contextmanager
    def bulk_transfer(self) -> Iterator[None]:
        """Mark a bulk transfer (a pull, or serving one) for as long as the block runs.

        No bandwidth probe is started or served meanwhile, and those in flight are abandoned: a
        probe would compete with the transfer for the same link (the transfer's bytes measure it).
        """
        self.driver.call(self.machine.bulk_transfer_started)
        for scope in list(self._probe_scopes):
            scope.cancel()
        try:
            yield
        finally:
            self.driver.call(self.machine.bulk_transfer_finished)

    def report_throughput(self, samples_per_s: float) -> None:
        """Publish this peer's training throughput to the cluster monitor."""
        if self.machine.has_left:
            return
        self.driver.call(lambda now: self.machine.set_local_resources(now, train_samples_per_s=samples_per_s))

    # ------------------------------------------------------------------ events
    def _on_event(self, event: Any) -> None:
        if isinstance(event, PeerJoined):
            log.info("member joined: %s", event.peer)
        elif isinstance(event, PeerFailed):
            on_loss = self.machine.statistics().failures_on_loss
            if on_loss > self._failures_on_loss:  # this verdict came from a connection loss check
                self._failures_on_loss = on_loss
                log.warning("member failed: %s (its host closed our connection; no relay could reach it)", event.peer)
            else:
                log.warning("member failed: %s", event.peer)
        elif isinstance(event, PeerLeft):
            log.info("member left: %s", event.peer)
        elif isinstance(event, LinkUp):
            log.debug("link up to %s (rtt %.2f ms)", event.peer, event.rtt_s * 1e3)
        elif isinstance(event, LinkDown):
            log.info("link down to %s: %s", event.peer, event.reason)
        self._publish(event)

    # ------------------------------------------------------------------ background loops
    async def _candidates_loop(self) -> None:
        """Offer the DHT's contacts as link candidates (better links replace worse ones)."""
        while not self.machine.has_left:
            candidates = list(self._dht_contacts())
            if candidates:
                self.driver.call(self.machine.offer_link_candidates, candidates)
            await anyio.sleep(CANDIDATE_INTERVAL_S)

    async def _probe_loop(self) -> None:
        while not self.machine.has_left:
            for probe in self.driver.call(self.machine.take_bandwidth_probes):
                self._task_group.start_soon(self._probe, probe.peer, min(probe.nbytes, MAX_PROBE_BYTES))
            await anyio.sleep(CANDIDATE_INTERVAL_S)

    async def _probe(self, peer: PeerID, nbytes: int) -> None:
        """Move ``nbytes`` to ``peer`` once and record the rate (bounded by the request timeout;
        abandoned when a bulk transfer starts)."""
        with anyio.CancelScope() as scope:
            self._probe_scopes.add(scope)
            try:
                with anyio.fail_after(self._host.config.request_timeout_s):
                    connection = await self._host.connection_to(peer, self.machine.dial_addrs(peer))
                    stream = connection.open_stream("probe")
                    try:
                        started = self._clock.now()
                        await stream.send_frame(nbytes)
                        await stream.send(bytes(nbytes), eof=True)
                        await stream.receive_frame()
                        elapsed = self._clock.now() - started
                    finally:
                        if scope.cancel_called:
                            stream.reset()
            except (ChaosError, TimeoutError) as exc:
                log.debug("bandwidth probe to %s failed: %s", peer, exc)
                return
            finally:
                self._probe_scopes.discard(scope)
        if scope.cancelled_caught:
            log.debug("bandwidth probe to %s abandoned: a bulk transfer started", peer)
            return
        if elapsed > 0 and not self.machine.has_left:
            self.record_transfer(peer, nbytes, elapsed, LinkDirection.SEND)

    async def _serve_probe(self, stream: Stream) -> None:
        if self.machine.probes_paused:  # a transfer has this peer's links: the prober asks again later
            stream.reset()
            return
        with anyio.CancelScope() as scope:
            self._probe_scopes.add(scope)
            try:
                await self._receive_probe(stream)
            finally:
                self._probe_scopes.discard(scope)
                if scope.cancel_called:
                    stream.reset()

    async def _receive_probe(self, stream: Stream) -> None:
        announced = await stream.receive_frame()
        if type(announced) is not int or not 0 < announced <= MAX_PROBE_BYTES:
            raise ChaosError(f"bandwidth probe of {announced!r} bytes refused")
        stream.set_receive_window(min(announced, 16 << 20))
        received = 0
        while chunk := await stream.receive_some(1 << 20):
            received += len(chunk)
            if received > announced:
                raise ChaosError("bandwidth probe sent more than it announced")
        await stream.send_frame(received, eof=True)


def local_resources() -> dict[str, Any]:
    """This host's CPU cores, memory and (if torch is already loaded) GPUs."""
    resources: dict[str, Any] = {"cpu_cores": os.cpu_count() or 1}
    try:
        resources["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    torch = sys.modules.get("torch")  # never import torch just to count GPUs: it takes seconds
    if torch is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        resources["gpus"] = count
        resources["gpu_memory_bytes"] = sum(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    return resources
