"""Events a :class:`~chaosp2p.protocols.transfer.pull.PullMachine` reports to its driver.

Frozen records, in the order things happened: the manifest is ready (allocate staging), chunks
were planned, a source was dropped or penalised, progress, and exactly one of :class:`Completed`
(commit the staging buffer) or :class:`Failed` (never commit it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import TransferError
from chaosp2p.protocols.transfer.messages import Manifest
from chaosp2p.wire.identity import PeerID


class DropReason(enum.Enum):
    """Why a source stopped being used for this transfer."""

    NO_VERSION = "no_version"
    """It does not hold the chosen version (not a fault)."""
    CONFLICT = "conflict"
    """It offers a snapshot that contradicts the one the other sources agree on (or that was pinned)."""
    VERSION_MISMATCH = "version_mismatch"
    """Its snapshot changed between the version query and the lease (not a fault)."""
    TIMEOUT = "timeout"
    STALLED = "stalled"
    FAILED = "failed"
    REFUSED = "refused"
    CORRUPT = "corrupt"
    PROTOCOL = "protocol"


class PenaltyReason(enum.Enum):
    """Misbehaviour worth remembering beyond this transfer (feed it to peer scoring)."""

    CORRUPT_DATA = "corrupt_data"
    BAD_MANIFEST = "bad_manifest"
    PROTOCOL_VIOLATION = "protocol_violation"


class PlanReason(enum.Enum):
    """Why the chunks were (re)assigned."""

    INITIAL = "initial"
    SOURCE_DROPPED = "source_dropped"
    BEHIND_PLAN = "behind_plan"
    """A source's measured rate differs from the rate its plan assumed (slower or faster)."""
    MEASURED = "measured"
    """Sources nobody knew were measured on their first requests."""
    SOURCE_ADDED = "source_added"
    """A source joined mid-pull."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceProgress:
    """One source's share of a transfer."""

    peer: PeerID
    active: bool
    bytes_done: int
    rate_bytes_per_s: float
    """Its measured rate (0 until its first request completed)."""
    inflight_chunks: int
    queued_chunks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferProgress:
    """Progress of a pull, for callbacks and progress bars."""

    run: str
    step: int
    bytes_done: int
    bytes_total: int
    chunks_done: int
    chunks_total: int
    resumed_bytes: int
    """Bytes already verified when this pull started (from a resume record)."""
    elapsed_s: float
    rate_bytes_per_s: float
    """Bytes verified in this pull per second since ``start_pull``."""
    eta_s: float | None
    sources: tuple[SourceProgress, ...]

    @property
    def fraction(self) -> float:
        """Share of the snapshot verified (1.0 for an empty snapshot)."""
        return 1.0 if self.bytes_total == 0 else self.bytes_done / self.bytes_total


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestReady:
    """The manifest is verified: allocate staging for it, then call ``start_pull``."""

    manifest: Manifest
    digest: bytes
    sources: tuple[PeerID, ...]
    resumed_chunks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeDiscarded:
    """The resume record given to the machine does not match the chosen snapshot."""

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """Unverified chunks were (re)assigned: how many each source now has queued."""

    reason: PlanReason
    chunks: int
    shares: tuple[tuple[PeerID, int], ...]
    rates: tuple[tuple[PeerID, float], ...] = ()
    """The rate (bytes/s) each source was planned with: measured, else estimated, else guessed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceDropped:
    """``source`` is no longer used for this transfer; close its stream now (see the safety rule)."""

    source: PeerID
    reason: DropReason
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SourcePenalised:
    """``source`` misbehaved (corrupt bytes, bad manifest, protocol violation)."""

    source: PeerID
    reason: PenaltyReason
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Completed:
    """Every chunk of the snapshot is verified in the staging buffer; commit it."""

    run: str
    step: int
    digest: bytes
    manifest: Manifest
    elapsed_s: float
    bytes_by_source: tuple[tuple[PeerID, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    """The pull cannot complete; the staging buffer must not be committed."""

    error: TransferError


PullEvent = (
    ManifestReady | ResumeDiscarded | Planned | SourceDropped | SourcePenalised | TransferProgress | Completed | Failed
)
