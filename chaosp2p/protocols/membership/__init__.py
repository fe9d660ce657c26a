"""SWIM membership, overlay-link heartbeats and the cluster monitor (sans-I/O).

See ``protocols/membership.md`` for the wire spec and :mod:`.machine` for the theory of operation
(the machine is a core plus role modules, listed there). The simulator of many machines on one
in-memory network is :mod:`chaosp2p.sim.membership`.
"""

from __future__ import annotations

from chaosp2p.protocols.membership.config import MembershipConfig
from chaosp2p.protocols.membership.events import (
    BandwidthProbe,
    LinkDirection,
    LinkDown,
    LinkUp,
    LinkView,
    Member,
    MembershipEvent,
    MembershipStatistics,
    MemberState,
    PeerAlive,
    PeerFailed,
    PeerJoined,
    PeerLeft,
    PeerSuspected,
    Topology,
)
from chaosp2p.protocols.membership.machine import MembershipMachine
from chaosp2p.protocols.membership.messages import (
    PROTOCOL,
    MembershipMessageType,
    Resources,
    UpdateKind,
    codec,
)

__all__ = [
    "PROTOCOL",
    "BandwidthProbe",
    "LinkDirection",
    "LinkDown",
    "LinkUp",
    "LinkView",
    "Member",
    "MemberState",
    "MembershipConfig",
    "MembershipEvent",
    "MembershipMachine",
    "MembershipMessageType",
    "MembershipStatistics",
    "PeerAlive",
    "PeerFailed",
    "PeerJoined",
    "PeerLeft",
    "PeerSuspected",
    "Resources",
    "Topology",
    "UpdateKind",
    "codec",
]
