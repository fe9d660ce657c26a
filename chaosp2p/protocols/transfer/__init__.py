"""The state-transfer protocol ``/chaos/transfer/1`` (sans-I/O machines).

A *source* serves immutable snapshots (:class:`SourceSession`, :mod:`.source`); a *newcomer* pulls
one snapshot from several sources at once (:class:`PullMachine`, :mod:`.pull`, built from
:mod:`.pull_core` and the phases :mod:`.querying`, :mod:`.opening` and :mod:`.pulling`), reporting
what happens as events (:mod:`.events`). The states of the pull, of each source and of each chunk
are tables in :mod:`.transitions`; the chunk scheduling of a running pull is :mod:`.scheduler` (one
:mod:`.lanes` entry per source) and the vote on which snapshot to pull is :mod:`.selection`. The
wire format lives in :mod:`.messages` and the configuration in :mod:`.config`; both are re-exported
here, so ``from chaosp2p.protocols.transfer import ...`` reaches everything.
``protocols/transfer.md`` is the normative description.
"""

from __future__ import annotations

from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.events import (
    Completed,
    DropReason,
    Failed,
    ManifestReady,
    PenaltyReason,
    Planned,
    PlanReason,
    PullEvent,
    ResumeDiscarded,
    SourceDropped,
    SourcePenalised,
    SourceProgress,
    TransferProgress,
)
from chaosp2p.protocols.transfer.lanes import RateMeter
from chaosp2p.protocols.transfer.messages import (
    PROTOCOL,
    PROTOCOL_ID,
    BufferSpec,
    CancelRequest,
    Manifest,
    TransferErrorCode,
    VersionInfo,
    check_manifest,
    decode_manifest,
    decode_message,
    encode_manifest,
    manifest_digest,
)
from chaosp2p.protocols.transfer.payload import OutgoingPayload, PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.planner import SchedulingPlanner, ShardPlanner, SourceEstimate
from chaosp2p.protocols.transfer.pull import PullMachine
from chaosp2p.protocols.transfer.resume_record import ResumeRecord
from chaosp2p.protocols.transfer.scheduler import ChunkScheduler
from chaosp2p.protocols.transfer.selection import Conflict, VersionChoice, choose_version
from chaosp2p.protocols.transfer.source import (
    PinnedSnapshot,
    RequestQueue,
    SkippedRequest,
    SnapshotCatalog,
    SourceSession,
    SourceStatistics,
)
from chaosp2p.protocols.transfer.transitions import ChunkState, PullState, SourceState

__all__ = [
    "PROTOCOL",
    "PROTOCOL_ID",
    "BufferSpec",
    "CancelRequest",
    "ChunkScheduler",
    "ChunkState",
    "Completed",
    "Conflict",
    "DropReason",
    "Failed",
    "Manifest",
    "ManifestReady",
    "OutgoingPayload",
    "PayloadKind",
    "PayloadSlot",
    "PenaltyReason",
    "PinnedSnapshot",
    "PlanReason",
    "Planned",
    "PullEvent",
    "PullMachine",
    "PullState",
    "RateMeter",
    "RequestQueue",
    "ResumeDiscarded",
    "ResumeRecord",
    "SchedulingPlanner",
    "ShardPlanner",
    "SkippedRequest",
    "SnapshotCatalog",
    "SourceDropped",
    "SourceEstimate",
    "SourcePenalised",
    "SourceProgress",
    "SourceSession",
    "SourceState",
    "SourceStatistics",
    "TransferConfig",
    "TransferErrorCode",
    "TransferProgress",
    "VersionChoice",
    "VersionInfo",
    "check_manifest",
    "choose_version",
    "decode_manifest",
    "decode_message",
    "encode_manifest",
    "manifest_digest",
]
