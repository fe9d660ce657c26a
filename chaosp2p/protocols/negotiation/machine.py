"""The negotiation machine: members of a training run agree on each change, and on the step it applies.

Theory of operation
-------------------
Each peer runs one :class:`NegotiationMachine` for all the runs it takes part in. A run has a
sequence of configurations C_0, C_1, ... (``run_configuration.py``); C_{e+1} is computed by every member
from C_e and the *value* decided by Paxos instance e+1: a batch of signed operations (join, leave,
fail, link up/down, throughput) and the activation step S from which C_{e+1} governs training.

* **Operations.** Events become operations signed by the peer that saw them (``leave()``, ``evict()``,
  ``observe_member`` for failures, ``link_changed``, ``set_throughput``; a newcomer's JOIN reaches a
  member through ``request_join``). Every receiver checks the signature (cached) and the
  deterministic rule of ``check_operation``; valid ones become *pending* and are announced to the
  few best-ranked proposers, not to every member.
* **Agreement.** One single-decree Paxos instance per epoch, acceptors = members of C_e, quorum = a
  majority, plus one in an odd run of five or more (``run_configuration.quorum``, ``paxos.py``);
  above round 0 an ACCEPT carries a quorum of signed promises (``justification.py``). There is no
  standing leader: the proposer ranking of an epoch is the member list rotated by the
  configuration's seed, skipping members believed down or about to be removed. The first of that
  order (the *coordinator*) may skip phase 1 at ballot round 0 -- the smallest ballot, so nothing
  can have been accepted before it -- and decides in one round trip; anyone else runs phase 1 after
  a backoff proportional to its rank, and any member that accepted a value or saw a proposal takes
  over after ``decision_timeout_s`` if no decision arrives.
* **Step gating.** An acceptor accepts a value only if it has not completed S, and from then on it
  does not begin (or finish) step S until the instance is decided: ``config_for_step`` returns None
  for gated steps. A member that already completed S refuses (REFUSE_PAST); when enough refuse, the
  value is provably unchoosable and a fresh one with a later S is proposed (see ``paxos.py``). A
  commit that activates at a step this member already completed raises ``ResyncNeeded``.
* **Certificates** (``certificates.py``). Accepting signs (run, epoch, ballot, digest of C_{e+1});
  the COMMIT carries the signatures of a quorum of C_e, and nothing -- a COMMIT, a commit record, a
  snapshot, a newcomer's admission -- is installed without them. Catch-up answers are read only
  when asked for. A FAIL removes its subject only with two members' first-hand FAILs, an EVICT
  with a quorum's. A newcomer believes its trusted (bootstrap) peers, then certificates (``joins.py``).
* **Decisions** go to every member of C_e and C_{e+1} (COMMIT; ACCEPT and COMMIT travel through
  about sqrt(n) relays above ``relay_threshold`` members); newcomers get the full configuration.
  Lost commits are repaired by SYNC beacons between ring neighbours (SYNC_REQUEST / SYNC_REPLY with
  the missing values, or a snapshot when the gap exceeds ``max_history``). A member that learns it
  is no longer in the configuration emits ``RemovedFromRun`` and stops.
* **Steps.** The refusal and "dead value" rules above concern *fresh* values only; a value
  re-proposed after phase 1 (adopted) is accepted by everyone, so a few refusers and a crashed
  member cannot block an instance. S is computed only from members that completed a step, since
  a newcomer enters its admission step at once.

Everything a peer sends is rate-limited and checked; a rejected input changes nothing, is counted
by reason and reported as an ``OperationRejected`` event. The machine never reads a clock.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chaosp2p.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation.config import MAX_STEP, NegotiationConfig
from chaosp2p.protocols.negotiation.events import (
    ConfigurationCommitted,
    NegotiationEvent,
    NegotiationStatistics,
    PendingOperation,
    RunStatus,
)
from chaosp2p.protocols.negotiation.learning import Learning
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Accepted,
    Commit,
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
)
from chaosp2p.protocols.negotiation.messages import JoinRefused as JoinRefusedMessage
from chaosp2p.protocols.negotiation.operations import (
    PROTOCOL,
    OpKind,
    SignatureCache,
)
from chaosp2p.protocols.negotiation.paxos import (
    JoinRecord,
)
from chaosp2p.protocols.negotiation.proposer import PaxosRoles
from chaosp2p.protocols.negotiation.run_configuration import Configuration, RunParams, genesis_configuration
from chaosp2p.protocols.negotiation.transitions import (
    MEMBER_STATES,
    RunEvent,
    RunState,
    transition,
)
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message


class NegotiationMachine(PaxosRoles, Learning):
    """Agreement on training-run configurations, as a sans-I/O machine (protocol ``"negotiation"``).

    Implements :class:`~chaosp2p.protocols.base.MessageMachine`; see the module docstring.
    """

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
        super().__init__(identity=identity, config=config, rng=rng, now=now, signature_cache=signature_cache)

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
        self._trusted_down.discard(sender.raw)
        if self._fail_hints:
            self._fail_hints.pop(sender.raw, None)  # it answered: alive
        name = _HANDLERS.get(type(message))
        if name is None:
            self._reject("", "bad_message", sender)
            return
        handler: Callable[[float, PeerID, Any], None] = getattr(self, name)
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
                    if not join.answered:
                        # Tell the training layer (it may know other members) and try the next.
                        sponsor = join.sponsors[(join.attempt - 1) % len(join.sponsors)]
                        self._join_refused(rec, sponsor, "no_answer")
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
        if peer.raw in self._trusted:
            self._trusted_down.add(peer.raw)
        if peer.raw in self._fail_hints:
            self._unreachable_subject(now, peer)
        for rec in self._runs.values():
            join = rec.join
            if rec.state is RunState.JOINING and join is not None and join.sponsors and not join.answered:
                current = join.sponsors[(join.attempt - 1) % len(join.sponsors)]
                if current == peer:
                    # The next sponsor is tried when the retry timer fires (no tight loop over
                    # dead sponsors); the training layer may also name another one at once.
                    join.answered = True
                    self._join_refused(rec, peer, "unreachable")

    # ================================================================== public API

    def create_run(
        self, now: float, run: str, *, params: RunParams, incarnation: int = 0, throughput: float = 1.0
    ) -> Configuration:
        """Found ``run``: C_0 = {this peer}, governing from step 0. A closed run
        (``params.admitted`` not empty) lists this peer too, whether or not the caller did (it
        could not rejoin its own run otherwise); the list is sorted here."""
        self._check_run_id(run)
        if params.admitted:
            listed = {p.raw: p for p in (*params.admitted, self.local_peer)}
            params = dataclasses.replace(params, admitted=tuple(listed[raw] for raw in sorted(listed)))
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

    def trust(self, peers: Iterable[PeerID]) -> None:
        """Take these peers' word for a run's configuration when joining (the operator's bootstrap
        peers). Without any, a newcomer believes the first member that answers (trust on first
        use); with some, only them, unless none of them is a member of the run (each said so, or
        could not be reached) -- and, either way, afterwards only configurations proven by quorum
        certificates to follow the one it believed (spec section 6, "Trust")."""
        self._trusted = frozenset(p.raw for p in peers)
        self._trusted_down &= self._trusted

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
        rec.pending_fails.clear()
        rec.pending_joins.clear()
        rec.pending_evicts.clear()
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

    def evict(self, now: float, run: str, subject: PeerID) -> bool:
        """Sign an EVICT of ``subject`` (its contributions kept failing this member's checks).

        It takes effect only once a quorum of distinct members of the configuration signed one for
        the same subject and incarnation. Returns False if nothing was raised: ``subject`` is not
        a member (or is this peer), or this peer already signed one for its current incarnation.
        """
        rec = self._member_run(run)
        config = rec.config
        assert config is not None
        held = config.incarnation_of(subject)
        if held is None or subject == self.local_peer:
            return False
        mine = rec.pending_evicts.get(subject.raw, {}).get(self.local_peer.raw)
        if mine is not None and rec.pending[mine].incarnation == held:
            return False
        if mine is not None:
            self._remove_pending(rec, mine)
        self._raise(now, rec, kind=OpKind.EVICT, subject=subject, incarnation=held)
        return True

    def stall(self, now: float, run: str, subject: PeerID) -> bool:
        """Sign a STALL of ``subject``: it contributed nothing to this member's round for the whole
        bounded wait (the training layer's first-hand observation; see protocols/negotiation.md §3c).

        Like a FAIL it removes the subject only with FAIL_SIGNERS distinct signers, and the batch
        is urgent (the others redo the stuck step without it); unlike a FAIL it does not lapse when
        the subject is heard from. Returns False if nothing was raised: ``subject`` is not a
        member (or is this peer), this peer already holds a FAIL or STALL of it pending, or a
        change of the run is being decided here (NEGOTIATING or GATED): members that accepted it
        may be gated at the very step, silent but not stalled; the next round judges again.
        """
        rec = self._member_run(run)
        config = rec.config
        assert config is not None
        held = config.incarnation_of(subject)
        if held is None or subject == self.local_peer:
            return False
        if rec.state is not RunState.STABLE or rec.accepted_value is not None:
            self._count("stalls_deferred")
            return False
        if self.local_peer.raw in rec.pending_fails.get(subject.raw, {}):
            return False
        self._raise(now, rec, kind=OpKind.STALL, subject=subject, incarnation=held)
        return True

    def observe_member(self, now: float, peer: PeerID, state: MemberState, incarnation: int) -> None:
        """Membership's view of ``peer``: FAILED or LEFT members of a run become FAIL operations."""
        if peer == self.local_peer:
            return
        raw = peer.raw
        if incarnation < self._alive_inc.get(raw, -1):
            return  # news older than what we already know (it refuted since)
        if raw in self._trusted:
            # A trusted peer that membership reports gone cannot tell a newcomer about a run.
            if state in (MemberState.FAILED, MemberState.LEFT):
                self._trusted_down.add(raw)
            else:
                self._trusted_down.discard(raw)
        if state in (MemberState.ALIVE, MemberState.SUSPECT):
            self._down.pop(raw, None)
            if self._failed.pop(raw, None) is not None:
                self._failed_version += 1
            if state is MemberState.ALIVE and incarnation > self._alive_inc.get(raw, -1):
                if len(self._alive_inc) >= self.config.max_tracked_senders:
                    self._alive_inc.pop(next(iter(self._alive_inc)))
                self._alive_inc[raw] = incarnation
                for rec in self._runs.values():
                    self._drop_stale_fails(rec, peer, incarnation)
            return
        self._mark_down(peer, now)
        if len(self._failed) >= self.config.max_tracked_senders:
            self._failed.pop(next(iter(self._failed)))
        self._failed[raw] = (peer, incarnation)
        self._failed_version += 1
        for rec in list(self._runs.values()):
            config = rec.config
            if rec.state not in MEMBER_STATES or config is None:
                continue
            join = rec.pending_joins.get(raw)
            if join is not None:
                self._remove_pending(rec, join)  # a newcomer that died before its admission
            held = config.incarnation_of(peer)
            if held is not None and self.local_peer.raw not in rec.pending_fails.get(raw, {}):
                self._raise(
                    now, rec, kind=OpKind.FAIL, subject=peer, incarnation=held, observed_incarnation=incarnation
                )
            # A member that left (or was admitted) for a later step still holds up the steps
            # before it if it died: _check_stuck fails it as long as our next step counts on it.
            self._check_stuck(now, rec)

    def link_changed(
        self, now: float, a: PeerID, b: PeerID, *, up: bool, bandwidth_bytes_per_s: float = 0.0, rtt_s: float = 0.0
    ) -> int:
        """A link between ``a`` and ``b`` (one of them us) went up/down or changed its figures.

        Returns how many runs got a LINK_UP/LINK_DOWN raised (0: every run already agrees, or the
        link is no pair of members of any)."""
        if a == b or self.local_peer not in (a, b):
            return 0
        if a.raw > b.raw:
            a, b = b, a
        raised = 0
        for rec in list(self._runs.values()):
            config = rec.config
            if rec.state not in MEMBER_STATES or config is None:
                continue
            if not (config.has_member(a) and config.has_member(b)):
                continue
            existing = config.link(a, b)
            if up:
                if existing is None and bandwidth_bytes_per_s == 0:
                    continue  # never reported down is usable already; a LINK_UP would change no plan
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
            raised += 1
        return raised

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
                self._check_stuck(now, rec)
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
                if rec.pending_fails and rec.config is not None and rec.state in MEMBER_STATES:
                    # A FAIL waiting for a second signer about a departed member whose last steps we
                    # are now past does not matter any more (no commit would revalidate it).
                    for signers in list(rec.pending_fails.values()):
                        for ident in list(signers.values()):
                            op = rec.pending.get(ident)
                            if op is not None and not self._fail_matters(rec, op):
                                self._remove_pending(rec, ident)

    def config_for_step(self, run: str, step: int) -> Configuration | None:
        """The configuration governing ``step``, or None if the step is gated or not ours.

        The governing configuration is the newest committed one whose activation step is <= step;
        this peer must take part in it at ``step`` (``Configuration.takes_part``): a newcomer starts
        at its ``since_step``. The all-reduce group of the step is ``participants(step)``.
        A removed peer (a leaver) still gets the configurations of the steps before its removal.
        """
        rec = self._runs.get(run)
        return None if rec is None else self._config_for(rec, step)

    def state_of(self, run: str) -> RunState | None:
        """This peer's state in ``run`` (None for an unknown run): cheaper than run_status."""
        rec = self._runs.get(run)
        return None if rec is None else rec.state

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


__all__ = ["NegotiationMachine"]


_HANDLERS: dict[type[Message], str] = {
    OpsAnnounce: "_on_announce",
    Prepare: "_on_prepare",
    Promise: "_on_promise",
    Nack: "_on_nack",
    Accept: "_on_accept",
    Accepted: "_on_accepted",
    RefusePast: "_on_refuse_past",
    Commit: "_on_commit",
    Sync: "_on_sync",
    SyncRequest: "_on_sync_request",
    SyncReply: "_on_sync_reply",
    RunInfoRequest: "_on_run_info_request",
    RunInfoReply: "_on_run_info",
    JoinRequest: "_on_join_request",
    JoinRefusedMessage: "_on_join_refused",
}
"""The handler of each message type, by name: a table of bound methods kept on each machine made
every machine a reference cycle, which only the cyclic garbage collector frees (its pauses showed in
the p99 of benchmark (a), and simulations drop many machines)."""
