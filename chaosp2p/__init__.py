"""chaosp2p: peer-to-peer networking for decentralized, elastic deep-learning training."""

from chaosp2p.errors import (
    AdmissionDenied,
    ChaosError,
    ChecksumMismatch,
    ConfigError,
    PeerUnreachable,
    ProtocolError,
    TransferError,
)

__version__ = "0.1.0"

__all__ = [
    "AdmissionDenied",
    "ChaosError",
    "ChecksumMismatch",
    "ConfigError",
    "PeerUnreachable",
    "ProtocolError",
    "TransferError",
    "__version__",
]
