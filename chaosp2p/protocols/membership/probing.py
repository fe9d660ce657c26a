"""Probing: SWIM failure detection by direct and indirect probes (part of the membership machine).

Theory of operation
-------------------
Every ``probe_interval_s`` (stretched by our *awareness*, see below) the next member of a shuffled
round-robin gets a PING carrying our own record and our view digests; a new member is inserted at a
random place of the current round, so every member is probed once per round. No ACK within the
probe timeout starts a *check*: ``indirect_probes`` random alive members get a PING_REQ and probe
the target for us, forwarding its ACK, or a NACK when it stays silent to them too. No ACK by the
end of the check makes the target SUSPECT (``suspicion.py``); if it is already suspect, our failed
check confirms the suspicion. Any ACK, direct or relayed, ends every pending check on the target,
and a direct one updates its smoothed RTT and brings its overlay link up.

Heartbeats on overlay links (``overlay.py``) are PINGs too: a missed one counts against the link
and starts the same check, so that neighbours detect a failure first. So are our own *looks* at a
member after another peer's hint that it is suspect or dead (``members.py``): a hint never changes
a member's state, it makes us probe it now -- at most once per probe interval per member, later
hints waiting for the next probe tick -- and if our own check then fails, the suspicion counts from
the hint. When the driver reports a member unreachable, the check starts at once, beside one direct
PING in case the member restarted on the same address.

*Connection loss.* When the member's host closed our last connection to it (the driver saw EOF or a
reset, not a goodbye -- what a kernel does for a killed process), the same check starts at once:
the direct PING makes the driver dial again and ``indirect_probes`` relays get a PING_REQ in the
same instant, without waiting for a probe timeout. Any ACK, direct or relayed, ends the check with
the member alive, as always: a live process whose connection closed for another reason (an idle
cleanup, a dial race, a middlebox) answers the new dial or the relays. The check ends early when it
is *conclusive*: the driver could not reach the member since (a dial refused, a send failed) and
every relay (at least one) answered NACK. Then the member is FAILED at once, without a suspicion:
a suspicion gives a member time to hear it and refute, and this one can be reached neither by us
nor by any relay; should it be alive after all, it refutes later with a higher incarnation, as
after any failure. Short of that (no relays, a relay silent, or a relay's ACK) the check runs as any
other. A relay that turns out unreachable itself (several processes killed at once) never answers:
it stops counting and a spare relay, if there is one, is asked in its place. One check per member
per probe interval starts this way; a member whose connections close more often is checked at the
usual pace.

A SWIM probe carries our view digests and, until the target has acknowledged our current
incarnation, our own signed ALIVE record: a member that missed it (gossip has a tail) catches up
from us directly, and the 66 bytes of a signature are not paid again on every probe.

*Awareness* (Lifeguard's local health) grows when our checks end without the NACKs the relays owe
us -- the trouble may be on our side -- and shrinks with each answered probe; probe intervals and
timeouts scale with it, so a slow peer does not blame others for its own slowness. Relaying is
bounded (``max_pending_relays``) and never done for ourselves or for the target's own request.
"""

from __future__ import annotations

from chaosp2p.protocols.membership.bookkeeping import MemberRecord, PingPurpose, ProbeRecord, RelayRecord
from chaosp2p.protocols.membership.core import MembershipCore, TimerKind
from chaosp2p.protocols.membership.events import LinkUp, MemberState
from chaosp2p.protocols.membership.messages import Ack, Nack, Ping, PingReq
from chaosp2p.wire.identity import PeerID

_ALIVE = MemberState.ALIVE
_SUSPECT = MemberState.SUSPECT
_LIVE = (_ALIVE, _SUSPECT)

_RTT_ALPHA = 0.125  # TCP's SRTT gain


class Probing(MembershipCore):
    """Direct probes, checks through other members, and relaying for them."""

    # ------------------------------------------------------------------ messages
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
        # The target answered (directly or through a relay): every pending check on it is moot,
        # and so is any hint that made us look.
        del self._probes[seq]
        member = self._members.get(target)
        if member is not None:
            member.hinted_at = None
            member.hinters = None
        check = self._checks.pop(target, None)
        if check is not None and check != seq:
            self._probes.pop(check, None)

    def _on_direct_ack(self, now: float, probe: ProbeRecord) -> None:
        target = probe.target
        member = self._members.get(target)
        if member is not None:
            sample = now - probe.sent_at
            member.rtt_s = sample if member.rtt_s is None else member.rtt_s + _RTT_ALPHA * (sample - member.rtt_s)
            if probe.carried_self > member.told_incarnation:
                member.told_incarnation = probe.carried_self
        link = self._links.get(target)
        if link is not None:
            link.missed = 0
            if not link.up:
                link.up = True
                link.since = now
                rtt = member.rtt_s if member is not None and member.rtt_s is not None else now - probe.sent_at
                self._events.append(LinkUp(at=now, peer=target, rtt_s=rtt))
        if probe.purpose is PingPurpose.PROBE and self._awareness > 0:
            self._awareness -= 1

    def _on_nack(self, now: float, sender: PeerID, msg: Nack) -> None:
        probe = self._probes.get(msg.seq)
        if probe is not None and sender in probe.relays:
            probe.nacks += 1
            self._counters.nacks_received += 1
            if probe.nacked_by is None:
                probe.nacked_by = set()
            probe.nacked_by.add(sender)  # (a check may turn into a lost one after its NACKs came)
            if probe.lost:
                self._conclude(now, probe)

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
        self._schedule(now + self._probe_timeout(), TimerKind.RELAY, seq)

    # ------------------------------------------------------------------ our probes and checks
    def _ping(self, now: float, target: PeerID, purpose: PingPurpose, *, probe: bool = False) -> None:
        seq = self._next_seq()
        record = ProbeRecord(seq=seq, target=target, sent_at=now, purpose=purpose)
        self._probes[seq] = record
        if not probe:
            updates, infos = self._piggyback(target)
            self._send(target, Ping(seq=seq, updates=updates, infos=infos))
        else:
            member = self._members.get(target)
            extra = None
            if member is not None and member.told_incarnation < self._incarnation:
                extra = self._self_record()
                record.carried_self = self._incarnation
            updates, infos = self._piggyback(target, extra)
            digest, info_digest = self._digest, self._info_digest
            self._send(target, Ping(seq=seq, updates=updates, infos=infos, digest=digest, info_digest=info_digest))
        self._schedule(now + self._probe_timeout(), TimerKind.DIRECT, seq)

    def _look(self, now: float, member: MemberRecord) -> None:
        # Another peer says the member is suspect or dead: probe it ourselves (a hint is a reason to
        # look, never a verdict). Once per probe interval per member: a peer repeating hints must
        # not make us probe at its pace; a hint that arrives meanwhile waits for the next tick.
        peer = member.peer
        if peer in self._checks:
            return
        if now - member.hint_checked_at < self.config.probe_interval_s:
            self._hint_pending.add(peer)
            return
        member.hint_checked_at = now
        self._counters.hints_checked += 1
        self._ping(now, peer, PingPurpose.LOOK)

    def _look_pending(self, now: float) -> None:
        pending, self._hint_pending = self._hint_pending, set()
        for peer in pending:
            member = self._members.get(peer)
            if member is not None and member.state is _ALIVE and member.hinted_at is not None:
                self._look(now, member)

    def _on_direct_timeout(self, now: float, deadline: float, seq: int) -> None:
        probe = self._probes.get(seq)
        if probe is None:
            return
        target = probe.target
        if probe.purpose is PingPurpose.HEARTBEAT or probe.heartbeat:
            link = self._links.get(target)
            if link is not None:
                link.missed += 1
                if link.up and link.missed >= self.config.link_down_after_missed:
                    self._link_down(now, link, "timeout")
        member = self._members.get(target)
        if member is None or member.state is not _ALIVE or target in self._checks:
            del self._probes[seq]  # (a silent suspect member: our suspicion already runs)
            return
        self._start_check(now, probe)

    def _start_check(self, now: float, probe: ProbeRecord) -> None:
        target = probe.target
        self._checks[target] = probe.seq
        want = self.config.indirect_probes
        # Relays must be members we have heard from ourselves, and that nobody has hinted are down:
        # a relay that cannot answer owes us a NACK it never sends, and each missed NACK raises our
        # awareness (slowing every probe). Made-up members a peer vouched for never answer, and in
        # a partition most of the other side is hinted before we have failed it.
        members = self._members
        relays = [
            p
            for p in self._sample_alive(2 * want + 1)
            if p != target and members[p].introducer is None and members[p].hinted_at is None
        ][:want]
        probe.relays = tuple(relays)
        if relays:
            updates, infos = self._piggyback(None)
            message = PingReq(seq=probe.seq, target=target, updates=updates, infos=infos)
            for relay in relays:
                self._send(relay, message)
            self._counters.indirect_probes_sent += len(relays)
        # Relays wait one probe timeout for the target; allow as long again for the round trips.
        self._schedule(now + 2 * self._probe_timeout(), TimerKind.CHECK_END, probe.seq)

    def _on_check_end(self, now: float, deadline: float, seq: int) -> None:
        probe = self._probes.pop(seq, None)
        if probe is None:
            return
        target = probe.target
        if self._checks.get(target) == seq:
            del self._checks[target]
        self._counters.probes_failed += 1
        if (
            probe.purpose is not PingPurpose.LOOK
            and probe.nacks < len(probe.relays)
            and self._awareness < self.config.awareness_max
        ):
            # Relays should have answered with a NACK at least: the trouble may be on our side.
            self._awareness += 1
        member = self._members.get(target)
        if member is None:
            return
        if member.state is _ALIVE:
            self._counters.suspicions_raised += 1
            self._suspect(now, member, member.incarnation, self.local_peer)

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

    def _tick_probe(self, now: float, deadline: float, key: None) -> None:
        target = self._next_probe_target()
        if target is not None:
            self._counters.probes_sent += 1
            self._ping(now, target, PingPurpose.PROBE, probe=True)
        self._sync_stranger(now)
        if self._hint_pending:
            self._look_pending(now)
        if self._suspicions:
            self._tell_suspects(now)
        if self._pending_refutation:
            self._refute_pending(now)
        self._schedule(now + self.config.probe_interval_s * (1 + self._awareness), TimerKind.PROBE, None)

    def _on_relay_timeout(self, now: float, deadline: float, seq: int) -> None:
        relay = self._relays.pop(seq, None)
        if relay is not None:
            self._send(relay.requester, Nack(seq=relay.request_seq))

    def _on_unreachable(self, now: float, peer: PeerID) -> None:
        # Like a failed direct probe, without the wait.
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
        check = self._checks.get(peer)
        probe = self._probes.get(check) if check is not None else None
        if probe is not None and probe.lost:
            probe.unreachable = True
            self._conclude(now, probe)
        for other in [self._probes.get(seq) for seq in self._checks.values()]:
            if other is not None and other.lost and peer in other.relays:
                self._replace_relay(now, other, peer)
        member = self._members.get(peer)
        if member is None or relayed:
            # (A relay's failure is the requester's check; starting our own would cascade.)
            return
        if member.state is _ALIVE and peer not in self._checks:
            seq = self._next_seq()
            probe = ProbeRecord(seq=seq, target=peer, sent_at=now, purpose=PingPurpose.CHECK)
            self._probes[seq] = probe
            # The peer may have restarted on the same address: a direct PING costs nothing.
            updates, infos = self._piggyback(peer)
            self._send(peer, Ping(seq=seq, updates=updates, infos=infos))
            self._start_check(now, probe)

    def _on_connection_lost(self, now: float, peer: PeerID) -> None:
        # The member's host closed our last connection to it: check it now, directly and through
        # relays at once (see the module docstring, "Connection loss").
        member = self._members.get(peer)
        if member is None or member.state not in _LIVE:
            return
        self._counters.connection_losses += 1
        check = self._checks.get(peer)
        probe = self._probes.get(check) if check is not None else None
        if probe is not None:
            # A check already runs (a missed heartbeat, an earlier loss): it now ends early once
            # conclusive. Ask directly again, under its seq, so that the driver dials anew.
            if not probe.lost:
                probe.lost = True
                updates, infos = self._piggyback(peer)
                self._send(peer, Ping(seq=probe.seq, updates=updates, infos=infos))
            return
        if now - member.loss_checked_at < self.config.probe_interval_s:
            return  # a member closing connections faster is checked at the usual pace
        member.loss_checked_at = now
        seq = self._next_seq()
        probe = ProbeRecord(seq=seq, target=peer, sent_at=now, purpose=PingPurpose.CHECK, lost=True)
        self._probes[seq] = probe
        updates, infos = self._piggyback(peer)
        self._send(peer, Ping(seq=seq, updates=updates, infos=infos))
        self._start_check(now, probe)

    def _replace_relay(self, now: float, probe: ProbeRecord, gone: PeerID) -> None:
        """A relay of a lost check cannot be reached itself (several processes killed at once): it
        will never answer, so it stops counting and a spare relay, if any, is asked instead."""
        relays = [r for r in probe.relays if r != gone]
        members = self._members
        spare = [
            p
            for p in self._sample_alive(2 * self.config.indirect_probes + 1 + len(probe.relays))
            if p not in (probe.target, gone)
            and p not in probe.relays
            and members[p].introducer is None
            and members[p].hinted_at is None
        ]
        if spare:
            relays.append(spare[0])
            updates, infos = self._piggyback(None)
            self._send(spare[0], PingReq(seq=probe.seq, target=probe.target, updates=updates, infos=infos))
            self._counters.indirect_probes_sent += 1
        probe.relays = tuple(relays)
        self._conclude(now, probe)

    def _conclude(self, now: float, probe: ProbeRecord) -> None:
        """End a check after a connection loss early if it is conclusive: the driver could not
        reach the member and every relay (at least one) answered NACK. The member is FAILED."""
        nacked = probe.nacked_by or set()
        if not (probe.unreachable and probe.relays and all(r in nacked for r in probe.relays)):
            return
        target = probe.target
        self._probes.pop(probe.seq, None)
        if self._checks.get(target) == probe.seq:
            del self._checks[target]
        self._counters.probes_failed += 1
        member = self._members.get(target)
        if member is None or member.state not in _LIVE:
            return
        self._counters.failures_on_loss += 1
        if member.state is _ALIVE:
            self._counters.suspicions_raised += 1
            member.suspected_at = now
        self._fail(now, member, member.incarnation, self.local_peer)
