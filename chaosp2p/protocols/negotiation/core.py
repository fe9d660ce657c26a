"""Shared state and helpers of the negotiation machine (see :mod:`.machine` for the theory).

:class:`MachineCore` holds what every part of the machine uses: the run records, the pending
operations of each run and how they are announced, the proposer ranking of an epoch, and the
outgoing queue, events and counters. The Paxos roles (``proposer.py``) and the learning of
decisions, catch-up and joins (``learning.py``) build on it; ``machine.py`` puts them together.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.negotiation.config import NegotiationConfig
from chaosp2p.protocols.negotiation.configuration_change import (
    FAIL_SIGNERS,
    AppliedOp,
    capped_evictions,
    check_operation,
    fail_signers_needed,
)
from chaosp2p.protocols.negotiation.events import (
    NegotiationEvent,
    OperationRejected,
)
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Commit,
    CommitRecord,
    OpsAnnounce,
    Sync,
    Value,
)
from chaosp2p.protocols.negotiation.operations import (
    FAIL_KINDS,
    PROTOCOL,
    REMOVAL_KINDS,
    Operation,
    OpKind,
    SignatureCache,
    check_run,
    op_id,
    sign_operation,
)
from chaosp2p.protocols.negotiation.paxos import (
    RunRecord,
    coordinator,
)
from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.protocols.negotiation.transitions import (
    MEMBER_STATES,
    ProposerPhase,
    RunEvent,
    RunState,
    transition,
)
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

_IDLE = ProposerPhase.IDLE


class MachineCore:
    """State and helpers shared by the parts of :class:`~.machine.NegotiationMachine`."""

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(
        self,
        *,
        identity: Identity,
        config: NegotiationConfig,
        rng: random.Random,
        now: float,
        signature_cache: SignatureCache | None = None,
    ) -> None:
        self.identity = identity
        self.local_peer = identity.peer_id
        self.config = config
        self._rng = rng
        self._runs: dict[str, RunRecord] = {}
        self._outgoing: list[Outgoing] = []
        self._events: list[NegotiationEvent] = []
        # A simulation of many peers in one process may share one cache (all its peers verify the
        # same signatures); a real peer has its own.
        self._sigs = signature_cache or SignatureCache(config.verified_cache_size)
        self._limiter = RateLimiter(
            rate_per_s=config.rate_limit_msgs_per_s,
            burst=config.rate_limit_burst,
            max_senders=config.max_tracked_senders,
        )
        self._down: dict[bytes, float] = {}
        self._failed: dict[bytes, tuple[PeerID, int]] = {}
        self._failed_version = 0
        """Peers membership reported FAILED/LEFT (and not alive since), with that incarnation."""
        """Peers membership reported failed/left or the driver could not reach (proposer ranking)."""
        self._alive_inc: dict[bytes, int] = {}
        """Highest membership incarnation at which each peer was reported alive."""
        self._fail_hints: dict[bytes, float] = {}
        """Members another member's FAIL named, that we sent a message to check them ourselves
        (raw id -> when): if our driver then cannot reach one, we sign a FAIL of it too."""
        self._queries: dict[int, tuple[str, PeerID]] = {}
        self._trusted: frozenset[bytes] = frozenset()
        """Peers whose word a newcomer takes for a run's configuration (``trust``)."""
        self._declined: dict[str, set[bytes]] = {}
        """Per run: trusted peers that answered they are no member of it."""
        self._trusted_asked: dict[str, set[bytes]] = {}
        """Per run: trusted peers this newcomer asked about it on its own (once each)."""
        self._trusted_down: set[bytes] = set()
        """Trusted peers the driver could not reach (until they are heard from)."""
        self._anchors: dict[str, Configuration] = {}
        """Per run we are not (yet) a member of: the newest configuration we believe (joins.py)."""
        self._counts: dict[str, int] = {}
        self._rejections: dict[str, int] = {}
        self._started = now

    # ------------------------------------------------------------------ provided by the other parts
    def _wake(self, now: float, rec: RunRecord) -> None:
        raise NotImplementedError

    def _request_sync(self, rec: RunRecord, peer: PeerID) -> None:
        raise NotImplementedError

    def _abandon(self, now: float, rec: RunRecord) -> None:
        raise NotImplementedError

    def _value_ids(self, rec: RunRecord, value: Value) -> tuple[bytes, ...] | None:
        raise NotImplementedError

    def _apply_commit(
        self,
        now: float,
        rec: RunRecord,
        record: CommitRecord,
        new_config: Configuration,
        results: tuple[AppliedOp, ...],
    ) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ steps
    def _config_for(self, rec: RunRecord, step: int) -> Configuration | None:
        """The configuration governing ``step`` if this peer takes part in it and it is not gated."""
        if rec.state not in MEMBER_STATES and rec.state is not RunState.REMOVED:
            return None
        newest = rec.config
        if rec.state is RunState.REMOVED and newest is not None:
            # Our participation ends where the newest configuration says it does.
            gone = newest.departed_entry(self.local_peer)
            if step >= (newest.activation_step if gone is None else gone.activation_step):
                return None
        gate = rec.gate_step
        if gate is not None and step >= gate:
            return None
        for config in reversed(rec.configs):
            if config.activation_step <= step:
                return config if config.takes_part(self.local_peer, step) else None
        return None

    def _check_stuck(self, now: float, rec: RunRecord) -> None:
        """Fail every peer membership reported failed that the configuration of our next step still
        counts on. Usually its FAIL was raised when the failure was reported; this catches the rest:
        a member that left (or was admitted) for a later step and died before it, or an urgent
        value whose step came out later than the one we are stuck in."""
        config = rec.config
        if not self._failed or rec.state not in MEMBER_STATES or config is None:
            return
        step = max(rec.entered, rec.completed + 1, 0)
        governing = self._config_for(rec, step)
        if governing is None:
            return
        key = (governing.epoch, step, self._failed_version)
        if rec.stuck_checked == key:
            return  # nothing changed since the last look (this runs on every step)
        rec.stuck_checked = key
        for raw, (peer, observed) in list(self._failed.items()):
            if self.local_peer.raw in rec.pending_fails.get(raw, {}) or not governing.takes_part(peer, step):
                continue
            held = config.incarnation_of(peer)
            if held is None:
                gone = config.departed_entry(peer)
                if gone is None:
                    continue
                held = gone.incarnation
            self._raise(now, rec, kind=OpKind.FAIL, subject=peer, incarnation=held, observed_incarnation=observed)

    def _lame_duck(self, rec: RunRecord) -> bool:
        """Removed, but still training the steps before its removal took effect (a leaver): it keeps
        learning decisions, since an urgent one may end those steps earlier."""
        next_step = max(rec.completed + 1, rec.entered)
        return rec.state is RunState.REMOVED and self._config_for(rec, next_step) is not None

    def _learner(self, rec: RunRecord) -> bool:
        """Does this peer apply the run's decisions (a member, or a lame duck)?"""
        return rec.config is not None and (rec.state in MEMBER_STATES or self._lame_duck(rec))

    # ------------------------------------------------------------------ pending operations

    def _raise(
        self, now: float, rec: RunRecord, *, kind: OpKind, subject: PeerID, incarnation: int, **extra: Any
    ) -> None:
        config = rec.config
        assert config is not None
        op = sign_operation(
            self.identity,
            kind=kind,
            run=rec.run,
            epoch=config.epoch,
            subject=subject,
            incarnation=incarnation,
            detected_at=now,
            **extra,
        )
        self._count("ops_raised")
        ident = self._sigs.remember(op)
        reason = check_operation(op, config)
        if reason is not None:
            raise LocalProtocolError(f"negotiation: cannot raise {kind.name}: {reason}")
        self._add_pending(rec, ident, op)
        if kind in FAIL_KINDS and self._fail_in_flight(rec, subject):
            # The value we accepted already fails this member: announcing our own FAIL would only
            # cost the proposer a signature check on its critical path (every survivor observes
            # the failure). It stays pending: it goes into our PROMISEs, our takeover (we accepted,
            # so our decision timer runs) proposes it, and a commit without it re-announces it.
            self._count("fail_announcements_held")
        else:
            self._announce(rec, (op,))
        self._ops_became_pending(now, rec)

    def _fail_in_flight(self, rec: RunRecord, subject: PeerID) -> bool:
        """Does the value this member accepted in the open instance FAIL ``subject``?"""
        value = rec.accepted_value
        return value is not None and any(op.kind in FAIL_KINDS and op.subject == subject for op in value.ops)

    def _add_pending(self, rec: RunRecord, ident: bytes, op: Operation) -> None:
        if op.kind is OpKind.JOIN:
            # A newcomer re-signs its JOIN on every attempt: keep only its newest one pending.
            raw = op.subject.raw
            older = rec.pending_joins.get(raw)
            if older is not None:
                kept = rec.pending[older]
                if (kept.incarnation, kept.detected_at, older) >= (op.incarnation, op.detected_at, ident):
                    return
                self._remove_pending(rec, older)
            rec.pending_joins[raw] = ident
        elif op.kind is OpKind.EVICT or op.kind in FAIL_KINDS:
            # One per signer and subject: only distinct signers count (an eviction needs a quorum
            # of them, a failure FAIL_SIGNERS; a signer's FAIL or STALL of a subject counts once).
            table = rec.pending_evicts if op.kind is OpKind.EVICT else rec.pending_fails
            signers = table.setdefault(op.subject.raw, {})
            if op.origin.raw in signers:
                return
            signers[op.origin.raw] = ident
        rec.pending[ident] = op
        if op.kind in REMOVAL_KINDS:
            raw = op.subject.raw
            rec.pending_removals[raw] = rec.pending_removals.get(raw, 0) + 1

    def _remove_pending(self, rec: RunRecord, ident: bytes) -> None:
        op = rec.pending.pop(ident, None)
        if op is not None and op.kind is OpKind.JOIN and rec.pending_joins.get(op.subject.raw) == ident:
            del rec.pending_joins[op.subject.raw]
        if op is not None and (op.kind is OpKind.EVICT or op.kind in FAIL_KINDS):
            table = rec.pending_evicts if op.kind is OpKind.EVICT else rec.pending_fails
            signers = table.get(op.subject.raw)
            if signers is not None and signers.get(op.origin.raw) == ident:
                del signers[op.origin.raw]
                if not signers:
                    del table[op.subject.raw]
        if op is not None and op.kind in REMOVAL_KINDS:
            raw = op.subject.raw
            left = rec.pending_removals.get(raw, 0) - 1
            if left > 0:
                rec.pending_removals[raw] = left
            else:
                rec.pending_removals.pop(raw, None)

    def _drop_own_pending(self, rec: RunRecord, match: Callable[[Operation], bool]) -> None:
        for ident in [i for i, op in rec.pending.items() if op.origin == self.local_peer and match(op)]:
            self._remove_pending(rec, ident)

    def _drop_stale_fails(self, rec: RunRecord, peer: PeerID, incarnation: int) -> None:
        stale = [
            i
            for i, op in rec.pending.items()
            if op.kind is OpKind.FAIL and op.subject == peer and op.observed_incarnation < incarnation
        ]
        for ident in stale:
            origin = rec.pending[ident].origin
            self._remove_pending(rec, ident)
            self._reject(rec.run, "stale_fail", origin)

    def _admit_ops(self, now: float, rec: RunRecord, ops: Iterable[Operation], sender: PeerID) -> int:
        """Check announced operations; the valid new ones become pending. Returns how many did."""
        config = rec.config
        assert config is not None
        added = 0
        for op in ops:
            if op.kind in FAIL_KINDS:
                signers = rec.pending_fails.get(op.subject.raw)
                if signers and (op.origin.raw in signers or len(signers) >= FAIL_SIGNERS):
                    # Enough distinct signers (or this one's) already: skip the rest before the
                    # signature check, the costly part (every survivor of a failure may announce one).
                    continue
            # Cheap checks first (issue 20, finding 7): the deterministic rule and the replay filter
            # cost microseconds, a signature check ~100; failed checks are cached by the verifier.
            reason = check_operation(op, config)
            if reason is not None:
                if reason == "future_epoch":
                    self._request_sync(rec, sender)
                self._reject(rec.run, reason, sender)
                continue
            ident = op_id(op)
            if ident in rec.pending:
                continue
            if ident in rec.applied:
                self._reject(rec.run, "replayed", sender)
                continue
            if self._sigs.check(op) is None:
                self._reject(rec.run, "bad_signature", sender)
                continue
            if op.kind in FAIL_KINDS:
                if not self._fail_matters(rec, op):
                    continue  # about a member already gone for the steps we are at
                # A STALL is no claim that the subject is down: news that it is alive refutes nothing.
                if op.kind is OpKind.FAIL and self._alive_inc.get(op.subject.raw, -1) > op.observed_incarnation:
                    self._reject(rec.run, "stale_fail", sender)
                    continue
            if op.kind is OpKind.JOIN and op.subject.raw in self._failed:
                continue  # membership says this newcomer died since it asked
            if op.kind is OpKind.EVICT and op.origin.raw in rec.pending_evicts.get(op.subject.raw, {}):
                continue  # that signer already counts once for this subject
            if len(rec.pending) >= self.config.max_pending_ops:
                self._reject(rec.run, "pending_full", sender)
                continue
            self._add_pending(rec, ident, op)
            added += 1
            if op.kind is OpKind.FAIL:
                self._check_subject(now, rec, op.subject)
        return added

    def _check_subject(self, now: float, rec: RunRecord, subject: PeerID) -> None:
        """Another member says ``subject`` failed; one FAIL removes nobody (a second signer is
        needed, §3b). Unless our own membership already said so, check it ourselves at once: a
        SYNC to it. If our driver cannot reach it, that is our own first-hand observation
        (``peer_unreachable``) and we sign a FAIL too -- typically within a round trip, where
        waiting for our membership's verdict took tens of milliseconds or more. A live subject just
        gets a SYNC."""
        raw = subject.raw
        config = rec.config
        if raw in self._failed or raw == self.local_peer.raw or config is None:
            return
        if self.local_peer.raw in rec.pending_fails.get(raw, {}):
            return  # we signed one already
        asked = self._fail_hints.get(raw)
        if asked is not None and now - asked < self.config.decision_timeout_s:
            return
        if len(self._fail_hints) >= self.config.max_tracked_senders:
            del self._fail_hints[next(iter(self._fail_hints))]
        self._fail_hints[raw] = now
        self._send(subject, Sync(run=rec.run, epoch=config.epoch, digest=config.digest))

    def _unreachable_subject(self, now: float, peer: PeerID) -> None:
        """Our check of a member another one failed could not reach it: sign our own FAIL of it."""
        asked = self._fail_hints.pop(peer.raw, None)
        if asked is None or now - asked > self.config.decision_timeout_s:
            return
        for rec in list(self._runs.values()):
            config = rec.config
            if rec.state not in MEMBER_STATES or config is None or not rec.pending_fails.get(peer.raw):
                continue
            held = config.incarnation_of(peer)
            if held is None or self.local_peer.raw in rec.pending_fails[peer.raw]:
                continue
            self._count("fails_from_unreachable")
            observed = self._alive_inc.get(peer.raw, 0)
            self._raise(now, rec, kind=OpKind.FAIL, subject=peer, incarnation=held, observed_incarnation=observed)

    def _evictable(self, rec: RunRecord) -> list[bytes]:
        """Subjects (raw ids) whose pending EVICTs come from a quorum of distinct members, at most
        as many as one change may evict (the others stay pending for the next epoch)."""
        config = rec.config
        if not rec.pending_evicts or config is None:
            return []
        need = config.quorum
        signed = (raw for raw, signers in rec.pending_evicts.items() if len(signers) >= need)
        return sorted(capped_evictions(config, signed))

    def _proposable(self, rec: RunRecord) -> bool:
        """Is anything pending that a fresh value would carry? EVICTs short of a quorum of signers
        wait for more signers without starting an instance."""
        waiting = sum(len(signers) for signers in rec.pending_evicts.values())
        waiting += sum(len(signers) for signers in rec.pending_fails.values())
        return len(rec.pending) > waiting or bool(self._evictable(rec)) or bool(self._failable(rec))

    def _failable(self, rec: RunRecord) -> list[bytes]:
        """Subjects (raw ids) whose pending FAILs come from enough distinct members to remove them
        (``fail_signers_needed``); a lone FAIL is evidence waiting for a second observer."""
        config = rec.config
        if not rec.pending_fails or config is None:
            return []
        out = []
        for raw, signers in rec.pending_fails.items():
            subject = rec.pending[next(iter(signers.values()))].subject
            if len(signers) >= fail_signers_needed(config, subject):
                out.append(raw)
        return out

    def _ops_became_pending(self, now: float, rec: RunRecord) -> None:
        if not self._proposable(rec):
            return  # EVICTs short of a quorum are evidence waiting for more signers: nothing to negotiate
        if rec.state in MEMBER_STATES:
            rec.state = transition(rec.state, RunEvent.OP_PENDING)
        if rec.activity_at is not None or rec.accepted_value is not None:
            return  # an instance is under way; its commit re-examines the pending set
        if rec.proposer.phase is not _IDLE:
            return
        rank = self._rank_of_self(rec)
        if rank == 0:
            self._wake(now, rec)
            return
        at = now + self.config.proposer_backoff_s * rank * self._jitter()
        if rec.wake_at is None or at < rec.wake_at:
            rec.wake_at = at

    def _announce(self, rec: RunRecord, ops: tuple[Operation, ...]) -> None:
        config = rec.config
        assert config is not None
        message = OpsAnnounce(
            run=rec.run,
            epoch=config.epoch,
            ops=ops[: self.config.max_ops_per_batch],
            entered=rec.entered,
            completed=rec.completed,
            step_time_s=rec.step_time_s,
        )
        for peer in self._ranked(rec, self.config.announce_fanout, skip_self=True):
            self._send(peer, message)

    def _fail_matters(self, rec: RunRecord, op: Operation) -> bool:
        """A FAIL about a member, or about a departed one that still takes part in our next steps
        (others that observed the same failure late must not make an epoch each)."""
        config = rec.config
        assert config is not None
        if config.has_member(op.subject):
            return True
        gone = config.departed_entry(op.subject)
        if gone is None:
            return False
        me = config.index_of(self.local_peer)
        since = config.since_steps[me] if me >= 0 else 0  # a newcomer starts at its since step
        return gone.activation_step > max(rec.entered, rec.completed + 1, since)

    def _heard_from(self, rec: RunRecord, peer: PeerID) -> None:
        """``peer`` just took part in this run's protocol: it is alive. Failures of it we hold
        pending are stale (raised during a partition, or a false suspicion): drop them, so that
        after a partition heals the two sides do not fail each other."""
        raw = peer.raw
        if self._failed.pop(raw, None) is not None:
            self._failed_version += 1
        if rec.pending_fails.get(raw):
            for ident in [i for i, op in rec.pending.items() if op.kind is OpKind.FAIL and op.subject.raw == raw]:
                self._remove_pending(rec, ident)
                self._count("stale_fails_dropped")

    def _note_progress(self, rec: RunRecord, entered: int, completed: int) -> None:
        if entered > rec.peer_entered:
            rec.peer_entered = entered
        if completed > rec.peer_completed:
            rec.peer_completed = completed

    # ------------------------------------------------------------------ proposer ranking

    def _excluded(self, rec: RunRecord, raw: bytes) -> bool:
        if raw in self._down:
            return True
        if raw not in rec.pending_removals:
            return False
        if rec.pending_fails.get(raw):
            return True
        # Only a LEAVE of it is pending: a leaver is a live member (an acceptor, and it may propose)
        # until its LEAVE commits. Others step aside for it -- it may stop soon after -- except
        # the epoch's coordinator, which proposes its own LEAVE at round 0 (no phase 1) instead
        # of leaving the next member a phase 1 after its backoff.
        leader = None if rec.config is None else coordinator(rec.config)
        return leader is None or leader.raw != raw

    def _ranked(self, rec: RunRecord, limit: int, *, skip_self: bool) -> list[PeerID]:
        """The first ``limit`` proposers of the epoch's order that are not believed down or leaving."""
        config = rec.config
        assert config is not None
        peers = config.peers
        n = len(peers)
        out: list[PeerID] = []
        if n == 0:
            return out
        start = config.seed % n
        me = self.local_peer.raw
        for k in range(n):
            peer = peers[(start + k) % n]
            raw = peer.raw
            if raw == me:
                if not skip_self:
                    out.append(peer)
            elif not self._excluded(rec, raw):
                out.append(peer)
            if len(out) >= limit:
                break
        return out

    def _rank_of_self(self, rec: RunRecord) -> int:
        """0 for the preferred proposer; capped at announce_fanout + 1."""
        cap = self.config.announce_fanout + 1
        if self._excluded(rec, self.local_peer.raw):
            return cap
        ranked = self._ranked(rec, cap, skip_self=False)
        for i, peer in enumerate(ranked):
            if peer == self.local_peer:
                return i
        return cap

    def _jitter(self) -> float:
        return 1.0 + self._rng.uniform(0.0, self.config.retry_jitter)

    # ------------------------------------------------------------------ helpers

    def _new_run(self, run: str) -> RunRecord:
        if run not in self._runs and len(self._runs) >= self.config.max_runs:
            removed = [name for name, r in self._runs.items() if r.state is RunState.REMOVED]
            if not removed:
                raise ConfigError(f"negotiation: already tracking {self.config.max_runs} runs")
            del self._runs[removed[0]]
        rec = self._runs.get(run)
        if rec is None:
            rec = RunRecord(run=run)
            self._runs[run] = rec
        return rec

    def _member_run(self, run: str) -> RunRecord:
        rec = self._runs.get(run)
        if rec is None or rec.state not in MEMBER_STATES or rec.config is None:
            state = "unknown" if rec is None or rec.state is None else rec.state.name
            raise LocalProtocolError(f"negotiation: not a member of {run!r} (state {state})")
        return rec

    def _check_run_id(self, run: str) -> None:
        try:
            check_run(run)
        except RemoteProtocolError:
            raise ConfigError(f"run id must be 1..{self.config.max_run_id_chars} characters") from None
        if len(run) > self.config.max_run_id_chars:
            raise ConfigError(f"run id must be 1..{self.config.max_run_id_chars} characters")

    def _mark_down(self, peer: PeerID, now: float) -> None:
        if len(self._down) >= self.config.max_tracked_senders:
            self._down.pop(next(iter(self._down)))
        self._down[peer.raw] = now

    def _send(self, peer: PeerID, message: Message) -> None:
        self._counts["messages_sent"] = self._counts.get("messages_sent", 0) + 1
        self._outgoing.append(Outgoing(to=peer, protocol=PROTOCOL, message=message))

    def _broadcast(self, peers: Iterable[PeerID], message: Message) -> None:
        # Raw ids compare fast: PeerID equality goes through the dataclass machinery.
        me = self.local_peer.raw
        out = self._outgoing
        sent = 0
        for peer in peers:
            if peer.raw != me:
                out.append(Outgoing(to=peer, protocol=PROTOCOL, message=message))
                sent += 1
        self._counts["messages_sent"] = self._counts.get("messages_sent", 0) + sent

    def _broadcast_first(self, first: Sequence[PeerID], peers: Iterable[PeerID], message: Message) -> None:
        """Send ``message`` to ``first``, then to the rest of ``peers`` (the driver sends in order)."""
        if not first:
            self._broadcast(peers, message)
            return
        early = {p.raw for p in first}
        self._broadcast(first, message)
        self._broadcast([p for p in peers if p.raw not in early], message)

    def _disseminate(self, config: Configuration, message: Accept | Commit, first: Sequence[PeerID] = ()) -> None:
        """Send ``message`` to every member but us: directly in small runs, else through relays.

        ``first`` (small runs): these members get it before the others. The driver sends in
        order, and with many members on few cores the last copy leaves tens of ms after the
        first: the backup proposers must see an ACCEPT before their backoff ends, or they start
        a phase 1 that duels with it."""
        peers = config.peers
        if len(peers) <= self.config.relay_threshold + 1:
            self._broadcast_first(first, peers, message)
            return
        me = config.index_of(self.local_peer)  # the members are sorted: no O(n) scan to skip us
        targets = list(peers) if me < 0 else [*peers[:me], *peers[me + 1 :]]
        size = math.isqrt(len(targets) - 1) + 1
        down = self._down
        for start in range(0, len(targets), size):
            group = targets[start : start + size]
            relay = group[0]
            if down and relay.raw in down:
                relay = next((p for p in group if p.raw not in down), relay)
            rest = group[1:] if relay is group[0] else [p for p in group if p is not relay]
            self._send(relay, message.relayed(tuple(rest)))

    def _forward(self, rec: RunRecord, sender: PeerID, message: Accept | Commit) -> None:
        """Pass on a relayed ACCEPT/COMMIT to the members it names (only for members of C_e)."""
        config = rec.config
        if not message.relay_to or config is None or not config.has_member(sender):
            return
        # _broadcast skips us; only those still members of C_e get it.
        self._broadcast([p for p in message.relay_to if config.has_member(p)], message.relayed(()))

    def _count(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1

    def _reject(self, run: str, reason: str, origin: PeerID) -> None:
        self._rejections[reason] = self._rejections.get(reason, 0) + 1
        self._events.append(OperationRejected(run=run, reason=reason, origin=origin))
