"""The state-transfer protocol ``/chaos/transfer/1`` (sans-I/O machines).

A *source* serves immutable snapshots (:class:`SourceSession`, :mod:`.source`); a *newcomer* pulls
one snapshot from several sources at once (:class:`PullMachine`, :mod:`.pull`), reporting what
happens as events (:mod:`.events`). The states of the pull, of each source and of each chunk are
tables in :mod:`.states`. The wire format lives in :mod:`chaosp2p.protocols.transfer_messages` and
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
from chaosp2p.protocols.transfer.source import PinnedSnapshot, SnapshotCatalog, SourceSession, SourceStatistics
from chaosp2p.protocols.transfer.states import ChunkState, PullState, SourceState
from chaosp2p.protocols.transfer_config import TransferConfig
from chaosp2p.protocols.transfer_messages import (
    PROTOCOL,
    PROTOCOL_ID,
    BufferSpec,
    Manifest,
    TransferErrorCode,
    VersionInfo,
    check_manifest,
    decode_manifest,
    encode_manifest,
    manifest_digest,
)

__all__ = [
    "PROTOCOL",
    "PROTOCOL_ID",
    "BufferSpec",
    "ChunkState",
    "Completed",
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
    "ResumeDiscarded",
    "ResumeRecord",
    "SchedulingPlanner",
    "ShardPlanner",
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
    "VersionInfo",
    "check_manifest",
    "decode_manifest",
    "encode_manifest",
    "manifest_digest",
]
