"""chaosp2p: peer-to-peer networking for decentralized, elastic deep-learning training.

The public API is importable from here: one peer per style -- :class:`AsyncPeer` (``async with
chaosp2p.open_peer(config) as peer``) for async code, the blocking :class:`Peer` for plain scripts --
training with others (:class:`Collaboration`, :class:`AsyncCollaboration`), the configs, and the
error tree. Heavier names are loaded on first use, so ``import chaosp2p.wire`` stays cheap.

Import paths that moved when the package was laid out by layers still work (see
:mod:`chaosp2p._moved`); new code uses the paths shown in the README.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chaosp2p import _moved
from chaosp2p._version import __version__
from chaosp2p.errors import (
    AdmissionDenied,
    ChaosError,
    ChecksumMismatch,
    ConfigError,
    ConnectionClosed,
    LocalProtocolError,
    PeerIdMismatch,
    PeerUnreachable,
    ProtocolError,
    ProtocolNotSupported,
    RemoteProtocolError,
    RequestTimeout,
    StreamReset,
    TrainingError,
    TransferError,
)

# name -> module that defines it; resolved lazily by __getattr__ below.
_LAZY = {
    "PeerConfig": "chaosp2p.runtime.config",
    "Peer": "chaosp2p.api.blocking_peer",
    "AsyncPeer": "chaosp2p.api.async_peer",
    "open_peer": "chaosp2p.api.async_peer",
    "Collaboration": "chaosp2p.api.blocking_collaboration",
    "AsyncCollaboration": "chaosp2p.training.collaboration",
    "CollaborationConfig": "chaosp2p.training.config",
    "StepStatistics": "chaosp2p.training.collab_core",
    "request_status": "chaosp2p.runtime.node",
    "PeerConnected": "chaosp2p.runtime.node",
    "PeerDisconnected": "chaosp2p.runtime.node",
    "BootstrapFailed": "chaosp2p.runtime.node",
    "SnapshotStore": "chaosp2p.state.snapshot",
    "TransferConfig": "chaosp2p.protocols.transfer.config",
    "TransferProgress": "chaosp2p.protocols.transfer",
    "DHTConfig": "chaosp2p.dht.config",
    "TransportConfig": "chaosp2p.transport.config",
    "Identity": "chaosp2p.wire.identity",
    "PeerID": "chaosp2p.wire.identity",
    "Multiaddr": "chaosp2p.wire.multiaddr",
}

if TYPE_CHECKING:
    from chaosp2p.api.async_peer import AsyncPeer, open_peer
    from chaosp2p.api.blocking_collaboration import Collaboration
    from chaosp2p.api.blocking_peer import Peer
    from chaosp2p.dht.config import DHTConfig
    from chaosp2p.protocols.transfer import TransferProgress
    from chaosp2p.protocols.transfer.config import TransferConfig
    from chaosp2p.runtime.config import PeerConfig
    from chaosp2p.runtime.node import BootstrapFailed, PeerConnected, PeerDisconnected, request_status
    from chaosp2p.state.snapshot import SnapshotStore
    from chaosp2p.training.collab_core import StepStatistics
    from chaosp2p.training.collaboration import AsyncCollaboration
    from chaosp2p.training.config import CollaborationConfig
    from chaosp2p.transport.config import TransportConfig
    from chaosp2p.wire.identity import Identity, PeerID
    from chaosp2p.wire.multiaddr import Multiaddr


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        return _moved.moved_name(__name__, name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AdmissionDenied",
    "AsyncCollaboration",
    "AsyncPeer",
    "BootstrapFailed",
    "ChaosError",
    "ChecksumMismatch",
    "Collaboration",
    "CollaborationConfig",
    "ConfigError",
    "ConnectionClosed",
    "DHTConfig",
    "Identity",
    "LocalProtocolError",
    "Multiaddr",
    "Peer",
    "PeerConfig",
    "PeerConnected",
    "PeerDisconnected",
    "PeerID",
    "PeerIdMismatch",
    "PeerUnreachable",
    "ProtocolError",
    "ProtocolNotSupported",
    "RemoteProtocolError",
    "RequestTimeout",
    "SnapshotStore",
    "StepStatistics",
    "StreamReset",
    "TrainingError",
    "TransferConfig",
    "TransferError",
    "TransferProgress",
    "TransportConfig",
    "__version__",
    "open_peer",
    "request_status",
]
