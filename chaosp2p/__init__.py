"""chaosp2p: peer-to-peer networking for decentralized, elastic deep-learning training.

The public API is importable from here (``chaosp2p.open_peer``, ``chaosp2p.PeerConfig``, the error
tree, ...). Heavier names are loaded on first use, so ``import chaosp2p.wire`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    TransferError,
)

# name -> module that defines it; resolved lazily by __getattr__ below.
_LAZY = {
    "PeerConfig": "chaosp2p.runtime.config",
    "Peer": "chaosp2p.sync",
    "AsyncPeer": "chaosp2p.api",
    "open_peer": "chaosp2p.api",
    "Node": "chaosp2p.runtime.node",
    "open_node": "chaosp2p.runtime.node",
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
    from chaosp2p.api import AsyncPeer, open_peer
    from chaosp2p.dht.config import DHTConfig
    from chaosp2p.protocols.transfer import TransferProgress
    from chaosp2p.protocols.transfer.config import TransferConfig
    from chaosp2p.runtime.config import PeerConfig
    from chaosp2p.runtime.node import BootstrapFailed, Node, PeerConnected, PeerDisconnected, open_node, request_status
    from chaosp2p.state.snapshot import SnapshotStore
    from chaosp2p.sync import Peer
    from chaosp2p.transport.config import TransportConfig
    from chaosp2p.wire.identity import Identity, PeerID
    from chaosp2p.wire.multiaddr import Multiaddr


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'chaosp2p' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AdmissionDenied",
    "AsyncPeer",
    "BootstrapFailed",
    "ChaosError",
    "ChecksumMismatch",
    "ConfigError",
    "ConnectionClosed",
    "DHTConfig",
    "Identity",
    "LocalProtocolError",
    "Multiaddr",
    "Node",
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
    "StreamReset",
    "TransferConfig",
    "TransferError",
    "TransferProgress",
    "TransportConfig",
    "__version__",
    "open_node",
    "open_peer",
    "request_status",
]
