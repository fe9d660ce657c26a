"""What the negotiation machine tells its driver and the training layer: events, status, statistics.

Events come out of ``take_events()`` in the order they happened. Times (``committed_at``, ...) are
the ``now`` of the machine call that produced them; ``detected_at`` and ``proposed_at`` come from the
origin's and the proposer's clocks (observability only: clocks of different peers are not aligned).
"""

from __future__ import annotations

from dataclasses import dataclass

from chaosp2p.protocols.negotiation.operations import OpKind
from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.protocols.negotiation.transitions import ProposerPhase, RunState
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationCommitted:
    """One operation of a committed batch (one event per operation, in apply order)."""

    run: str
    epoch: int
    """The epoch the batch produced."""
    kind: OpKind
    subject: PeerID
    other: PeerID | None
    origin: PeerID
    detected_at: float
    proposed_at: float
    committed_at: float
    activation_step: int
    """The training step from which it applies (``applied_at_step``)."""
    applied: bool
    """False if incarnation precedence dropped it or it no longer applied in its turn."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigurationCommitted:
    """This peer now holds ``configuration`` (epoch and activation step inside)."""

    run: str
    configuration: Configuration
    committed_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """This peer became a member of ``run``; it trains from ``activation_step`` on."""

    run: str
    configuration: Configuration
    activation_step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRefused:
    """A sponsor refused our JOIN_REQUEST; the machine retries another member after join_retry_s."""

    run: str
    sponsor: PeerID
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RemovedFromRun:
    """This peer is no longer a member of ``run`` (from ``epoch``): it stops participating.

    ``reason``: ``"left"`` (our LEAVE committed), ``"failed"`` (a FAIL about us committed),
    ``"evicted"`` (a quorum of members signed EVICTs about us: our contributions kept failing their
    checks), ``"stalled"`` (two members signed that we sent nothing to their rounds: we stopped
    stepping), ``"excluded"`` (a later configuration without us, e.g. after a partition), ``"lost"`` (cut
    off while the run turned over: no member alive can prove its newer configuration to us). To train again the
    peer rejoins as a newcomer (``request_join``).
    """

    run: str
    epoch: int
    reason: str
    activation_step: int
    """The first step this peer is not part of (a leaver trains until the step before it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResyncNeeded:
    """A commit activates at ``step``, which this peer already completed under an older
    configuration: its training state for steps >= ``step`` is wrong and must be reloaded. The
    machine's record of this peer's progress goes back to ``step - 1`` with it."""

    run: str
    step: int
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GateRaised:
    """This peer accepted a value activating at ``step``: it must not begin ``step`` until decided."""

    run: str
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GateReleased:
    """The gated instance was decided (a ConfigurationCommitted precedes this event)."""

    run: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """Answer to ``query_run``: ``from_peer``'s configuration (None: not a member) and step."""

    run: str
    configuration: Configuration | None
    step: int
    from_peer: PeerID
    withheld: str = ""
    """Why a configuration ``from_peer`` sent was not believed (e.g. ``"untrusted"``: this newcomer
    waits for its trusted peers first); empty if it sent none or it was believed. A withheld answer
    is no "not a member": ask again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationRejected:
    """An input was refused and changed nothing; ``origin`` is the peer that sent it."""

    run: str
    reason: str
    origin: PeerID


NegotiationEvent = (
    OperationCommitted
    | ConfigurationCommitted
    | Admitted
    | JoinRefused
    | RemovedFromRun
    | ResyncNeeded
    | GateRaised
    | GateReleased
    | RunInfo
    | OperationRejected
)
"""Every event ``take_events()`` can return."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingOperation:
    """An operation waiting to be committed, as ``status --json`` shows it."""

    op_id: str
    """Hex of the op id."""
    kind: OpKind
    subject: PeerID
    other: PeerID | None
    origin: PeerID
    detected_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStatus:
    """One run as this peer sees it (an entry of ``status --json``'s ``runs``)."""

    run: str
    state: RunState
    epoch: int
    """-1 while joining."""
    activation_step: int
    step: int
    """Highest step training reported entering (-1: none)."""
    completed_step: int
    config_digest: str
    """Hex; empty while joining."""
    members: tuple[PeerID, ...]
    pending: tuple[PendingOperation, ...]
    gate_step: int | None
    """The activation step this peer is gated at, if any."""
    proposer: ProposerPhase


@dataclass(frozen=True, slots=True, kw_only=True)
class NegotiationStatistics:
    """Counters since the machine started."""

    messages_received: int
    messages_sent: int
    rate_limited: int
    ops_raised: int
    """Operations this peer signed."""
    proposals: int
    """Phase-1 or fast-path proposals this peer started."""
    fast_proposals: int
    commits: int
    """Instances this peer decided as proposer."""
    configurations_applied: int
    ops_committed: int
    refused_past: int
    """ACCEPTs this peer refused because it had completed the activation step."""
    nacks_received: int
    syncs_requested: int
    snapshots_adopted: int
    resyncs_needed: int
    signature_verifications: int
    signature_cache_hits: int
    rejected: int
    """Inputs refused (sum of ``rejected_by_reason``)."""
    rejected_by_reason: tuple[tuple[str, int], ...]
    """(reason, count), sorted by reason."""
