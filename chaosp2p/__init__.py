"""chaosp2p: peer-to-peer networking for decentralized, elastic deep-learning training.

The public API is importable from here (``chaosp2p.open_peer``, ``chaosp2p.PeerConfig``, the error
tree, ...). Heavier names are loaded on first use, so ``import chaosp2p.wire`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

__version__ = "0.1.0"

# name -> module that defines it; resolved lazily by __getattr__ below.
_LAZY = {
    "PeerConfig": "chaosp2p.runtime.config",
    "Peer": "chaosp2p.runtime.peer",
    "open_peer": "chaosp2p.runtime.peer",
    "request_status": "chaosp2p.runtime.peer",
    "PeerConnected": "chaosp2p.runtime.peer",
    "PeerDisconnected": "chaosp2p.runtime.peer",
    "BootstrapFailed": "chaosp2p.runtime.peer",
    "TransportConfig": "chaosp2p.transport.config",
    "Identity": "chaosp2p.wire.identity",
    "PeerID": "chaosp2p.wire.identity",
    "Multiaddr": "chaosp2p.wire.multiaddr",
}

if TYPE_CHECKING:
    from chaosp2p.runtime.config import PeerConfig
    from chaosp2p.runtime.peer import BootstrapFailed, Peer, PeerConnected, PeerDisconnected, open_peer, request_status
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
    "BootstrapFailed",
    "ChaosError",
    "ChecksumMismatch",
    "ConfigError",
    "ConnectionClosed",
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
    "StreamReset",
    "TransferError",
    "TransportConfig",
    "__version__",
    "open_peer",
    "request_status",
]
