"""The member table: applying what others say about members, and the state changes (part of the machine).

Theory of operation
-------------------
Every member is ALIVE, SUSPECT, FAILED or LEFT at an incarnation number that only the member itself
may raise. What others say arrives as updates (piggybacked, gossiped, or a whole view in a
PUSH_PULL) and info records. Gossip cannot decide anything by itself:

* **Claims a member makes about itself** -- ALIVE at an incarnation with its addresses, LEFT, and
  its info record -- carry its own signature (``signing.py``) and are believed from anyone once
  the signature checks out; they go through the one transition table (``transitions.py``): the
  higher incarnation wins. A check costs the sender's budget and is made once per (member,
  incarnation): the record we hold is the cache, and old news -- most of what arrives, since every
  update comes many times -- takes a fast path before anything is checked.
* **Claims about another member** -- SUSPECT and DEAD -- are *hints*. A hint about a member we hold
  alive makes us probe it ourselves (``probing.py``); only if our own direct and indirect probes go
  unanswered do we suspect it, and only our own suspicion running out fails it. The first hint is
  passed on to a few members (once per incarnation and window), so that all look soon. A hint from the
  member's suspector itself, about a member we already suspect, counts as an independent
  confirmation (it shortens our suspicion, Lifeguard's way; it cannot start or end one).
* **Claims about ourselves** that we did not make are refuted by raising our incarnation: at most
  ``max_incarnation_jump`` past ours for an unsigned verdict (a claim far above our incarnation is
  forged, and following it would pin us at the largest incarnation), without limit for a record
  signed with our own key (our own, from before a restart), and at most once per probe interval.

Senders that are not members (nor a contact we asked) may only speak for themselves: what they say
about third parties is ignored. The table is bounded: when it is full, a newcomer takes the place
of the member failed or gone the longest, else of a member that only a third party has vouched for
(we never heard from it ourselves), taken from the voucher with the most such members; that
voucher's own newcomers do not displace others. So one peer's gossip cannot shut real newcomers
out, and a newcomer that talks to us directly always gets in. Failed and left members are
forgotten after their retention time. Counts and digests of the live view are kept in step with
every state change (see ``core.py``), so probing and gossip never scan the table.
"""

from __future__ import annotations

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.membership.bookkeeping import (
    MemberRecord,
    PingPurpose,
    check_addrs,
    check_relay_addrs,
    info_size,
    member_hash,
)
from chaosp2p.protocols.membership.config import MAX_INCARNATION
from chaosp2p.protocols.membership.core import MembershipCore, TimerKind
from chaosp2p.protocols.membership.events import MemberState, PeerAlive, PeerJoined, PeerLeft
from chaosp2p.protocols.membership.messages import (
    Gossip,
    InfoUpdate,
    Leave,
    MemberUpdate,
    UpdateKind,
)
from chaosp2p.protocols.membership.signing import alive_payload, info_payload, left_payload, relay_payload
from chaosp2p.protocols.membership.transitions import transition
from chaosp2p.wire.identity import PeerID

_ALIVE = MemberState.ALIVE
_SUSPECT = MemberState.SUSPECT
_FAILED = MemberState.FAILED
_LEFT = MemberState.LEFT
_LIVE = (_ALIVE, _SUSPECT)
_HINTS = (UpdateKind.SUSPECT, UpdateKind.DEAD)

_PUSH_PULL_EXPIRY_S_MULT = 4.0


class MemberTable(MembershipCore):
    """Applying membership updates and info records, and every member state change."""

    # ------------------------------------------------------------------ applying updates
    def _on_leave(self, now: float, sender: PeerID, msg: Leave) -> None:
        update = MemberUpdate(kind=UpdateKind.LEFT, peer=sender, incarnation=msg.incarnation, signature=msg.signature)
        self._apply_update(now, sender, update, merging=False, known=True)

    def _apply_piggyback(
        self, now: float, sender: PeerID, updates: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]
    ) -> None:
        if not updates and not infos:
            return
        # More items than we accept: use the first ones, count the rest as rejected, and still
        # answer the message -- a peer configured differently must not look dead to us.
        cfg = self.config
        excess = max(0, len(updates) - cfg.max_gossip_items_per_message)
        excess += max(0, len(infos) - cfg.max_info_items_per_message)
        if excess:
            self._counters.rejected_updates += excess
            updates = updates[: cfg.max_gossip_items_per_message]
            infos = infos[: cfg.max_info_items_per_message]
        known = self._known(sender)
        for update in updates:
            self._apply_update(now, sender, update, merging=False, known=known)
        for info in infos:
            self._apply_info(now, sender, info, known=known)

    def _merge_state(
        self, now: float, sender: PeerID, members: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]
    ) -> bool:
        self._unsigned_news = False
        cap = self.config.max_push_pull_members
        excess = max(0, len(members) - cap) + max(0, len(infos) - cap)
        if excess:
            self._counters.rejected_updates += excess
            members, infos = members[:cap], infos[:cap]
        known = self._known(sender)  # decided once: a stranger's own record must not vouch for the rest
        for update in members:
            self._apply_update(now, sender, update, merging=True, known=known)
        for info in infos:
            self._apply_info(now, sender, info, known=known)
        return self._unsigned_news

    def _known(self, sender: PeerID) -> bool:
        # A member (in any state) or a contact we asked may tell us about others; a stranger may
        # only speak for itself.
        return sender in self._members or sender in self._contacts

    def _apply_update(self, now: float, sender: PeerID, update: MemberUpdate, *, merging: bool, known: bool) -> None:
        counters = self._counters
        peer = update.peer
        incarnation = update.incarnation
        kind = update.kind
        member = self._members.get(peer)
        if member is not None and type(incarnation) is int:
            # Fast path: most gossip is news we already hold (every update arrives many times).
            if incarnation < member.incarnation:
                return
            if incarnation == member.incarnation and kind is member.record.kind and kind is not UpdateKind.SUSPECT:
                return
        if type(incarnation) is not int or not 0 <= incarnation <= MAX_INCARNATION:
            counters.rejected_updates += 1
            return
        if peer == self.local_peer:
            self._about_me(now, update, sender, merging)
        elif kind in _HINTS:
            self._on_hint(now, sender, member, update, known)
        elif not known and peer != sender:
            counters.ignored_from_strangers += 1
        elif kind is UpdateKind.ALIVE:
            self._on_alive(now, sender, member, update, merging)
        else:
            self._on_left(now, sender, member, update, merging)

    def _on_alive(
        self, now: float, sender: PeerID, member: MemberRecord | None, update: MemberUpdate, merging: bool
    ) -> None:
        peer, incarnation = update.peer, update.incarnation
        if member is not None:
            if merging and member.state is _FAILED and incarnation == member.incarnation:
                self._verify_failed(now, member)
                return
            if transition(member.state, member.incarnation, UpdateKind.ALIVE, incarnation) is None:
                return
        # Cheap checks before the signature: addresses the record itself could never have.
        if not update.addrs or check_addrs(update.addrs, peer, self.config) is not None:
            self._counters.rejected_updates += 1
            return
        if merging and not update.signature:
            self._unsigned_news = True  # an unsigned sync (PushPull.signed = False): ask again, signed
            return
        if not self._signed(sender, peer, update.signature, alive_payload(peer, incarnation, update.addrs)):
            return
        if member is not None:
            self._set_alive(now, member, update)
            return
        introducer = None if sender == peer else sender
        if not self._make_room(introducer):
            self._counters.rejected_updates += 1
            return
        self._add_member(now, update, introducer)

    def _on_left(
        self, now: float, sender: PeerID, member: MemberRecord | None, update: MemberUpdate, merging: bool
    ) -> None:
        if member is None:
            self._counters.ignored_unknown += 1
            return
        peer, incarnation = update.peer, update.incarnation
        if transition(member.state, member.incarnation, UpdateKind.LEFT, incarnation) is None:
            return
        if merging and not update.signature:
            self._unsigned_news = True
            return
        if self._signed(sender, peer, update.signature, left_payload(peer, incarnation)):
            self._set_left(now, member, update)

    def _on_hint(
        self, now: float, sender: PeerID, member: MemberRecord | None, update: MemberUpdate, known: bool
    ) -> None:
        # Someone says ``member`` is suspect or dead: a reason to look, never a verdict.
        if member is None:
            self._counters.ignored_unknown += 1
            return
        if not known:
            self._counters.ignored_from_strangers += 1
            return
        # The sender's own verdict at the incarnation we hold is an independent confirmation of a
        # suspicion of ours (a verdict it relays for someone else is not: the origin is unverifiable).
        origin = update.origin
        own_verdict = update.incarnation == member.incarnation and (origin is None or origin == sender)
        if member.state is _SUSPECT:
            if own_verdict:
                self._confirm(now, member, sender)
        elif member.state is _ALIVE:
            if member.hinted_at is None:
                member.hinted_at = now
                self._relay_hint(now, sender, member, update)
            if own_verdict:
                # Kept for our own suspicion, should our look fail: the verdicts that made us look
                # count as they would have had we suspected first (bounded by k).
                hinters = member.hinters
                if hinters is None:
                    hinters = member.hinters = set()
                if len(hinters) < self.config.suspicion_confirmations:
                    hinters.add(sender)
            self._look(now, member)

    def _relay_hint(self, now: float, sender: PeerID, member: MemberRecord, update: MemberUpdate) -> None:
        # Pass a hint on, once per incarnation of the member and at most once per minimum
        # suspicion timeout, to a few random members: every peer then looks soon (the hint's own
        # epidemic), instead of one look's time per hop. Relayed, it names its author as origin, so
        # no receiver takes it for the relay's verdict or counts it as a confirmation. What it can
        # cost others is bounded by their looks (one per member per probe interval).
        relayed_inc, relayed_at = member.hint_relayed
        window = self.config.suspicion_min_s(self._live_count + 1)
        if relayed_inc == member.incarnation or now - relayed_at < window:
            return
        member.hint_relayed = (member.incarnation, now)
        hint = MemberUpdate(
            kind=update.kind, peer=member.peer, incarnation=member.incarnation, origin=update.origin or sender
        )
        message = Gossip(updates=(hint,))
        # As many as the epidemic's transmissions of one update (the retransmit limit): with fewer,
        # a few peers would hear of the failure only from the suspectors' own gossip, later.
        fanout = self.config.retransmit_limit(self._live_count + 1)
        targets = [p for p in self._sample_alive(fanout + 2) if p != member.peer and p != sender]
        for peer in targets[:fanout]:
            self._send(peer, message)

    def _verify_failed(self, now: float, member: MemberRecord) -> None:
        # Someone's full state holds alive a member we declared failed, at the same incarnation --
        # typically the other half of a healed partition. Ping it: our PING tells it that we hold
        # it dead, a live member refutes in its ACK, and we gossip it back to life.
        peer = member.peer
        if self._verified.get(peer) == member.incarnation:
            return
        self._verified[peer] = member.incarnation
        self._ping(now, peer, PingPurpose.PROBE)

    def _about_me(self, now: float, update: MemberUpdate, sender: PeerID, merging: bool) -> None:
        kind, incarnation, mine = update.kind, update.incarnation, self._incarnation
        if kind is UpdateKind.ALIVE:
            if incarnation < mine or (incarnation == mine and update.addrs == self._addrs):
                return  # old news about us
        elif incarnation < mine:
            # The sender still holds an old verdict about us that our refutation never reached
            # (gossip has a tail): answer it directly with our current record.
            if self._told_stale.get(sender, -1.0) + self.config.probe_interval_s <= self._last_now:
                self._told_stale[sender] = self._last_now
                self._send(sender, Gossip(updates=(self._self_record(),)))
            return
        if kind in _HINTS:
            # Another peer's verdict on us. Far above our incarnation it is forged (only we raise
            # it): following it would let anyone push us to the largest incarnation for good.
            if incarnation - mine > self.config.max_incarnation_jump:
                self._counters.rejected_updates += 1
                return
        else:
            # ALIVE elsewhere or LEFT in our name: our own record from before a restart (signed by
            # us: out-bid it, however high), or a forgery nobody else believes either (ignore).
            if merging and not update.signature:
                self._unsigned_news = True
                return
            payload = (
                alive_payload(self.local_peer, incarnation, update.addrs)
                if kind is UpdateKind.ALIVE
                else left_payload(self.local_peer, incarnation)
            )
            if not self._signed(sender, self.local_peer, update.signature, payload):
                return
        self._refute(now, incarnation)

    def _refute(self, now: float, claimed: int) -> None:
        # Out-bid a belief about us: incarnation claimed + 1, at most once per probe interval (a
        # peer repeating claims must not make us re-sign and the swarm re-check at its pace; a
        # refutation put off is made by the next probe tick, well within any suspicion timeout).
        target = claimed + 1
        if target >= MAX_INCARNATION:
            self._counters.rejected_updates += 1
            return
        if target <= self._incarnation:
            return
        if now < self._next_refutation_at:
            self._pending_refutation = max(self._pending_refutation, target)
            return
        self._next_refutation_at = now + self.config.probe_interval_s
        self._pending_refutation = 0
        self._counters.refutations += 1
        self._set_incarnation(now, target)

    def _refute_pending(self, now: float) -> None:
        if self._pending_refutation > self._incarnation and now >= self._next_refutation_at:
            self._refute(now, self._pending_refutation - 1)

    def _apply_info(self, now: float, sender: PeerID, info: InfoUpdate, *, known: bool) -> None:
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
            # Our own record at a version we did not publish in this process (a restart): jump
            # past it -- if it is ours at all; a forged one is believed by nobody.
            if (
                version >= self._info_version
                and version + 1 < MAX_INCARNATION
                and info != self._self_info()
                and self._signed(sender, peer, info.signature, info_payload(info))
            ):
                self._publish_info(past=version)
            return
        if member is None:
            counters.ignored_unknown += 1
            return
        if not known and peer != sender:
            counters.ignored_from_strangers += 1
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
        if not self._signed(sender, peer, info.signature, info_payload(info)):
            return
        if info.relay_addrs and (
            check_relay_addrs(info.relay_addrs, peer, self.config) is not None
            or not self._signed(sender, peer, info.relay_signature, relay_payload(peer, version, info.relay_addrs))
        ):
            counters.rejected_updates += 1
            return
        member.info = info
        new_hash = member_hash(peer, version)
        if member.state in _LIVE:
            self._info_digest ^= member.info_hash ^ new_hash
            self._info_digest_changed_at = now
        member.info_hash = new_hash
        self._infos.put(peer.raw, info, info_size(info))

    # ------------------------------------------------------------------ state changes
    def _add_member(self, now: float, record: MemberUpdate, introducer: PeerID | None) -> None:
        peer = record.peer
        incarnation, addrs = record.incarnation, record.addrs
        member = MemberRecord(peer=peer, state=_ALIVE, incarnation=incarnation, addrs=addrs, since=now, record=record)
        member.introducer = introducer
        self._members[peer] = member
        if introducer is not None:
            self._unvouched.setdefault(introducer, {})[peer] = None
        self._live_count += 1
        self._digest_toggle(now, peer, record.incarnation)
        self._alive_cache = None
        order = self._probe_order
        order.insert(self._rng.randint(self._probe_index, len(order)), peer)
        self._queue_update(record)
        self._events.append(PeerJoined(at=now, peer=peer, incarnation=record.incarnation, addrs=record.addrs))
        self._links_dirty = True

    def _heard_from(self, member: MemberRecord) -> None:
        # The member spoke to us itself: no longer only a third party's word (see _make_room).
        introducer = member.introducer
        if introducer is None:
            return
        member.introducer = None
        vouched = self._unvouched.get(introducer)
        if vouched is not None:
            vouched.pop(member.peer, None)
            if not vouched:
                del self._unvouched[introducer]

    def _make_room(self, introducer: PeerID | None) -> bool:
        """Whether a new member (introduced by ``introducer``, None: by itself) fits, evicting if need be."""
        if len(self._members) < self.config.max_members:
            return True
        gone = [m for m in self._members.values() if m.state not in _LIVE]
        if gone:
            self._forget(min(gone, key=lambda m: m.since))
            return True
        if not self._unvouched:
            return False
        unvouched = self._unvouched
        largest = max(unvouched, key=lambda p: len(unvouched[p]))
        own = unvouched.get(introducer) if introducer is not None else None
        if own is not None and len(own) >= len(unvouched[largest]):
            return False  # its share is the largest already: it may not displace anyone else's
        victim = self._members[next(iter(unvouched[largest]))]
        self._forget(victim)
        self._counters.evicted_unvouched += 1
        self._links_dirty = True
        return True

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
        if member.state is not state or member.incarnation != incarnation:
            member.hinted_at = None
            member.hinters = None
        member.state = state
        member.incarnation = incarnation
        if state is not _SUSPECT:
            self._suspicions.pop(member.peer, None)
            member.suspected_at = None if state is _ALIVE else member.suspected_at

    def _set_alive(self, now: float, member: MemberRecord, record: MemberUpdate) -> None:
        previous = member.state
        incarnation = record.incarnation
        self._set_state(now, member, _ALIVE, incarnation)
        member.addrs = record.addrs
        member.record = record
        member.told_incarnation = -1  # a new incarnation may be a restart: it may not know us any more
        self._queue_update(record)
        if previous is _SUSPECT:
            self._counters.suspicions_refuted += 1
            self._events.append(PeerAlive(at=now, peer=member.peer, incarnation=incarnation))
        elif previous is not _ALIVE:
            order = self._probe_order
            order.insert(self._rng.randint(self._probe_index, len(order)), member.peer)
            self._events.append(PeerJoined(at=now, peer=member.peer, incarnation=incarnation, addrs=record.addrs))
            self._links_dirty = True

    def _set_left(self, now: float, member: MemberRecord, record: MemberUpdate) -> None:
        incarnation = record.incarnation
        self._set_state(now, member, _LEFT, incarnation)
        member.record = record
        self._queue_update(record)
        self._events.append(PeerLeft(at=now, peer=member.peer, incarnation=incarnation))
        self._drop_link(now, member.peer, "left")

    def _forget(self, member: MemberRecord) -> None:
        peer = member.peer
        if member.state in _LIVE:
            self._live_count -= 1
            self._digest_toggle(self._last_now, peer, member.incarnation)
            self._info_digest ^= member.info_hash
            self._info_digest_changed_at = self._last_now
        self._heard_from(member)  # (drops it from its introducer's list)
        del self._members[peer]
        self._alive_cache = None
        self._suspicions.pop(peer, None)
        self._hint_pending.discard(peer)
        self._verified.pop(peer, None)
        self._updates.discard(peer.raw)
        self._infos.discard(peer.raw)
        self._links.pop(peer, None)

    # ------------------------------------------------------------------ retention
    def _tick_sweep(self, now: float, deadline: float, key: None) -> None:
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
        self._byte_limiter.sweep(now)
        self._verify_limiter.sweep(now)
        self._told_stale.clear()
        horizon = _PUSH_PULL_EXPIRY_S_MULT * max(cfg.push_pull_interval_s, cfg.probe_interval_s)
        for seq, (_, sent) in list(self._push_pulls.items()):
            if now - sent > horizon:
                del self._push_pulls[seq]
        self._schedule(now + self._sweep_interval(), TimerKind.SWEEP, None)
