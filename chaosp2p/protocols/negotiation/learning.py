"""Learning decisions, catching up and joining (part of the negotiation machine).

A member applies a decided value when a COMMIT arrives (from the proposer, or from an acceptor
answering a late PREPARE/ACCEPT), after checking every operation and the resulting digest. Ring
neighbours exchange SYNC beacons; a member that is behind asks for the missing commits and gets
them, or the whole current configuration when the gap exceeds the history. Newcomers ask a member
for the run's configuration (RUN_INFO), sign a JOIN against it and are admitted by the COMMIT that
carries the configuration including them -- the proposer's copy, or the one the members they asked
pass on (they hold a connection to the newcomer; the proposer may not). Spec section 9 argues why
a late admission is safe and which two are refused.
"""

from __future__ import annotations

import bisect

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.negotiation.configuration_change import AppliedOp, check_operation, next_configuration
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.core import MachineCore
from chaosp2p.protocols.negotiation.events import (
    Admitted,
    ConfigurationCommitted,
    GateReleased,
    JoinRefused,
    OperationCommitted,
    RemovedFromRun,
    ResyncNeeded,
    RunInfo,
)
from chaosp2p.protocols.negotiation.messages import (
    Commit,
    CommitRecord,
    JoinRequest,
    OpsAnnounce,
    RunInfoReply,
    RunInfoRequest,
    Sync,
    SyncReply,
    SyncRequest,
)
from chaosp2p.protocols.negotiation.messages import JoinRefused as JoinRefusedMessage
from chaosp2p.protocols.negotiation.operations import (
    REMOVAL_KINDS,
    OpKind,
    sign_operation,
)
from chaosp2p.protocols.negotiation.paxos import (
    RunRecord,
    coordinator,
)
from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.protocols.negotiation.transitions import (
    MEMBER_STATES,
    RunEvent,
    RunState,
    transition,
)
from chaosp2p.wire.identity import PeerID

_MAX_QUERIES = 1024
"""Outstanding RUN_INFO requests remembered (the oldest is forgotten first)."""
_MAX_SPONSORED = 256
"""Newcomers per run whose admission we pass on (the oldest is forgotten first)."""


class Learning(MachineCore):
    """Commits, anti-entropy and joins."""

    # ------------------------------------------------------------------ decisions

    def _on_commit(self, now: float, sender: PeerID, msg: Commit) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        if rec.state is RunState.JOINING:
            if msg.configuration:
                self._offer_configuration(now, rec, msg.configuration, sender, expected_digest=msg.digest)
            return
        config = rec.config
        if config is None or not self._learner(rec):
            return
        self._forward(rec, sender, msg)  # a relay passes it on even if it knew the decision
        if msg.epoch <= config.epoch:
            return  # a duplicate
        if msg.epoch > config.epoch + 1:
            self._request_sync(rec, sender)
            return
        if not config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return
        self._learn(now, rec, CommitRecord(epoch=msg.epoch, value=msg.value, digest=msg.digest), sender)

    def _pass_admissions(self, rec: RunRecord, old: Configuration, record: CommitRecord) -> None:
        """Send the COMMIT we just applied, with its configuration, to the newcomers we sponsor that
        it admits. The proposer sends it too, but it may hold no connection or address for them
        yet (membership spreads a newcomer's address only over the next heartbeats); we do, since
        they asked us. It is the same decided value: the newcomer checks it like the proposer's
        (spec sections 6 and 9). Also when we learned it in a catch-up (SYNC_REPLY): the
        proposer's copy to us may come after a member's SYNC beacon made us ask; a newcomer handed
        a configuration already replaced asks us for the newer commits at once."""
        config = rec.config
        assert config is not None
        full: Commit | None = None
        for raw, (peer, incarnation) in list(rec.sponsored.items()):
            held = config.incarnation_of(peer)
            if held is None or held < incarnation:
                continue  # not admitted (yet)
            del rec.sponsored[raw]
            before = old.incarnation_of(peer)
            if before is not None and before >= incarnation:
                continue  # admitted earlier, by a commit we learned elsewhere: its retry serves it
            if full is None:
                encoded = self._encoded(rec)
                full = Commit(
                    run=rec.run, epoch=record.epoch, value=record.value, digest=record.digest, configuration=encoded
                )
            self._send(peer, full)

    def _learn(self, now: float, rec: RunRecord, record: CommitRecord, sender: PeerID) -> bool:
        """Apply a decided value learned from ``sender`` after checking it; False if refused."""
        config = rec.config
        assert config is not None
        value = record.value
        if rec.accepted_value is not None and rec.accepted_value == value:
            ids: tuple[bytes, ...] | None = rec.accepted_ids
        else:
            ids = self._value_ids(rec, value)
        if ids is None:
            self._reject(rec.run, "bad_value", sender)
            return False
        new_config, results = next_configuration(config, zip(ids, value.ops, strict=True), value.activation_step)
        if new_config.digest != record.digest:
            self._reject(rec.run, "digest_mismatch", sender)
            return False
        self._apply_commit(now, rec, record, new_config, results)
        if rec.sponsored and rec.config is new_config:
            self._pass_admissions(rec, config, record)
        return True

    def _apply_commit(
        self,
        now: float,
        rec: RunRecord,
        record: CommitRecord,
        new_config: Configuration,
        results: tuple[AppliedOp, ...],
    ) -> None:
        old = rec.config
        assert old is not None
        was_gated = rec.accepted_value is not None
        self._abandon(now, rec)  # a decision learned from elsewhere ends our own proposal
        self._install(rec, new_config)
        rec.history[record.epoch] = record
        rec.history.pop(record.epoch - self.config.max_history, None)
        self._count("configurations_applied")
        value = record.value
        me = self.local_peer
        own_fate = ""
        for result in results:
            op = result.op
            rec.applied[result.op_id] = record.epoch
            self._remove_pending(rec, result.op_id)
            self._count("ops_committed")
            if result.applied and op.subject == me and (op.kind in REMOVAL_KINDS or op.kind is OpKind.EVICT):
                own_fate = {OpKind.LEAVE: "left", OpKind.EVICT: "evicted"}.get(op.kind, "failed")
            self._events.append(
                OperationCommitted(
                    run=rec.run,
                    epoch=record.epoch,
                    kind=op.kind,
                    subject=op.subject,
                    other=op.other,
                    origin=op.origin,
                    detected_at=op.detected_at,
                    proposed_at=value.proposed_at,
                    committed_at=now,
                    activation_step=value.activation_step,
                    applied=result.applied,
                )
            )
        self._trim_applied(rec)
        self._events.append(ConfigurationCommitted(run=rec.run, configuration=new_config, committed_at=now))
        if rec.state is RunState.REMOVED:
            return  # a lame duck only needs the configurations (its last steps may end earlier)
        if was_gated:
            self._events.append(GateReleased(run=rec.run))
        rec.reset_instance()
        if not new_config.has_member(me):
            self._remove(now, rec, own_fate or "excluded")
            return
        rec.state = transition(rec.state, RunEvent.COMMIT)
        if rec.completed >= new_config.activation_step:
            self._resync(rec, new_config)
        self._revalidate_pending(now, rec)

    def _install(self, rec: RunRecord, config: Configuration) -> None:
        rec.config = config
        rec.configs.append(config)
        if len(rec.configs) > self.config.max_history:
            del rec.configs[0]
        rec.encoded = None
        me = config.incarnation_of(self.local_peer)
        if me is not None:
            rec.incarnation = me

    def _trim_applied(self, rec: RunRecord) -> None:
        horizon = rec.epoch - self.config.max_history
        if rec.applied and next(iter(rec.applied.values())) < horizon:
            for ident in [i for i, e in rec.applied.items() if e < horizon]:
                del rec.applied[ident]

    def _revalidate_pending(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        assert config is not None
        for ident, op in list(rec.pending.items()):
            if ident in rec.applied or check_operation(op, config) is not None:
                self._remove_pending(rec, ident)
            elif op.kind is OpKind.FAIL and not self._fail_matters(rec, op):
                self._remove_pending(rec, ident)  # its removal already took effect here
        self._check_stuck(now, rec)
        if rec.pending:
            # The new epoch ranks proposers differently: hand our pending operations to its best.
            self._announce(rec, tuple(rec.pending.values()))
            self._ops_became_pending(now, rec)

    def _resync(self, rec: RunRecord, config: Configuration) -> None:
        """Tell training its steps from ``config``'s activation step on are void; our record of its
        progress goes back with it (so a step it must redo is seen as the one it is at)."""
        step = config.activation_step
        self._count("resyncs_needed")
        self._events.append(ResyncNeeded(run=rec.run, step=step, epoch=config.epoch))
        rec.completed = min(rec.completed, step - 1)
        rec.entered = min(rec.entered, step - 1)
        rec.last_completed_at = None
        rec.stuck_checked = None

    def _remove(self, now: float, rec: RunRecord, reason: str) -> None:
        rec.state = transition(rec.state, RunEvent.REMOVE)
        rec.removed_reason = reason
        rec.pending.clear()
        rec.pending_removals.clear()
        rec.pending_fails.clear()
        rec.pending_joins.clear()
        rec.pending_evicts.clear()
        rec.sponsored.clear()
        rec.reset_instance()
        rec.sync_at = now + self.config.sync_interval_s if self._lame_duck(rec) else None
        config = rec.config
        step = 0 if config is None else config.activation_step
        self._events.append(RemovedFromRun(run=rec.run, epoch=rec.epoch, reason=reason, activation_step=step))

    # ------------------------------------------------------------------ anti-entropy

    def _send_sync(self, now: float, rec: RunRecord) -> None:
        rec.sync_at = None
        config = rec.config
        if config is None or not self._learner(rec):
            return
        rec.sync_at = now + self.config.sync_interval_s * self._rng.uniform(0.75, 1.25)
        n = len(config.peers)
        member = config.has_member(self.local_peer)
        if n == 0 or (n == 1 and member):
            return
        # Our ring neighbours; a lame duck (no longer a member) uses the place it would sit at.
        i = config.index_of(self.local_peer) if member else bisect.bisect_left(config.peers, self.local_peer)
        message = Sync(run=rec.run, epoch=config.epoch, digest=config.digest)
        # Plus one random member: both neighbours may be gone (crashed, left) without our knowing.
        neighbours = {config.peers[(i + 1) % n], config.peers[(i - 1) % n], config.peers[self._rng.randrange(n)]}
        for peer in neighbours:
            if peer != self.local_peer:
                self._send(peer, message)

    def _request_sync(self, rec: RunRecord, peer: PeerID) -> None:
        self._count("syncs_requested")
        self._send(peer, SyncRequest(run=rec.run, from_epoch=rec.epoch + 1))

    def _on_sync(self, now: float, sender: PeerID, msg: Sync) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        config = rec.config
        if config is None or rec.state is RunState.JOINING:
            return
        if rec.state in MEMBER_STATES and config.has_member(sender):
            self._heard_from(rec, sender)
        if msg.epoch > config.epoch:
            if self._learner(rec):
                self._request_sync(rec, sender)
        elif msg.epoch < config.epoch:
            self._send(sender, self._sync_reply(rec, msg.epoch + 1))
        elif msg.digest != config.digest:
            self._reject(msg.run, "digest_mismatch", sender)

    def _on_sync_request(self, now: float, sender: PeerID, msg: SyncRequest) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        if rec.config is None or msg.from_epoch > rec.epoch:
            return
        self._send(sender, self._sync_reply(rec, msg.from_epoch))

    def _sync_reply(self, rec: RunRecord, from_epoch: int) -> SyncReply:
        config = rec.config
        assert config is not None
        epochs = range(max(from_epoch, 1), config.epoch + 1)
        if len(epochs) <= self.config.max_history and all(e in rec.history for e in epochs):
            return SyncReply(run=rec.run, commits=tuple(rec.history[e] for e in epochs))
        return SyncReply(run=rec.run, snapshot=self._encoded(rec))

    def _encoded(self, rec: RunRecord) -> bytes:
        config = rec.config
        assert config is not None
        if rec.encoded is None:
            rec.encoded = config.encode()
        return rec.encoded

    def _on_sync_reply(self, now: float, sender: PeerID, msg: SyncReply) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        if rec.state is RunState.JOINING:
            if msg.snapshot:
                self._offer_configuration(now, rec, msg.snapshot, sender, expected_digest=None)
            return
        if not self._learner(rec):
            return
        if len(msg.commits) > self.config.max_history:
            self._reject(msg.run, "too_many_commits", sender)
            return
        for record in sorted(msg.commits, key=lambda r: r.epoch):
            if not self._learner(rec):
                return
            if record.epoch != rec.epoch + 1:
                continue
            if not self._learn(now, rec, record, sender):
                return
        if msg.snapshot and self._learner(rec):
            self._offer_configuration(now, rec, msg.snapshot, sender, expected_digest=None)

    def _offer_configuration(
        self, now: float, rec: RunRecord, raw: bytes, sender: PeerID, *, expected_digest: bytes | None
    ) -> None:
        """A full configuration from ``sender``: admission (joining) or a snapshot (far behind)."""
        try:
            config = decode_configuration(raw, max_members=self.config.max_members, max_links=self.config.max_links)
        except RemoteProtocolError:
            self._reject(rec.run, "bad_configuration", sender)
            return
        if config.run != rec.run or (expected_digest is not None and config.digest != expected_digest):
            self._reject(rec.run, "digest_mismatch", sender)
            return
        if config.epoch <= rec.epoch:
            return
        join = rec.join
        if rec.state is RunState.JOINING:
            assert join is not None
            known = join.known
            trusted = config.has_member(sender) or (known is not None and known.has_member(sender))
            mine = config.incarnation_of(self.local_peer)
            # Only a configuration holding the JOIN we signed in this attempt admits us: a delayed
            # or duplicated COMMIT of an earlier admission (an incarnation since removed) would
            # put us back under a configuration the run has replaced (spec section 9, joins).
            if not trusted or mine is None or join.op is None or mine < join.op.incarnation:
                return
            self._admit(now, rec, config, sender)
            return
        if not (config.has_member(sender) or (rec.config is not None and rec.config.has_member(sender))):
            self._reject(rec.run, "not_member", sender)
            return
        if rec.state is RunState.REMOVED:
            # A lame duck far behind: the newest configuration's record of its departure says
            # when its participation ends (_config_for); older configurations still tell it who
            # trains the steps before that.
            self._install(rec, config)
            self._events.append(ConfigurationCommitted(run=rec.run, configuration=config, committed_at=now))
            return
        # A member far behind: adopt the snapshot (the history cannot bridge the gap).
        was_gated = rec.accepted_value is not None
        self._abandon(now, rec)
        self._count("snapshots_adopted")
        rec.configs.clear()
        rec.history.clear()
        self._install(rec, config)
        self._events.append(ConfigurationCommitted(run=rec.run, configuration=config, committed_at=now))
        if was_gated:
            self._events.append(GateReleased(run=rec.run))
        rec.reset_instance()
        if not config.has_member(self.local_peer):
            self._remove(now, rec, "excluded")
            return
        rec.state = transition(rec.state, RunEvent.COMMIT)
        if rec.completed >= config.activation_step:
            self._resync(rec, config)
        # Operations older than the snapshot may have been applied in the epochs we skipped.
        for ident, op in list(rec.pending.items()):
            if op.epoch < config.epoch:
                self._remove_pending(rec, ident)
        self._revalidate_pending(now, rec)

    # ------------------------------------------------------------------ joins, run info, announcements

    def _send_query(self, run: str, peer: PeerID) -> int:
        request_id = self._rng.getrandbits(63)
        if len(self._queries) >= _MAX_QUERIES:
            self._queries.pop(next(iter(self._queries)))
        self._queries[request_id] = (run, peer)
        self._send(peer, RunInfoRequest(run=run, request_id=request_id))
        return request_id

    def _join_attempt(self, now: float, rec: RunRecord) -> None:
        join = rec.join
        assert join is not None
        sponsor = join.sponsors[join.attempt % len(join.sponsors)]
        join.attempt += 1
        join.answered = False
        join.request_id = self._send_query(rec.run, sponsor)
        join.retry_at = now + self.config.join_retry_s * self._jitter()

    def _on_run_info_request(self, now: float, sender: PeerID, msg: RunInfoRequest) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.state not in MEMBER_STATES or rec.config is None:
            self._send(sender, RunInfoReply(run=msg.run, request_id=msg.request_id))
            return
        raw = self._encoded_for(rec, sender)
        self._send(sender, RunInfoReply(run=msg.run, request_id=msg.request_id, configuration=raw, step=rec.entered))

    def _encoded_for(self, rec: RunRecord, peer: PeerID) -> bytes:
        """The configuration to hand ``peer``: our newest, unless ``peer`` is a member that may not
        have learned its admission yet (its COMMIT was lost; we completed no step it takes part
        in, which no step can be without it) and configurations committed since then activate
        after its first step. Then it gets the newest one governing that step (the one that
        admitted it, or a later one activating earlier), and catches up from there through SYNC:
        a newcomer handed only the newest configuration would know none for the steps before its
        activation step, which the members count on it for."""
        config = rec.config
        assert config is not None
        i = config.index_of(peer)
        if i < 0 or config.activation_step <= config.since_steps[i] or config.since_steps[i] <= rec.completed:
            return self._encoded(rec)
        since, incarnation = config.since_steps[i], config.incarnations[i]
        for older in reversed(rec.configs):
            if older.activation_step <= since:
                # The newcomer trusts a configuration only from one of its members.
                if older.incarnation_of(peer) == incarnation and older.has_member(self.local_peer):
                    return older.encode()
                break
        return self._encoded(rec)  # beyond our history (or we joined later): the newest is all we can give

    def _on_run_info(self, now: float, sender: PeerID, msg: RunInfoReply) -> None:
        query = self._queries.pop(msg.request_id, None)
        if query is None or query != (msg.run, sender):
            self._reject(msg.run, "unsolicited", sender)
            return
        config: Configuration | None = None
        if msg.configuration:
            try:
                config = decode_configuration(
                    msg.configuration, max_members=self.config.max_members, max_links=self.config.max_links
                )
            except RemoteProtocolError:
                self._reject(msg.run, "bad_configuration", sender)
                return
            if config.run != msg.run or not config.has_member(sender):
                self._reject(msg.run, "bad_configuration", sender)
                config = None
        self._events.append(RunInfo(run=msg.run, configuration=config, step=msg.step, from_peer=sender))
        rec = self._runs.get(msg.run)
        join = None if rec is None else rec.join
        if rec is None or join is None or rec.state is not RunState.JOINING or msg.request_id != join.request_id:
            return
        join.answered = True
        if config is None:
            self._join_refused(rec, sender, "not_member")
            return
        join.known = config
        skip = (sender.raw, self.local_peer.raw)  # raw bytes compare much faster than PeerIDs
        others = [p for p in config.peers if p.raw not in skip]
        if others:
            start = self._rng.randrange(len(others))
            others = others[start:] + others[:start]
        join.sponsors = [sender, *others]
        join.attempt = 1
        mine = config.incarnation_of(self.local_peer)
        if mine is not None and mine >= join.incarnation:
            self._admit(now, rec, config, sender)  # our admission commit was lost; this is the configuration
            return
        gone = config.departed_incarnation(self.local_peer)
        incarnation = max(join.incarnation, -1 if gone is None else gone + 1, -1 if mine is None else mine + 1)
        join.incarnation = incarnation
        join.op = sign_operation(
            self.identity,
            kind=OpKind.JOIN,
            run=rec.run,
            epoch=config.epoch,
            subject=self.local_peer,
            incarnation=incarnation,
            detected_at=now,
            throughput_samples_per_s=join.throughput,
        )
        self._count("ops_raised")
        request = JoinRequest(run=rec.run, op=join.op)
        self._send(sender, request)
        # The epoch's coordinator proposes at once, without phase 1, when it holds the JOIN: a copy
        # to it saves the sponsor's announcement hop (the sponsor still announces it, in case the
        # coordinator is down; the duplicate is recognised by its op id).
        lead = coordinator(config)
        if lead is not None and lead.raw not in skip:
            self._send(lead, request)

    def _join_refused(self, rec: RunRecord, sponsor: PeerID, reason: str) -> None:
        rec.state = transition(rec.state, RunEvent.JOIN_REFUSED)
        self._events.append(JoinRefused(run=rec.run, sponsor=sponsor, reason=reason))

    def _on_join_refused(self, now: float, sender: PeerID, msg: JoinRefusedMessage) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.state is not RunState.JOINING or rec.join is None:
            return
        if sender not in rec.join.sponsors:
            self._reject(msg.run, "unsolicited", sender)
            return
        rec.join.answered = True
        self._join_refused(rec, sender, msg.reason)

    def _on_join_request(self, now: float, sender: PeerID, msg: JoinRequest) -> None:
        rec = self._runs.get(msg.run)
        op = msg.op
        if rec is None or rec.state not in MEMBER_STATES or rec.config is None:
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="not_member"))
            return
        if op.kind is not OpKind.JOIN or op.origin != sender or op.subject != sender or op.run != msg.run:
            self._reject(msg.run, "forged_origin", sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="forged_origin"))
            return
        ident = self._sigs.check(op)
        if ident is None:
            self._reject(msg.run, "bad_signature", sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="bad_signature"))
            return
        config = rec.config
        held = config.incarnation_of(sender)
        if ident in rec.applied or (held is not None and held >= op.incarnation):
            snapshot = self._encoded_for(rec, sender)
            self._send(sender, SyncReply(run=msg.run, snapshot=snapshot))  # already admitted
            return
        if ident in rec.pending:
            self._sponsor(rec, sender, op.incarnation)
            self._announce(rec, (op,))  # a retry: the first announcement may have been lost
            return
        reason = check_operation(op, config)
        if reason is not None:
            self._reject(msg.run, reason, sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason=reason))
            return
        self._sponsor(rec, sender, op.incarnation)
        if self._admit_ops(now, rec, (op,), sender):
            self._announce(rec, (op,))
            self._ops_became_pending(now, rec)

    def _sponsor(self, rec: RunRecord, newcomer: PeerID, incarnation: int) -> None:
        sponsored = rec.sponsored
        sponsored.pop(newcomer.raw, None)
        sponsored[newcomer.raw] = (newcomer, incarnation)
        if len(sponsored) > _MAX_SPONSORED:
            del sponsored[next(iter(sponsored))]  # the oldest request; its newcomer still retries

    def _admit(self, now: float, rec: RunRecord, config: Configuration, sender: PeerID | None = None) -> None:
        rec.state = transition(rec.state, RunEvent.ADMIT)
        rec.configs.clear()
        rec.history.clear()
        rec.applied.clear()
        rec.join = None
        rec.entered = rec.completed = -1
        rec.last_completed_at = None
        self._install(rec, config)
        rec.reset_instance()
        rec.sync_at = now + self.config.sync_interval_s * self._rng.uniform(0.5, 1.5)
        self._events.append(ConfigurationCommitted(run=rec.run, configuration=config, committed_at=now))
        since = config.since_steps[config.index_of(self.local_peer)]
        self._events.append(Admitted(run=rec.run, configuration=config, activation_step=since))
        if sender is not None:
            # The configuration that admitted us may have been replaced already (its COMMIT came
            # late, or a member handed us the one governing our first step): catch up at once
            # instead of at the first SYNC beacon. Nothing newer: no answer.
            self._request_sync(rec, sender)

    def _on_announce(self, now: float, sender: PeerID, msg: OpsAnnounce) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        config = rec.config
        if rec.state not in MEMBER_STATES or config is None:
            self._reject(msg.run, "not_member", sender)
            return
        if len(msg.ops) > self.config.max_ops_per_batch:
            self._reject(msg.run, "too_many_ops", sender)
            return
        if msg.epoch > config.epoch:
            self._request_sync(rec, sender)
        if config.has_member(sender):
            self._note_progress(rec, msg.entered, msg.completed)
        if self._admit_ops(now, rec, msg.ops, sender):
            self._ops_became_pending(now, rec)
