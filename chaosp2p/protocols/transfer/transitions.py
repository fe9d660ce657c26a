"""The pull's state machines as data: one Enum of states and one transition table for each.

Three machines run inside a :class:`~chaosp2p.protocols.transfer.pull.PullMachine`:

* the **pull** itself (:class:`PullState`): query versions, open leases, wait for staging, pull,
  and end completed, failed or aborted;
* each **source** (:class:`SourceState`): asked for its versions, chosen or set aside, leased,
  then dropped (a fault or a race lost) or done;
* each **chunk** (:class:`ChunkState`): missing, queued on a source, requested (in flight, from
  one source or -- in the end game -- from two), verified.

Every state change goes through :func:`advance` with the table that governs it; an input a table
does not list for the current state is a bug in the caller and raises
:class:`~chaosp2p.errors.LocalProtocolError`. Inputs that arrive late from the network (an answer
for a request already settled) are filtered by the machine *before* they reach a table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from chaosp2p.errors import LocalProtocolError

S = TypeVar("S", bound=enum.Enum)
I = TypeVar("I", bound=enum.Enum)  # noqa: E741 - the input of a transition, as in the tables


def advance(table: Mapping[tuple[S, I], S], state: S, event: I, what: str) -> S:
    """The state ``event`` leads to from ``state`` in ``table``; :class:`LocalProtocolError` if none."""
    target = table.get((state, event))
    if target is None:
        raise LocalProtocolError(f"{what}: {event.value} is not allowed in state {state.value}")
    return target


# ========================================================================================= pull
class PullState(enum.Enum):
    """States of a :class:`~chaosp2p.protocols.transfer.pull.PullMachine`."""

    IDLE = "idle"
    QUERYING = "querying"
    OPENING = "opening"
    READY = "ready"
    PULLING = "pulling"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class PullInput(enum.Enum):
    """What moves a pull between states."""

    START = "start"
    VERSION_CHOSEN = "version_chosen"
    MANIFEST_ACCEPTED = "manifest_accepted"
    START_PULL = "start_pull"
    ALL_VERIFIED = "all_verified"
    FAIL = "fail"
    ABORT = "abort"


PULL_TRANSITIONS: dict[tuple[PullState, PullInput], PullState] = {
    (PullState.IDLE, PullInput.START): PullState.QUERYING,
    (PullState.QUERYING, PullInput.VERSION_CHOSEN): PullState.OPENING,
    (PullState.OPENING, PullInput.MANIFEST_ACCEPTED): PullState.READY,
    (PullState.READY, PullInput.START_PULL): PullState.PULLING,
    (PullState.PULLING, PullInput.ALL_VERIFIED): PullState.COMPLETED,
    **{
        (state, PullInput.FAIL): PullState.FAILED
        for state in (PullState.QUERYING, PullState.OPENING, PullState.READY, PullState.PULLING)
    },
    **{
        (state, PullInput.ABORT): PullState.ABORTED
        for state in (PullState.IDLE, PullState.QUERYING, PullState.OPENING, PullState.READY, PullState.PULLING)
    },
}
"""The pull's lifecycle (see the theory of operation in :mod:`chaosp2p.protocols.transfer.pull`)."""

PULL_FINAL = frozenset({PullState.COMPLETED, PullState.FAILED, PullState.ABORTED})
"""States a pull never leaves."""


# ======================================================================================= source
class SourceState(enum.Enum):
    """One source as the newcomer sees it during one pull."""

    QUERYING = "querying"
    """Asked which versions it holds; no answer yet."""
    ANSWERED = "answered"
    """Answered; waiting for the version choice (or, mid-pull, for its lease to be opened)."""
    OPENING = "opening"
    """Holds the chosen version; a lease was asked for."""
    LEASED = "leased"
    """Lease held: chunks may be requested from it."""
    DROPPED = "dropped"
    """No longer used for this pull (it failed, misbehaved or lost a race)."""
    UNUSED = "unused"
    """Set aside without fault: it does not hold the chosen version."""
    DONE = "done"
    """The pull ended while it was in use (its lease was released)."""


class SourceInput(enum.Enum):
    """What moves a source between states."""

    VERSIONS = "versions"
    """It answered the version query."""
    CHOSEN = "chosen"
    """It holds the chosen version: open a lease."""
    SET_ASIDE = "set_aside"
    """It does not hold the chosen version (or answered that it holds nothing)."""
    LEASE_GRANTED = "lease_granted"
    DROP = "drop"
    FINISH = "finish"


_LIVE_SOURCE = (SourceState.QUERYING, SourceState.ANSWERED, SourceState.OPENING, SourceState.LEASED)

SOURCE_TRANSITIONS: dict[tuple[SourceState, SourceInput], SourceState] = {
    (SourceState.QUERYING, SourceInput.VERSIONS): SourceState.ANSWERED,
    (SourceState.ANSWERED, SourceInput.CHOSEN): SourceState.OPENING,
    (SourceState.OPENING, SourceInput.LEASE_GRANTED): SourceState.LEASED,
    **{(state, SourceInput.SET_ASIDE): SourceState.UNUSED for state in _LIVE_SOURCE},
    **{(state, SourceInput.DROP): SourceState.DROPPED for state in _LIVE_SOURCE},
    **{(state, SourceInput.FINISH): SourceState.DONE for state in _LIVE_SOURCE},
}
"""A source's life within one pull."""

SOURCE_GONE = frozenset({SourceState.DROPPED, SourceState.UNUSED, SourceState.DONE})
"""States in which nothing from a source is read any more."""


# ======================================================================================== chunk
class ChunkState(enum.IntEnum):
    """One chunk of the snapshot in the staging buffer (an int, so a table of them is compact)."""

    MISSING = 0
    """Nobody has it queued or in flight: it needs an owner."""
    QUEUED = 1
    """Planned on a source, not yet requested."""
    INFLIGHT = 2
    """Requested; its bytes are on the way (from one source, or in the end game from two)."""
    VERIFIED = 3
    """Its bytes in the staging buffer match the manifest. Final."""


class ChunkInput(enum.Enum):
    """What moves a chunk between states."""

    ASSIGN = "assign"
    UNASSIGN = "unassign"
    REQUEST = "request"
    DUPLICATE = "duplicate"
    """End game: request it again from another source while the first request is still out."""
    VERIFY = "verify"
    LOSE = "lose"
    """Every request for it ended without verified bytes (failed, corrupt, aborted)."""
    RESUME = "resume"
    """A resume record says the staging buffer already holds it."""


CHUNK_TRANSITIONS: dict[tuple[ChunkState, ChunkInput], ChunkState] = {
    (ChunkState.MISSING, ChunkInput.ASSIGN): ChunkState.QUEUED,
    (ChunkState.MISSING, ChunkInput.RESUME): ChunkState.VERIFIED,
    (ChunkState.QUEUED, ChunkInput.UNASSIGN): ChunkState.MISSING,
    (ChunkState.QUEUED, ChunkInput.REQUEST): ChunkState.INFLIGHT,
    (ChunkState.INFLIGHT, ChunkInput.DUPLICATE): ChunkState.INFLIGHT,
    (ChunkState.INFLIGHT, ChunkInput.VERIFY): ChunkState.VERIFIED,
    (ChunkState.INFLIGHT, ChunkInput.LOSE): ChunkState.MISSING,
}
"""A chunk's life within one pull."""
