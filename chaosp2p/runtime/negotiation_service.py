"""The negotiation machine over real connections: training runs whose members agree on changes.

The driver feeds :class:`~chaosp2p.protocols.negotiation.NegotiationMachine` from the host, the way
the membership service feeds SWIM, and adds what only the runtime has: the membership view (a
member that SWIM declares failed or left becomes a FAIL operation; link events become LINK_UP /
LINK_DOWN) and awaitable conditions for the training layer -- "the configuration that governs step
k" (which waits while a pending change gates step k), "admitted", "any change to run R". It makes
no protocol decisions. Operations committed by the run are forwarded to ``peer.events()`` and
logged with their timings.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError, LocalProtocolError, RunRemoved
from chaosp2p.protocols.membership import LinkDown, LinkUp, MemberState, PeerFailed, PeerJoined, PeerLeft
from chaosp2p.protocols.negotiation import (
    Admitted,
    Configuration,
    ConfigurationCommitted,
    JoinRefused,
    NegotiationConfig,
    NegotiationMachine,
    OperationCommitted,
    OperationRejected,
    RemovedFromRun,
    ResyncNeeded,
    RunInfo,
    RunParams,
    RunStatus,
)
from chaosp2p.protocols.negotiation import codec as NEGOTIATION_CODEC
from chaosp2p.protocols.negotiation.link_watch import LinkWatch, LinkWatchConfig
from chaosp2p.runtime.driver import MachineDriver
from chaosp2p.transport.host import Host
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.negotiation")

ROUTINE_REJECTIONS = frozenset({"stale_ballot", "old_epoch", "stale_fail", "unsolicited", "replayed"})
"""Refusals that concurrent proposers and late messages cause all the time (logged at debug)."""
LINK_SETTLE_INTERVALS = 30
"""A link change becomes an operation once it held for this many heartbeat intervals: flapping
heartbeats on a loaded host would otherwise make a new configuration every few steps."""


class NegotiationService:
    """Training runs this peer founded or joined, and the agreed configurations of each."""

    def __init__(
        self,
        *,
        host: Host,
        clock: Clock,
        config: NegotiationConfig,
        rng: random.Random,
        task_group: anyio.abc.TaskGroup,
        publish: Callable[[Any], None],
        resolve: Callable[[PeerID], Sequence[Dialable]],
        link_settle_s: float,
        trusted: Iterable[PeerID] = (),
        link_watch: LinkWatchConfig | None = None,
    ) -> None:
        self._clock = clock
        self._publish = publish
        self.config = config
        self.machine = NegotiationMachine(identity=host.identity, config=config, rng=rng, now=clock.now())
        # A newcomer believes these peers (the operator's bootstrap peers) about a run's
        # configuration, and afterwards only what quorum certificates prove (spec section 6).
        self.machine.trust(trusted)
        self.driver = MachineDriver(
            host=host,
            machine=self.machine,
            codecs={"negotiation": NEGOTIATION_CODEC},
            clock=clock,
            task_group=task_group,
            resolve=resolve,
            on_event=self._on_event,
            name="negotiation",
            # A member behind NAT reaches the others' votes through a relay (issue 21): in a star
            # around one public peer no other member could gather a quorum for its proposals.
            relay=True,
        )
        self._changed = anyio.Event()
        self._run_info: dict[tuple[str, PeerID], RunInfo] = {}
        self._admitted: dict[str, Configuration] = {}
        self._removed: dict[str, tuple[str, int]] = {}  # run -> (reason, first step we are not part of)
        self._resync: dict[str, int] = {}
        self._task_group = task_group
        self._link_settle_s = link_settle_s
        self._link_changes: dict[PeerID, tuple[bool, float, float]] = {}  # peer -> (up, since, rtt)
        self._host = host
        self._resolve = resolve
        self.link_watch = LinkWatch(link_watch)
        """The links this peer declared down first-hand (from failed rounds), probed until they are up."""
        self._gone: set[PeerID] = set()  # peers membership reported failed or left (until they rejoin)

    def start(self) -> None:
        """Start the machine's timers and the link-change settling loop."""
        self.driver.start()
        self._task_group.start_soon(self._settle_links, name="chaosp2p negotiation links")
        self._task_group.start_soon(self._probe_links, name="chaosp2p negotiation link probes")

    # ------------------------------------------------------------------ membership feed
    def observe(self, event: Any) -> None:
        """Feed a membership event (called for every event the node publishes)."""
        if isinstance(event, PeerFailed):
            self._note_gone(event.peer)
            self.driver.call(self.machine.observe_member, event.peer, MemberState.FAILED, event.incarnation)
        elif isinstance(event, PeerLeft):
            self._note_gone(event.peer)
            self.driver.call(self.machine.observe_member, event.peer, MemberState.LEFT, event.incarnation)
        elif isinstance(event, PeerJoined):
            self._gone.discard(event.peer)
            self.driver.call(self.machine.observe_member, event.peer, MemberState.ALIVE, event.incarnation)
        elif isinstance(event, LinkUp):
            self._link_changes[event.peer] = (True, self._clock.now(), event.rtt_s)
        elif isinstance(event, LinkDown):
            self._link_changes[event.peer] = (False, self._clock.now(), 0.0)

    async def _settle_links(self) -> None:
        """Turn link changes that held for ``link_settle_s`` into LINK_UP / LINK_DOWN operations."""
        local = self.machine.local_peer
        while True:
            await anyio.sleep(self._link_settle_s / 2)
            now = self._clock.now()
            for peer, (up, since, rtt) in list(self._link_changes.items()):
                if now - since < self._link_settle_s:
                    continue
                del self._link_changes[peer]
                if up and self.link_watch.is_down(peer):
                    continue  # declared down first-hand: only the probes declare it up (hysteresis)
                self.driver.call(
                    lambda now, p=peer, u=up, r=rtt: self.machine.link_changed(now, local, p, up=u, rtt_s=r)
                )

    # ------------------------------------------------------------------ first-hand link events
    def _note_gone(self, peer: PeerID) -> None:
        if len(self._gone) >= self.config.max_tracked_senders:
            self._gone.pop()  # bounded; forgetting one only allows a LINK_DOWN the machine drops anyway
        self._gone.add(peer)
        self.link_watch.forget(peer)

    def link_failed(self, run: str, peer: PeerID) -> bool:
        """A round of ``run`` could not exchange with ``peer`` (first-hand): LINK_DOWN at once.

        Nothing if membership holds ``peer`` failed or gone (a FAIL is the business of membership),
        or if this peer already declared the link down. True if a LINK_DOWN was raised. Signed by
        this peer, an endpoint of the link; ``protocols/negotiation.md`` section 3d.
        """
        config = self.machine.configuration(run)
        local = self.machine.local_peer
        if peer == local or peer in self._gone or config is None or not config.has_member(peer):
            return False
        self.link_watch.failed(peer, self._clock.now())  # counts the flap, starts the probes
        self._link_changes.pop(peer, None)
        # The machine raises it unless the run already agrees the link is down (a LINK_DOWN lost or
        # still pending is raised again).
        raised = self.driver.call(lambda now: self.machine.link_changed(now, local, peer, up=False))
        if raised:
            log.warning("run %r: no exchange with %s in a round (alive to the others): link declared down", run, peer)
        return bool(raised)

    async def _probe_links(self) -> None:
        """Probe the links declared down first-hand; LINK_UP once one held for its required time."""
        config = self.link_watch.config
        local = self.machine.local_peer
        while True:
            await anyio.sleep(config.probe_interval_s)
            for peer in self.link_watch.to_probe(self._clock.now()):
                ok = await self._probe(peer, config.probe_timeout_s)
                if self.link_watch.probed(peer, self._clock.now(), ok=ok):
                    log.info(
                        "link to %s answered for %.1f s: declaring it up", peer, self.link_watch.required_up_s(peer)
                    )
                    self.driver.call(lambda now, p=peer: self.machine.link_changed(now, local, p, up=True))

    async def _probe(self, peer: PeerID, timeout_s: float) -> bool:
        """One round trip to ``peer`` over a *direct* connection (dialling first if needed).

        Never through a relay: reaching ``peer`` at its relay address says nothing about the link,
        and a LINK_UP from it would put a pair that only a relay joins back into the plan as
        linked (each such step stalled until its round's direct dial timed out)."""
        direct = [addr for addr in self._resolve(peer) if not isinstance(addr, CircuitAddr)]
        with anyio.move_on_after(timeout_s):
            try:
                connection = await self._host.connection_to(peer, direct)
                if connection.relayed:
                    return False
                await connection.ping()
            except ChaosError:
                return False
            return True
        return False

    # ------------------------------------------------------------------ runs
    def create_run(self, run: str, params: RunParams) -> Configuration:
        """Found ``run`` with this peer as its only member (configuration 0, from step 0)."""
        return self.driver.call(lambda now: self.machine.create_run(now, run, params=params))

    def configuration(self, run: str) -> Configuration | None:
        """The newest configuration of ``run`` this peer knows, if it takes part."""
        return self.machine.configuration(run)

    def runs(self) -> list[str]:
        """Runs this peer takes part in."""
        return list(self.machine.runs())

    def report_step(self, run: str, *, entered: int | None = None, completed: int | None = None) -> None:
        """Tell the run which step this peer began (``entered``) or finished (``completed``)."""
        self.driver.call(lambda now: self.machine.report_step(now, run, entered=entered, completed=completed))

    def set_throughput(self, run: str, samples_per_s: float) -> None:
        """Report measured training speed (the run rebalances batch shares when it moved enough)."""
        self.driver.call(self.machine.set_throughput, run, samples_per_s)

    def evict(self, run: str, peer: PeerID) -> bool:
        """Sign an eviction of ``peer`` from ``run`` (its contributions kept failing our checks).

        It takes effect only when a quorum of the run's members signed one. False if nothing was
        signed: ``peer`` is no member, or this peer already signed for its current incarnation.
        """
        if self.machine.configuration(run) is None or run in self._removed:
            return False
        try:
            return self.driver.call(lambda now: self.machine.evict(now, run, peer))
        except LocalProtocolError:  # no longer a member ourselves
            return False

    def stall(self, run: str, peer: PeerID) -> bool:
        """Sign a STALL of ``peer``: it contributed nothing to this peer's round of ``run`` for the
        round's whole bounded wait. It takes effect only with a second member's FAIL or STALL of it.
        False if nothing was signed (``peer`` is no member, or this peer already signed one)."""
        if self.machine.configuration(run) is None or run in self._removed:
            return False
        try:
            return self.driver.call(lambda now: self.machine.stall(now, run, peer))
        except LocalProtocolError:  # no longer a member ourselves
            return False

    def link_changed(self, a: PeerID, b: PeerID, up: bool) -> None:
        """Explicit connect-link / disconnect-link between two members (one of them is this peer)."""
        self.driver.call(lambda now: self.machine.link_changed(now, a, b, up=up))

    def announce_leave(self, run: str) -> bool:
        """Tell the run this peer leaves; False if it is no longer a member anyway.

        The peer stays a member until the run commits the leave at an agreed step: until then it
        must keep taking part in the averaging rounds (the collaboration does, with zero weight).
        """
        if self.machine.configuration(run) is None or run in self._removed:
            return False
        try:
            self.driver.call(self.machine.leave, run)
        except LocalProtocolError:  # no longer a member (removed while we were not looking)
            return False
        return True

    async def leave(self, run: str, *, timeout_s: float) -> bool:
        """Announce that this peer leaves ``run``; wait (bounded) until the run committed it.

        For a peer that does not train (a training member uses the collaboration's ``leave``).
        """
        if not self.announce_leave(run):
            return True
        with anyio.move_on_after(timeout_s):
            while run in self.machine.runs() and run not in self._removed:
                await self.wait_changed()
            return True
        return False

    # ------------------------------------------------------------------ joining
    async def query_run(self, run: str, peer: PeerID, *, timeout_s: float) -> RunInfo:
        """Ask ``peer`` for the current configuration of ``run``."""
        self._run_info.pop((run, peer), None)
        self.driver.call(self.machine.query_run, run, peer)
        with anyio.fail_after(timeout_s):
            while (run, peer) not in self._run_info:
                await self.wait_changed()
        return self._run_info.pop((run, peer))

    async def join(
        self, run: str, sponsor: PeerID, *, incarnation: int, throughput: float, timeout_s: float
    ) -> Configuration:
        """Ask ``sponsor`` to have the run admit this peer; return the configuration that does."""
        self._admitted.pop(run, None)
        self.driver.call(
            lambda now: self.machine.request_join(now, run, sponsor, incarnation=incarnation, throughput=throughput)
        )
        with anyio.fail_after(timeout_s):
            while run not in self._admitted:  # a refusing sponsor is replaced by the machine itself
                await self.wait_changed()
        return self._admitted.pop(run)

    # ------------------------------------------------------------------ stepping
    def governing(self, run: str, step: int) -> Configuration | None:
        """The configuration governing ``step`` now, or None while a pending change gates it."""
        return self.machine.config_for_step(run, step)

    async def configuration_for_step(self, run: str, step: int) -> Configuration:
        """The configuration governing ``step``; waits while a pending change gates it."""
        while True:
            removed = self._removed.get(run)
            if removed is not None and step >= removed[1]:
                raise RunRemoved(f"this peer was removed from run {run!r} from step {removed[1]}: {removed[0]}")
            found = self.machine.config_for_step(run, step)
            if found is not None:
                return found
            await self.wait_changed()

    def take_resync(self, run: str) -> int | None:
        """The step from which this peer's state is known wrong (a commit it had run past), once."""
        return self._resync.pop(run, None)

    def removed_reason(self, run: str) -> str | None:
        """Why this peer was removed from ``run``, if it was."""
        removed = self._removed.get(run)
        return None if removed is None else removed[0]

    def removed_from_step(self, run: str) -> int | None:
        """The first step of ``run`` this peer no longer takes part in, if it was removed."""
        removed = self._removed.get(run)
        return None if removed is None else removed[1]

    def forget_removal(self, run: str) -> None:
        """Clear a removal (before rejoining the run as a newcomer)."""
        self._removed.pop(run, None)

    async def wait_changed(self) -> None:
        """Return at the next negotiation event (bound it with a timeout)."""
        await self._changed.wait()

    def run_status(self) -> list[RunStatus]:
        """One entry per run this peer takes part in (for ``status --json``'s ``runs``)."""
        return [self.machine.run_status(run) for run in self.machine.runs()]

    # ------------------------------------------------------------------ events
    def _on_event(self, event: Any) -> None:
        if isinstance(event, RunInfo):
            self._run_info[(event.run, event.from_peer)] = event
        elif isinstance(event, Admitted):
            self._admitted[event.run] = event.configuration
            log.info("admitted to run %r from step %d", event.run, event.activation_step)
        elif isinstance(event, JoinRefused):
            log.info("joining run %r: %s refused (%s); asking another member", event.run, event.sponsor, event.reason)
        elif isinstance(event, RemovedFromRun):
            self._removed[event.run] = (event.reason, event.activation_step)
            level = logging.INFO if event.reason == "left" else logging.WARNING
            log.log(level, "no longer in run %r from step %d: %s", event.run, event.activation_step, event.reason)
        elif isinstance(event, ResyncNeeded):
            self._resync[event.run] = event.step
            log.warning("run %r: state from step %d must be reloaded", event.run, event.step)
        elif isinstance(event, OperationCommitted):
            log.info(
                "run %r epoch %d: %s %s from step %d (decided in %.1f ms)",
                event.run,
                event.epoch,
                event.kind.name.lower(),
                event.subject,
                event.activation_step,
                (event.committed_at - event.proposed_at) * 1e3,
            )
        elif isinstance(event, OperationRejected):
            level = logging.DEBUG if event.reason in ROUTINE_REJECTIONS else logging.WARNING
            log.log(level, "run %r: refused a message from %s: %s", event.run, event.origin, event.reason)
        elif isinstance(event, ConfigurationCommitted):
            log.debug("run %r: configuration %d committed", event.run, event.configuration.epoch)
        self._publish(event)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
