"""The per-run state machine and the proposer's phases, as data.

A peer's relation to one run is a :class:`RunState`; it changes only through :data:`TRANSITIONS`
(``transition()`` raises :class:`LocalProtocolError` for a pair not in the table). Independently, the
peer's proposer for the run's open instance is in a :class:`ProposerPhase`, changed only through
:data:`PROPOSER_TRANSITIONS`. ``protocols/negotiation.md`` shows both as Mermaid diagrams produced by
:func:`render_state_diagram`; a unit test fails if the document's copy is stale.

Run states:

* ``JOINING``     -- not a member; a JOIN_REQUEST is outstanding (or waits for RUN_INFO).
* ``STABLE``      -- member; no pending operation, nothing accepted for the open instance.
* ``NEGOTIATING`` -- member; operations are pending (an instance is being or will be proposed).
* ``GATED``       -- member that accepted a value for the open instance: it does not begin the
  value's activation step until the instance is decided.
* ``REMOVED``     -- not in the newest configuration (left, failed, or removed while partitioned
  away); a leaver still trains the steps before that configuration's activation step.
"""

from __future__ import annotations

import enum

from chaosp2p.errors import LocalProtocolError


class RunState(enum.Enum):
    """This peer's relation to one run (``status --json`` prints the value)."""

    JOINING = "joining"
    STABLE = "stable"
    NEGOTIATING = "negotiating"
    GATED = "gated"
    REMOVED = "removed"


class RunEvent(enum.Enum):
    """What can happen to a run at this peer."""

    CREATE = "create"
    """create_run(): found C_0 with this peer alone."""
    REQUEST_JOIN = "request_join"
    """request_join(): ask a sponsor to admit us (again, with another sponsor, while joining)."""
    JOIN_REFUSED = "join_refused"
    """A sponsor refused; retry another member."""
    ADMIT = "admit"
    """A commit (or snapshot) names us a member."""
    OP_PENDING = "op_pending"
    """A valid operation became pending (ours -- leave, throughput, fail, link -- or announced)."""
    ACCEPT = "accept"
    """We accepted a value for the open instance (gate raised)."""
    REPORT_STEP = "report_step"
    """Training reported progress."""
    COMMIT = "commit"
    """The open instance was decided and we are still a member."""
    REMOVE = "remove"
    """A committed configuration does not contain us."""


J, S, N, G, R = RunState.JOINING, RunState.STABLE, RunState.NEGOTIATING, RunState.GATED, RunState.REMOVED
_MEMBER = (S, N, G)

TRANSITIONS: dict[tuple[RunState | None, RunEvent], RunState] = {
    (None, RunEvent.CREATE): S,
    (None, RunEvent.REQUEST_JOIN): J,
    (R, RunEvent.REQUEST_JOIN): J,
    (J, RunEvent.REQUEST_JOIN): J,
    (J, RunEvent.JOIN_REFUSED): J,
    (J, RunEvent.ADMIT): S,
    (S, RunEvent.OP_PENDING): N,
    (N, RunEvent.OP_PENDING): N,
    (G, RunEvent.OP_PENDING): G,
    (S, RunEvent.ACCEPT): G,
    (N, RunEvent.ACCEPT): G,
    (G, RunEvent.ACCEPT): G,
    (S, RunEvent.REPORT_STEP): S,
    (N, RunEvent.REPORT_STEP): N,
    (G, RunEvent.REPORT_STEP): G,
    (R, RunEvent.REPORT_STEP): R,
    (S, RunEvent.COMMIT): S,
    (N, RunEvent.COMMIT): S,
    (G, RunEvent.COMMIT): S,
    (S, RunEvent.REMOVE): R,
    (N, RunEvent.REMOVE): R,
    (G, RunEvent.REMOVE): R,
}
"""The run state machine (see ``protocols/negotiation.md``, "Run state machine")."""

MEMBER_STATES = frozenset(_MEMBER)
"""States in which this peer is a member of the run's current configuration."""


def transition(current: RunState | None, event: RunEvent) -> RunState:
    """The state ``event`` leads to from ``current``; LocalProtocolError if it is illegal there."""
    new = TRANSITIONS.get((current, event))
    if new is None:
        where = "an unknown run" if current is None else f"state {current.name}"
        raise LocalProtocolError(f"negotiation: {event.value} is illegal in {where}")
    return new


class ProposerPhase(enum.Enum):
    """Where this peer's proposer stands in the open instance."""

    IDLE = "idle"
    PREPARING = "preparing"
    """Phase 1: PREPARE sent, collecting promises."""
    ACCEPTING = "accepting"
    """Phase 2: ACCEPT sent, collecting ACCEPTED."""


class ProposerEvent(enum.Enum):
    """What moves the proposer."""

    PREPARE = "prepare"
    """Start (or restart, with a higher ballot) phase 1."""
    FAST_ACCEPT = "fast_accept"
    """The epoch's coordinator skips phase 1 at round 0 (no lower ballot exists)."""
    PROMISED = "promised"
    """A quorum promised: send ACCEPT."""
    DECIDED = "decided"
    """A quorum accepted: send COMMIT."""
    ABANDON = "abandon"
    """The instance was decided elsewhere, or there is nothing left to propose."""


PI, PP, PA = ProposerPhase.IDLE, ProposerPhase.PREPARING, ProposerPhase.ACCEPTING

PROPOSER_TRANSITIONS: dict[tuple[ProposerPhase, ProposerEvent], ProposerPhase] = {
    (PI, ProposerEvent.PREPARE): PP,
    (PP, ProposerEvent.PREPARE): PP,
    (PA, ProposerEvent.PREPARE): PP,
    (PI, ProposerEvent.FAST_ACCEPT): PA,
    (PP, ProposerEvent.PROMISED): PA,
    (PA, ProposerEvent.DECIDED): PI,
    (PP, ProposerEvent.ABANDON): PI,
    (PA, ProposerEvent.ABANDON): PI,
}
"""The proposer's phases (see ``protocols/negotiation.md``, "Proposer")."""


def proposer_transition(current: ProposerPhase, event: ProposerEvent) -> ProposerPhase:
    """The phase ``event`` leads to; LocalProtocolError if it is illegal in ``current``."""
    new = PROPOSER_TRANSITIONS.get((current, event))
    if new is None:
        raise LocalProtocolError(f"negotiation proposer: {event.value} is illegal in {current.name}")
    return new


def render_state_diagram() -> str:
    """Both tables as Mermaid ``stateDiagram-v2`` blocks (the copy in the spec must equal this)."""
    lines = ["```mermaid", "stateDiagram-v2"]
    for (source, event), target in TRANSITIONS.items():
        origin = "[*]" if source is None else source.name
        lines.append(f"    {origin} --> {target.name} : {event.value}")
    lines += ["```", "", "```mermaid", "stateDiagram-v2"]
    lines.append(f"    [*] --> {PI.name}")
    for (phase, pevent), ptarget in PROPOSER_TRANSITIONS.items():
        lines.append(f"    {phase.name} --> {ptarget.name} : {pevent.value}")
    lines.append("```")
    return "\n".join(lines) + "\n"
