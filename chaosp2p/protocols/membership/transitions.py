"""Member states and the one transition table that governs them.

A member's state in the local view changes only through this table (plus two timers: a suspicion
that runs out makes a SUSPECT member FAILED; retention expiry forgets FAILED/LEFT members). The
ALIVE and LEFT rows apply to claims signed by their subject; the SUSPECT and DEAD rows to this
peer's own verdicts only (its check failed, its suspicion ran out): the same records from others
are hints that make it look for itself (``members.py``), never inputs to this table. Each
entry says which state an update of a given kind leads to and how its incarnation must compare
with the one we hold: ``NEWER`` (strictly greater: only the member itself can make this happen,
by refuting) or ``AT_LEAST`` (greater or equal: a claim against the current incarnation). Pairs not
in the table are ignored: a dead member cannot be suspected, a member that left cannot fail, and
suspect/dead/left claims about members we never knew cannot introduce them (they carry no address).
"""

from __future__ import annotations

import enum

from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.membership.messages import UpdateKind


class Order(enum.Enum):
    """How an update's incarnation must compare with the held one for the transition to apply."""

    ANY = "any"
    NEWER = "newer"
    AT_LEAST = "at_least"


A, S, F, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.FAILED, MemberState.LEFT

TRANSITIONS: dict[tuple[MemberState | None, UpdateKind], tuple[MemberState, Order]] = {
    # current state, update kind      -> new state, incarnation rule
    (None, UpdateKind.ALIVE): (A, Order.ANY),
    (A, UpdateKind.ALIVE): (A, Order.NEWER),
    (A, UpdateKind.SUSPECT): (S, Order.AT_LEAST),
    (A, UpdateKind.DEAD): (F, Order.AT_LEAST),
    (A, UpdateKind.LEFT): (L, Order.AT_LEAST),
    (S, UpdateKind.ALIVE): (A, Order.NEWER),
    (S, UpdateKind.SUSPECT): (S, Order.AT_LEAST),  # same incarnation: a confirmation
    (S, UpdateKind.DEAD): (F, Order.AT_LEAST),
    (S, UpdateKind.LEFT): (L, Order.AT_LEAST),
    (F, UpdateKind.ALIVE): (A, Order.NEWER),
    (F, UpdateKind.LEFT): (L, Order.AT_LEAST),
    (L, UpdateKind.ALIVE): (A, Order.NEWER),
}
"""The member state machine (see ``protocols/membership.md``, "Member state machine")."""

KIND_OF_STATE: dict[MemberState, UpdateKind] = {
    A: UpdateKind.ALIVE,
    S: UpdateKind.SUSPECT,
    F: UpdateKind.DEAD,
    L: UpdateKind.LEFT,
}
"""The update kind that describes a member in a given state (for gossip and push-pull)."""


def transition(
    current: MemberState | None, current_incarnation: int, kind: UpdateKind, incarnation: int
) -> MemberState | None:
    """The state an update leads to, or ``None`` if the update does not apply."""
    rule = TRANSITIONS.get((current, kind))
    if rule is None:
        return None
    new_state, order = rule
    if order is Order.NEWER and incarnation <= current_incarnation:
        return None
    if order is Order.AT_LEAST and incarnation < current_incarnation:
        return None
    return new_state
