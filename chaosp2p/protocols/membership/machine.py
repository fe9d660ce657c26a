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
  starts the check at once.
* **Dissemination.** Membership updates and info records (resources + link summaries, versioned
  by their owner) wait in transmit-limited queues and ride piggyback on every PING/ACK/PING_REQ,
  plus a GOSSIP message to a few random members when there is news. Every
  ``push_pull_interval_s`` a random member gets a full-state PUSH_PULL, and every
  ``reconnect_interval_s`` a random *failed* member does: that is how the two halves of a healed
  partition find each other again. Joining is a PUSH_PULL with a contact the driver supplies.

Everything a peer sends is rate-limited per sender and checked against configured limits before it
is used; garbage is dropped and counted, never raised. The machine never reads a clock: ``now`` is
always a parameter, and a large gap between calls is taken as a local pause (SIGSTOP, GC, a loaded
CPU), after which in-flight probes are discarded instead of blamed on their targets.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership.config import MAX_INCARNATION, MembershipConfig
from chaosp2p.protocols.membership.events import (
    BandwidthProbe,
    LinkDown,
    LinkUp,
    LinkView,
    Member,
    MembershipEvent,
    MembershipStatistics,
    MemberState,
    PeerAlive,
    PeerFailed,
    PeerJoined,
    PeerLeft,
    PeerSuspected,
    Topology,
)
from chaosp2p.protocols.membership.gossip import BroadcastQueue
from chaosp2p.protocols.membership.links import LinkMetrics, plan_links
from chaosp2p.protocols.membership.messages import (
    PROTOCOL,
    Ack,
    Gossip,
    InfoUpdate,
    Leave,
    LinkSummary,
    MemberUpdate,
    Nack,
    Ping,
    PingReq,
    PushPull,
    PushPullReply,
    Resources,
    UpdateKind,
)
from chaosp2p.protocols.membership.records import (
    CHECK,
    HEARTBEAT,
    PROBE,
    ContactRecord,
    Counters,
    LinkRecord,
    MemberRecord,
    ProbeRecord,
    RelayRecord,
    SuspicionRecord,
    check_addrs,
    info_size,
    member_hash,
    update_size,
)
from chaosp2p.protocols.membership.state import transition
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message
from chaosp2p.wire.multiaddr import Multiaddr

_ALIVE = MemberState.ALIVE
_SUSPECT = MemberState.SUSPECT
_FAILED = MemberState.FAILED
_LEFT = MemberState.LEFT
_LIVE = (_ALIVE, _SUSPECT)

# Timer kinds (heap entries are (deadline, sequence, kind, key)).
_T_PROBE, _T_HEARTBEAT, _T_GOSSIP, _T_PUSH_PULL, _T_RECONNECT, _T_LINKS, _T_INFO, _T_SWEEP = range(8)
_T_DIRECT, _T_CHECK_END, _T_RELAY, _T_SUSPICION, _T_JOIN = range(8, 13)


_RTT_ALPHA = 0.125  # TCP's SRTT gain
_BANDWIDTH_ALPHA = 0.3
_INFO_CHANGE = 0.25  # republish link summaries when a figure moved by a quarter...
_INFO_RTT_FLOOR_S = 0.001  # ...and an RTT by a millisecond at least (LAN RTTs jitter by more than 25 %)
_PUSH_PULL_EXPIRY_S_MULT = 4.0
_DIGEST_QUIETPROBES = 2  # our view must have been stable this many probe intervals before a digest sync
_LINK_SAMPLE_MULT = 8  # link candidates sampled per refresh, per link slot
_UPDATE_SIZE_ESTIMATE = 100  # bytes of one piggybacked update with one address, for the info budget


class MembershipMachine:
    """SWIM membership, overlay link detection and cluster monitor, as a sans-I/O machine.

    Implements :class:`~chaosp2p.protocols.base.MessageMachine` for the ``"membership"`` protocol.
    The driver resolves a PeerID to dial with :meth:`addresses`.
    """

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(
        self,
        *,
        local_peer: PeerID,
        addrs: Sequence[str],
        config: MembershipConfig,
        rng: random.Random,
        now: float,
        incarnation: int = 0,
        resources: Resources | None = None,
    ) -> None:
        addrs = tuple(addrs)
        problem = check_addrs(addrs, local_peer, config) if addrs else "no address"
        if problem is not None:
            raise ConfigError(f"local addresses rejected: {problem}")
        if not 0 <= incarnation < MAX_INCARNATION:
            raise ConfigError(f"incarnation out of range: {incarnation}")
        self.local_peer = local_peer
        self.config = config
        self._rng = rng
        self._addrs = addrs
        self._incarnation = incarnation
        self._resources = resources or Resources()
        if resources is not None:
            self._resources.validate()
        self._info_version = 0
        self._left = False
        self._started = now
        self._last_now = now

        self._members: dict[PeerID, MemberRecord] = {}
        self._live_count = 0  # ALIVE + SUSPECT, not counting ourselves
        self._alive_cache: list[PeerID] | None = None
        self._probe_order: list[PeerID] = []
        self._probe_index = 0
        self._suspicions: dict[PeerID, SuspicionRecord] = {}
        self._probes: dict[int, ProbeRecord] = {}
        self._checks: dict[PeerID, int] = {}
        self._relays: dict[int, RelayRecord] = {}
        self._links: dict[PeerID, LinkRecord] = {}
        self._published_links: tuple[LinkSummary, ...] = ()
        self._links_dirty = False
        self._contacts: dict[PeerID, ContactRecord] = {}
        self._hints: dict[PeerID, MemberUpdate] = {}
        self._verified: dict[PeerID, int] = {}
        self._strangers: dict[PeerID, float] = {}
        self._told_stale: dict[PeerID, float] = {}
        self._push_pulls: dict[int, tuple[PeerID, float]] = {}
        self._seq = rng.randrange(1 << 32)
        self._awareness = 0
        self._digest = 0
        self._digest_changed_at = now
        self._last_digest_sync = -math.inf
        self._digest_toggle(now, local_peer, incarnation)
        # The same over (peer, info version) of live members with info: the monitor's view.
        self._info_digest = member_hash(local_peer, 0)
        self._info_digest_changed_at = now

        self._updates: BroadcastQueue[MemberUpdate] = BroadcastQueue()
        self._infos: BroadcastQueue[InfoUpdate] = BroadcastQueue()
        self._limiter = RateLimiter(
            rate_per_s=config.rate_limit_msgs_per_s,
            burst=config.rate_limit_burst,
            max_senders=config.max_tracked_senders,
        )
        self._outgoing: list[Outgoing] = []
        self._events: list[MembershipEvent] = []
        self._counters = Counters()

        self._timers: list[tuple[float, int, int, Any]] = []
        self._timer_seq = 0
        c = config
        for kind, interval in (
            (_T_PROBE, c.probe_interval_s),
            (_T_HEARTBEAT, c.heartbeat_interval_s),
            (_T_GOSSIP, c.gossip_interval_s),
            (_T_PUSH_PULL, c.push_pull_interval_s),
            (_T_RECONNECT, c.reconnect_interval_s),
            (_T_LINKS, c.link_refresh_interval_s),
            (_T_INFO, c.info_report_interval_s),
            (_T_SWEEP, self._sweep_interval()),
        ):
            # Random phases keep a swarm started at one instant from probing in lockstep.
            self._schedule(now + rng.uniform(0.0, interval), kind, None)
        self._queue_update(self._self_record())
        self._infos.put(local_peer.raw, self._self_info(), info_size(self._self_info()))

    # ================================================================== MessageMachine interface
    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """Handle one message from ``sender``; garbage is counted and dropped, never raised."""
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
        if sender not in self._members and len(self._strangers) < self.config.max_contacts:
            self._strangers.setdefault(sender, now)
        try:
            if isinstance(message, Ping):
                self._on_ping(now, sender, message)
            elif isinstance(message, Ack):
                self._on_ack(now, sender, message)
            elif isinstance(message, Gossip):
                self._apply_piggyback(now, sender, message.updates, message.infos)
            elif isinstance(message, PingReq):
                self._on_ping_req(now, sender, message)
            elif isinstance(message, Nack):
                self._on_nack(sender, message)
            elif isinstance(message, PushPull):
                self._on_push_pull(now, sender, message)
            elif isinstance(message, PushPullReply):
                self._on_push_pull_reply(now, sender, message)
            elif isinstance(message, Leave):
                self._on_leave(now, sender, message)
            else:
                counters.rejected_messages += 1
        except RemoteProtocolError:
            counters.rejected_messages += 1
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
            self._fire(now, deadline, kind, key)
        if self._links_dirty:
            self._fill_links(now)

    def next_deadline(self) -> float | None:
        """The earliest timer (possibly a stale one; firing it early is harmless)."""
        if self._left or not self._timers:
            return None
        return self._timers[0][0]

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
        relayed = False
        for seq, relay in list(self._relays.items()):
            if relay.target == peer:
                del self._relays[seq]
                self._send(relay.requester, Nack(seq=relay.request_seq))
                relayed = True
        link = self._links.get(peer)
        if link is not None:
            link.missed = max(link.missed, self.config.link_down_after_missed)
            if link.up:
                self._link_down(now, link, "unreachable")
        member = self._members.get(peer)
        if member is None or relayed:
            # (A relay's failure is the requester's check; starting our own would cascade.)
            return
        if member.state is _ALIVE and peer not in self._checks:
            seq = self._next_seq()
            probe = ProbeRecord(seq=seq, target=peer, sent_at=now, purpose=CHECK)
            self._probes[seq] = probe
            # The peer may have restarted on the same address: a direct PING costs nothing.
            updates, infos = self._piggyback(peer)
            self._send(peer, Ping(seq=seq, updates=updates, infos=infos))
            self._start_check(now, probe)
        elif member.state is _SUSPECT:
            self._confirm(now, member, self.local_peer)

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
        self._schedule(contact.next_try, _T_JOIN, peer)

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

    def set_local_addrs(self, now: float, addrs: Sequence[str]) -> None:
        """This peer now listens on ``addrs``: re-announce itself under a new incarnation."""
        self._require_running("set_local_addrs")
        addrs = tuple(addrs)
        problem = check_addrs(addrs, self.local_peer, self.config) if addrs else "no address"
        if problem is not None:
            raise ConfigError(f"local addresses rejected: {problem}")
        if addrs != self._addrs:
            self._addrs = addrs
            self._digest_toggle(now, self.local_peer, self._incarnation)
            self._incarnation += 1
            self._digest_toggle(now, self.local_peer, self._incarnation)
            self._queue_update(self._self_record())

    def record_transfer(self, now: float, peer: PeerID, nbytes: int, seconds: float) -> None:
        """Feed one completed transfer with ``peer`` into its bandwidth estimate."""
        if nbytes < 0 or not seconds >= 0:
            raise ConfigError("record_transfer needs nbytes >= 0 and seconds >= 0")
        member = self._members.get(peer)
        if member is None or nbytes < self.config.bandwidth_min_sample_bytes or seconds == 0:
            return
        rate = min(nbytes / seconds, 1e13)
        if member.bandwidth is None:
            member.bandwidth = rate
        else:
            member.bandwidth += _BANDWIDTH_ALPHA * (rate - member.bandwidth)
        member.bandwidth_at = now

    def take_bandwidth_probes(self, now: float) -> list[BandwidthProbe]:
        """Links that have no (fresh) bandwidth estimate and want a bounded active probe now.

        Each peer is returned at most once per ``bandwidth_probe_retry_s``; the driver moves
        ``nbytes`` and reports the result with :meth:`record_transfer`.
        """
        if self._left:
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

    def leave(self, now: float) -> None:
        """Leave gracefully: tell every live member at once; afterwards the machine is inert."""
        self._require_running("leave")
        message = Leave(incarnation=self._incarnation)
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
        )

    # ================================================================== message handlers
    def _on_ping(self, now: float, sender: PeerID, msg: Ping) -> None:
        self._apply_piggyback(now, sender, msg.updates, msg.infos)
        updates, infos = self._piggyback(sender)
        self._send(sender, Ack(seq=msg.seq, updates=updates, infos=infos))
        if msg.digest:
            self._check_digest(now, sender, msg.digest, msg.info_digest)

    def _on_ack(self, now: float, sender: PeerID, msg: Ack) -> None:
        self._apply_piggyback(now, sender, msg.updates, msg.infos)
        seq = msg.seq
        relay = self._relays.get(seq)
        if relay is not None:
            if sender != relay.target:
                return
            del self._relays[seq]
            updates, infos = self._piggyback(relay.requester)
            self._send(relay.requester, Ack(seq=relay.request_seq, updates=updates, infos=infos))
            return
        probe = self._probes.get(seq)
        if probe is None:
            self._counters.late_acks += 1
            return
        target = probe.target
        if sender == target:
            self._on_direct_ack(now, probe)
        elif sender not in probe.relays:
            return
        # The target answered (directly or through a relay): every pending check on it is moot.
        del self._probes[seq]
        check = self._checks.pop(target, None)
        if check is not None and check != seq:
            self._probes.pop(check, None)

    def _on_direct_ack(self, now: float, probe: ProbeRecord) -> None:
        target = probe.target
        member = self._members.get(target)
        if member is not None:
            sample = now - probe.sent_at
            member.rtt_s = sample if member.rtt_s is None else member.rtt_s + _RTT_ALPHA * (sample - member.rtt_s)
        link = self._links.get(target)
        if link is not None:
            link.missed = 0
            if not link.up:
                link.up = True
                link.since = now
                rtt = member.rtt_s if member is not None and member.rtt_s is not None else now - probe.sent_at
                self._events.append(LinkUp(at=now, peer=target, rtt_s=rtt))
        if probe.purpose == PROBE and self._awareness > 0:
            self._awareness -= 1

    def _on_nack(self, sender: PeerID, msg: Nack) -> None:
        probe = self._probes.get(msg.seq)
        if probe is not None and sender in probe.relays:
            probe.nacks += 1
            self._counters.nacks_received += 1

    def _on_ping_req(self, now: float, sender: PeerID, msg: PingReq) -> None:
        self._apply_piggyback(now, sender, msg.updates, msg.infos)
        target = msg.target
        if target == self.local_peer or target == sender or len(self._relays) >= self.config.max_pending_relays:
            self._counters.rejected_messages += 1
            return
        seq = self._next_seq()
        self._relays[seq] = RelayRecord(requester=sender, request_seq=msg.seq, target=target)
        updates, infos = self._piggyback(target)
        self._send(target, Ping(seq=seq, updates=updates, infos=infos))
        self._schedule(now + self._probe_timeout(), _T_RELAY, seq)

    def _on_push_pull(self, now: float, sender: PeerID, msg: PushPull) -> None:
        self._counters.push_pulls_received += 1
        self._merge_state(now, sender, msg.members, msg.infos)
        members, infos = self._state_snapshot(with_infos=bool(msg.infos))
        self._send(sender, PushPullReply(seq=msg.seq, members=members, infos=infos))

    def _on_push_pull_reply(self, now: float, sender: PeerID, msg: PushPullReply) -> None:
        pending = self._push_pulls.pop(msg.seq, None)
        if pending is None or pending[0] != sender:
            if pending is not None:
                self._push_pulls[msg.seq] = pending
            self._counters.rejected_messages += 1
            return
        self._contacts.pop(sender, None)
        self._merge_state(now, sender, msg.members, msg.infos)

    def _on_leave(self, now: float, sender: PeerID, msg: Leave) -> None:
        update = MemberUpdate(kind=UpdateKind.LEFT, peer=sender, incarnation=msg.incarnation)
        self._apply_update(now, sender, update, merging=False)

    # ================================================================== applying updates
    def _apply_piggyback(
        self, now: float, sender: PeerID, updates: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]
    ) -> None:
        # More items than we accept: use the first ones, count the rest as rejected, and still
        # answer the message -- a peer configured differently must not look dead to us.
        cfg = self.config
        excess = max(0, len(updates) - cfg.max_gossip_items_per_message)
        excess += max(0, len(infos) - cfg.max_info_items_per_message)
        if excess:
            self._counters.rejected_updates += excess
            updates = updates[: cfg.max_gossip_items_per_message]
            infos = infos[: cfg.max_info_items_per_message]
        for update in updates:
            self._apply_update(now, sender, update, merging=False)
        for info in infos:
            self._apply_info(now, sender, info)

    def _merge_state(
        self, now: float, sender: PeerID, members: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]
    ) -> None:
        cap = self.config.max_push_pull_members
        excess = max(0, len(members) - cap) + max(0, len(infos) - cap)
        if excess:
            self._counters.rejected_updates += excess
            members, infos = members[:cap], infos[:cap]
        for update in members:
            self._apply_update(now, sender, update, merging=True)
        for info in infos:
            self._apply_info(now, sender, info)

    def _apply_update(self, now: float, sender: PeerID, update: MemberUpdate, *, merging: bool) -> None:
        counters = self._counters
        peer = update.peer
        incarnation = update.incarnation
        member = self._members.get(peer)
        if member is not None and type(incarnation) is int:
            # Fast path: most gossip is news we already hold (every update arrives many times).
            if incarnation < member.incarnation:
                return
            if incarnation == member.incarnation and update.kind is member.record.kind:
                if update.kind is not UpdateKind.SUSPECT:
                    return
                suspicion = self._suspicions.get(peer)
                if (
                    suspicion is None
                    or len(suspicion.confirmers) > suspicion.k
                    or (update.origin or sender) in suspicion.confirmers
                ):
                    return
        if type(incarnation) is not int or not 0 <= incarnation <= MAX_INCARNATION:
            counters.rejected_updates += 1
            return
        if peer == self.local_peer:
            self._about_me(update, sender)
            return
        kind = update.kind
        if (
            member is not None
            and member.state is _ALIVE
            and kind in (UpdateKind.SUSPECT, UpdateKind.DEAD)
            and incarnation >= member.incarnation
            and (merging or self._cut_off(now, update.origin or sender))
        ):
            self._verify(now, member, update)
            return
        if (
            merging
            and member is not None
            and member.state is _FAILED
            and kind is UpdateKind.ALIVE
            and incarnation == member.incarnation
        ):
            self._verify_failed(now, member)
            return
        if member is None:
            if kind is not UpdateKind.ALIVE:
                counters.ignored_unknown += 1
                return
            if check_addrs(update.addrs, peer, self.config) is not None or not update.addrs:
                counters.rejected_updates += 1
                return
            if len(self._members) >= self.config.max_members and not self._evict_one():
                counters.rejected_updates += 1
                return
            self._add_member(now, update)
            return
        new_state = transition(member.state, member.incarnation, kind, incarnation)
        if new_state is None:
            return
        if incarnation - member.incarnation > self.config.max_incarnation_jump and sender != peer:
            counters.rejected_updates += 1
            return
        if kind is UpdateKind.ALIVE:
            if not update.addrs or check_addrs(update.addrs, peer, self.config) is not None:
                counters.rejected_updates += 1
                return
            self._set_alive(now, member, incarnation, update.addrs)
        elif kind is UpdateKind.SUSPECT:
            origin = update.origin or sender
            if member.state is _SUSPECT and incarnation == member.incarnation:
                self._confirm(now, member, origin)
            else:
                self._suspect(now, member, incarnation, origin)
        elif kind is UpdateKind.DEAD:
            self._fail(now, member, incarnation, update.origin or sender)
        else:
            self._set_left(now, member, incarnation)

    def _cut_off(self, now: float, origin: PeerID) -> bool:
        # A verdict reached by a peer we hold failed, or held failed until moments ago, may have
        # been reached without us: typically the other half of a partition that just healed,
        # whose gossip queues still hold its verdicts on our half.
        member = self._members.get(origin)
        if member is None:
            return False
        if member.state is _FAILED:
            return True
        if member.revived_at is None:
            return False
        window = self.config.suspicion_min_s(self._live_count + 1) * self.config.suspicion_max_timeout_mult
        return now - member.revived_at < window

    def _verify(self, now: float, member: MemberRecord, claim: MemberUpdate) -> None:
        # A full-state sync says a member we hold alive is suspect or dead. That state may be stale
        # (after a partition heals each half holds the other as dead), so instead of believing it we
        # probe the member ourselves -- a silent member gets suspected the usual way -- and pass the
        # claim on to it so that a live member refutes it for everyone.
        peer = member.peer
        if self._verified.get(peer) == member.incarnation:
            return
        self._verified[peer] = member.incarnation
        self._hints[peer] = MemberUpdate(kind=claim.kind, peer=peer, incarnation=claim.incarnation)
        if peer not in self._checks:
            self._ping(now, peer, PROBE)

    def _verify_failed(self, now: float, member: MemberRecord) -> None:
        # The converse: someone's full state holds alive a member we declared failed, at the same
        # incarnation -- typically the other half of a healed partition. Ping it: our PING tells it
        # that we hold it dead, a live member refutes in its ACK, and we gossip it back to life.
        peer = member.peer
        if self._verified.get(peer) == member.incarnation:
            return
        self._verified[peer] = member.incarnation
        self._ping(now, peer, PROBE)

    def _digest_toggle(self, now: float, peer: PeerID, incarnation: int) -> None:
        # The digest is the XOR of a hash of (peer, incarnation) over live members, ourselves
        # included: identical views have identical digests, and updating it costs one hash.
        self._digest ^= member_hash(peer, incarnation)
        self._digest_changed_at = now

    def _check_digest(self, now: float, sender: PeerID, digest: int, info_digest: int) -> None:
        # A prober's view differs from ours while ours has been quiet for a while: one of us missed
        # some gossip (the epidemic has a tail). Exchange full state, at most once per interval.
        cfg = self.config
        if now - self._last_digest_sync < cfg.digest_sync_interval_s:
            return
        quiet = _DIGEST_QUIETPROBES * cfg.probe_interval_s
        members_differ = digest != self._digest and now - self._digest_changed_at >= quiet
        infos_differ = (
            info_digest != 0 and info_digest != self._info_digest and now - self._info_digest_changed_at >= quiet
        )
        if not (members_differ or infos_differ):
            return
        self._last_digest_sync = now
        self._send_push_pull(now, sender, join=False)

    def _about_me(self, update: MemberUpdate, sender: PeerID) -> None:
        if update.kind is UpdateKind.ALIVE:
            stale = update.incarnation < self._incarnation or (
                update.incarnation == self._incarnation and update.addrs == self._addrs
            )
            if stale:
                return
        elif update.incarnation < self._incarnation:
            # The sender still holds an old verdict about us that our refutation never reached
            # (gossip has a tail): answer it directly with our current record.
            if self._told_stale.get(sender, -1.0) + self.config.probe_interval_s <= self._last_now:
                self._told_stale[sender] = self._last_now
                self._send(sender, Gossip(updates=(self._self_record(),)))
            return
        if update.incarnation + 1 >= MAX_INCARNATION:
            self._counters.rejected_updates += 1
            return
        # Someone believes we are suspect, dead, gone, or somewhere else: out-bid that belief.
        self._digest_toggle(self._last_now, self.local_peer, self._incarnation)
        self._incarnation = update.incarnation + 1
        self._digest_toggle(self._last_now, self.local_peer, self._incarnation)
        self._counters.refutations += 1
        self._queue_update(self._self_record())

    def _apply_info(self, now: float, sender: PeerID, info: InfoUpdate) -> None:
        counters = self._counters
        version = info.version
        member = self._members.get(info.peer)
        if member is not None and member.info is not None and type(version) is int and version <= member.info.version:
            return  # fast path: old news
        if type(version) is not int or not 0 <= version <= MAX_INCARNATION:
            counters.rejected_updates += 1
            return
        peer = info.peer
        if peer == self.local_peer:
            if version >= self._info_version and version + 1 < MAX_INCARNATION and info != self._self_info():
                self._publish_info(past=version)
            return
        if member is None:
            counters.ignored_unknown += 1
            return
        if member.info is not None and version <= member.info.version:
            return
        if len(info.links) > self.config.max_links_per_info:
            counters.rejected_updates += 1
            return
        try:
            info.resources.validate()
            for summary in info.links:
                summary.validate()
        except RemoteProtocolError:
            counters.rejected_updates += 1
            return
        member.info = info
        new_hash = member_hash(peer, version)
        if member.state in _LIVE:
            self._info_digest ^= member.info_hash ^ new_hash
            self._info_digest_changed_at = now
        member.info_hash = new_hash
        self._infos.put(peer.raw, info, info_size(info))

    # ================================================================== state changes
    def _add_member(self, now: float, update: MemberUpdate) -> None:
        peer = update.peer
        record = MemberUpdate(kind=UpdateKind.ALIVE, peer=peer, incarnation=update.incarnation, addrs=update.addrs)
        member = MemberRecord(
            peer=peer, state=_ALIVE, incarnation=update.incarnation, addrs=update.addrs, since=now, record=record
        )
        self._members[peer] = member
        self._live_count += 1
        self._digest_toggle(now, peer, update.incarnation)
        self._alive_cache = None
        order = self._probe_order
        order.insert(self._rng.randint(self._probe_index, len(order)), peer)
        self._queue_update(record)
        self._events.append(PeerJoined(at=now, peer=peer, incarnation=update.incarnation, addrs=update.addrs))
        self._links_dirty = True

    def _set_state(self, now: float, member: MemberRecord, state: MemberState, incarnation: int) -> None:
        was_live = member.state in _LIVE
        is_live = state in _LIVE
        if was_live != is_live:
            self._live_count += 1 if is_live else -1
        if was_live != is_live or (is_live and incarnation != member.incarnation):
            if was_live:
                self._digest_toggle(now, member.peer, member.incarnation)
            if is_live:
                self._digest_toggle(now, member.peer, incarnation)
        if was_live != is_live and member.info_hash:
            self._info_digest ^= member.info_hash
            self._info_digest_changed_at = now
        if member.state is not state:
            self._alive_cache = None
            member.since = now
        member.state = state
        member.incarnation = incarnation
        if state is not _SUSPECT:
            self._suspicions.pop(member.peer, None)
            member.suspected_at = None if state is _ALIVE else member.suspected_at

    def _set_alive(self, now: float, member: MemberRecord, incarnation: int, addrs: tuple[str, ...]) -> None:
        previous = member.state
        self._set_state(now, member, _ALIVE, incarnation)
        member.addrs = addrs
        member.record = MemberUpdate(kind=UpdateKind.ALIVE, peer=member.peer, incarnation=incarnation, addrs=addrs)
        self._queue_update(member.record)
        if previous is _SUSPECT:
            self._counters.suspicions_refuted += 1
            self._events.append(PeerAlive(at=now, peer=member.peer, incarnation=incarnation))
        elif previous is not _ALIVE:
            member.revived_at = now
            order = self._probe_order
            order.insert(self._rng.randint(self._probe_index, len(order)), member.peer)
            self._events.append(PeerJoined(at=now, peer=member.peer, incarnation=incarnation, addrs=addrs))
            self._links_dirty = True

    def _suspect(self, now: float, member: MemberRecord, incarnation: int, origin: PeerID) -> None:
        was_suspect = member.state is _SUSPECT
        self._set_state(now, member, _SUSPECT, incarnation)
        if not was_suspect:
            member.suspected_at = now
            self._events.append(PeerSuspected(at=now, peer=member.peer, incarnation=incarnation))
        cfg = self.config
        n = self._live_count + 1
        min_s = cfg.suspicion_min_s(n)
        suspicion = SuspicionRecord(
            incarnation=incarnation,
            start=now,
            min_s=min_s,
            max_s=min_s * cfg.suspicion_max_timeout_mult,
            k=min(cfg.suspicion_confirmations, max(0, n - 2)),
            confirmers={origin},
        )
        self._suspicions[member.peer] = suspicion
        self._arm_suspicion(member.peer, suspicion)
        member.record = MemberUpdate(
            kind=UpdateKind.SUSPECT, peer=member.peer, incarnation=incarnation, addrs=(), origin=origin
        )
        self._queue_update(member.record)

    def _confirm(self, now: float, member: MemberRecord, origin: PeerID) -> None:
        suspicion = self._suspicions.get(member.peer)
        if suspicion is None or origin in suspicion.confirmers:
            return
        if len(suspicion.confirmers) - 1 >= suspicion.k:
            return
        suspicion.confirmers.add(origin)
        self._arm_suspicion(member.peer, suspicion)
        # Re-gossip so that others count this confirmation too.
        member.record = MemberUpdate(
            kind=UpdateKind.SUSPECT, peer=member.peer, incarnation=member.incarnation, addrs=(), origin=origin
        )
        self._queue_update(member.record)

    def _arm_suspicion(self, peer: PeerID, suspicion: SuspicionRecord) -> None:
        confirmations = len(suspicion.confirmers) - 1  # the first suspector is not a confirmation
        if suspicion.k < 1:
            timeout = suspicion.min_s
        else:
            fraction = math.log(confirmations + 1) / math.log(suspicion.k + 1)
            timeout = max(suspicion.min_s, suspicion.max_s - (suspicion.max_s - suspicion.min_s) * fraction)
        suspicion.deadline = suspicion.start + timeout
        self._schedule(suspicion.deadline, _T_SUSPICION, peer)

    def _fail(self, now: float, member: MemberRecord, incarnation: int, origin: PeerID) -> None:
        suspected_at = member.suspected_at
        self._set_state(now, member, _FAILED, incarnation)
        member.suspected_at = None
        member.record = MemberUpdate(
            kind=UpdateKind.DEAD, peer=member.peer, incarnation=incarnation, origin=origin
        )
        self._queue_update(member.record)
        self._counters.failures_declared += 1
        self._events.append(
            PeerFailed(at=now, peer=member.peer, incarnation=incarnation, suspected_at=suspected_at)
        )
        self._drop_link(now, member.peer, "failed")

    def _set_left(self, now: float, member: MemberRecord, incarnation: int) -> None:
        self._set_state(now, member, _LEFT, incarnation)
        member.record = MemberUpdate(kind=UpdateKind.LEFT, peer=member.peer, incarnation=incarnation)
        self._queue_update(member.record)
        self._events.append(PeerLeft(at=now, peer=member.peer, incarnation=incarnation))
        self._drop_link(now, member.peer, "left")

    def _forget(self, member: MemberRecord) -> None:
        peer = member.peer
        if member.state in _LIVE:
            self._live_count -= 1
            self._digest_toggle(self._last_now, peer, member.incarnation)
            self._info_digest ^= member.info_hash
            self._info_digest_changed_at = self._last_now
        del self._members[peer]
        self._alive_cache = None
        self._suspicions.pop(peer, None)
        self._hints.pop(peer, None)
        self._verified.pop(peer, None)
        self._updates.discard(peer.raw)
        self._infos.discard(peer.raw)
        self._links.pop(peer, None)

    def _evict_one(self) -> bool:
        gone = [m for m in self._members.values() if m.state not in _LIVE]
        if not gone:
            return False
        self._forget(min(gone, key=lambda m: m.since))
        return True

    # ================================================================== probing
    def _probe_timeout(self) -> float:
        return self.config.probe_timeout_s * (1 + self._awareness)

    def _ping(self, now: float, target: PeerID, purpose: int, *, extra: MemberUpdate | None = None) -> None:
        seq = self._next_seq()
        self._probes[seq] = ProbeRecord(seq=seq, target=target, sent_at=now, purpose=purpose)
        updates, infos = self._piggyback(target, extra)
        if extra is None:
            self._send(target, Ping(seq=seq, updates=updates, infos=infos))
        else:
            digest, info_digest = self._digest, self._info_digest
            self._send(target, Ping(seq=seq, updates=updates, infos=infos, digest=digest, info_digest=info_digest))
        self._schedule(now + self._probe_timeout(), _T_DIRECT, seq)

    def _on_direct_timeout(self, now: float, seq: int) -> None:
        probe = self._probes.get(seq)
        if probe is None:
            return
        target = probe.target
        if probe.purpose == HEARTBEAT:
            link = self._links.get(target)
            if link is not None:
                link.missed += 1
                if link.up and link.missed >= self.config.link_down_after_missed:
                    self._link_down(now, link, "timeout")
        member = self._members.get(target)
        if member is None or member.state is not _ALIVE or target in self._checks:
            del self._probes[seq]
            if member is not None and member.state is _SUSPECT:
                self._confirm(now, member, self.local_peer)
            return
        self._start_check(now, probe)

    def _start_check(self, now: float, probe: ProbeRecord) -> None:
        target = probe.target
        self._checks[target] = probe.seq
        relays = [p for p in self._sample_alive(self.config.indirect_probes + 1) if p != target]
        relays = relays[: self.config.indirect_probes]
        probe.relays = tuple(relays)
        if relays:
            updates, infos = self._piggyback(None)
            message = PingReq(seq=probe.seq, target=target, updates=updates, infos=infos)
            for relay in relays:
                self._send(relay, message)
            self._counters.indirect_probes_sent += len(relays)
        # Relays wait one probe timeout for the target; allow as long again for the round trips.
        self._schedule(now + 2 * self._probe_timeout(), _T_CHECK_END, probe.seq)

    def _on_check_end(self, now: float, seq: int) -> None:
        probe = self._probes.pop(seq, None)
        if probe is None:
            return
        target = probe.target
        if self._checks.get(target) == seq:
            del self._checks[target]
        self._counters.probes_failed += 1
        if probe.nacks < len(probe.relays) and self._awareness < self.config.awareness_max:
            # Relays should have answered with a NACK at least: the trouble may be on our side.
            self._awareness += 1
        member = self._members.get(target)
        if member is None:
            return
        if member.state is _ALIVE:
            self._counters.suspicions_raised += 1
            self._suspect(now, member, member.incarnation, self.local_peer)
        elif member.state is _SUSPECT:
            self._confirm(now, member, self.local_peer)

    def _next_probe_target(self) -> PeerID | None:
        order = self._probe_order
        for _ in range(2):
            while self._probe_index < len(order):
                peer = order[self._probe_index]
                self._probe_index += 1
                member = self._members.get(peer)
                if member is not None and member.state in _LIVE:
                    return peer
            live = [p for p, m in self._members.items() if m.state in _LIVE]
            self._rng.shuffle(live)
            self._probe_order = order = live
            self._probe_index = 0
        return None

    def _alive_list(self) -> list[PeerID]:
        cache = self._alive_cache
        if cache is None:
            cache = self._alive_cache = [p for p, m in self._members.items() if m.state is _ALIVE]
        return cache

    def _sample_alive(self, k: int) -> list[PeerID]:
        alive = self._alive_list()
        if len(alive) <= k:
            return list(alive)
        return self._rng.sample(alive, k)

    # ================================================================== links
    def _link_down(self, now: float, link: LinkRecord, reason: str) -> None:
        link.up = False
        link.since = now
        self._events.append(LinkDown(at=now, peer=link.peer, reason=reason))

    def _drop_link(self, now: float, peer: PeerID, reason: str) -> None:
        link = self._links.pop(peer, None)
        if link is None:
            return
        if link.up:
            self._events.append(LinkDown(at=now, peer=peer, reason=reason))
        self._links_dirty = True

    def _fill_links(self, now: float) -> None:
        # Called once after each input, not per membership change: a PUSH_PULL that introduces
        # hundreds of members must not pick links among whichever few were merged first.
        self._links_dirty = False
        if len(self._links) < self.config.max_link_degree and len(self._alive_list()) > len(self._links):
            self._refresh_links(now)

    def _refresh_links(self, now: float) -> None:
        cfg = self.config
        for peer, link in list(self._links.items()):
            member = self._members.get(peer)
            stale_down = not link.up and now - link.since >= cfg.link_drop_down_after_s
            if member is None or member.state not in _LIVE or stale_down:
                del self._links[peer]
                if link.up:
                    self._events.append(LinkDown(at=now, peer=peer, reason="failed"))
        # A bounded random sample of alive members competes with the current links each round, so
        # the work per refresh does not grow with the cluster; good peers are found over rounds.
        candidates: dict[PeerID, LinkMetrics] = {}
        for peer in (*self._links, *self._sample_alive(_LINK_SAMPLE_MULT * cfg.max_link_degree)):
            member = self._members[peer]
            candidates[peer] = LinkMetrics(rtt_s=member.rtt_s, bandwidth_bytes_per_s=member.bandwidth)
        plan = plan_links(
            list(self._links),
            candidates,
            degree=cfg.max_link_degree,
            improvement=cfg.link_replace_improvement,
            reference_bytes=cfg.link_cost_reference_bytes,
            rng=self._rng,
        )
        for peer in plan.drop:
            link = self._links.pop(peer)
            if link.up:
                self._events.append(LinkDown(at=now, peer=peer, reason="replaced"))
        for peer in plan.add:
            self._links[peer] = LinkRecord(peer=peer, since=now)
            self._ping(now, peer, HEARTBEAT)

    def _link_summaries(self) -> tuple[LinkSummary, ...]:
        out = []
        for peer in sorted(self._links):
            member = self._members.get(peer)
            out.append(
                LinkSummary(
                    peer=peer,
                    rtt_s=(member.rtt_s or 0.0) if member is not None else 0.0,
                    bandwidth_bytes_per_s=(member.bandwidth or 0.0) if member is not None else 0.0,
                    up=self._links[peer].up,
                )
            )
        return tuple(out)

    def _links_changed(self, new: tuple[LinkSummary, ...]) -> bool:
        old = self._published_links
        if len(old) != len(new):
            return True
        for a, b in zip(old, new, strict=True):
            if a.peer != b.peer or a.up != b.up:
                return True
            if abs(a.rtt_s - b.rtt_s) > max(_INFO_CHANGE * max(a.rtt_s, b.rtt_s), _INFO_RTT_FLOOR_S):
                return True
            x, y = a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s
            if abs(x - y) > _INFO_CHANGE * max(x, y):
                return True
        return False

    # ================================================================== dissemination
    def _queue_update(self, update: MemberUpdate) -> None:
        self._updates.put(update.peer.raw, update, update_size(update))

    def _publish_info(self, *, past: int = 0) -> None:
        old = self._info_version
        self._info_version = max(old, past) + 1
        self._info_digest ^= member_hash(self.local_peer, old) ^ member_hash(self.local_peer, self._info_version)
        self._info_digest_changed_at = self._last_now
        info = self._self_info()
        self._infos.put(self.local_peer.raw, info, info_size(info))

    def _piggyback(
        self, dest: PeerID | None, extra: MemberUpdate | None = None
    ) -> tuple[tuple[MemberUpdate, ...], tuple[InfoUpdate, ...]]:
        cfg = self.config
        limit = cfg.retransmit_limit(self._live_count + 1)
        budget = cfg.max_message_bytes
        updates: list[MemberUpdate] = []
        skip: bytes | None = None
        if dest is not None:
            member = self._members.get(dest)
            if member is not None and member.state is not _ALIVE:
                # Tell a peer what we believe about it, so that it can refute at once.
                updates.append(member.record)
                skip = dest.raw
            elif self._hints:
                hint = self._hints.pop(dest, None)
                if hint is not None:
                    # Pass on what someone else's state claims about it (see _verify).
                    updates.append(hint)
                    skip = dest.raw
        if extra is not None:
            updates.append(extra)
        if self._updates:
            updates += self._updates.take(
                max_items=cfg.max_gossip_items_per_message - len(updates), max_bytes=budget, limit=limit, skip=skip
            )
        infos: list[InfoUpdate] = []
        if self._infos:
            used = _UPDATE_SIZE_ESTIMATE * len(updates)
            infos = self._infos.take(
                max_items=cfg.max_info_items_per_message,
                max_bytes=max(1, budget - used),
                limit=cfg.info_retransmit_limit(self._live_count + 1),
            )
        return tuple(updates), tuple(infos)

    def _state_snapshot(self, *, with_infos: bool) -> tuple[tuple[MemberUpdate, ...], tuple[InfoUpdate, ...]]:
        cap = self.config.max_push_pull_members
        records = [m.record for m in self._members.values()]
        if len(records) + 1 > cap:
            rank = {UpdateKind.ALIVE: 0, UpdateKind.SUSPECT: 1, UpdateKind.DEAD: 2, UpdateKind.LEFT: 3}
            self._rng.shuffle(records)
            records.sort(key=lambda r: rank[r.kind])
            records = records[: cap - 1]
        members = (self._self_record(), *records)
        if not with_infos:
            return members, ()
        infos = [self._self_info()]
        for record in records:
            info = self._members[record.peer].info
            if info is not None:
                infos.append(info)
        return members, tuple(infos)

    def _send_push_pull(self, now: float, peer: PeerID, *, join: bool, with_infos: bool = True) -> None:
        seq = self._next_seq()
        self._push_pulls[seq] = (peer, now)
        members, infos = self._state_snapshot(with_infos=with_infos)
        self._send(peer, PushPull(seq=seq, join=join, members=members, infos=infos))
        self._counters.push_pulls_sent += 1

    # ================================================================== timers
    def _schedule(self, at: float, kind: int, key: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, kind, key))

    def _sweep_interval(self) -> float:
        return max(1.0, 10 * self.config.probe_interval_s)

    def _fire(self, now: float, deadline: float, kind: int, key: Any) -> None:
        cfg = self.config
        if kind == _T_DIRECT:
            self._on_direct_timeout(now, key)
        elif kind == _T_CHECK_END:
            self._on_check_end(now, key)
        elif kind == _T_RELAY:
            relay = self._relays.pop(key, None)
            if relay is not None:
                self._send(relay.requester, Nack(seq=relay.request_seq))
        elif kind == _T_SUSPICION:
            suspicion = self._suspicions.get(key)
            member = self._members.get(key)
            if suspicion is not None and member is not None and suspicion.deadline == deadline:
                self._fail(now, member, suspicion.incarnation, self.local_peer)
        elif kind == _T_PROBE:
            target = self._next_probe_target()
            if target is not None:
                self._counters.probes_sent += 1
                # Probes go to random members and carry our own record: a member that missed our
                # latest ALIVE (gossip has a tail) catches up without waiting for a push-pull.
                self._ping(now, target, PROBE, extra=self._self_record())
            self._sync_stranger(now)
            self._schedule(now + cfg.probe_interval_s * (1 + self._awareness), _T_PROBE, None)
        elif kind == _T_HEARTBEAT:
            for peer in list(self._links):
                self._ping(now, peer, HEARTBEAT)
            self._schedule(now + cfg.heartbeat_interval_s, _T_HEARTBEAT, None)
        elif kind == _T_GOSSIP:
            # Only membership news gets messages of its own, to random members (the link graph is
            # fixed; random targets spread faster). Info records ride on PINGs and ACKs (and
            # PUSH_PULL carries them too).
            if self._updates:
                for peer in self._sample_alive(cfg.gossip_fanout):
                    updates, infos = self._piggyback(peer)
                    if not updates and not infos:
                        break
                    self._send(peer, Gossip(updates=updates, infos=infos))
            self._schedule(now + cfg.gossip_interval_s, _T_GOSSIP, None)
        elif kind == _T_PUSH_PULL:
            alive = self._sample_alive(1)
            if alive:
                # Membership only: info records are bulky, and a divergence in them shows up in the
                # info digest of probes, which triggers a full exchange (see _check_digest).
                self._send_push_pull(now, alive[0], join=False, with_infos=False)
            self._schedule(now + cfg.push_pull_period_s(self._live_count + 1), _T_PUSH_PULL, None)
        elif kind == _T_RECONNECT:
            failed = [p for p, m in self._members.items() if m.state is _FAILED]
            # Serf's rule: try with probability failed/alive, so that across the cluster each failed
            # member is tried about once per interval however large the cluster is.
            if failed and self._rng.random() * max(1, self._live_count) < len(failed):
                self._send_push_pull(now, self._rng.choice(failed), join=False)
            self._schedule(now + cfg.reconnect_interval_s, _T_RECONNECT, None)
        elif kind == _T_LINKS:
            self._refresh_links(now)
            self._schedule(now + cfg.link_refresh_interval_s, _T_LINKS, None)
        elif kind == _T_INFO:
            summaries = self._link_summaries()
            if self._links_changed(summaries):
                self._published_links = summaries
                self._publish_info()
            self._schedule(now + cfg.info_report_interval_s, _T_INFO, None)
        elif kind == _T_SWEEP:
            self._sweep(now)
            self._schedule(now + self._sweep_interval(), _T_SWEEP, None)
        elif kind == _T_JOIN:
            self._retry_join(now, key)

    def _sync_stranger(self, now: float) -> None:
        # A peer that talks to us but never reached us through gossip (the epidemic's tail):
        # exchange full state with it, one per probe tick.
        for peer, first_seen in list(self._strangers.items()):
            if peer in self._members or peer in self._contacts:
                del self._strangers[peer]
            elif now - first_seen >= self.config.probe_interval_s:
                del self._strangers[peer]
                self._send_push_pull(now, peer, join=False)
                return

    def _retry_join(self, now: float, peer: PeerID) -> None:
        contact = self._contacts.get(peer)
        if contact is None or now < contact.next_try:
            return
        member = self._members.get(peer)
        if contact.attempts >= self.config.join_max_attempts or (member is not None and member.state in _LIVE):
            del self._contacts[peer]
            return
        contact.attempts += 1
        contact.next_try = now + self.config.join_retry_interval_s * (1 << min(contact.attempts - 1, 4))
        self._send_push_pull(now, peer, join=True)
        self._schedule(contact.next_try, _T_JOIN, peer)

    def _sweep(self, now: float) -> None:
        cfg = self.config
        expired = [
            m
            for m in self._members.values()
            if (m.state is _FAILED and now - m.since >= cfg.dead_member_retention_s)
            or (m.state is _LEFT and now - m.since >= cfg.left_member_retention_s)
        ]
        for member in expired:
            self._forget(member)
        self._limiter.sweep(now)
        self._told_stale.clear()
        horizon = _PUSH_PULL_EXPIRY_S_MULT * max(cfg.push_pull_interval_s, cfg.probe_interval_s)
        for seq, (_, sent) in list(self._push_pulls.items()):
            if now - sent > horizon:
                del self._push_pulls[seq]

    def _note_time(self, now: float) -> None:
        gap = now - self._last_now
        if gap > self.config.local_pause_threshold_s:
            self._local_pause(now)
        if now > self._last_now:
            self._last_now = now

    def _local_pause(self, now: float) -> None:
        # We were not running (SIGSTOP, swap, GC, starved loop). Probes in flight timed out because
        # of us, not their targets: forget them. Suspicions get a grace period so refutations that
        # queued up while we were paused are read before anyone is declared failed.
        self._counters.local_pauses += 1
        self._probes.clear()
        self._checks.clear()
        self._relays.clear()
        for link in self._links.values():
            link.missed = 0
        grace = now + self.config.probe_interval_s + self._probe_timeout()
        for peer, suspicion in self._suspicions.items():
            if suspicion.deadline < grace:
                suspicion.start += grace - suspicion.deadline
                suspicion.deadline = grace
                self._schedule(grace, _T_SUSPICION, peer)

    # ================================================================== helpers
    def _send(self, to: PeerID, message: Message) -> None:
        self._outgoing.append(Outgoing(to=to, protocol=PROTOCOL, message=message))
        self._counters.messages_sent += 1

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFFFFFFFFFF
        return self._seq

    def _require_running(self, what: str) -> None:
        if self._left:
            raise LocalProtocolError(f"{what}: this peer has left the membership")

    def _self_record(self) -> MemberUpdate:
        return MemberUpdate(
            kind=UpdateKind.ALIVE, peer=self.local_peer, incarnation=self._incarnation, addrs=self._addrs
        )

    def _self_info(self) -> InfoUpdate:
        return InfoUpdate(
            peer=self.local_peer, version=self._info_version, resources=self._resources, links=self._published_links
        )

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
