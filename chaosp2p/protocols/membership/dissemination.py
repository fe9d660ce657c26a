"""Dissemination: how news about members reaches every peer (part of the membership machine).

Theory of operation
-------------------
News is of two sorts: membership updates (ALIVE / SUSPECT / DEAD / LEFT at an incarnation) and
info records (a member's resources and link summaries, versioned by their owner). Each waits in a
transmit-limited queue (``gossip.py``) and rides piggyback on every PING, ACK and PING_REQ, within
a byte budget; a message to a member we hold as not alive leads with that verdict (ours: others'
hints are not its news), so that a live member can refute it at once. A GOSSIP message goes
to a few random members only when there is membership news: random targets spread faster than the
fixed link graph.

The epidemic has a tail, so full-state exchanges (PUSH_PULL / PUSH_PULL_REPLY) repair what
piggybacking misses: one with a random member every ``push_pull_interval_s`` (membership only),
one whenever a prober's view digest differs from ours after our view has been quiet for a while
(info records included), one with each peer that talks to us without having reached us through
gossip, and, with probability failed/alive, one with a random *failed* member every
``reconnect_interval_s``: that is how the two halves of a healed partition find each other again.
Joining is the same exchange with a contact the driver supplied, retried with backoff until it
answers or the attempts run out. A reply counts only from the peer we asked, for a request still
pending. The periodic exchange leaves out the records' signatures (the receiver holds almost all
of them already): news in it that needs one is asked for again, signed.
"""

from __future__ import annotations

import math

from chaosp2p.protocols.membership.bookkeeping import info_size, member_hash, update_size
from chaosp2p.protocols.membership.core import MembershipCore, TimerKind
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.membership.messages import (
    Gossip,
    InfoUpdate,
    MemberUpdate,
    PushPull,
    PushPullReply,
    UpdateKind,
)
from chaosp2p.wire.identity import PeerID

_ALIVE = MemberState.ALIVE
_FAILED = MemberState.FAILED
_LIVE = (_ALIVE, MemberState.SUSPECT)

_DIGEST_QUIETPROBES = 2  # our view must have been stable this many probe intervals before a digest sync
_UPDATE_SIZE_ESTIMATE = 100  # bytes of one piggybacked update with one address, for the info budget
_SNAPSHOT_RANK = {UpdateKind.ALIVE: 0, UpdateKind.SUSPECT: 1, UpdateKind.DEAD: 2, UpdateKind.LEFT: 3}


def _unsigned(record: MemberUpdate) -> MemberUpdate:
    return MemberUpdate(kind=record.kind, peer=record.peer, incarnation=record.incarnation, addrs=record.addrs)


class Dissemination(MembershipCore):
    """Piggybacked news, gossip, full-state exchanges and joins."""

    # ------------------------------------------------------------------ queued news
    def _queue_update(self, update: MemberUpdate) -> None:
        self._updates.put(update.peer.raw, update, update_size(update))
        parked = self._gossip_parked_at
        if parked is not None:
            # Resume the parked tick on its old grid (parked + k x interval), so news waits for the
            # next tick exactly as long as if the tick had kept running.
            self._gossip_parked_at = None
            interval = self.config.gossip_interval_s
            at = parked + interval
            if at < self._last_now:
                at += math.ceil((self._last_now - at) / interval) * interval
            self._schedule(at, TimerKind.GOSSIP, None)

    def _publish_info(self, *, past: int = 0) -> None:
        old = self._info_version
        self._info_version = max(old, past) + 1
        self._info_digest ^= member_hash(self.local_peer, old) ^ member_hash(self.local_peer, self._info_version)
        self._info_digest_changed_at = self._last_now
        info = self._self_info_record = self._sign_info()
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
                # Tell a peer what we believe about it, so that it can refute at once. (Only our own
                # verdicts: others' hints are ours to check; ``members.py`` relays them to others.)
                updates.append(member.record)
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

    def _on_gossip(self, now: float, sender: PeerID, msg: Gossip) -> None:
        self._apply_piggyback(now, sender, msg.updates, msg.infos)

    def _tick_gossip(self, now: float, deadline: float, key: None) -> None:
        # Only membership news gets messages of its own, to random members (the link graph is
        # fixed; random targets spread faster). Info records ride on PINGs and ACKs (and
        # PUSH_PULL carries them too).
        cfg = self.config
        if not self._updates:
            self._gossip_parked_at = now  # nothing to say: no tick until news is queued
            return
        for peer in self._sample_alive(cfg.gossip_fanout):
            updates, infos = self._piggyback(peer)
            if not updates and not infos:
                break
            self._send(peer, Gossip(updates=updates, infos=infos))
        self._schedule(now + cfg.gossip_interval_s, TimerKind.GOSSIP, None)

    # ------------------------------------------------------------------ full-state exchanges
    def _state_snapshot(
        self, *, with_infos: bool, signed: bool = True
    ) -> tuple[tuple[MemberUpdate, ...], tuple[InfoUpdate, ...]]:
        cap = self.config.max_push_pull_members
        records = [m.record for m in self._members.values()]
        if len(records) + 1 > cap:
            self._rng.shuffle(records)
            records.sort(key=lambda r: _SNAPSHOT_RANK[r.kind])
            records = records[: cap - 1]
        if not signed:
            # The periodic sync: the receiver almost always holds every record already, and 66 bytes
            # of signature per record would double the exchange. News it finds, it asks for again.
            records = [_unsigned(r) if r.signature else r for r in records]
        members = (self._self_record(), *records)
        if not with_infos:
            return members, ()
        infos = [self._self_info()]
        for record in records:
            info = self._members[record.peer].info
            if info is not None:
                infos.append(info)
        return members, tuple(infos)

    def _send_push_pull(
        self, now: float, peer: PeerID, *, join: bool, with_infos: bool = True, signed: bool = True
    ) -> None:
        seq = self._next_seq()
        self._push_pulls[seq] = (peer, now)
        members, infos = self._state_snapshot(with_infos=with_infos, signed=signed)
        self._send(peer, PushPull(seq=seq, join=join, members=members, infos=infos, signed=signed))
        self._counters.push_pulls_sent += 1

    def _on_push_pull(self, now: float, sender: PeerID, msg: PushPull) -> None:
        self._counters.push_pulls_received += 1
        unsigned_news = self._merge_state(now, sender, msg.members, msg.infos)
        members, infos = self._state_snapshot(with_infos=bool(msg.infos), signed=msg.signed)
        self._send(sender, PushPullReply(seq=msg.seq, members=members, infos=infos))
        if unsigned_news:
            self._ask_signed(now, sender)

    def _ask_signed(self, now: float, peer: PeerID) -> None:
        # An unsigned sync showed news we cannot take without signatures: ask that peer again,
        # signed (its reply mirrors the request), at most once per digest sync interval.
        if now - self._last_signed_sync >= self.config.digest_sync_interval_s:
            self._last_signed_sync = now
            self._send_push_pull(now, peer, join=False, with_infos=False)

    def _on_push_pull_reply(self, now: float, sender: PeerID, msg: PushPullReply) -> None:
        pending = self._push_pulls.pop(msg.seq, None)
        if pending is None or pending[0] != sender:
            if pending is not None:
                self._push_pulls[msg.seq] = pending
            self._counters.rejected_messages += 1
            return
        # Merge first: a contact we asked is vouched for (the view of a peer we chose to join
        # through counts), and stops being a contact once its answer is in.
        unsigned_news = self._merge_state(now, sender, msg.members, msg.infos)
        self._contacts.pop(sender, None)
        if unsigned_news:
            self._ask_signed(now, sender)

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

    def _tick_push_pull(self, now: float, deadline: float, key: None) -> None:
        alive = self._sample_alive(1)
        if alive:
            # Membership only: info records are bulky, and a divergence in them shows up in the
            # info digest of probes, which triggers a full exchange (see _check_digest). Unsigned:
            # see _state_snapshot.
            self._send_push_pull(now, alive[0], join=False, with_infos=False, signed=False)
        self._schedule(now + self.config.push_pull_period_s(self._live_count + 1), TimerKind.PUSH_PULL, None)

    def _tick_reconnect(self, now: float, deadline: float, key: None) -> None:
        failed = [p for p, m in self._members.items() if m.state is _FAILED]
        # Serf's rule: try with probability failed/alive, so that across the cluster each failed
        # member is tried about once per interval however large the cluster is.
        if failed and self._rng.random() * max(1, self._live_count) < len(failed):
            self._send_push_pull(now, self._rng.choice(failed), join=False)
        self._schedule(now + self.config.reconnect_interval_s, TimerKind.RECONNECT, None)

    def _retry_join(self, now: float, deadline: float, peer: PeerID) -> None:
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
        self._schedule(contact.next_try, TimerKind.JOIN, peer)
