"""The state-transfer protocol ``/chaos/transfer/1`` (sans-I/O machines).

A *source* serves immutable snapshots (:class:`SourceSession`, :mod:`.source`); a *newcomer* pulls
one snapshot from several sources at once (:class:`PullMachine`, :mod:`.pull`), reporting what
happens as events (:mod:`.events`). The states of the pull, of each source and of each chunk are
tables in :mod:`.states`; the chunk scheduling of a running pull is :mod:`.scheduler` and the vote
on which snapshot to pull is :mod:`.selection`. The wire format lives in :mod:`chaosp2p.protocols.transfer_messages` and
the configuration in :mod:`chaosp2p.protocols.transfer_config`; both are re-exported here, so
``from chaosp2p.protocols.transfer import ...`` reaches everything. ``protocols/transfer.md`` is the
normative description.
"""

from __future__ import annotations

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
from chaosp2p.protocols.transfer.payload import OutgoingPayload, PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.planner import SchedulingPlanner, ShardPlanner, SourceEstimate
from chaosp2p.protocols.transfer.pull import PullMachine
from chaosp2p.protocols.transfer.resume_record import ResumeRecord
from chaosp2p.protocols.transfer.scheduler import ChunkScheduler, RateMeter
from chaosp2p.protocols.transfer.selection import Conflict, VersionChoice, choose_version
from chaosp2p.protocols.transfer.source import (
    PinnedSnapshot,
    RequestQueue,
    SkippedRequest,
    SnapshotCatalog,
    SourceSession,
    SourceStatistics,
)
from chaosp2p.protocols.transfer.states import ChunkState, PullState, SourceState
from chaosp2p.protocols.transfer_config import TransferConfig
from chaosp2p.protocols.transfer_messages import (
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
