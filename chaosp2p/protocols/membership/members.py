"""The member table: applying what others say about members, and the state changes (part of the machine).

Theory of operation
-------------------
Every member is ALIVE, SUSPECT, FAILED or LEFT at an incarnation number that only the member itself
may raise. What others say arrives as updates (piggybacked, gossiped, or a whole view in a
PUSH_PULL) and info records; each is checked against the configured limits, then applied through
the one transition table (``transitions.py``): the higher incarnation wins, and at equal
incarnation the worse verdict does. Old news -- most of what arrives, since every update comes
many times -- takes a fast path. A claim about ourselves is refuted by raising our incarnation.

Second-hand verdicts are hints, not facts. When a full-state exchange (or gossip from a peer that
we held failed until moments ago: the other half of a partition that just healed) says a member we
hold alive is suspect or dead, we probe it ourselves and pass the claim on to it, so that a live
member refutes it for everyone; when someone's full state holds alive a member we declared failed,
we ping it and let its answer decide. The table is bounded: a newcomer that does not fit evicts
the member that has been failed or gone the longest, and failed and left members are forgotten
after their retention time. Counts and digests of the live view are kept in step with every
state change (see ``core.py``), so probing and gossip never scan the table.
"""

from __future__ import annotations

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.membership.bookkeeping import (
    MemberRecord,
    PingPurpose,
    check_addrs,
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
from chaosp2p.protocols.membership.transitions import transition
from chaosp2p.wire.identity import PeerID

_ALIVE = MemberState.ALIVE
_SUSPECT = MemberState.SUSPECT
_FAILED = MemberState.FAILED
_LEFT = MemberState.LEFT
_LIVE = (_ALIVE, _SUSPECT)

_PUSH_PULL_EXPIRY_S_MULT = 4.0


class MemberTable(MembershipCore):
    """Applying membership updates and info records, and every member state change."""

    # ------------------------------------------------------------------ applying updates
    def _on_leave(self, now: float, sender: PeerID, msg: Leave) -> None:
        update = MemberUpdate(kind=UpdateKind.LEFT, peer=sender, incarnation=msg.incarnation)
        self._apply_update(now, sender, update, merging=False)

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
            self._ping(now, peer, PingPurpose.PROBE)

    def _verify_failed(self, now: float, member: MemberRecord) -> None:
        # The converse: someone's full state holds alive a member we declared failed, at the same
        # incarnation -- typically the other half of a healed partition. Ping it: our PING tells it
        # that we hold it dead, a live member refutes in its ACK, and we gossip it back to life.
        peer = member.peer
        if self._verified.get(peer) == member.incarnation:
            return
        self._verified[peer] = member.incarnation
        self._ping(now, peer, PingPurpose.PROBE)

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

    # ------------------------------------------------------------------ state changes
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
        self._told_stale.clear()
        horizon = _PUSH_PULL_EXPIRY_S_MULT * max(cfg.push_pull_interval_s, cfg.probe_interval_s)
        for seq, (_, sent) in list(self._push_pulls.items()):
            if now - sent > horizon:
                del self._push_pulls[seq]
        self._schedule(now + self._sweep_interval(), TimerKind.SWEEP, None)
