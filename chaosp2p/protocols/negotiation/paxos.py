"""Per-run bookkeeping of the negotiation machine and the pure rules of its Paxos instances.

One single-decree Paxos instance decides each epoch: instance e+1 chooses the *value* (operations,
activation step S) that turns C_e into C_{e+1}; its acceptors are the members of C_e, and a quorum
is ``run_configuration.quorum`` of them. This module holds the mutable records (:class:`RunRecord`,
the acceptor and proposer state inside it) and the two decisions a proposer makes -- which value
it may propose after phase 1 (:func:`choose_value`) and from which step a fresh value applies
(:func:`activation_step`). The machine (``machine.py``) moves messages; the reasoning is here.

Safety of skipping an accepted value ("dead" values). Paxos obliges a proposer to re-propose the
highest-ballot value reported in its quorum of promises. An acceptor refuses a *fresh* value if it
completed its activation step S, or if the value FAILs the acceptor itself (:func:`refuses`); a
value re-proposed as *adopted* (taken from a promise) it accepts regardless -- otherwise a few
refusers and a crashed member could block an instance forever. Once it accepted a value it does
not complete S until it learns the decision (the training layer checks ``config_for_step`` before
finishing a step). If a value v was ever chosen by a quorum Q, every promise from a member of Q
for a later ballot reports v (or, by induction, a later ballot's value, which is v) as accepted.
So the promises for one ballot that come from acceptors that would refuse v *and* did not accept
it number at most n - q. Conversely, when n - q + 1 such promises arrive for our ballot, v was
never chosen (and no lower ballot's value was either, since v was safe at its ballot): any value is
safe, and the proposer proposes a fresh one (with S past those steps, without those failures).
This is how "a member already past S refuses, and S is raised" stays compatible with Paxos; a
member past S that accepts an adopted value learns from the commit that it must resync.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from chaosp2p.protocols.negotiation.config import NegotiationConfig
from chaosp2p.protocols.negotiation.configuration_change import AppliedOp
from chaosp2p.protocols.negotiation.justification import WAIT, Claim, dead, forced
from chaosp2p.protocols.negotiation.link_graph import link_owners
from chaosp2p.protocols.negotiation.messages import Ballot, Certificate, CommitRecord, SignedPromise, Value
from chaosp2p.protocols.negotiation.operations import FAIL_KINDS, Operation, OpKind
from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.protocols.negotiation.transitions import ProposerPhase, RunState
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True)
class BackedClaim:
    """An acceptance of ours that another member backs: what our promises may claim."""

    ballot: Ballot
    value: Value
    digest: bytes
    """Digest of the configuration ``value`` makes."""
    backer: PeerID
    backing: bytes


@dataclass(slots=True)
class PromiseInfo:
    """What one promise told the proposer."""

    accepted_ballot: Ballot | None
    """Its accepted ballot, if another member backed the claim (``justification.backing_valid``)."""
    accepted_value: Value | None
    """The accepted value, if it makes ``accepted_digest`` (checked by the proposer)."""
    entered: int
    completed: int
    step_time_s: float
    accepted_digest: bytes = b""
    proof: SignedPromise | None = None
    """The signed promise, as the ACCEPT carries it (``justification.py``)."""


@dataclass(slots=True)
class ProposerRecord:
    """This peer's proposer for the open instance of one run."""

    phase: ProposerPhase = ProposerPhase.IDLE
    ballot: Ballot | None = None
    value: Value | None = None
    value_ids: tuple[bytes, ...] = ()
    adopted: bool = False
    """The value came from a promise (Paxos adoption), not from our pending operations."""
    promises: dict[bytes, PromiseInfo] = field(default_factory=dict)
    promised_entered: int = -1
    """Highest ``entered`` among the promises of the current ballot."""
    promised_completed: int = -1
    """Highest ``completed`` among the promises of the current ballot."""
    accepted_by: set[bytes] = field(default_factory=set)
    shares: dict[bytes, bytes] = field(default_factory=dict)
    """Acceptor raw id -> its verified signature over the acceptance statement of our value."""
    outcome: tuple[Configuration, tuple[AppliedOp, ...]] | None = None
    """C_{e+1} (and what became of each operation) if our current value is chosen."""
    refused: dict[bytes, int] = field(default_factory=dict)
    """Acceptors that refused our current value (completed >= S), with their completed step."""
    refusers: set[bytes] = field(default_factory=set)
    """Everyone who refused any of our values in this instance (worth waiting for in phase 1)."""
    max_round: int = 0
    """Highest round seen in this instance (ours or others')."""
    skipped: Value | None = None
    """The forced value phase 1 found dead (the ACCEPT carries it to prove it may be skipped)."""
    fast_used: bool = False
    retry_at: float | None = None
    started_at: float = 0.0


@dataclass(slots=True)
class JoinRecord:
    """A newcomer's attempt to be admitted."""

    incarnation: int
    throughput: float
    sponsors: list[PeerID]
    """Members to ask, in order; the first is the sponsor named by the caller."""
    attempt: int = 0
    retry_at: float | None = None
    op: Operation | None = None
    request_id: int = 0
    known: Configuration | None = None
    """The configuration the last RUN_INFO reported."""
    answered: bool = False
    """The current attempt's sponsor answered (RUN_INFO or a refusal)."""


REPLY_EXPECTED = 0
"""``RunRecord.sync_asked`` value of a sponsor we sent a JOIN: a member that already admitted us
answers it with a SYNC_REPLY, which we read, but we have asked it for no commits (real requests
start at epoch 1 or later, so a catch-up is still asked of it when its COMMIT needs one)."""


@dataclass(slots=True)
class RunRecord:
    """Everything this peer knows about one run."""

    run: str
    state: RunState | None = None
    config: Configuration | None = None
    configs: list[Configuration] = field(default_factory=list)
    """Recent configurations, oldest first (config_for_step looks back through them)."""
    history: dict[int, CommitRecord] = field(default_factory=dict)
    """Committed values by the epoch they produced (bounded by max_history)."""
    certs: dict[int, Certificate] = field(default_factory=dict)
    """The certificate of each configuration in ``configs`` we hold one for (C_0 has none)."""
    applied: dict[bytes, int] = field(default_factory=dict)
    """Op ids committed recently -> epoch (local replay filter for pending ops)."""
    pending: dict[bytes, Operation] = field(default_factory=dict)
    pending_removals: dict[bytes, int] = field(default_factory=dict)
    """Subject raw id -> number of pending FAIL/LEAVE ops about it."""
    pending_fails: dict[bytes, dict[bytes, bytes]] = field(default_factory=dict)
    """Subject raw id -> origin raw id -> the one pending FAIL that origin signed about it."""
    pending_joins: dict[bytes, bytes] = field(default_factory=dict)
    """Subject raw id -> the one pending JOIN of that newcomer (its newest)."""
    pending_evicts: dict[bytes, dict[bytes, bytes]] = field(default_factory=dict)
    """Subject raw id -> origin raw id -> the one pending EVICT that origin signed about it."""
    incarnation: int = 0
    """Our own incarnation in this run."""
    # acceptor state of the open instance (epoch config.epoch + 1)
    promised: Ballot | None = None
    accepted_ballot: Ballot | None = None
    accepted_value: Value | None = None
    accepted_ids: tuple[bytes, ...] = ()
    accepted_outcome: tuple[Configuration, tuple[AppliedOp, ...]] | None = None
    """C_{e+1} computed when we accepted (the commit of that value reuses it)."""
    accepted_signature: bytes = b""
    """Our signature over the acceptance statement of (accepted_ballot, C_{e+1}'s digest)."""
    accepted_backer: PeerID | None = None
    accepted_backing: bytes = b""
    """Another member's signature that our accepted value was proposed/accepted at its ballot (the
    proposer's from its ACCEPT, or an acceptor's share when we are the proposer): our promises
    show it, or our claim counts for nothing (``justification.py``)."""
    backed: BackedClaim | None = None
    """Our newest acceptance that another member backs. As a proposer we accept our own value
    before anyone answers; until someone does, our promises report this one instead: the unbacked
    claim would count as nothing and hide it (spec section 4b, "Backed claims")."""
    sync_asked: dict[bytes, int] = field(default_factory=dict)
    """Peers we sent a SYNC_REQUEST (raw id -> from epoch): only their SYNC_REPLY is read. A
    newcomer's sponsor is entered as ``REPLY_EXPECTED`` (no catch-up asked of it yet)."""
    unverifiable_from: set[bytes] = field(default_factory=set)
    """Members of ``config`` whose newer snapshot we could not tie to it (learning._lost)."""
    proposer: ProposerRecord = field(default_factory=ProposerRecord)
    # progress reported by training
    entered: int = -1
    completed: int = -1
    step_time_s: float = 0.0
    last_completed_at: float | None = None
    peer_entered: int = -1
    peer_completed: int = -1
    # timers
    wake_at: float | None = None
    """Start a proposal (or take over a stuck one) at this time if the instance is still open."""
    activity_at: float | None = None
    """Last time another proposer's PREPARE/ACCEPT for the open instance arrived."""
    sync_at: float | None = None
    sync_quiet: int = 0
    """SYNC rounds in a row that found the run quiet (each doubles the next interval; a new
    configuration resets it)."""
    join: JoinRecord | None = None
    removed_reason: str = ""
    stuck_checked: tuple[int, int, int] | None = None
    """(epoch, step, failure-report version) of the last stuck check (skip it if unchanged)."""
    encoded: bytes | None = None
    """Cached wire form of ``config`` (RUN_INFO replies and snapshots)."""
    encoded_older: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    """Epoch -> (digest, wire form) of a few older configurations handed out (newest excluded)."""
    sponsored: dict[bytes, tuple[PeerID, int]] = field(default_factory=dict)
    """Newcomers whose JOIN_REQUEST we accepted (raw id -> (peer, incarnation)), not admitted yet:
    we pass on the COMMIT that admits them (we hold a connection to them; the proposer may not)."""

    @property
    def epoch(self) -> int:
        """Current epoch (-1 without a configuration)."""
        return -1 if self.config is None else self.config.epoch

    @property
    def gate_step(self) -> int | None:
        """The activation step of the accepted, undecided value, if any."""
        value = self.accepted_value
        return None if value is None else value.activation_step

    def reset_instance(self) -> None:
        """Forget the acceptor and proposer state of the instance that was just decided."""
        self.promised = None
        self.accepted_ballot = None
        self.accepted_value = None
        self.accepted_ids = ()
        self.accepted_outcome = None
        self.accepted_signature = b""
        self.accepted_backer = None
        self.accepted_backing = b""
        self.backed = None
        self.proposer = ProposerRecord()
        self.activity_at = None
        self.wake_at = None


def choose_value(
    promises: dict[bytes, PromiseInfo], config: Configuration
) -> tuple[Ballot | None, Value | None, Value | None] | Literal["wait"]:
    """Phase-1 outcome: (ballot, value) to re-propose, or (None, None) if any value is safe; the
    third item is the forced value skipped as dead (None if none). :data:`~.justification.WAIT`
    if the promises cannot tell yet (``justification.forced``), or the forced value's content is
    not among them. Every acceptor recomputes this from the signed promises the ACCEPT carries."""
    claims = [
        Claim(raw, p.accepted_ballot, p.accepted_digest, p.completed, p.proof.accepted_digest if p.proof else b"")
        for raw, p in promises.items()
    ]
    verdict = forced(claims, config)
    if verdict is None:
        return None, None, None
    if isinstance(verdict, str):
        return WAIT
    ballot, digest = verdict
    value = next(
        (p.accepted_value for p in promises.values() if p.accepted_digest == digest and p.accepted_value), None
    )
    if value is None:
        return WAIT
    if dead(value, digest, claims, config):
        return None, None, value
    return ballot, value, None


def is_urgent(ops: Iterable[Operation]) -> bool:
    """A batch that removes a member that cannot contribute (a FAIL or a STALL): survivors redo the
    stuck step."""
    return any(op.kind in FAIL_KINDS for op in ops)


def breaks_plan(ops: Iterable[Operation], config: Configuration) -> bool:
    """Does the batch take down a link that every round under ``config`` needs?

    A LINK_DOWN of a usable link with a member that owns a shard under ``config``'s link plan (the
    members of maximal degree, :mod:`.link_graph`) at one end: every member sends that owner its
    part of the shard and gets the result back over the link the plan takes as usable, so no round
    of the step the run is in can complete without it. The run redoes that step under the batch
    (``protocols/negotiation.md`` section 3d), where the pair exchanges through a relay, instead of
    waiting ``margin`` steps it cannot take. (A newcomer's links are assumed usable, so a newcomer
    that cannot reach the others may own a shard of the step it is admitted at.)
    """
    downs = [op for op in ops if op.kind is OpKind.LINK_DOWN and op.other is not None]
    if not downs:
        return False
    owners = link_owners(config.peers, config.links)
    return any((op.subject in owners or op.other in owners) and _usable(config, op) for op in downs)


def link_down_supersedes(ops: Iterable[Operation], config: Configuration, previous: Configuration | None) -> bool:
    """May a plan-breaking LINK_DOWN batch activate before ``config`` does (supersede it)?

    Only if ``config`` brought no link up that ``previous`` (the configuration before it) had
    down: then the steps before ``config`` activates run under a plan that needs the broken link
    too, and waiting for ``config`` would leave the run stuck. After a LINK_UP, the batch
    activates no earlier than ``config``, so a member that flaps its links on purpose gets at most
    one round redone per LINK_UP/LINK_DOWN cycle, and at least one step completes in between
    (``protocols/negotiation.md`` section 3d).
    """
    ops = list(ops)
    if not breaks_plan(ops, config):
        return False
    if previous is None:
        return True
    for link in previous.links:
        if not link.up and config.has_member(link.a) and config.has_member(link.b):
            now = config.link(link.a, link.b)
            if now is None or now.up:
                return False  # ``config`` brought this link up again
    return True


def _usable(config: Configuration, op: Operation) -> bool:
    assert op.other is not None
    entry = config.link(op.subject, op.other)
    return entry is None or entry.up


def activation_step(
    *,
    config: Configuration,
    settings: NegotiationConfig,
    ops: Iterable[Operation],
    entered: Iterable[int],
    completed: Iterable[int],
    step_times: Iterable[float],
    previous: Configuration | None = None,
) -> int:
    """S for a fresh value.

    S = max(max(entered) + margin, max(completed) + 1, C_e.activation_step) with
    margin = 1 + ceil(decision_estimate_s / step_time_s), decision_estimate_s = 4 x the slowest RTT
    in the link snapshot (default_rtt_s if none is known) + decision_floor_s, step_time_s the
    median reported; ``default_margin_steps`` if no step time is known. An urgent batch (a FAIL)
    uses S = max(completed) + 1 and no lower bound from C_e, so the survivors redo the step the
    failed member left stuck. (Not max(entered): a newcomer enters its admission step at once,
    before the old members finished the steps before it.) A batch that :func:`breaks_plan` (a
    LINK_DOWN every round needs) uses S = max(completed) + 1 too, with C_e's activation step as a
    lower bound unless :func:`link_down_supersedes` (``previous`` is C_{e-1}).
    """
    ops = list(ops)
    max_entered = max(entered, default=-1)
    max_completed = max(completed, default=-1)
    if not is_urgent(ops) and breaks_plan(ops, config):
        floor = 0 if link_down_supersedes(ops, config, previous) else config.activation_step
        return max(max_completed + 1, floor, 0)
    if is_urgent(ops):
        if max_completed < 0:
            # Nobody we heard from completed a step (only members admitted after the last step
            # anyone completed answered, or the run has not started): the earliest step any of
            # them entered. Not the furthest: a member stuck at its admission step under a
            # configuration that counts on the dead member must be able to redo that step, and
            # the newest newcomer's admission step would leave it stuck forever (found by the
            # property test: the only members that had completed steps crashed). Anyone that did
            # complete S refuses the value, which raises S.
            return min((e for e in entered if e >= 0), default=0)
        # The first step nobody completed: the survivors redo it without the failed member. No
        # lower bound from C_e: if C_e activates later, the urgent value supersedes it (the
        # configuration governing a step is the newest one activating at or before it; members
        # it admitted keep their later since_step), otherwise the survivors would wait forever
        # under a configuration that counts on the failed member.
        return max(max_completed + 1, 0)
    else:
        times = [t for t in step_times if t > 0.0]
        if times:
            rtt = max((lk.rtt_s for lk in config.links if lk.up), default=0.0)
            estimate = 4.0 * max(rtt, settings.default_rtt_s) + settings.decision_floor_s
            margin = 1 + math.ceil(estimate / statistics.median(times))
        else:
            margin = settings.default_margin_steps
        margin = min(margin, settings.max_margin_steps)
    return max(max_entered + margin, max_completed + 1, config.activation_step, 0)


def refuses_mid_step(value: Value, config: Configuration, *, entered: int, completed: int) -> bool:
    """Does an acceptor inside step S (it entered S after completing a step, and has not completed
    S) refuse the fresh, ordinary ``value`` activating at S?

    Yes: its round of S may already be delivering results, so the other members can complete S
    under C_e while accepting would gate S here -- the value would void a step others completed
    (``ResyncNeeded``; star run 5). Refusing makes the proposer look again, and its next S comes
    from the promises' progress, past S. Not an urgent or plan-breaking value: its S is the step
    the run is stuck in, which every member entered. Not a newcomer that completed nothing (it
    enters its admission step at once, wherever the others are).
    """
    if completed < 0 or entered < value.activation_step:
        return False
    ops = list(value.ops)
    return not is_urgent(ops) and not breaks_plan(ops, config)


def coordinator(config: Configuration) -> PeerID | None:
    """The member allowed to skip phase 1 at round 0 in the instance following ``config``."""
    peers = config.peers
    return peers[config.seed % len(peers)] if peers else None
