"""Negotiation: members of a training run agree on joins, leaves, failures, link changes and
throughput, and on the training step from which each change applies (sans-I/O).

See ``protocols/negotiation.md`` for the wire spec and :mod:`.machine` for the theory of operation.
"""

from __future__ import annotations

from chaosp2p.protocols.negotiation.config import NegotiationConfig
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.events import (
    Admitted,
    ConfigurationCommitted,
    GateRaised,
    GateReleased,
    JoinRefused,
    NegotiationEvent,
    NegotiationStatistics,
    OperationCommitted,
    OperationRejected,
    PendingOperation,
    RemovedFromRun,
    ResyncNeeded,
    RunInfo,
    RunStatus,
)
from chaosp2p.protocols.negotiation.machine import NegotiationMachine
from chaosp2p.protocols.negotiation.messages import NegotiationMessageType, codec
from chaosp2p.protocols.negotiation.operations import PROTOCOL, Operation, OpKind
from chaosp2p.protocols.negotiation.run_configuration import (
    Configuration,
    LinkEntry,
    MemberEntry,
    RunParams,
    batch_shares,
    compute_shares,
    quorum,
    ring_order,
)
from chaosp2p.protocols.negotiation.transitions import ProposerPhase, RunState

__all__ = [
    "PROTOCOL",
    "Admitted",
    "Configuration",
    "ConfigurationCommitted",
    "GateRaised",
    "GateReleased",
    "JoinRefused",
    "LinkEntry",
    "MemberEntry",
    "NegotiationConfig",
    "NegotiationEvent",
    "NegotiationMachine",
    "NegotiationMessageType",
    "NegotiationStatistics",
    "OpKind",
    "Operation",
    "OperationCommitted",
    "OperationRejected",
    "PendingOperation",
    "ProposerPhase",
    "RemovedFromRun",
    "ResyncNeeded",
    "RunInfo",
    "RunParams",
    "RunState",
    "RunStatus",
    "batch_shares",
    "codec",
    "compute_shares",
    "next_configuration",
    "quorum",
    "ring_order",
]
