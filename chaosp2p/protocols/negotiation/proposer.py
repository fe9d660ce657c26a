"""The Paxos roles of the negotiation machine: proposer and acceptor of each epoch's instance.

Instance e+1 decides the value that turns C_e into C_(e+1); the acceptors are the members of C_e.
The proposer of an instance either is the epoch's coordinator skipping phase 1 at round 0, or runs
phase 1 (PREPARE / PROMISE) and then phase 2 (ACCEPT / ACCEPTED) with a higher ballot; the value
rules (Paxos adoption, dead values, the activation step) are in ``paxos.py``. An acceptor gates at
the activation step of the value it accepted until the instance is decided.
"""

from __future__ import annotations

from collections.abc import Iterable

from chaosp2p.protocols.negotiation.certificates import make_certificate, statement
from chaosp2p.protocols.negotiation.configuration_change import (
    AppliedOp,
    check_operation,
    fail_signers_needed,
    next_configuration,
)
from chaosp2p.protocols.negotiation.core import MachineCore
from chaosp2p.protocols.negotiation.events import (
    GateRaised,
)
from chaosp2p.protocols.negotiation.justification import propose_statement, refuses
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Accepted,
    Ballot,
    Commit,
    CommitRecord,
    Nack,
    Prepare,
    Promise,
    RefusePast,
    Value,
)
from chaosp2p.protocols.negotiation.operations import (
    FAIL_KINDS,
    MEMBER_KINDS,
    REMOVAL_KINDS,
    Operation,
    OpKind,
    apply_key,
)
from chaosp2p.protocols.negotiation.paxos import (
    PromiseInfo,
    RunRecord,
    activation_step,
    choose_value,
    coordinator,
    is_urgent,
    link_down_supersedes,
    refuses_mid_step,
)
from chaosp2p.protocols.negotiation.promises import (
    back_acceptance,
    claimed_value,
    justified,
    promise_info,
    signed_promise,
)
from chaosp2p.protocols.negotiation.run_configuration import Configuration, quorum
from chaosp2p.protocols.negotiation.transitions import (
    MEMBER_STATES,
    ProposerEvent,
    ProposerPhase,
    RunEvent,
    proposer_transition,
    transition,
)
from chaosp2p.wire.identity import PeerID

_IDLE = ProposerPhase.IDLE
_PREPARING = ProposerPhase.PREPARING
_ACCEPTING = ProposerPhase.ACCEPTING


class PaxosRoles(MachineCore):
    """Proposer and acceptor of the open instance of each run."""

    # ------------------------------------------------------------------ proposer

    def _wake(self, now: float, rec: RunRecord) -> None:
        """Start a proposal if this member has something to decide and nobody else is deciding it."""
        if rec.state not in MEMBER_STATES or rec.proposer.phase is not _IDLE:
            return
        if rec.accepted_value is None and not self._proposable(rec):
            return
        config = rec.config
        assert config is not None
        fast = (
            coordinator(config) == self.local_peer
            and not rec.proposer.fast_used
            and rec.promised is None
            and rec.accepted_value is None
            # S comes from the progress of the members: a proposer without progress of its own (a
            # newcomer that has not trained yet) asks a quorum for theirs in phase 1 instead of
            # guessing from what it heard earlier, which may be stale.
            and self._informed(rec, rec.entered, rec.completed)
        )
        self._start_proposal(now, rec, fast=fast)

    def _urgent_pending(self, rec: RunRecord) -> bool:
        return bool(rec.pending_fails)

    def _informed(self, rec: RunRecord, entered: int, completed: int) -> bool:
        """Does this progress report pin S down? Only a member that completed a step knows where
        the run is: a newcomer enters its admission step at once, which may be far behind."""
        return completed >= 0

    def _start_proposal(self, now: float, rec: RunRecord, *, fast: bool) -> None:
        config = rec.config
        assert config is not None
        prop = rec.proposer
        prop.promises = {}
        prop.accepted_by = set()
        prop.shares = {}
        prop.outcome = None
        prop.refused = {}
        prop.started_at = now
        if fast:
            value, ids = self._fresh_value(now, rec, ())
            if value is None:
                return
            prop.phase = proposer_transition(prop.phase, ProposerEvent.FAST_ACCEPT)
            prop.fast_used = True
            prop.adopted = False
            prop.skipped = None
            prop.ballot = Ballot(round=0, proposer=self.local_peer)
            prop.value, prop.value_ids = value, ids
            self._count("proposals")
            self._count("fast_proposals")
            self._send_accepts(now, rec)
            return
        top = prop.max_round
        for ballot in (rec.promised, rec.accepted_ballot):
            if ballot is not None and ballot.round > top:
                top = ballot.round
        prop.max_round = top + 1
        ballot = Ballot(round=top + 1, proposer=self.local_peer)
        prop.phase = proposer_transition(prop.phase, ProposerEvent.PREPARE)
        prop.ballot = ballot
        prop.value, prop.value_ids = None, ()
        prop.retry_at = now + self.config.phase_timeout_s * self._jitter()
        self._count("proposals")
        rec.promised = ballot
        own = signed_promise(self.identity, rec, ballot)
        backed = own.backer is not None
        claimed = claimed_value(rec)
        prop.promises[self.local_peer.raw] = PromiseInfo(
            accepted_ballot=claimed[0] if backed else None,
            accepted_value=claimed[1] if backed else None,
            entered=rec.entered,
            completed=rec.completed,
            step_time_s=rec.step_time_s,
            accepted_digest=own.accepted_digest if backed else b"",
            proof=own,
        )
        prop.promised_entered, prop.promised_completed = rec.entered, rec.completed
        prepare = Prepare(run=rec.run, epoch=config.epoch + 1, ballot=ballot)
        self._broadcast_first(self._backups(rec), config.peers, prepare)
        if len(prop.promises) >= quorum(config):
            self._phase1_done(now, rec, force=True)

    def _fresh_value(
        self, now: float, rec: RunRecord, promises: Iterable[PromiseInfo], *, allow_empty: bool = False
    ) -> tuple[Value | None, tuple[bytes, ...]]:
        """A new value from the pending operations (one removal/join per subject), or None.

        ``allow_empty``: an instance that has a value accepted somewhere must be closed even if
        that value turned out dead and nothing is pending -- its acceptors stay gated until a
        decision -- so then an empty value (a configuration with nothing changed) is proposed.
        """
        config = rec.config
        assert config is not None
        chosen: dict[tuple[int, bytes], tuple[bytes, Operation]] = {}
        others: list[tuple[bytes, Operation]] = []
        me = self.local_peer
        # Evictions go in only with a quorum of distinct signers (fewer would do nothing): the
        # quorum's first signatures in apply order, the rest stay pending and lapse once it commits.
        evictable = set(self._evictable(rec))
        need = config.quorum
        for raw in evictable:
            signed = sorted(
                ((ident, rec.pending[ident]) for ident in rec.pending_evicts[raw].values()),
                key=lambda e: apply_key(e[0], e[1]),
            )
            others.extend(signed[:need])
        # Likewise failures: only with enough distinct first-hand signers (FAIL_SIGNERS), and then
        # just that many of their FAILs; a lone FAIL waits for a second observer.
        failable = {raw for raw in self._failable(rec) if raw != me.raw and raw not in evictable}
        for raw in failable:
            signed = sorted(
                ((ident, rec.pending[ident]) for ident in rec.pending_fails[raw].values()),
                key=lambda e: apply_key(e[0], e[1]),
            )
            others.extend(signed[: fail_signers_needed(config, signed[0][1].subject)])
        for ident, op in rec.pending.items():
            if op.kind is OpKind.EVICT or op.kind in FAIL_KINDS:
                continue  # handled above
            if op.kind is OpKind.LEAVE and op.subject.raw in failable:
                continue  # the failure removes it (urgently)
            if op.subject.raw in evictable and op.kind in MEMBER_KINDS:
                continue  # void against the eviction (it would be dropped)
            if op.kind is OpKind.JOIN and op.subject.raw in self._failed:
                continue  # membership says the newcomer died: admitting it would only cost a quorum
            if op.kind in REMOVAL_KINDS or op.kind is OpKind.JOIN:
                # A LEAVE, or repeated JOINs of one newcomer: propose one, keep the rest pending
                # (they become invalid, and are dropped, once it commits).
                key = (0 if op.kind in REMOVAL_KINDS else 1, op.subject.raw)
                best = chosen.get(key)
                if best is None or apply_key(ident, op) < apply_key(*best):
                    chosen[key] = (ident, op)
            else:
                others.append((ident, op))
        entries = sorted([*chosen.values(), *others], key=lambda e: apply_key(e[0], e[1]))
        # Admit only as many newcomers as keep the members we believe alive a quorum of the new
        # configuration even if every newcomer dies at once (they could not be failed otherwise).
        # A run of one member still admits one (a two-member run tolerates no crash anyway).
        removed = {
            op.subject.raw
            for _, op in entries
            if (op.kind in REMOVAL_KINDS or op.kind is OpKind.EVICT) and config.has_member(op.subject)
        }
        size = len(config.peers) - len(removed)
        # Counted from the smaller side (this runs on every proposal; runs have ~1000 members).
        failed = self._failed
        if len(failed) < len(config.peers):
            live = size - sum(1 for raw in failed if raw not in removed and config.index_of(failed[raw][0]) >= 0)
        else:
            live = sum(1 for p in config.peers if p.raw not in removed and p.raw not in failed)
        # The largest j with live >= (size + j + 1) // 2 + 1 for every smaller j, in closed form.
        joins_left = max(0, 2 * live - size - 1)
        if len(config.peers) == 1:
            joins_left = max(joins_left, 1)
        kept = []
        for entry in entries:
            if entry[1].kind is OpKind.JOIN:
                if joins_left == 0:
                    continue
                joins_left -= 1
            kept.append(entry)
        entries = _whole_failures(config, kept[: self.config.max_ops_per_batch])
        if not entries and not allow_empty:
            return None, ()
        ops = [op for _, op in entries]
        infos = list(promises)
        step = activation_step(
            config=config,
            settings=self.config,
            ops=ops,
            entered=[rec.entered, rec.peer_entered, *(p.entered for p in infos)],
            completed=[rec.completed, rec.peer_completed, *(p.completed for p in infos)],
            step_times=[rec.step_time_s, *(p.step_time_s for p in infos)],
            previous=self._previous_config(rec),
        )
        value = Value(ops=tuple(ops), activation_step=step, proposed_at=now)
        return value, tuple(i for i, _ in entries)

    def _phase1_done(self, now: float, rec: RunRecord, *, force: bool) -> None:
        """A quorum promised: pick the value (Paxos rule, or fresh if none/dead) and send ACCEPT."""
        config = rec.config
        assert config is not None
        prop = rec.proposer
        choice = choose_value(prop.promises, config)
        if isinstance(choice, str):
            # The highest ballot is equivocated (or its value's content missing): more promises
            # are needed. Once everyone answered or the phase timed out, start over with a
            # higher ballot (a new phase 1 may hear from the members missing now).
            if force and len(config.peers) > 1:
                self._start_proposal(now, rec, fast=False)
            return
        _, value, skipped_value = choice
        skipped = skipped_value is not None
        prop.skipped = skipped_value
        ids: tuple[bytes, ...] | None = None
        adopted = value is not None
        if value is not None:
            if not force and prop.refusers - set(prop.promises):
                return  # members that refused this instance may prove the value dead: wait a bit
            ids = self._value_ids(rec, value)
            if ids is None:
                value = None  # an invalid accepted value cannot have been chosen by correct acceptors
        if value is None or ids is None:
            adopted = False
            if not force and not self._informed(rec, prop.promised_entered, prop.promised_completed):
                # Only newcomers that have not trained answered so far: an S from stale knowledge
                # could be accepted by them alone and rewrite steps the others completed. Wait for
                # a member with progress (until the phase times out).
                return
            value, ids = self._fresh_value(
                now, rec, prop.promises.values(), allow_empty=skipped or rec.accepted_value is not None
            )
            if value is None:
                prop.phase = proposer_transition(prop.phase, ProposerEvent.ABANDON)
                prop.retry_at = None
                return
        prop.phase = proposer_transition(prop.phase, ProposerEvent.PROMISED)
        prop.adopted = adopted
        prop.value, prop.value_ids = value, ids
        self._send_accepts(now, rec)

    def _send_accepts(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        prop = rec.proposer
        assert config is not None and prop.ballot is not None and prop.value is not None
        prop.retry_at = now + self.config.phase_timeout_s * self._jitter()
        prop.accepted_by = set()
        prop.shares = {}
        prop.outcome = self._outcome(rec, prop.value, prop.value_ids)
        refused = self._local_accept(
            now, rec, prop.ballot, prop.value, prop.value_ids, adopted=prop.adopted, outcome=prop.outcome
        )
        me = self.local_peer.raw
        if refused is None:
            prop.accepted_by.add(me)
            prop.shares[me] = rec.accepted_signature
        else:
            prop.refused[me] = refused
            prop.refusers.add(me)
        epoch = config.epoch + 1
        proposed = propose_statement(rec.run, epoch, prop.ballot, prop.outcome[0].digest)
        proofs = () if prop.ballot.round == 0 else tuple(p.proof for p in prop.promises.values() if p.proof)
        accept = Accept(
            run=rec.run,
            epoch=epoch,
            ballot=prop.ballot,
            value=prop.value,
            adopted=prop.adopted,
            proposer_signature=self.identity.sign(proposed),
            justification=proofs,
            skipped=prop.skipped if prop.value != prop.skipped else None,
        )
        self._disseminate(config, accept, self._backups(rec))
        self._check_phase2(now, rec)

    def _backups(self, rec: RunRecord) -> list[PeerID]:
        """The other proposers of the epoch, best-ranked first: PREPARE and ACCEPT go to them
        before the rest, since their backoff may end while the other copies are still being sent
        (and then they start a phase 1 that duels with ours)."""
        return self._ranked(rec, self.config.announce_fanout + 1, skip_self=True)

    def _check_phase2(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        prop = rec.proposer
        assert config is not None
        q = quorum(config)
        if len(prop.accepted_by) >= q:
            self._decide(now, rec)
        elif len(prop.refused) + self._silent_subjects(rec) >= len(config.peers) - q + 1:
            # Too many members are past S for this value to be chosen at this ballot: look again.
            self._start_proposal(now, rec, fast=False)

    def _silent_subjects(self, rec: RunRecord) -> int:
        """Members of C_e that a fresh value FAILs and that have not answered: by ``refuses`` they
        can never accept it at this ballot (alive, they refuse it; dead, they never answer), so
        they count towards the restart threshold like refusals -- without waiting for a timeout.
        An adopted value is accepted even by its subjects, so then nobody is counted. Restarting
        phase 1 is always safe (a higher ballot); this only decides *when*. They are not added to
        ``refusers`` (phase 1 waits for refusers' promises, and a dead subject sends none)."""
        prop = rec.proposer
        config = rec.config
        value = prop.value
        if prop.adopted or value is None or config is None:
            return 0
        subjects = {op.subject.raw for op in value.ops if op.kind in FAIL_KINDS and config.has_member(op.subject)}
        return len(subjects - prop.accepted_by - prop.refused.keys())

    def _proposer_timeout(self, now: float, rec: RunRecord) -> None:
        prop = rec.proposer
        config = rec.config
        if rec.state not in MEMBER_STATES or config is None:
            return
        if prop.phase is _PREPARING and len(prop.promises) >= quorum(config):
            self._phase1_done(now, rec, force=True)
        elif prop.phase is not _IDLE:
            self._start_proposal(now, rec, fast=False)

    def _abandon(self, now: float, rec: RunRecord) -> None:
        prop = rec.proposer
        if prop.phase is not _IDLE:
            prop.phase = proposer_transition(prop.phase, ProposerEvent.ABANDON)
            prop.retry_at = None

    def _decide(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        prop = rec.proposer
        assert config is not None and prop.value is not None
        assert prop.ballot is not None and prop.outcome is not None
        value = prop.value
        new_config, results = prop.outcome
        prop.phase = proposer_transition(prop.phase, ProposerEvent.DECIDED)
        prop.retry_at = None
        self._count("commits")
        certificate = make_certificate(config, prop.ballot, prop.shares)
        record = CommitRecord(epoch=new_config.epoch, value=value, digest=new_config.digest, certificate=certificate)
        plain = Commit.of(rec.run, record)
        self._disseminate(config, plain)
        # Members that left but still train steps this value now governs must learn it too.
        lame = [d.peer_id for d in config.departed if d.activation_step > value.activation_step]
        if lame:
            self._broadcast(lame, plain)
        newcomers = [
            r.op.subject
            for r in results
            if r.applied
            and r.op.kind is OpKind.JOIN
            and new_config.has_member(r.op.subject)
            and not config.has_member(r.op.subject)
        ]
        if newcomers:
            full = Commit.of(rec.run, record, new_config.encode())
            for peer in newcomers:
                self._send(peer, full)
        self._apply_commit(now, rec, record, new_config, results)

    def _value_ids(self, rec: RunRecord, value: Value) -> tuple[bytes, ...] | None:
        """Op ids of a value whose operations are all correctly signed and valid against C_e."""
        config = rec.config
        assert config is not None
        if len(value.ops) > self.config.max_ops_per_batch:
            return None
        # The deterministic rule first: it costs microseconds, a signature check ~100.
        for op in value.ops:
            if check_operation(op, config) is not None:
                return None
        if _short_failures(config, value.ops):
            return None  # a FAIL without its second signer: urgent in form, removing nobody
        ids = []
        for op in value.ops:
            ident = self._sigs.check(op)
            if ident is None or ident in rec.applied:
                return None  # forged, or committed before (a replay)
            ids.append(ident)
        if len(set(ids)) != len(ids):
            return None
        return tuple(ids)

    # ------------------------------------------------------------------ acceptor

    def _instance(self, now: float, sender: PeerID, run: str, epoch: int) -> RunRecord | None:
        """The run if ``epoch`` is its open instance and ``sender`` a member of C_e; else None (handled)."""
        rec = self._runs.get(run)
        if rec is None:
            self._reject(run, "unknown_run", sender)
            return None
        config = rec.config
        if rec.state not in MEMBER_STATES or config is None:
            self._reject(run, "not_member", sender)
            return None
        if epoch <= config.epoch:
            record = rec.history.get(epoch)
            if not config.params.admits(sender):
                self._reject(run, "not_admitted", sender)  # a closed run's commits are not for outsiders
                return None
            if record is not None:
                # The sender missed this decision: give it the commit instead of an answer.
                self._send(sender, Commit.of(run, record))
            else:  # too old for our history: tell it where we are, it will ask for a snapshot
                ballot = Ballot(round=0, proposer=sender)
                self._send(sender, Nack(run=run, epoch=epoch, ballot=ballot, known_epoch=config.epoch))
            self._reject(run, "old_epoch", sender)
            return None
        if epoch > config.epoch + 1:
            self._request_sync(rec, sender)
            return None
        if not config.has_member(sender):
            self._reject(run, "not_member", sender)
            return None
        self._heard_from(rec, sender)
        return rec

    def _ballot_ok(self, rec: RunRecord, sender: PeerID, ballot: Ballot, *, accept: bool) -> bool:
        config = rec.config
        assert config is not None
        # A PREPARE comes from its proposer; an ACCEPT may be relayed by another member (the
        # answer goes to the ballot's proposer either way).
        if ballot.proposer != sender and not (accept and config.has_member(ballot.proposer)):
            self._reject(rec.run, "forged_ballot", sender)
            return False
        if ballot.round == 0 and not (accept and coordinator(config) == ballot.proposer):
            # Round 0 skips phase 1: only the epoch's coordinator may use it, and only to ACCEPT.
            self._reject(rec.run, "forged_ballot", sender)
            return False
        return True

    def _on_prepare(self, now: float, sender: PeerID, msg: Prepare) -> None:
        rec = self._instance(now, sender, msg.run, msg.epoch)
        if rec is None or not self._ballot_ok(rec, sender, msg.ballot, accept=False):
            return
        promised = rec.promised
        if promised is not None and msg.ballot.key() < promised.key():
            self._nack(rec, sender, msg.epoch, msg.ballot)
            return
        rec.promised = msg.ballot
        self._saw_other_proposer(now, rec, msg.ballot)
        proof = signed_promise(self.identity, rec, msg.ballot)
        accepted_ballot, accepted_value = claimed_value(rec)
        self._send(
            sender,
            Promise(
                run=msg.run,
                epoch=msg.epoch,
                ballot=msg.ballot,
                accepted_ballot=accepted_ballot,
                accepted_value=accepted_value,
                ops=tuple(rec.pending.values())[: self.config.max_ops_per_batch],
                entered=rec.entered,
                completed=rec.completed,
                step_time_s=rec.step_time_s,
                accepted_digest=proof.accepted_digest,
                backer=proof.backer,
                backing=proof.backing,
                signature=proof.signature,
            ),
        )

    def _nack(self, rec: RunRecord, sender: PeerID, epoch: int, ballot: Ballot) -> None:
        self._send(sender, Nack(run=rec.run, epoch=epoch, ballot=ballot, promised=rec.promised, known_epoch=rec.epoch))
        self._reject(rec.run, "stale_ballot", sender)

    def _saw_other_proposer(self, now: float, rec: RunRecord, ballot: Ballot) -> None:
        """Another proposer is active: stand back, and take over only if it does not finish."""
        prop = rec.proposer
        if prop.ballot is not None and prop.phase is not _IDLE and prop.ballot.key() < ballot.key():
            self._abandon(now, rec)
        prop.max_round = max(prop.max_round, ballot.round)
        first = rec.activity_at is None
        rec.activity_at = now
        if first or rec.wake_at is None:
            # Counted from the first sign of the instance, not postponed by later ones: a proposer
            # that keeps retrying without success (say it cannot hear the answers) must not keep
            # everyone else from finishing the instance.
            rank = min(self._rank_of_self(rec), 8)
            rec.wake_at = now + self.config.decision_timeout_s * (1.0 + 0.5 * rank) * self._jitter()

    def _on_accept(self, now: float, sender: PeerID, msg: Accept) -> None:
        rec = self._instance(now, sender, msg.run, msg.epoch)
        if rec is None or not self._ballot_ok(rec, sender, msg.ballot, accept=True):
            return
        self._forward(rec, sender, msg)
        proposer = msg.ballot.proposer
        promised = rec.promised
        if promised is not None and msg.ballot.key() < promised.key():
            self._nack(rec, proposer, msg.epoch, msg.ballot)
            return
        value = msg.value
        if rec.accepted_ballot == msg.ballot:
            if rec.accepted_value == value:
                self._reply_accepted(rec, proposer, msg)  # a duplicate: answer again
            else:
                # Another value at a ballot we already accepted: its proposer equivocates (an honest
                # one proposes one value per ballot). Accepting both would let it certify both.
                self._reject(msg.run, "equivocation", sender)
            return
        ids = self._value_ids(rec, value)
        if ids is None:
            self._reject(msg.run, "bad_value", sender)
            return
        reason = self._step_problem(rec, value)
        if reason is not None:
            self._reject(msg.run, reason, sender)
            return
        outcome = self._outcome(rec, value, ids)
        reason, adopted = justified(self._sigs, rec, msg, outcome[0].digest, self._digest_of)
        if reason is not None:
            self._reject(msg.run, reason, sender)
            return
        refused = self._local_accept(now, rec, msg.ballot, value, ids, adopted=adopted, outcome=outcome)
        if refused is not None:
            self._send(proposer, RefusePast(run=msg.run, epoch=msg.epoch, ballot=msg.ballot, completed=refused))
            return
        if proposer != self.local_peer:
            back_acceptance(rec, proposer, msg.proposer_signature)
        self._saw_other_proposer(now, rec, msg.ballot)
        self._reply_accepted(rec, proposer, msg)

    def _reply_accepted(self, rec: RunRecord, sender: PeerID, msg: Accept) -> None:
        self._send(
            sender,
            Accepted(
                run=msg.run,
                epoch=msg.epoch,
                ballot=msg.ballot,
                entered=rec.entered,
                completed=rec.completed,
                step_time_s=rec.step_time_s,
                signature=rec.accepted_signature,
            ),
        )

    def _digest_of(self, rec: RunRecord, value: Value) -> bytes | None:
        """Digest of the configuration ``value`` makes from C_e, or None if the value is invalid."""
        ids = self._value_ids(rec, value)
        return None if ids is None else self._outcome(rec, value, ids)[0].digest

    def _outcome(
        self, rec: RunRecord, value: Value, ids: tuple[bytes, ...]
    ) -> tuple[Configuration, tuple[AppliedOp, ...]]:
        """C_{e+1} if ``value`` is chosen (computed once per value: accepting, signing and the commit
        all need it)."""
        config = rec.config
        assert config is not None
        if rec.accepted_value is value or (rec.accepted_value == value and rec.accepted_outcome is not None):
            assert rec.accepted_outcome is not None
            return rec.accepted_outcome
        prop = rec.proposer
        if prop.outcome is not None and (prop.value is value or prop.value == value):
            return prop.outcome
        return next_configuration(config, zip(ids, value.ops, strict=True), value.activation_step)

    @staticmethod
    def _previous_config(rec: RunRecord) -> Configuration | None:
        """C_{e-1}, if still kept (it decides whether a LINK_DOWN may supersede C_e)."""
        config = rec.config
        if config is None:
            return None
        return next((c for c in reversed(rec.configs) if c.epoch == config.epoch - 1), None)

    def _step_problem(self, rec: RunRecord, value: Value) -> str | None:
        """Why the value's activation step is unacceptable as input (not merely late), or None."""
        config = rec.config
        assert config is not None
        step = value.activation_step
        if step < config.activation_step and not (
            is_urgent(value.ops) or link_down_supersedes(value.ops, config, self._previous_config(rec))
        ):
            return "step_in_past"
        reference = max(rec.completed, rec.entered, rec.peer_entered, config.activation_step, 0)
        if step > reference + self.config.max_step_ahead:
            return "step_too_far"
        return None

    def _local_accept(
        self,
        now: float,
        rec: RunRecord,
        ballot: Ballot,
        value: Value,
        ids: tuple[bytes, ...],
        *,
        adopted: bool,
        outcome: tuple[Configuration, tuple[AppliedOp, ...]],
    ) -> int | None:
        """Accept ``value`` (and gate at its step) unless it refuses it (see ``paxos.refuses``);
        returns the completed step if refused. Accepting signs the acceptance statement over the
        digest of C_{e+1}: the proposer needs a quorum of these signatures to commit."""
        config = rec.config
        assert config is not None
        if not adopted and (
            refuses(value, self.local_peer.raw, rec.completed)
            or refuses_mid_step(value, config, entered=rec.entered, completed=rec.completed)
        ):
            self._count("refused_past")
            return rec.completed
        old_gate = rec.gate_step
        epoch = outcome[0].epoch
        rec.promised = ballot
        rec.accepted_ballot = ballot
        rec.accepted_value = value
        rec.accepted_ids = ids
        rec.accepted_outcome = outcome
        rec.accepted_backer, rec.accepted_backing = None, b""  # set by the caller (or a share)
        body = statement(rec.run, epoch, ballot, outcome[0].digest)
        rec.accepted_signature = self.identity.sign(body)
        self._sigs.remember_share(self.local_peer, rec.accepted_signature, body)
        rec.state = transition(rec.state, RunEvent.ACCEPT)
        if old_gate != value.activation_step:
            self._events.append(GateRaised(run=rec.run, step=value.activation_step))
        return None

    def _on_promise(self, now: float, sender: PeerID, msg: Promise) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.config is None or rec.state not in MEMBER_STATES:
            return
        prop = rec.proposer
        if msg.epoch != rec.epoch + 1 or prop.phase is not _PREPARING or msg.ballot != prop.ballot:
            return  # late or for an older ballot: harmless
        if not rec.config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return
        info = promise_info(self._sigs, rec, sender, msg, self._digest_of)
        if info is None:
            self._reject(msg.run, "bad_promise", sender)
            return
        self._heard_from(rec, sender)
        self._note_progress(rec, msg.entered, msg.completed)
        if msg.ops:
            self._admit_ops(now, rec, msg.ops, sender)
        prop.promises[sender.raw] = info
        prop.promised_entered = max(prop.promised_entered, msg.entered)
        prop.promised_completed = max(prop.promised_completed, msg.completed)
        if len(prop.promises) >= quorum(rec.config):
            self._phase1_done(now, rec, force=len(prop.promises) >= len(rec.config.peers))

    def _on_nack(self, now: float, sender: PeerID, msg: Nack) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.state not in MEMBER_STATES:
            return
        self._count("nacks_received")
        if msg.known_epoch > rec.epoch:
            self._request_sync(rec, sender)
            return
        prop = rec.proposer
        if msg.promised is not None:
            prop.max_round = max(prop.max_round, msg.promised.round)
        if msg.epoch == rec.epoch + 1 and prop.phase is not _IDLE and msg.ballot == prop.ballot:
            # Someone holds a higher ballot: let it finish, take over if it does not.
            self._abandon(now, rec)
            rec.activity_at = now
            rec.wake_at = now + self.config.phase_timeout_s * self._jitter()

    def _phase2_answer(self, sender: PeerID, msg: Accepted | RefusePast) -> RunRecord | None:
        """The run if ``msg`` answers our current ACCEPT and comes from a member of C_e."""
        rec = self._runs.get(msg.run)
        if rec is None or rec.config is None or rec.state not in MEMBER_STATES:
            return None
        prop = rec.proposer
        if msg.epoch != rec.epoch + 1 or prop.phase is not _ACCEPTING or msg.ballot != prop.ballot:
            return None  # late or for an older ballot: harmless
        if not rec.config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return None
        return rec

    def _on_accepted(self, now: float, sender: PeerID, msg: Accepted) -> None:
        rec = self._phase2_answer(sender, msg)
        if rec is None:
            return
        prop = rec.proposer
        outcome = prop.outcome
        assert outcome is not None and prop.ballot is not None
        if sender.raw in prop.shares:
            return  # a duplicate
        # The acceptor's signature is what makes the certificate: one that does not cover our value
        # (a forged or confused answer) does not count.
        body = statement(msg.run, msg.epoch, prop.ballot, outcome[0].digest)
        if not msg.signature or not self._sigs.verify(sender, msg.signature, body):
            self._reject(msg.run, "bad_signature", sender)
            return
        self._heard_from(rec, sender)
        self._note_progress(rec, msg.entered, msg.completed)
        prop.accepted_by.add(sender.raw)
        prop.shares[sender.raw] = msg.signature
        if rec.accepted_ballot == prop.ballot and rec.accepted_backer is None and sender != self.local_peer:
            # Our own acceptance of our value counts in our promises only with another's share.
            back_acceptance(rec, sender, msg.signature)
        self._check_phase2(now, rec)

    def _on_refuse_past(self, now: float, sender: PeerID, msg: RefusePast) -> None:
        rec = self._phase2_answer(sender, msg)
        if rec is None:
            return
        prop = rec.proposer
        self._heard_from(rec, sender)
        self._note_progress(rec, -1, msg.completed)
        prop.refused[sender.raw] = msg.completed
        prop.refusers.add(sender.raw)
        self._check_phase2(now, rec)


def _fail_counts(config: Configuration, ops: Iterable[Operation]) -> dict[bytes, tuple[PeerID, set[bytes]]]:
    counts: dict[bytes, tuple[PeerID, set[bytes]]] = {}
    for op in ops:
        if op.kind in FAIL_KINDS:
            counts.setdefault(op.subject.raw, (op.subject, set()))[1].add(op.origin.raw)
    return counts


def _short_failures(config: Configuration, ops: Iterable[Operation]) -> bool:
    """Does a FAIL in ``ops`` lack the distinct co-signers it needs (``fail_signers_needed``)?"""
    counts = _fail_counts(config, ops)
    return any(len(who) < fail_signers_needed(config, subject) for subject, who in counts.values())


def _whole_failures(config: Configuration, entries: list[tuple[bytes, Operation]]) -> list[tuple[bytes, Operation]]:
    """``entries`` without the FAILs of a subject whose co-signers the batch cap cut off."""
    counts = _fail_counts(config, (op for _, op in entries))
    short = {raw for raw, (subject, who) in counts.items() if len(who) < fail_signers_needed(config, subject)}
    if not short:
        return entries
    return [(i, op) for i, op in entries if not (op.kind in FAIL_KINDS and op.subject.raw in short)]
