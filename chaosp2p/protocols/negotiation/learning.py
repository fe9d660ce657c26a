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
from chaosp2p.protocols.negotiation.certificates import certified_forward, check_certificate
from chaosp2p.protocols.negotiation.configuration_change import AppliedOp, check_operation, next_configuration
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.events import (
    ConfigurationCommitted,
    GateReleased,
    OperationCommitted,
    RemovedFromRun,
    ResyncNeeded,
)
from chaosp2p.protocols.negotiation.joins import Joins
from chaosp2p.protocols.negotiation.messages import (
    Certificate,
    Commit,
    CommitRecord,
    OpsAnnounce,
    Sync,
    SyncReply,
    SyncRequest,
)
from chaosp2p.protocols.negotiation.operations import (
    FAIL_KINDS,
    REMOVAL_KINDS,
    OpKind,
    op_id,
)
from chaosp2p.protocols.negotiation.paxos import REPLY_EXPECTED, RunRecord
from chaosp2p.protocols.negotiation.run_configuration import MAX_OP_AGE_EPOCHS, Configuration
from chaosp2p.protocols.negotiation.transitions import (
    MEMBER_STATES,
    RunEvent,
    RunState,
    transition,
)
from chaosp2p.wire.identity import PeerID

_MAX_SYNC_ASKED = 64
"""Outstanding SYNC_REQUESTs per run (the oldest is forgotten first)."""


_SYNC_REPLY_BYTES = 512 << 10
"""Commit records per SYNC_REPLY stop at about this many bytes (frames are 1 MiB by default)."""


def _record_bytes(record: CommitRecord) -> int:
    """A generous estimate of a commit record's wire size (no encoding needed)."""
    cert = record.certificate
    signed = 0 if cert is None else 70 * len(cert.signatures) + len(cert.signers)
    return 160 + signed + 320 * len(record.value.ops)


class Learning(Joins):
    """Commits and anti-entropy (joins: ``joins.py``)."""

    # ------------------------------------------------------------------ decisions

    def _on_commit(self, now: float, sender: PeerID, msg: Commit) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        if rec.state is RunState.JOINING:
            join = rec.join
            known = None if join is None else join.known
            if join is None or known is None or not (known.has_member(sender) or sender in join.sponsors):
                # Only a member of the configuration we believe, or a member we asked, admits us:
                # anyone else's COMMIT is dropped before its configuration is even decoded.
                self._reject(msg.run, "not_member", sender)
                return
            if msg.configuration:
                self._offer_configuration(
                    now, rec, msg.configuration, sender, expected_digest=msg.digest, certificate=msg.certificate
                )
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
        self._learn(now, rec, msg.record(), sender)

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
                full = Commit.of(rec.run, record, self._encoded(rec))
            self._send(peer, full)

    def _learn(self, now: float, rec: RunRecord, record: CommitRecord, sender: PeerID) -> bool:
        """Apply a decided value learned from ``sender`` after checking it; False if refused."""
        config = rec.config
        assert config is not None
        value = record.value
        cert = record.certificate
        if cert is None:
            # Without the signatures of a quorum of C_e, a COMMIT is one member's word (finding 1
            # and 3 of issue 20: it forked the run). Checked before anything costly.
            self._reject(rec.run, "uncertified", sender)
            return False
        own = b""
        if rec.accepted_value is not None and rec.accepted_value == value and rec.accepted_outcome is not None:
            new_config, results = rec.accepted_outcome
            if rec.accepted_ballot == cert.ballot:
                own = rec.accepted_signature
        else:
            ids = self._value_ids(rec, value)
            if ids is None:
                self._reject(rec.run, "bad_value", sender)
                return False
            new_config, results = next_configuration(config, zip(ids, value.ops, strict=True), value.activation_step)
        if new_config.digest != record.digest:
            self._reject(rec.run, "digest_mismatch", sender)
            return False
        reason = check_certificate(
            self._sigs, config, record.epoch, record.digest, cert, me=self.local_peer, own_signature=own or None
        )
        if reason is not None:
            self._reject(rec.run, reason, sender)
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
        self._install(rec, new_config, record.certificate)
        self._sync_soon(now, rec)
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
                fates = {OpKind.LEAVE: "left", OpKind.EVICT: "evicted", OpKind.STALL: "stalled"}
                own_fate = fates.get(op.kind, "failed")
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

    def _trim_applied(self, rec: RunRecord) -> None:
        # Committed ids are remembered as long as an operation stays valid (MAX_OP_AGE_EPOCHS),
        # not just max_history: a replay older than our memory but still valid would otherwise
        # pass as new (issue 20, finding 10).
        horizon = rec.epoch - MAX_OP_AGE_EPOCHS
        if rec.applied and next(iter(rec.applied.values())) < horizon:
            for ident in [i for i, e in rec.applied.items() if e < horizon]:
                del rec.applied[ident]

    def _revalidate_pending(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        assert config is not None
        for ident, op in list(rec.pending.items()):
            if ident in rec.applied or check_operation(op, config) is not None:
                self._remove_pending(rec, ident)
            elif op.kind in FAIL_KINDS and not self._fail_matters(rec, op):
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

    def _remove(self, now: float, rec: RunRecord, reason: str, *, from_step: int | None = None) -> None:
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
        step = from_step if from_step is not None else 0 if config is None else config.activation_step
        self._events.append(RemovedFromRun(run=rec.run, epoch=rec.epoch, reason=reason, activation_step=step))

    # ------------------------------------------------------------------ anti-entropy

    def _send_sync(self, now: float, rec: RunRecord) -> None:
        rec.sync_at = None
        config = rec.config
        if config is None or not self._learner(rec):
            return
        # No work per round while nothing changes: a quiet run doubles the interval each round
        # (up to sync_interval_max_s); a new configuration resets it (_sync_soon), and anything
        # pending or an open instance keeps it at the base rate.
        quiet = not rec.pending and rec.accepted_value is None and not rec.sponsored
        rec.sync_quiet = rec.sync_quiet + 1 if quiet else 0
        cfg = self.config
        interval = min(cfg.sync_interval_s * 2.0 ** min(rec.sync_quiet, 30), cfg.sync_interval_max_s)
        rec.sync_at = now + interval * self._rng.uniform(0.75, 1.25)
        n = len(config.peers)
        member = config.has_member(self.local_peer)
        if n == 0 or (n == 1 and member):
            return
        # Our ring neighbours; a lame duck (no longer a member) uses the place it would sit at.
        i = config.index_of(self.local_peer) if member else bisect.bisect_left(config.peers, self.local_peer)
        message = Sync(run=rec.run, epoch=config.epoch, digest=config.digest)
        if rec.sync_quiet == 1:
            # The first quiet round after a change (typically just after a commit): the ring
            # successor only -- n SYNCs per decision instead of 3n, and still every member that
            # missed the COMMIT hears of it from its predecessor within sync_interval_s.
            neighbours = {config.peers[(i + 1) % n]}
        else:
            # Plus one random member: both neighbours may be gone (crashed, left) without our knowing.
            neighbours = {config.peers[(i + 1) % n], config.peers[(i - 1) % n], config.peers[self._rng.randrange(n)]}
        for peer in neighbours:
            if peer != self.local_peer:
                self._send(peer, message)

    def _sync_soon(self, now: float, rec: RunRecord) -> None:
        """A new configuration was installed: back to the base SYNC interval, so that a neighbour
        that missed its COMMIT hears of it within ``sync_interval_s`` even after a quiet spell."""
        base = self.config.sync_interval_s
        if rec.sync_at is not None and rec.sync_at > now + 1.25 * base:  # backed off (else no draw)
            rec.sync_at = now + base * self._rng.uniform(0.75, 1.25)

    def _request_sync(self, rec: RunRecord, peer: PeerID) -> None:
        if rec.config is not None:
            start = rec.epoch + 1
        else:  # a newcomer catching up from the configuration it trusts
            known = None if rec.join is None else rec.join.known
            if known is None:
                return
            start = known.epoch + 1
        self._count("syncs_requested")
        asked = rec.sync_asked
        if peer.raw not in asked and len(asked) >= _MAX_SYNC_ASKED:
            del asked[next(iter(asked))]
        asked[peer.raw] = start
        self._send(peer, SyncRequest(run=rec.run, from_epoch=start))

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
            # The sender is behind: tell it where we are and let it ask. Catch-up answers are read
            # only by a peer that asked for them (an unsolicited SYNC_REPLY replaced whole
            # configurations: issue 20, finding 1).
            self._send(sender, Sync(run=rec.run, epoch=config.epoch, digest=config.digest))
        elif msg.digest != config.digest:
            self._reject(msg.run, "digest_mismatch", sender)

    def _on_sync_request(self, now: float, sender: PeerID, msg: SyncRequest) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        if rec.config is None or msg.from_epoch > rec.epoch:
            return
        if not rec.config.params.admits(sender):  # a closed run's commits are for its admitted peers
            self._reject(msg.run, "not_admitted", sender)
            return
        self._send(sender, self._sync_reply(rec, msg.from_epoch))

    def _sync_reply(self, rec: RunRecord, from_epoch: int) -> SyncReply:
        config = rec.config
        assert config is not None
        epochs = range(max(from_epoch, 1), config.epoch + 1)
        if len(epochs) <= self.config.max_history and all(e in rec.history for e in epochs):
            # Certificates make records large (~34 KB at 1024 members): a reply carries what fits in
            # a frame, and the asker asks again from where it got to (_on_sync_reply).
            records: list[CommitRecord] = []
            size = 0
            for e in epochs:
                record = rec.history[e]
                size += _record_bytes(record)
                if records and size > _SYNC_REPLY_BYTES:
                    break
                records.append(record)
            return SyncReply(run=rec.run, commits=tuple(records))
        # Beyond our history: the configuration with its certificate, and the one before it (which
        # names the certificate's signers), so that the asker can count its own members among them.
        previous = next((c for c in reversed(rec.configs) if c.epoch == config.epoch - 1), None)
        return SyncReply(
            run=rec.run,
            snapshot=self._encoded(rec),
            certificate=rec.certs.get(config.epoch),
            previous=b"" if previous is None else self._encoded_config(rec, previous),
        )

    def _on_sync_reply(self, now: float, sender: PeerID, msg: SyncReply) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        if rec.sync_asked.pop(sender.raw, None) is None:
            self._reject(msg.run, "unsolicited", sender)
            return
        if len(msg.commits) > self.config.max_history:
            self._reject(msg.run, "too_many_commits", sender)
            return
        if rec.state is RunState.JOINING:
            self._newcomer_catch_up(now, rec, msg, sender)
            return
        config = rec.config
        if config is None or not self._learner(rec):
            return
        if not config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return
        learned = False
        for record in sorted(msg.commits, key=lambda r: r.epoch):
            if not self._learner(rec):
                return
            if record.epoch != rec.epoch + 1:
                continue
            if not self._learn(now, rec, record, sender):
                return
            learned = True
        if learned and not msg.snapshot and self._learner(rec):
            self._request_sync(rec, sender)  # the reply may have been cut to fit a frame: the rest, if any
        if msg.snapshot and self._learner(rec):
            self._offer_configuration(
                now, rec, msg.snapshot, sender, expected_digest=None, certificate=msg.certificate, previous=msg.previous
            )

    def _newcomer_catch_up(self, now: float, rec: RunRecord, msg: SyncReply, sender: PeerID) -> None:
        """A newcomer walks certified commits forward from its anchor (the configuration that admits
        it may be several epochs past the one it joined against), then takes any snapshot."""
        join = rec.join
        known = None if join is None else join.known
        if join is None or known is None:
            return
        for record in sorted(msg.commits, key=lambda r: r.epoch):
            if record.epoch != known.epoch + 1:
                continue
            value = record.value
            if len(value.ops) > self.config.max_ops_per_batch or any(check_operation(op, known) for op in value.ops):
                self._reject(rec.run, "bad_value", sender)
                return
            new, _ = next_configuration(known, ((op_id(op), op) for op in value.ops), value.activation_step)
            reason = "digest_mismatch" if new.digest != record.digest else None
            reason = reason or check_certificate(self._sigs, known, record.epoch, record.digest, record.certificate)
            if reason is not None:
                self._reject(rec.run, reason, sender)
                return
            known = join.known = new
            mine = new.incarnation_of(self.local_peer)
            if mine is not None and join.op is not None and mine >= join.op.incarnation:
                self._admit(now, rec, new, (sender, record.certificate))
                return
        if msg.snapshot:
            self._offer_configuration(
                now, rec, msg.snapshot, sender, expected_digest=None, certificate=msg.certificate, previous=msg.previous
            )

    def _decode(self, rec: RunRecord, raw: bytes, sender: PeerID) -> Configuration | None:
        """A configuration from the wire (None, rejected, if it does not decode or is another run's)."""
        try:
            config = decode_configuration(raw, max_members=self.config.max_members, max_links=self.config.max_links)
        except RemoteProtocolError:
            self._reject(rec.run, "bad_configuration", sender)
            return None
        if config.run != rec.run:
            self._reject(rec.run, "bad_configuration", sender)
            return None
        return config

    def _offer_configuration(
        self,
        now: float,
        rec: RunRecord,
        raw: bytes,
        sender: PeerID,
        *,
        expected_digest: bytes | None,
        certificate: Certificate | None,
        previous: bytes = b"",
    ) -> None:
        """A full configuration from ``sender``: admission (joining) or a snapshot (far behind).

        Installed only if proven to follow the configuration this peer trusts (the one it holds,
        or a newcomer's anchor): the next one with a quorum certificate, or a later one whose
        certificate a quorum of the trusted one's members signed (``certificates.certified_forward``).
        """
        config = self._decode(rec, raw, sender)
        if config is None:
            return
        if expected_digest is not None and config.digest != expected_digest:
            self._reject(rec.run, "digest_mismatch", sender)
            return
        if config.epoch <= rec.epoch:
            return
        before = None
        if previous:
            before = self._decode(rec, previous, sender)
            if before is None:
                return
        join = rec.join
        if rec.state is RunState.JOINING:
            assert join is not None
            known = join.known
            mine = config.incarnation_of(self.local_peer)
            # Only a configuration holding the JOIN we signed in this attempt admits us: a delayed
            # or duplicated COMMIT of an earlier admission (an incarnation since removed) would
            # put us back under a configuration the run has replaced (spec section 9, joins).
            if known is None or mine is None or join.op is None or mine < join.op.incarnation:
                return
            reason = certified_forward(self._sigs, known, config, certificate, before, me=self.local_peer)
            if reason is not None:
                self._reject(rec.run, reason, sender)
                # The commits between our anchor and it prove it. Asked once per sender: the entry
                # our JOIN left for the sponsor is no request (a second newcomer admitted together
                # with another is handed a configuration two epochs past its anchor, by the sponsor).
                if config.epoch > known.epoch + 1 and rec.sync_asked.get(sender.raw, REPLY_EXPECTED) == REPLY_EXPECTED:
                    self._request_sync(rec, sender)
                return
            self._admit(now, rec, config, (sender, certificate))
            return
        held = rec.config
        if held is None or not (config.has_member(sender) or held.has_member(sender)):
            self._reject(rec.run, "not_member", sender)
            return
        reason = certified_forward(self._sigs, held, config, certificate, before, me=self.local_peer)
        if reason is not None:
            self._reject(rec.run, reason, sender)
            if reason == "unverifiable" and held.has_member(sender):
                self._lost(now, rec, sender)
            return
        if rec.state is RunState.REMOVED:
            # A lame duck far behind: the newest configuration's record of its departure says
            # when its participation ends (_config_for); older configurations still tell it who
            # trains the steps before that.
            self._install(rec, config, certificate)
            self._sync_soon(now, rec)
            self._events.append(ConfigurationCommitted(run=rec.run, configuration=config, committed_at=now))
            return
        # A member far behind: adopt the snapshot (the history cannot bridge the gap).
        was_gated = rec.accepted_value is not None
        self._abandon(now, rec)
        self._count("snapshots_adopted")
        rec.configs.clear()
        rec.history.clear()
        rec.certs.clear()
        self._install(rec, config, certificate)
        self._sync_soon(now, rec)
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

    def _lost(self, now: float, rec: RunRecord, sender: PeerID) -> None:
        """``sender`` holds a newer configuration that no chain we can check ties to ours: the
        members who signed the epochs between have all gone, and nobody alive keeps their commits
        (a peer cut off while the run turned over). Waiting cannot fix that; once two members of
        our configuration (the only other one, in a pair) say so, leave the run as "lost" and
        rejoin as a newcomer, which takes its trust anew. One dishonest member alone cannot push
        us out, and leaving is always safe: it is what a crash does."""
        held = rec.config
        assert held is not None
        rec.unverifiable_from.add(sender.raw)
        if len(rec.unverifiable_from) < min(2, len(held.peers) - 1) or rec.state not in MEMBER_STATES:
            return
        self._count("lost")
        was_gated = rec.accepted_value is not None
        self._abandon(now, rec)
        if was_gated:
            self._events.append(GateReleased(run=rec.run))
        rec.reset_instance()
        # Nothing we hold governs a step any more (no lame duck of a future we cannot see): we stop
        # at the next step, and the newcomer we become loads the run's state afresh.
        rec.configs.clear()
        rec.certs.clear()
        rec.history.clear()
        self._remove(now, rec, "lost", from_step=rec.completed + 1)

    # ------------------------------------------------------------------ announcements

    def _on_announce(self, now: float, sender: PeerID, msg: OpsAnnounce) -> None:
        rec = self._runs.get(msg.run)
        if rec is None:
            self._reject(msg.run, "unknown_run", sender)
            return
        config = rec.config
        if rec.state not in MEMBER_STATES or config is None or not config.has_member(sender):
            # Only members announce operations: anyone else's are refused before any decoding of
            # their content or signature check (issue 20, finding 7).
            self._reject(msg.run, "not_member", sender)
            return
        if len(msg.ops) > self.config.max_ops_per_batch:
            self._reject(msg.run, "too_many_ops", sender)
            return
        if msg.epoch > config.epoch:
            self._request_sync(rec, sender)
        self._note_progress(rec, msg.entered, msg.completed)
        if self._admit_ops(now, rec, msg.ops, sender):
            self._ops_became_pending(now, rec)
