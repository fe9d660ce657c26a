"""The membership machine: SWIM failure detection, overlay links and the cluster monitor.

Theory of operation
-------------------
Each peer runs one :class:`MembershipMachine`. It keeps a table of members (every peer it has heard
of, itself included), each ALIVE, SUSPECT, FAILED or LEFT at an *incarnation* number that only the
member itself may raise. Three loops drive it, all from ``handle_timeout``:

* **SWIM probing.** Every ``probe_interval_s`` the next member of a shuffled round-robin gets a
  PING. No ACK within ``probe_timeout_s`` starts a *check*: ``indirect_probes`` other members get
  a PING_REQ and probe the target for us, forwarding its ACK (or a NACK when it stays silent). No
  ACK by the end of the check makes the target SUSPECT. A suspicion runs out after a timeout that
  scales with log(n) and shrinks as other peers independently confirm it (Lifeguard); then the
  member is FAILED. A live member that hears it is suspected, failed or left refutes by raising its
  incarnation; the higher incarnation wins everywhere. A LEAVE message removes a member at once.
* **Overlay links.** A bounded set of neighbours (``max_link_degree``), chosen from alive members
  by measured RTT and bandwidth and refreshed periodically, gets a heartbeat PING every
  ``heartbeat_interval_s``. Unanswered heartbeats take a link down (LinkDown) -- this catches a
  stalled peer whose TCP connection stays open -- and an ACK brings it up again (LinkUp). A missed
  heartbeat also starts the same check as a failed SWIM probe, so neighbours detect failures
  first. ``peer_unreachable`` from the driver (connection refused or lost) takes the link down and
  starts the check at once; so does ``connection_lost`` (the member's host closed our last
  connection to it), and that check fails the member as soon as it is conclusive -- the driver
  cannot reach it and every relay answered NACK -- instead of after a suspicion.
* **Dissemination.** Membership updates and info records (resources + link summaries, versioned
  by their owner) wait in transmit-limited queues and ride piggyback on every PING/ACK/PING_REQ,
  plus a GOSSIP message to a few random members when there is news. Every
  ``push_pull_interval_s`` a random member gets a full-state PUSH_PULL, and every
  ``reconnect_interval_s`` a random *failed* member does: that is how the two halves of a healed
  partition find each other again. Joining is a PUSH_PULL with a contact the driver supplies.

Gossip cannot decide. What a member says about itself (ALIVE with its addresses, LEFT, its info
record) carries its signature and is checked once per incarnation; what anyone says about another
member (SUSPECT, DEAD) only makes this peer probe that member itself, and a member fails in this
peer's view only after this peer's own probes went unanswered (``members.py``, ``signing.py``).
Everything a peer sends is rate-limited per sender -- messages and bytes, before decoding
(:meth:`MembershipMachine.admit`), and signature checks -- and checked against configured limits
before it is used; garbage is dropped and counted, never raised. The machine never reads a clock: ``now`` is
always a parameter, and a large gap between calls is taken as a local pause (SIGSTOP, GC, a loaded
CPU), after which in-flight probes are discarded instead of blamed on their targets.

Layout
------
The machine is a core plus one role module per idea, as ``negotiation/`` is: ``core.py`` (shared
tables, timer heap, helpers), ``members.py`` (applying updates, state changes, retention),
``suspicion.py``, ``probing.py``, ``dissemination.py`` and ``overlay.py``; their row types are in
``bookkeeping.py`` and the member state table in ``transitions.py``. This module puts them together:
the public API, and two tables that dispatch each message type and each :class:`~.core.TimerKind`
to the part that handles it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership.bookkeeping import ContactRecord, MemberRecord, check_addrs, check_relay_addrs
from chaosp2p.protocols.membership.core import TimerKind
from chaosp2p.protocols.membership.dissemination import Dissemination
from chaosp2p.protocols.membership.events import (
    BandwidthProbe,
    LinkDirection,
    LinkView,
    Member,
    MembershipEvent,
    MembershipStatistics,
    MemberState,
    Topology,
)
from chaosp2p.protocols.membership.members import MemberTable
from chaosp2p.protocols.membership.messages import (
    PROTOCOL,
    Ack,
    Gossip,
    Leave,
    MembershipMessageType,
    Nack,
    Ping,
    PingReq,
    PushPull,
    PushPullReply,
    Resources,
    peek_type,
)
from chaosp2p.protocols.membership.overlay import Overlay
from chaosp2p.protocols.membership.probing import Probing
from chaosp2p.protocols.membership.suspicion import Suspicion
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message
from chaosp2p.wire.multiaddr import Multiaddr

_ALIVE = MemberState.ALIVE
_LEFT = MemberState.LEFT
_LIVE = (_ALIVE, MemberState.SUSPECT)

_BANDWIDTH_ALPHA = 0.3
_PUSH_PULL = int(MembershipMessageType.PUSH_PULL)
_FULL_STATE = (_PUSH_PULL, int(MembershipMessageType.PUSH_PULL_REPLY))
_FREE_BYTES = 1024  # bodies up to this size are charged to the message budget only


class MembershipMachine(MemberTable, Suspicion, Probing, Dissemination, Overlay):
    """SWIM membership, overlay link detection and cluster monitor, as a sans-I/O machine.

    Implements :class:`~chaosp2p.protocols.base.MessageMachine` for the ``"membership"`` protocol.
    The driver resolves a PeerID to dial with :meth:`addresses`.
    """

    protocols: Sequence[str] = (PROTOCOL,)

    # ================================================================== MessageMachine interface
    def admit(self, now: float, sender: PeerID, body: bytes | memoryview) -> bool:
        """Whether to decode an encoded message at all: the cheap checks, before any decoding.

        The runtime calls this for each datagram before it decodes it (decoding costs about 0.1 s of
        CPU per MiB), then hands admitted messages to :meth:`receive_admitted`. It refuses bodies
        over the size cap of their type and charges the sender's message budget (a PUSH_PULL costs
        ``push_pull_token_cost``) and, for bodies over ``_FREE_BYTES``, its byte budget (smaller
        ones are bounded by the message budget: heartbeats stay one bucket lookup). Refusals are
        counted, never raised.
        """
        if self._left:
            return False
        counters = self._counters
        counters.messages_received += 1
        size = len(body)
        # The type is the array's first item: read it without decoding (fast path: a fixarray).
        kind = body[1] if size > 1 and 0x91 <= body[0] <= 0x9F else peek_type(body)
        cfg = self.config
        cost = 1.0
        if kind in _FULL_STATE:
            cap = cfg.max_push_pull_bytes
            if kind == _PUSH_PULL:
                cost = cfg.push_pull_token_cost
        else:
            cap = cfg.max_datagram_bytes
        if size > cap or sender.raw == self._local_raw:
            counters.rejected_messages += 1
            return False
        if not self._limiter.allow(sender, now, cost) or (
            size > _FREE_BYTES and not self._byte_limiter.allow(sender, now, size)
        ):
            counters.rate_limited += 1
            return False
        return True

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """Handle one decoded message from ``sender``; garbage is counted and dropped, never raised.

        For callers that hand over messages they decoded without asking :meth:`admit` first (the
        simulator, tests): the sender's message budget is charged here.
        """
        if self._left:
            return
        self._note_time(now)
        counters = self._counters
        counters.messages_received += 1
        if protocol != PROTOCOL or sender == self.local_peer:
            counters.rejected_messages += 1
            return
        cost = self.config.push_pull_token_cost if type(message) is PushPull else 1.0
        if not self._limiter.allow(sender, now, cost):
            counters.rate_limited += 1
            return
        self._dispatch(now, sender, message)

    def receive_admitted(self, now: float, sender: PeerID, message: Message) -> None:
        """Handle one message that :meth:`admit` let through (its budgets are already charged)."""
        if not self._left:
            self._note_time(now)
            self._dispatch(now, sender, message)

    def _dispatch(self, now: float, sender: PeerID, message: Message) -> None:
        member = self._members.get(sender)
        if member is None:
            if len(self._strangers) < self.config.max_contacts:
                self._strangers.setdefault(sender, now)
        elif member.introducer is not None:
            self._heard_from(member)
        handler = _HANDLERS.get(type(message))
        if handler is None:
            self._counters.rejected_messages += 1
        else:
            try:
                handler(self, now, sender, message)
            except RemoteProtocolError:
                self._counters.rejected_messages += 1
        if self._links_dirty:
            self._fill_links(now)

    def handle_timeout(self, now: float) -> None:
        """Run every timer due at ``now``."""
        if self._left:
            return
        self._note_time(now)
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, _, kind, key = heapq.heappop(timers)
            _TIMERS[kind](self, now, deadline, key)
        if self._links_dirty:
            self._fill_links(now)

    def next_deadline(self) -> float | None:
        """The earliest timer (possibly a stale one; firing it early is harmless).

        The timeouts of probes and relays answered meanwhile are dropped from the front here
        first: every heartbeat and probe leaves one, and waking up only to find the ACK already
        in cost a wake-up per interval and link set, for nothing."""
        if self._left:
            return None
        timers, probes, relays = self._timers, self._probes, self._relays
        while timers:
            _, _, kind, key = timers[0]
            if (kind in _PROBE_TIMEOUTS and key not in probes) or (kind is TimerKind.RELAY and key not in relays):
                heapq.heappop(timers)
                continue
            return timers[0][0]
        return None

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the queued messages."""
        out, self._outgoing = self._outgoing, []
        return out

    def take_events(self) -> list[MembershipEvent]:
        """Remove and return the events raised since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """The driver could not reach ``peer``: like a failed direct probe, without the wait."""
        if self._left or peer == self.local_peer:
            return
        self._note_time(now)
        self._on_unreachable(now, peer)

    def connection_lost(self, now: float, peer: PeerID) -> None:
        """``peer``'s host closed our last connection to it (EOF or reset, without a goodbye).

        A first-hand hint, never a verdict: it starts a check at once -- a direct PING (the driver
        dials again) and PING_REQs to ``indirect_probes`` relays -- that ends early, with the
        member FAILED, only when the driver could not reach it and every relay answered NACK
        (``probing.py``). Any ACK ends it with the member alive. Call it only when no connection
        to ``peer`` remains open: another open one shows the process alive.
        """
        if self._left or peer == self.local_peer:
            return
        self._note_time(now)
        self._on_connection_lost(now, peer)

    # ================================================================== driver API
    def add_contact(self, now: float, peer: PeerID, addrs: Sequence[str]) -> None:
        """Join (or re-sync) through ``peer`` at ``addrs``: a bootstrap or DHT-discovered peer."""
        self._require_running("add_contact")
        if peer == self.local_peer:
            return
        addrs = tuple(addrs)
        problem = check_addrs(addrs, peer, self.config)
        if problem is not None:
            raise ConfigError(f"contact {peer.short()} rejected: {problem}")
        self._note_time(now)
        if peer not in self._contacts and len(self._contacts) >= self.config.max_contacts:
            raise ConfigError(f"too many pending contacts (max {self.config.max_contacts})")
        contact = ContactRecord(addrs=addrs, attempts=1, next_try=now + self.config.join_retry_interval_s)
        self._contacts[peer] = contact
        self._send_push_pull(now, peer, join=True)
        self._schedule(contact.next_try, TimerKind.JOIN, peer)

    def offer_link_candidates(self, now: float, candidates: Iterable[tuple[PeerID, Sequence[str]]]) -> None:
        """Peers the driver found (e.g. through the DHT) that could become overlay links.

        Unknown ones are contacted (a PUSH_PULL), which makes them members; every alive member is
        a link candidate, ranked by measured RTT and bandwidth at the next link refresh.
        """
        self._require_running("offer_link_candidates")
        for peer, addrs in candidates:
            member = self._members.get(peer)
            if peer == self.local_peer or (member is not None and member.state in _LIVE):
                continue
            if peer in self._contacts or len(self._contacts) >= self.config.max_contacts:
                continue
            if check_addrs(tuple(addrs), peer, self.config) is not None or not addrs:
                self._counters.rejected_updates += 1  # candidates come from the DHT: remote data
                continue
            self.add_contact(now, peer, addrs)

    def set_local_resources(
        self,
        now: float,
        *,
        cpu_cores: int | None = None,
        memory_bytes: int | None = None,
        gpus: int | None = None,
        gpu_memory_bytes: int | None = None,
        train_samples_per_s: float | None = None,
    ) -> None:
        """Publish this peer's resources (figures left as ``None`` keep their previous value)."""
        self._require_running("set_local_resources")
        old = self._resources
        new = Resources(
            cpu_cores=old.cpu_cores if cpu_cores is None else cpu_cores,
            memory_bytes=old.memory_bytes if memory_bytes is None else memory_bytes,
            gpus=old.gpus if gpus is None else gpus,
            gpu_memory_bytes=old.gpu_memory_bytes if gpu_memory_bytes is None else gpu_memory_bytes,
            train_samples_per_s=old.train_samples_per_s if train_samples_per_s is None else float(train_samples_per_s),
        )
        try:
            new.validate()
        except RemoteProtocolError as exc:
            raise ConfigError(str(exc)) from None
        if new != old:
            self._resources = new
            self._publish_info()

    def set_local_relay_addrs(self, now: float, addrs: Sequence[str]) -> None:
        """Announce ``addrs`` (relay addresses naming this peer; empty: none) in a new info version."""
        self._require_running("set_local_relay_addrs")
        addrs = tuple(addrs)
        problem = check_relay_addrs(addrs, self.local_peer, self.config)
        if problem is not None:
            raise ConfigError(f"cannot announce relay addresses {list(addrs)}: {problem}")
        if addrs != self._relay_addrs:
            self._relay_addrs = addrs
            self._publish_info()

    def set_local_addrs(self, now: float, addrs: Sequence[str]) -> None:
        """This peer now listens on ``addrs``: re-announce itself under a new incarnation."""
        self._require_running("set_local_addrs")
        addrs = tuple(addrs)
        problem = check_addrs(addrs, self.local_peer, self.config) if addrs else "no address"
        if problem is not None:
            raise ConfigError(f"local addresses rejected: {problem}")
        if addrs != self._addrs:
            self._addrs = addrs
            self._set_incarnation(now, self._incarnation + 1)

    def record_transfer(
        self, now: float, peer: PeerID, nbytes: int, seconds: float, direction: LinkDirection = LinkDirection.SEND
    ) -> None:
        """Feed one completed transfer with ``peer`` into the estimate of its ``direction``.

        A bandwidth probe measures :attr:`LinkDirection.SEND`; a pull from ``peer`` measures
        :attr:`LinkDirection.RECEIVE`, the direction a later pull from it is planned with.
        """
        if nbytes < 0 or not seconds >= 0:
            raise ConfigError("record_transfer needs nbytes >= 0 and seconds >= 0")
        member = self._members.get(peer)
        if member is None or nbytes < self.config.bandwidth_min_sample_bytes or seconds == 0:
            return
        rate = min(nbytes / seconds, 1e13)
        if direction is LinkDirection.RECEIVE:
            old = member.receive_bandwidth
            member.receive_bandwidth = rate if old is None else old + _BANDWIDTH_ALPHA * (rate - old)
            member.receive_bandwidth_at = now
            return
        if member.bandwidth is None:
            member.bandwidth = rate
        else:
            member.bandwidth += _BANDWIDTH_ALPHA * (rate - member.bandwidth)
        member.bandwidth_at = now

    def bulk_transfer_started(self, now: float) -> None:
        """This peer began a bulk transfer (a pull, or serving one): no bandwidth probe until it ends.

        A probe would share the transfer's (possibly capped) link and slow it down -- 8 MiB is
        0.4 s of a 20 MB/s uplink -- while the transfer's own bytes measure the link anyway. The
        driver also abandons the probes it has in flight (their peers are asked again after
        ``bandwidth_probe_retry_s``).
        """
        del now  # the pause lasts until the matching bulk_transfer_finished, however long
        self._bulk_transfers += 1

    def bulk_transfer_finished(self, now: float) -> None:
        """A bulk transfer begun with :meth:`bulk_transfer_started` ended (completed or not)."""
        del now
        if self._bulk_transfers <= 0:
            raise LocalProtocolError("bulk_transfer_finished without a matching bulk_transfer_started")
        self._bulk_transfers -= 1

    @property
    def probes_paused(self) -> bool:
        """True while a bulk transfer runs: no probe is asked for, sent or served."""
        return self._bulk_transfers > 0

    def take_bandwidth_probes(self, now: float) -> list[BandwidthProbe]:
        """Links that have no (fresh) bandwidth estimate and want a bounded active probe now.

        Each peer is returned at most once per ``bandwidth_probe_retry_s``; the driver moves
        ``nbytes`` and reports the result with :meth:`record_transfer`. None while
        :attr:`probes_paused` (the peers are not marked as asked: they are probed afterwards).
        """
        if self._left or self.probes_paused:
            return []
        cfg = self.config
        wanted: list[BandwidthProbe] = []
        for peer, link in self._links.items():
            member = self._members.get(peer)
            if not link.up or member is None:
                continue
            fresh = member.bandwidth_at is not None and now - member.bandwidth_at < cfg.bandwidth_estimate_max_age_s
            asked = member.bandwidth_asked_at
            if fresh or (asked is not None and now - asked < cfg.bandwidth_probe_retry_s):
                continue
            member.bandwidth_asked_at = now
            wanted.append(BandwidthProbe(peer=peer, nbytes=cfg.bandwidth_probe_bytes))
        return wanted

    def receive_estimate(self, now: float, peer: PeerID) -> float | None:
        """``peer``'s upload to us (bytes/s) as our pulls from it measured it, while fresh; else None.

        Not our probe of it: that measures our uplink, the other direction.
        """
        member = self._members.get(peer)
        if member is None or member.receive_bandwidth_at is None:
            return None
        if now - member.receive_bandwidth_at >= self.config.bandwidth_estimate_max_age_s:
            return None
        return member.receive_bandwidth

    def leave(self, now: float) -> None:
        """Leave gracefully: tell every live member at once; afterwards the machine is inert."""
        self._require_running("leave")
        # Signed, so that those who hear it second-hand believe it: only a member may say it left.
        message = Leave(incarnation=self._incarnation, signature=self._sign_left().signature)
        for member in self._members.values():
            if member.state in _LIVE:
                self._send(member.peer, message)
        self._left = True
        self._timers.clear()

    # ================================================================== read API
    @property
    def incarnation(self) -> int:
        """This peer's current incarnation."""
        return self._incarnation

    @property
    def has_left(self) -> bool:
        """True once :meth:`leave` was called."""
        return self._left

    def addresses(self, peer: PeerID) -> tuple[str, ...]:
        """Where to dial ``peer`` (member or pending contact); empty if unknown."""
        if peer == self.local_peer:
            return self._addrs
        member = self._members.get(peer)
        if member is not None:
            return member.addrs
        contact = self._contacts.get(peer)
        return contact.addrs if contact is not None else ()

    def dial_addrs(self, peer: PeerID) -> tuple[Multiaddr, ...]:
        """:meth:`addresses` parsed, for the driver's address resolver (they were validated on entry)."""
        return tuple(Multiaddr.parse(a) for a in self.addresses(peer))

    def relay_addrs(self, peer: PeerID) -> tuple[CircuitAddr, ...]:
        """The relay addresses ``peer`` announced in its info record (validated on entry), or ours."""
        if peer == self.local_peer:
            texts = self._relay_addrs
        else:
            member = self._members.get(peer)
            texts = member.info.relay_addrs if member is not None and member.info is not None else ()
        return tuple(CircuitAddr.parse(a) for a in texts)

    def state_of(self, peer: PeerID) -> MemberState | None:
        """``peer``'s state in our view (cheap: no snapshot), or ``None`` if unknown."""
        if peer == self.local_peer:
            return _LEFT if self._left else _ALIVE
        m = self._members.get(peer)
        return None if m is None else m.state

    def member(self, peer: PeerID) -> Member | None:
        """One member's view, or ``None`` if unknown (or forgotten)."""
        if peer == self.local_peer:
            return self._self_view()
        m = self._members.get(peer)
        return None if m is None else self._view(m)

    def members(self) -> tuple[Member, ...]:
        """Every member we know (the local peer first, then by PeerID), in any state."""
        others = sorted(self._members.values(), key=lambda m: m.peer)
        return (self._self_view(), *(self._view(m) for m in others))

    def links(self) -> tuple[LinkView, ...]:
        """This peer's overlay links with their current measurements."""
        out = []
        for peer in sorted(self._links):
            link = self._links[peer]
            member = self._members.get(peer)
            out.append(
                LinkView(
                    source=self.local_peer,
                    target=peer,
                    up=link.up,
                    rtt_s=None if member is None else member.rtt_s,
                    bandwidth_bytes_per_s=None if member is None else member.bandwidth,
                    receive_bytes_per_s=None if member is None else member.receive_bandwidth,
                )
            )
        return tuple(out)

    def topology(self) -> Topology:
        """Live nodes with their resources, and every live node's reported links (ours measured now)."""
        nodes = [self._self_view()]
        links = list(self.links())
        for m in sorted(self._members.values(), key=lambda m: m.peer):
            if m.state not in _LIVE:
                continue
            nodes.append(self._view(m))
            if m.info is None:
                continue
            for summary in m.info.links:
                links.append(
                    LinkView(
                        source=m.peer,
                        target=summary.peer,
                        up=summary.up,
                        rtt_s=summary.rtt_s or None,
                        bandwidth_bytes_per_s=summary.bandwidth_bytes_per_s or None,
                    )
                )
        return Topology(nodes=tuple(nodes), links=tuple(links))

    def statistics(self) -> MembershipStatistics:
        """Counters since start (rate limiting, rejections, probes, suspicions, ...)."""
        c = self._counters
        return MembershipStatistics(
            messages_received=c.messages_received,
            messages_sent=c.messages_sent,
            rate_limited=c.rate_limited,
            rejected_messages=c.rejected_messages,
            rejected_updates=c.rejected_updates,
            ignored_unknown=c.ignored_unknown,
            probes_sent=c.probes_sent,
            indirect_probes_sent=c.indirect_probes_sent,
            probes_failed=c.probes_failed,
            suspicions_raised=c.suspicions_raised,
            suspicions_refuted=c.suspicions_refuted,
            refutations=c.refutations,
            failures_declared=c.failures_declared,
            late_acks=c.late_acks,
            nacks_received=c.nacks_received,
            push_pulls_sent=c.push_pulls_sent,
            push_pulls_received=c.push_pulls_received,
            local_pauses=c.local_pauses,
            awareness=self._awareness,
            bad_signatures=c.bad_signatures,
            signatures_verified=c.signatures_verified,
            verify_limited=c.verify_limited,
            hints_checked=c.hints_checked,
            connection_losses=c.connection_losses,
            failures_on_loss=c.failures_on_loss,
            ignored_from_strangers=c.ignored_from_strangers,
            evicted_unvouched=c.evicted_unvouched,
        )

    # ================================================================== views
    def _self_view(self) -> Member:
        return Member(
            peer_id=self.local_peer,
            state=_LEFT if self._left else _ALIVE,
            incarnation=self._incarnation,
            addrs=self._addrs,
            resources=self._resources,
            info_version=self._info_version,
            last_change_s=self._started,
            is_local=True,
        )

    def _view(self, m: MemberRecord) -> Member:
        return Member(
            peer_id=m.peer,
            state=m.state,
            incarnation=m.incarnation,
            addrs=m.addrs,
            resources=None if m.info is None else m.info.resources,
            info_version=-1 if m.info is None else m.info.version,
            last_change_s=m.since,
        )


__all__ = ["MembershipMachine", "check_addrs"]


_MessageHandler = Callable[[MembershipMachine, float, PeerID, Any], None]
_TimerHandler = Callable[[MembershipMachine, float, float, Any], None]

_HANDLERS: dict[type[Message], _MessageHandler] = {
    Ping: Probing._on_ping,
    Ack: Probing._on_ack,
    Gossip: Dissemination._on_gossip,
    PingReq: Probing._on_ping_req,
    Nack: Probing._on_nack,
    PushPull: Dissemination._on_push_pull,
    PushPullReply: Dissemination._on_push_pull_reply,
    Leave: MemberTable._on_leave,
}
"""The handler of each message type: ``handler(machine, now, sender, message)``. Plain functions in
a module-level table, not bound methods kept on each machine (that made every machine a reference
cycle, which only the cyclic garbage collector frees; simulations drop many machines)."""

_PROBE_TIMEOUTS = (TimerKind.DIRECT, TimerKind.CHECK_END)
"""Timers keyed by a probe's seq that do nothing once the probe is answered (gone from _probes)."""

_TIMERS: dict[TimerKind, _TimerHandler] = {
    TimerKind.PROBE: Probing._tick_probe,
    TimerKind.HEARTBEAT: Overlay._tick_heartbeat,
    TimerKind.GOSSIP: Dissemination._tick_gossip,
    TimerKind.PUSH_PULL: Dissemination._tick_push_pull,
    TimerKind.RECONNECT: Dissemination._tick_reconnect,
    TimerKind.LINKS: Overlay._tick_links,
    TimerKind.INFO: Overlay._tick_info,
    TimerKind.SWEEP: MemberTable._tick_sweep,
    TimerKind.DIRECT: Probing._on_direct_timeout,
    TimerKind.CHECK_END: Probing._on_check_end,
    TimerKind.RELAY: Probing._on_relay_timeout,
    TimerKind.SUSPICION: Suspicion._on_suspicion_timeout,
    TimerKind.JOIN: Dissemination._retry_join,
}
"""The handler of each timer kind: ``handler(machine, now, deadline, key)``, ``key`` as armed (see
:class:`~.core.TimerKind`). A periodic handler arms its own next round."""
