"""The negotiation machine: members of a training run agree on each change, and on the step it applies.

Theory of operation
-------------------
Each peer runs one :class:`NegotiationMachine` for all the runs it takes part in. A run has a
sequence of configurations C_0, C_1, ... (``configuration.py``); C_{e+1} is computed by every member
from C_e and the *value* decided by Paxos instance e+1: a batch of signed operations (join, leave,
fail, link up/down, throughput) and the activation step S from which C_{e+1} governs training.

* **Operations.** Events become operations signed by the peer that saw them (``leave()``,
  ``observe_member`` for failures, ``link_changed``, ``set_throughput``; a newcomer's JOIN reaches a
  member through ``request_join``). Every receiver checks the signature (cached) and the
  deterministic rule of ``check_operation``; valid ones become *pending* and are announced to the
  few best-ranked proposers, not to every member.
* **Agreement.** One single-decree Paxos instance per epoch, acceptors = members of C_e, quorum =
  majority (``paxos.py``). There is no standing leader: the proposer ranking of an epoch is the
  member list rotated by the configuration's seed, skipping members believed down or about to be
  removed. The first of that order (the *coordinator*) may skip phase 1 at ballot round 0 -- the
  smallest ballot, so nothing can have been accepted before it -- and decides in one round trip;
  anyone else runs phase 1 after a backoff proportional to its rank, and any member that accepted
  a value or saw a proposal takes over after ``decision_timeout_s`` if no decision arrives.
* **Step gating.** An acceptor accepts a value only if it has not completed S, and from then on it
  does not begin (or finish) step S until the instance is decided: ``config_for_step`` returns None
  for gated steps. A member that already completed S refuses (REFUSE_PAST); when enough refuse, the
  value is provably unchoosable and a fresh one with a later S is proposed (see ``paxos.py``). A
  commit that activates at a step this member already completed raises ``ResyncNeeded``.
* **Decisions** go to every member of C_e and C_{e+1} (COMMIT); newcomers get the full
  configuration. Lost commits are repaired by SYNC beacons between ring neighbours (SYNC_REQUEST /
  SYNC_REPLY with the missing values, or a snapshot when the gap exceeds ``max_history``). A member
  that learns it is no longer in the configuration emits ``RemovedFromRun`` and stops.

Everything a peer sends is rate-limited and checked; a rejected input changes nothing, is counted
by reason and reported as an ``OperationRejected`` event. The machine never reads a clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation.config import MAX_STEP, NegotiationConfig
from chaosp2p.protocols.negotiation.configuration import (
    AppliedOp,
    Configuration,
    RunParams,
    check_operation,
    decode_configuration,
    genesis_configuration,
    next_configuration,
    quorum,
)
from chaosp2p.protocols.negotiation.events import (
    Admitted,
    ConfigurationCommitted,
    GateRaised,
    GateReleased,
    JoinRefused,
    NegotiationEvent,
    NegotiationStatistics,
    OperationCommitted,
    OperationRejected,
    PendingOperation,
    RemovedFromRun,
    ResyncNeeded,
    RunInfo,
    RunStatus,
)
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Accepted,
    Ballot,
    Commit,
    CommitRecord,
    JoinRequest,
    Nack,
    OpsAnnounce,
    Prepare,
    Promise,
    RefusePast,
    RunInfoReply,
    RunInfoRequest,
    Sync,
    SyncReply,
    SyncRequest,
    Value,
)
from chaosp2p.protocols.negotiation.messages import JoinRefused as JoinRefusedMessage
from chaosp2p.protocols.negotiation.operations import (
    PROTOCOL,
    REMOVAL_KINDS,
    Operation,
    OpKind,
    SignatureCache,
    apply_key,
    check_run,
    op_id,
    sign_operation,
)
from chaosp2p.protocols.negotiation.paxos import (
    JoinRecord,
    PromiseInfo,
    RunRecord,
    activation_step,
    choose_value,
    coordinator,
    is_urgent,
)
from chaosp2p.protocols.negotiation.state import (
    MEMBER_STATES,
    ProposerEvent,
    ProposerPhase,
    RunEvent,
    RunState,
    proposer_transition,
    transition,
)
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

_IDLE = ProposerPhase.IDLE
_PREPARING = ProposerPhase.PREPARING
_ACCEPTING = ProposerPhase.ACCEPTING
_MAX_QUERIES = 1024


class NegotiationMachine:
    """Agreement on training-run configurations, as a sans-I/O machine (protocol ``"negotiation"``).

    Implements :class:`~chaosp2p.protocols.base.MessageMachine`; see the module docstring.
    """

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(self, *, identity: Identity, config: NegotiationConfig, rng: random.Random, now: float) -> None:
        self.identity = identity
        self.local_peer = identity.peer_id
        self.config = config
        self._rng = rng
        self._runs: dict[str, RunRecord] = {}
        self._outgoing: list[Outgoing] = []
        self._events: list[NegotiationEvent] = []
        self._sigs = SignatureCache(config.verified_cache_size)
        self._limiter = RateLimiter(
            rate_per_s=config.rate_limit_msgs_per_s,
            burst=config.rate_limit_burst,
            max_senders=config.max_tracked_senders,
        )
        self._down: dict[bytes, float] = {}
        """Peers membership reported failed/left or the driver could not reach (proposer ranking)."""
        self._alive_inc: dict[bytes, int] = {}
        """Highest membership incarnation at which each peer was reported alive."""
        self._queries: dict[int, tuple[str, PeerID]] = {}
        self._counts: dict[str, int] = {}
        self._rejections: dict[str, int] = {}
        self._started = now
        self._handlers: dict[type[Message], Callable[[float, PeerID, Any], None]] = {
            OpsAnnounce: self._on_announce,
            Prepare: self._on_prepare,
            Promise: self._on_promise,
            Nack: self._on_nack,
            Accept: self._on_accept,
            Accepted: self._on_accepted,
            RefusePast: self._on_refuse_past,
            Commit: self._on_commit,
            Sync: self._on_sync,
            SyncRequest: self._on_sync_request,
            SyncReply: self._on_sync_reply,
            RunInfoRequest: self._on_run_info_request,
            RunInfoReply: self._on_run_info,
            JoinRequest: self._on_join_request,
            JoinRefusedMessage: self._on_join_refused,
        }

    # ================================================================== MessageMachine interface
    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """Handle one message from ``sender``; bad input is counted and dropped, never raised."""
        self._count("messages_received")
        if protocol != PROTOCOL or sender == self.local_peer:
            self._reject("", "bad_message", sender)
            return
        if not self._limiter.allow(sender, now):
            self._count("rate_limited")
            return
        self._down.pop(sender.raw, None)
        handler = self._handlers.get(type(message))
        if handler is None:
            self._reject("", "bad_message", sender)
            return
        try:
            handler(now, sender, message)
        except RemoteProtocolError:
            self._reject(getattr(message, "run", ""), "bad_message", sender)

    def handle_timeout(self, now: float) -> None:
        """Run every timer due at ``now``."""
        for rec in list(self._runs.values()):
            prop = rec.proposer
            if prop.retry_at is not None and prop.retry_at <= now:
                prop.retry_at = None
                self._proposer_timeout(now, rec)
            if rec.wake_at is not None and rec.wake_at <= now:
                rec.wake_at = None
                self._wake(now, rec)
            if rec.sync_at is not None and rec.sync_at <= now:
                self._send_sync(now, rec)
            join = rec.join
            if join is not None and join.retry_at is not None and join.retry_at <= now:
                join.retry_at = None
                if rec.state is RunState.JOINING:
                    self._join_attempt(now, rec)

    def next_deadline(self) -> float | None:
        """The earliest timer of any run, or None."""
        best: float | None = None
        for rec in self._runs.values():
            join = rec.join
            for at in (rec.wake_at, rec.proposer.retry_at, rec.sync_at, None if join is None else join.retry_at):
                if at is not None and (best is None or at < best):
                    best = at
        return best

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the queued messages."""
        out, self._outgoing = self._outgoing, []
        return out

    def take_events(self) -> list[NegotiationEvent]:
        """Remove and return the events raised since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """The driver could not reach ``peer``: rank it last as a proposer; a sponsor is replaced."""
        if peer == self.local_peer:
            return
        self._mark_down(peer, now)
        for rec in self._runs.values():
            join = rec.join
            if rec.state is RunState.JOINING and join is not None and join.sponsors:
                current = join.sponsors[(join.attempt - 1) % len(join.sponsors)]
                if current == peer:
                    self._join_attempt(now, rec)

    # ================================================================== public API
    def create_run(
        self, now: float, run: str, *, params: RunParams, incarnation: int = 0, throughput: float = 1.0
    ) -> Configuration:
        """Found ``run``: C_0 = {this peer}, governing from step 0."""
        self._check_run_id(run)
        try:
            params.validate()
        except RemoteProtocolError as exc:
            raise ConfigError(str(exc)) from None
        if not 0 <= incarnation <= MAX_STEP or not throughput > 0:
            raise ConfigError("incarnation must be in range and throughput > 0")
        rec = self._runs.get(run)
        state = transition(None if rec is None else rec.state, RunEvent.CREATE)
        rec = self._new_run(run)
        config = genesis_configuration(
            run, self.local_peer, incarnation=incarnation, throughput=throughput, params=params
        )
        rec.state = state
        rec.incarnation = incarnation
        self._install(rec, config)
        rec.sync_at = now + self.config.sync_interval_s * self._rng.uniform(0.5, 1.5)
        self._events.append(ConfigurationCommitted(run=run, configuration=config, committed_at=now))
        return config

    def query_run(self, now: float, run: str, peer: PeerID) -> None:
        """Ask ``peer`` for its configuration of ``run``; a ``RunInfo`` event brings the answer."""
        self._check_run_id(run)
        if peer == self.local_peer:
            raise LocalProtocolError("negotiation: query_run asks another peer")
        self._send_query(run, peer)

    def request_join(self, now: float, run: str, sponsor: PeerID, *, incarnation: int, throughput: float) -> None:
        """Ask ``sponsor`` (a member) to admit this peer to ``run``; ``Admitted`` reports success.

        The machine first asks for the run's configuration (RUN_INFO), signs a JOIN against it --
        with an incarnation above any this peer had in the run -- and retries other members every
        ``join_retry_s`` until admitted.
        """
        self._check_run_id(run)
        if sponsor == self.local_peer:
            raise LocalProtocolError("negotiation: a newcomer cannot sponsor itself")
        if not 0 <= incarnation <= MAX_STEP or not throughput > 0:
            raise ConfigError("incarnation must be in range and throughput > 0")
        rec = self._runs.get(run)
        state = transition(None if rec is None else rec.state, RunEvent.REQUEST_JOIN)
        if rec is None:
            rec = self._new_run(run)
        rec.state = state
        rec.join = JoinRecord(incarnation=max(incarnation, rec.incarnation), throughput=throughput, sponsors=[sponsor])
        rec.config = None
        rec.configs.clear()
        rec.pending.clear()
        rec.pending_removals.clear()
        rec.reset_instance()
        rec.sync_at = None
        self._join_attempt(now, rec)

    def leave(self, now: float, run: str) -> None:
        """Announce that this peer leaves ``run``; it stays an acceptor until the LEAVE commits."""
        rec = self._member_run(run)
        rec.state = transition(rec.state, RunEvent.OP_PENDING)
        if any(op.kind is OpKind.LEAVE and op.origin == self.local_peer for op in rec.pending.values()):
            return
        self._raise(now, rec, kind=OpKind.LEAVE, subject=self.local_peer, incarnation=rec.incarnation)

    def observe_member(self, now: float, peer: PeerID, state: MemberState, incarnation: int) -> None:
        """Membership's view of ``peer``: FAILED or LEFT members of a run become FAIL operations."""
        if peer == self.local_peer:
            return
        raw = peer.raw
        if state in (MemberState.ALIVE, MemberState.SUSPECT):
            self._down.pop(raw, None)
            if state is MemberState.ALIVE and incarnation > self._alive_inc.get(raw, -1):
                if len(self._alive_inc) >= self.config.max_tracked_senders:
                    self._alive_inc.pop(next(iter(self._alive_inc)))
                self._alive_inc[raw] = incarnation
                for rec in self._runs.values():
                    self._drop_stale_fails(rec, peer, incarnation)
            return
        self._mark_down(peer, now)
        for rec in list(self._runs.values()):
            config = rec.config
            if rec.state not in MEMBER_STATES or config is None:
                continue
            held = config.incarnation_of(peer)
            if held is None or rec.pending_removals.get(raw):
                continue
            self._raise(now, rec, kind=OpKind.FAIL, subject=peer, incarnation=held, observed_incarnation=incarnation)

    def link_changed(
        self, now: float, a: PeerID, b: PeerID, *, up: bool, bandwidth_bytes_per_s: float = 0.0, rtt_s: float = 0.0
    ) -> None:
        """A link between ``a`` and ``b`` (one of them us) went up/down or changed its figures."""
        if a == b or self.local_peer not in (a, b):
            return
        if a.raw > b.raw:
            a, b = b, a
        for rec in list(self._runs.values()):
            config = rec.config
            if rec.state not in MEMBER_STATES or config is None:
                continue
            if not (config.has_member(a) and config.has_member(b)):
                continue
            existing = config.link(a, b)
            if up:
                if existing is not None and existing.up:
                    old = existing.bandwidth_bytes_per_s
                    if old > 0 and abs(bandwidth_bytes_per_s - old) <= self.config.link_change_threshold * old:
                        continue
                    if old == 0 and bandwidth_bytes_per_s == 0:
                        continue
            elif existing is not None and not existing.up:
                continue
            kind = OpKind.LINK_UP if up else OpKind.LINK_DOWN
            self._drop_own_pending(rec, lambda op: op.kind in (OpKind.LINK_UP, OpKind.LINK_DOWN) and op.other == b)
            self._raise(
                now,
                rec,
                kind=kind,
                subject=a,
                other=b,
                incarnation=rec.incarnation,
                bandwidth_bytes_per_s=bandwidth_bytes_per_s if up else 0.0,
                rtt_s=rtt_s if up else 0.0,
            )

    def set_throughput(self, now: float, run: str, samples_per_s: float) -> None:
        """This peer's training rate; a change beyond ``rebalance_threshold`` is negotiated."""
        rec = self._member_run(run)
        if not samples_per_s > 0:
            raise ConfigError("throughput must be > 0")
        config = rec.config
        assert config is not None
        i = config.index_of(self.local_peer)
        current = config.throughputs[i]
        if abs(samples_per_s - current) <= self.config.rebalance_threshold * current:
            return
        rec.state = transition(rec.state, RunEvent.OP_PENDING)
        self._drop_own_pending(rec, lambda op: op.kind is OpKind.THROUGHPUT)
        self._raise(
            now,
            rec,
            kind=OpKind.THROUGHPUT,
            subject=self.local_peer,
            incarnation=rec.incarnation,
            throughput_samples_per_s=samples_per_s,
        )

    def report_step(self, now: float, run: str, *, entered: int | None = None, completed: int | None = None) -> None:
        """Training progress: it began step ``entered`` / finished step ``completed``.

        Beginning or finishing a step at or past the gate (an accepted, undecided activation step)
        is a LocalProtocolError: the training layer must ask ``config_for_step`` first.
        """
        rec = self._runs.get(run)
        rec_state = None if rec is None else rec.state
        transition(rec_state, RunEvent.REPORT_STEP)
        assert rec is not None
        gate = rec.gate_step
        if entered is not None:
            if not 0 <= entered <= MAX_STEP:
                raise LocalProtocolError(f"negotiation: step {entered} out of range")
            if entered > rec.entered:
                if self.config_for_step(run, entered) is None:
                    raise LocalProtocolError(f"negotiation: step {entered} of {run!r} is gated or not ours")
                rec.entered = entered
        if completed is not None:
            if not 0 <= completed <= MAX_STEP:
                raise LocalProtocolError(f"negotiation: step {completed} out of range")
            if completed > rec.completed:
                if gate is not None and completed >= gate:
                    raise LocalProtocolError(f"negotiation: step {completed} of {run!r} is gated at {gate}")
                if rec.last_completed_at is not None and completed == rec.completed + 1 and now > rec.last_completed_at:
                    sample = now - rec.last_completed_at
                    rec.step_time_s = sample if rec.step_time_s == 0 else 0.8 * rec.step_time_s + 0.2 * sample
                rec.completed = completed
                rec.last_completed_at = now
                rec.entered = max(rec.entered, completed)

    def config_for_step(self, run: str, step: int) -> Configuration | None:
        """The configuration governing ``step``, or None if the step is gated or not ours.

        The governing configuration is the newest committed one whose activation step is <= step.
        A removed peer (a leaver) still gets the configurations of the steps before its removal.
        """
        rec = self._runs.get(run)
        if rec is None or (rec.state not in MEMBER_STATES and rec.state is not RunState.REMOVED):
            return None
        gate = rec.gate_step
        if gate is not None and step >= gate:
            return None
        for config in reversed(rec.configs):
            if config.activation_step <= step:
                return config if config.has_member(self.local_peer) else None
        return None

    def configuration(self, run: str) -> Configuration | None:
        """The newest configuration this peer holds for ``run`` (None while joining)."""
        rec = self._runs.get(run)
        return None if rec is None else rec.config

    def run_status(self, run: str) -> RunStatus:
        """``run`` as this peer sees it (LocalProtocolError for an unknown run)."""
        rec = self._runs.get(run)
        if rec is None or rec.state is None:
            raise LocalProtocolError(f"negotiation: unknown run {run!r}")
        config = rec.config
        return RunStatus(
            run=run,
            state=rec.state,
            epoch=rec.epoch,
            activation_step=-1 if config is None else config.activation_step,
            step=rec.entered,
            completed_step=rec.completed,
            config_digest="" if config is None else config.digest.hex(),
            members=() if config is None else config.peers,
            pending=tuple(
                PendingOperation(
                    op_id=ident.hex(),
                    kind=op.kind,
                    subject=op.subject,
                    other=op.other,
                    origin=op.origin,
                    detected_at=op.detected_at,
                )
                for ident, op in rec.pending.items()
            ),
            gate_step=rec.gate_step,
            proposer=rec.proposer.phase,
        )

    def runs(self) -> tuple[str, ...]:
        """Every run this peer tracks."""
        return tuple(self._runs)

    def statistics(self) -> NegotiationStatistics:
        """Counters since the machine started."""
        c = self._counts.get
        return NegotiationStatistics(
            messages_received=c("messages_received", 0),
            messages_sent=c("messages_sent", 0),
            rate_limited=c("rate_limited", 0),
            ops_raised=c("ops_raised", 0),
            proposals=c("proposals", 0),
            fast_proposals=c("fast_proposals", 0),
            commits=c("commits", 0),
            configurations_applied=c("configurations_applied", 0),
            ops_committed=c("ops_committed", 0),
            refused_past=c("refused_past", 0),
            nacks_received=c("nacks_received", 0),
            syncs_requested=c("syncs_requested", 0),
            snapshots_adopted=c("snapshots_adopted", 0),
            resyncs_needed=c("resyncs_needed", 0),
            signature_verifications=self._sigs.verifications,
            signature_cache_hits=self._sigs.hits,
            rejected=sum(self._rejections.values()),
            rejected_by_reason=tuple(sorted(self._rejections.items())),
        )

    # ================================================================== operations
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
        ident = self._sigs.check(op)
        assert ident is not None
        reason = check_operation(op, config)
        if reason is not None:
            raise LocalProtocolError(f"negotiation: cannot raise {kind.name}: {reason}")
        self._add_pending(rec, ident, op)
        self._announce(rec, (op,))
        self._ops_became_pending(now, rec)

    def _add_pending(self, rec: RunRecord, ident: bytes, op: Operation) -> None:
        rec.pending[ident] = op
        if op.kind in REMOVAL_KINDS:
            raw = op.subject.raw
            rec.pending_removals[raw] = rec.pending_removals.get(raw, 0) + 1

    def _remove_pending(self, rec: RunRecord, ident: bytes) -> None:
        op = rec.pending.pop(ident, None)
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
            ident = self._sigs.check(op)
            if ident is None:
                self._reject(rec.run, "bad_signature", sender)
                continue
            if ident in rec.pending:
                continue
            if ident in rec.applied:
                self._reject(rec.run, "replayed", sender)
                continue
            reason = check_operation(op, config)
            if reason is not None:
                if reason == "future_epoch":
                    self._request_sync(rec, sender)
                self._reject(rec.run, reason, sender)
                continue
            if op.kind is OpKind.FAIL:
                if rec.pending_removals.get(op.subject.raw):
                    continue  # one removal per subject is enough; others would only cost verifications
                if self._alive_inc.get(op.subject.raw, -1) > op.observed_incarnation:
                    self._reject(rec.run, "stale_fail", sender)
                    continue
            if len(rec.pending) >= self.config.max_pending_ops:
                self._reject(rec.run, "pending_full", sender)
                continue
            self._add_pending(rec, ident, op)
            added += 1
        return added

    def _ops_became_pending(self, now: float, rec: RunRecord) -> None:
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

    # ================================================================== proposer ranking
    def _excluded(self, rec: RunRecord, raw: bytes) -> bool:
        return raw in self._down or raw in rec.pending_removals

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
        if rec.pending_removals.get(self.local_peer.raw):
            return cap
        ranked = self._ranked(rec, cap, skip_self=False)
        for i, peer in enumerate(ranked):
            if peer == self.local_peer:
                return i
        return cap

    def _jitter(self) -> float:
        return 1.0 + self._rng.uniform(0.0, self.config.retry_jitter)

    # ================================================================== proposer
    def _wake(self, now: float, rec: RunRecord) -> None:
        """Start a proposal if this member has something to decide and nobody else is deciding it."""
        if rec.state not in MEMBER_STATES or rec.proposer.phase is not _IDLE:
            return
        if not rec.pending and rec.accepted_value is None:
            return
        config = rec.config
        assert config is not None
        fast = (
            coordinator(config) == self.local_peer
            and not rec.proposer.fast_used
            and rec.promised is None
            and rec.accepted_value is None
        )
        self._start_proposal(now, rec, fast=fast)

    def _start_proposal(self, now: float, rec: RunRecord, *, fast: bool) -> None:
        config = rec.config
        assert config is not None
        prop = rec.proposer
        prop.promises = {}
        prop.accepted_by = set()
        prop.refused = {}
        prop.started_at = now
        if fast:
            value, ids = self._fresh_value(now, rec, ())
            if value is None:
                return
            prop.phase = proposer_transition(prop.phase, ProposerEvent.FAST_ACCEPT)
            prop.fast_used = True
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
        prop.promises[self.local_peer.raw] = PromiseInfo(
            accepted_ballot=rec.accepted_ballot,
            accepted_value=rec.accepted_value,
            entered=rec.entered,
            completed=rec.completed,
            step_time_s=rec.step_time_s,
        )
        self._broadcast(config.peers, Prepare(run=rec.run, epoch=config.epoch + 1, ballot=ballot))
        if len(prop.promises) >= quorum(config):
            self._phase1_done(now, rec, force=True)

    def _fresh_value(
        self, now: float, rec: RunRecord, promises: Iterable[PromiseInfo]
    ) -> tuple[Value | None, tuple[bytes, ...]]:
        """A new value from the pending operations (one removal/join per subject), or None."""
        config = rec.config
        assert config is not None
        chosen: dict[tuple[int, bytes], tuple[bytes, Operation]] = {}
        others: list[tuple[bytes, Operation]] = []
        for ident, op in rec.pending.items():
            if op.kind in REMOVAL_KINDS or op.kind is OpKind.JOIN:
                # Several FAILs of one subject (raised by different observers) or repeated JOINs
                # of one newcomer do the same thing: propose one, keep the rest pending (they
                # become invalid, and are dropped, once it commits).
                key = (0 if op.kind in REMOVAL_KINDS else 1, op.subject.raw)
                best = chosen.get(key)
                if best is None or apply_key(ident, op) < apply_key(*best):
                    chosen[key] = (ident, op)
            else:
                others.append((ident, op))
        entries = sorted([*chosen.values(), *others], key=lambda e: apply_key(e[0], e[1]))
        entries = entries[: self.config.max_ops_per_batch]
        if not entries:
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
        )
        value = Value(ops=tuple(ops), activation_step=step, proposed_at=now)
        return value, tuple(i for i, _ in entries)

    def _phase1_done(self, now: float, rec: RunRecord, *, force: bool) -> None:
        """A quorum promised: pick the value (Paxos rule, or fresh if none/dead) and send ACCEPT."""
        config = rec.config
        assert config is not None
        prop = rec.proposer
        _, value, _ = choose_value(prop.promises, config)
        ids: tuple[bytes, ...] | None = None
        if value is not None:
            if not force and prop.refusers - set(prop.promises):
                return  # members that refused this instance may prove the value dead: wait a bit
            ids = self._value_ids(rec, value)
            if ids is None:
                value = None  # an invalid accepted value cannot have been chosen by correct acceptors
        if value is None or ids is None:
            value, ids = self._fresh_value(now, rec, prop.promises.values())
            if value is None:
                prop.phase = proposer_transition(prop.phase, ProposerEvent.ABANDON)
                prop.retry_at = None
                return
        prop.phase = proposer_transition(prop.phase, ProposerEvent.PROMISED)
        prop.value, prop.value_ids = value, ids
        self._send_accepts(now, rec)

    def _send_accepts(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        prop = rec.proposer
        assert config is not None and prop.ballot is not None and prop.value is not None
        prop.retry_at = now + self.config.phase_timeout_s * self._jitter()
        refused = self._local_accept(now, rec, prop.ballot, prop.value, prop.value_ids)
        me = self.local_peer.raw
        if refused is None:
            prop.accepted_by.add(me)
        else:
            prop.refused[me] = refused
            prop.refusers.add(me)
        self._broadcast(config.peers, Accept(run=rec.run, epoch=config.epoch + 1, ballot=prop.ballot, value=prop.value))
        self._check_phase2(now, rec)

    def _check_phase2(self, now: float, rec: RunRecord) -> None:
        config = rec.config
        prop = rec.proposer
        assert config is not None
        q = quorum(config)
        if len(prop.accepted_by) >= q:
            self._decide(now, rec)
        elif len(prop.refused) >= len(config.peers) - q + 1:
            # Too many members are past S for this value to be chosen at this ballot: look again.
            self._start_proposal(now, rec, fast=False)

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
        value, ids = prop.value, prop.value_ids
        new_config, results = next_configuration(config, zip(ids, value.ops, strict=True), value.activation_step)
        prop.phase = proposer_transition(prop.phase, ProposerEvent.DECIDED)
        prop.retry_at = None
        self._count("commits")
        record = CommitRecord(epoch=new_config.epoch, value=value, digest=new_config.digest)
        plain = Commit(run=rec.run, epoch=record.epoch, value=value, digest=record.digest)
        self._broadcast(config.peers, plain)
        newcomers = [p for p in new_config.peers if not config.has_member(p)]
        if newcomers:
            full = Commit(
                run=rec.run, epoch=record.epoch, value=value, digest=record.digest, configuration=new_config.encode()
            )
            for peer in newcomers:
                self._send(peer, full)
        self._apply_commit(now, rec, record, new_config, results)

    def _value_ids(self, rec: RunRecord, value: Value) -> tuple[bytes, ...] | None:
        """Op ids of a value whose operations are all correctly signed and valid against C_e."""
        config = rec.config
        assert config is not None
        if not value.ops or len(value.ops) > self.config.max_ops_per_batch:
            return None
        ids = []
        for op in value.ops:
            ident = self._sigs.check(op)
            if ident is None or check_operation(op, config) is not None:
                return None
            ids.append(ident)
        if len(set(ids)) != len(ids):
            return None
        return tuple(ids)

    # ================================================================== acceptor
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
            if record is not None:
                # The sender missed this decision: give it the commit instead of an answer.
                self._send(sender, Commit(run=run, epoch=epoch, value=record.value, digest=record.digest))
            self._reject(run, "old_epoch", sender)
            return None
        if epoch > config.epoch + 1:
            self._request_sync(rec, sender)
            return None
        if not config.has_member(sender):
            self._reject(run, "not_member", sender)
            return None
        return rec

    def _ballot_ok(self, rec: RunRecord, sender: PeerID, ballot: Ballot, *, accept: bool) -> bool:
        config = rec.config
        assert config is not None
        if ballot.proposer != sender:
            self._reject(rec.run, "forged_ballot", sender)
            return False
        if ballot.round == 0 and not (accept and coordinator(config) == sender):
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
        self._send(
            sender,
            Promise(
                run=msg.run,
                epoch=msg.epoch,
                ballot=msg.ballot,
                accepted_ballot=rec.accepted_ballot,
                accepted_value=rec.accepted_value,
                ops=tuple(rec.pending.values())[: self.config.max_ops_per_batch],
                entered=rec.entered,
                completed=rec.completed,
                step_time_s=rec.step_time_s,
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
        promised = rec.promised
        if promised is not None and msg.ballot.key() < promised.key():
            self._nack(rec, sender, msg.epoch, msg.ballot)
            return
        value = msg.value
        if rec.accepted_ballot == msg.ballot and rec.accepted_value == value:
            self._reply_accepted(rec, sender, msg)  # a duplicate: answer again
            return
        ids = self._value_ids(rec, value)
        if ids is None:
            self._reject(msg.run, "bad_value", sender)
            return
        reason = self._step_problem(rec, value)
        if reason is not None:
            self._reject(msg.run, reason, sender)
            return
        refused = self._local_accept(now, rec, msg.ballot, value, ids)
        if refused is not None:
            self._send(sender, RefusePast(run=msg.run, epoch=msg.epoch, ballot=msg.ballot, completed=refused))
            return
        self._saw_other_proposer(now, rec, msg.ballot)
        self._reply_accepted(rec, sender, msg)

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
            ),
        )

    def _step_problem(self, rec: RunRecord, value: Value) -> str | None:
        """Why the value's activation step is unacceptable as input (not merely late), or None."""
        config = rec.config
        assert config is not None
        step = value.activation_step
        if step < config.activation_step and not is_urgent(value.ops):
            return "step_in_past"
        reference = max(rec.completed, rec.entered, rec.peer_entered, config.activation_step, 0)
        if step > reference + self.config.max_step_ahead:
            return "step_too_far"
        return None

    def _local_accept(
        self, now: float, rec: RunRecord, ballot: Ballot, value: Value, ids: tuple[bytes, ...]
    ) -> int | None:
        """Accept ``value`` (and gate at its step) unless already past it; returns the completed step if refused."""
        if rec.completed >= value.activation_step:
            self._count("refused_past")
            return rec.completed
        old_gate = rec.gate_step
        rec.promised = ballot
        rec.accepted_ballot = ballot
        rec.accepted_value = value
        rec.accepted_ids = ids
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
        self._note_progress(rec, msg.entered, msg.completed)
        if msg.ops:
            self._admit_ops(now, rec, msg.ops, sender)
        prop.promises[sender.raw] = PromiseInfo(
            accepted_ballot=msg.accepted_ballot,
            accepted_value=msg.accepted_value,
            entered=msg.entered,
            completed=msg.completed,
            step_time_s=msg.step_time_s,
        )
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

    def _on_accepted(self, now: float, sender: PeerID, msg: Accepted) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.config is None or rec.state not in MEMBER_STATES:
            return
        prop = rec.proposer
        if msg.epoch != rec.epoch + 1 or prop.phase is not _ACCEPTING or msg.ballot != prop.ballot:
            return
        if not rec.config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return
        self._note_progress(rec, msg.entered, msg.completed)
        prop.accepted_by.add(sender.raw)
        self._check_phase2(now, rec)

    def _on_refuse_past(self, now: float, sender: PeerID, msg: RefusePast) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.config is None or rec.state not in MEMBER_STATES:
            return
        prop = rec.proposer
        if msg.epoch != rec.epoch + 1 or prop.phase is not _ACCEPTING or msg.ballot != prop.ballot:
            return
        if not rec.config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return
        self._note_progress(rec, -1, msg.completed)
        prop.refused[sender.raw] = msg.completed
        prop.refusers.add(sender.raw)
        self._check_phase2(now, rec)

    def _note_progress(self, rec: RunRecord, entered: int, completed: int) -> None:
        if entered > rec.peer_entered:
            rec.peer_entered = entered
        if completed > rec.peer_completed:
            rec.peer_completed = completed

    # ================================================================== learning decisions
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
        if rec.state not in MEMBER_STATES or config is None:
            return
        if msg.epoch <= config.epoch:
            return  # a duplicate
        if msg.epoch > config.epoch + 1:
            self._request_sync(rec, sender)
            return
        if not config.has_member(sender):
            self._reject(msg.run, "not_member", sender)
            return
        self._learn(now, rec, CommitRecord(epoch=msg.epoch, value=msg.value, digest=msg.digest), sender)

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
            if result.applied and op.subject == me and op.kind in REMOVAL_KINDS:
                own_fate = "left" if op.kind is OpKind.LEAVE else "failed"
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
        if was_gated:
            self._events.append(GateReleased(run=rec.run))
        rec.reset_instance()
        if not new_config.has_member(me):
            self._remove(rec, own_fate or "excluded")
            return
        rec.state = transition(rec.state, RunEvent.COMMIT)
        if rec.completed >= new_config.activation_step:
            self._count("resyncs_needed")
            self._events.append(ResyncNeeded(run=rec.run, step=new_config.activation_step, epoch=new_config.epoch))
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
        if rec.pending:
            # The new epoch ranks proposers differently: hand our pending operations to its best.
            self._announce(rec, tuple(rec.pending.values()))
            self._ops_became_pending(now, rec)

    def _remove(self, rec: RunRecord, reason: str) -> None:
        rec.state = transition(rec.state, RunEvent.REMOVE)
        rec.removed_reason = reason
        rec.pending.clear()
        rec.pending_removals.clear()
        rec.reset_instance()
        rec.sync_at = None
        config = rec.config
        step = 0 if config is None else config.activation_step
        self._events.append(RemovedFromRun(run=rec.run, epoch=rec.epoch, reason=reason, activation_step=step))

    # ================================================================== anti-entropy
    def _send_sync(self, now: float, rec: RunRecord) -> None:
        rec.sync_at = None
        config = rec.config
        if rec.state not in MEMBER_STATES or config is None:
            return
        rec.sync_at = now + self.config.sync_interval_s * self._rng.uniform(0.75, 1.25)
        n = len(config.peers)
        i = config.index_of(self.local_peer)
        if n < 2 or i < 0:
            return
        message = Sync(run=rec.run, epoch=config.epoch, digest=config.digest)
        neighbours = {config.peers[(i + 1) % n], config.peers[(i - 1) % n]}
        for peer in neighbours:
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
        if msg.epoch > config.epoch:
            if rec.state in MEMBER_STATES:
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
        if rec.state not in MEMBER_STATES or rec.config is None:
            return
        if len(msg.commits) > self.config.max_history:
            self._reject(msg.run, "too_many_commits", sender)
            return
        for record in sorted(msg.commits, key=lambda r: r.epoch):
            if rec.state not in MEMBER_STATES or rec.config is None:
                return
            if record.epoch != rec.epoch + 1:
                continue
            if not self._learn(now, rec, record, sender):
                return
        if msg.snapshot and rec.state in MEMBER_STATES:
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
            if not trusted or mine is None or mine < join.incarnation:
                return
            self._admit(now, rec, config)
            return
        # A member far behind: adopt the snapshot (the history cannot bridge the gap).
        if not (config.has_member(sender) or (rec.config is not None and rec.config.has_member(sender))):
            self._reject(rec.run, "not_member", sender)
            return
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
            self._remove(rec, "excluded")
            return
        rec.state = transition(rec.state, RunEvent.COMMIT)
        if rec.completed >= config.activation_step:
            self._count("resyncs_needed")
            self._events.append(ResyncNeeded(run=rec.run, step=config.activation_step, epoch=config.epoch))
        # Operations older than the snapshot may have been applied in the epochs we skipped.
        for ident, op in list(rec.pending.items()):
            if op.epoch < config.epoch:
                self._remove_pending(rec, ident)
        self._revalidate_pending(now, rec)

    # ================================================================== joins and run info
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
        join.request_id = self._send_query(rec.run, sponsor)
        join.retry_at = now + self.config.join_retry_s * self._jitter()

    def _on_run_info_request(self, now: float, sender: PeerID, msg: RunInfoRequest) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.state not in MEMBER_STATES or rec.config is None:
            self._send(sender, RunInfoReply(run=msg.run, request_id=msg.request_id))
            return
        reply = RunInfoReply(run=msg.run, request_id=msg.request_id, configuration=self._encoded(rec), step=rec.entered)
        self._send(sender, reply)

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
        if config is None:
            self._join_refused(rec, sender, "not_member")
            return
        join.known = config
        others = [p for p in config.peers if p != sender and p != self.local_peer]
        if others:
            start = self._rng.randrange(len(others))
            others = others[start:] + others[:start]
        join.sponsors = [sender, *others]
        join.attempt = 1
        mine = config.incarnation_of(self.local_peer)
        if mine is not None and mine >= join.incarnation:
            self._admit(now, rec, config)  # our admission commit was lost; this is the configuration
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
        self._send(sender, JoinRequest(run=rec.run, op=join.op))

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
            self._send(sender, SyncReply(run=msg.run, snapshot=self._encoded(rec)))  # already admitted
            return
        if ident in rec.pending:
            self._announce(rec, (op,))  # a retry: the first announcement may have been lost
            return
        reason = check_operation(op, config)
        if reason is not None:
            self._reject(msg.run, reason, sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason=reason))
            return
        if self._admit_ops(now, rec, (op,), sender):
            self._announce(rec, (op,))
            self._ops_became_pending(now, rec)

    def _admit(self, now: float, rec: RunRecord, config: Configuration) -> None:
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
        self._events.append(Admitted(run=rec.run, configuration=config, activation_step=config.activation_step))

    # ================================================================== announcements
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

    # ================================================================== helpers
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
        me = self.local_peer
        out = self._outgoing
        sent = 0
        for peer in peers:
            if peer != me:
                out.append(Outgoing(to=peer, protocol=PROTOCOL, message=message))
                sent += 1
        self._counts["messages_sent"] = self._counts.get("messages_sent", 0) + sent

    def _count(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1

    def _reject(self, run: str, reason: str, origin: PeerID) -> None:
        self._rejections[reason] = self._rejections.get(reason, 0) + 1
        self._events.append(OperationRejected(run=run, reason=reason, origin=origin))


__all__ = ["NegotiationMachine", "op_id"]
