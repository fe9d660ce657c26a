"""State snapshots, manifests, staging buffers, resume records and the (lazy) PyTorch adapter.

Importing this package never imports torch; use :mod:`chaosp2p.state.torch_adapter` for
``publish_torch`` / ``load_torch``.
"""

from chaosp2p.protocols.transfer import ResumeRecord, SourceProgress, TransferProgress
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.state.buffers import StagingBuffer
from chaosp2p.state.manifest import (
    BufferSpec,
    FlatState,
    Manifest,
    array_views,
    build_manifest,
    check_manifest,
    hash_chunks,
    layout_buffers,
    verify_chunks,
)
from chaosp2p.state.progress import ProgressCallback, format_progress
from chaosp2p.state.resume import checkpoint, load_resume, reverify, save_resume
from chaosp2p.state.snapshot import (
    SnapshotBuilder,
    SnapshotInfo,
    SnapshotLease,
    SnapshotStore,
    StateProvider,
)

__all__ = [
    "BufferSpec",
    "FlatState",
    "Manifest",
    "ProgressCallback",
    "ResumeRecord",
    "SnapshotBuilder",
    "SnapshotInfo",
    "SnapshotLease",
    "SnapshotStore",
    "SourceProgress",
    "StagingBuffer",
    "StateProvider",
    "TransferConfig",
    "TransferProgress",
    "array_views",
    "build_manifest",
    "check_manifest",
    "checkpoint",
    "format_progress",
    "hash_chunks",
    "layout_buffers",
    "load_resume",
    "reverify",
    "save_resume",
    "verify_chunks",
]
