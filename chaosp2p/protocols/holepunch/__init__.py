"""Hole punching, ``/chaos/holepunch/1``: from a relayed connection to a direct one (the pure pieces).

:mod:`.messages` is the wire format (CONNECT, SYNC, RESULT), :mod:`.config` the limits and timing,
:mod:`.machine` the coordination of one punch and the choice of handshake roles. The driver is
:mod:`chaosp2p.transport.holepunch` (``await punch(host, peer)``); ``protocols/holepunch.md`` is the
normative description, with test vectors.
"""

from __future__ import annotations

from chaosp2p.protocols.holepunch.config import HolePunchConfig
from chaosp2p.protocols.holepunch.machine import TRANSITIONS, PunchEvent, PunchMachine, PunchState, Role, decide
from chaosp2p.protocols.holepunch.messages import (
    MAX_PUNCH_ADDRS,
    PROTOCOL,
    PROTOCOL_ID,
    Connect,
    Outcome,
    PunchMessageType,
    Refusal,
    Result,
    Sync,
    codec,
    refusal,
)

__all__ = [
    "MAX_PUNCH_ADDRS",
    "PROTOCOL",
    "PROTOCOL_ID",
    "TRANSITIONS",
    "Connect",
    "HolePunchConfig",
    "Outcome",
    "PunchEvent",
    "PunchMachine",
    "PunchMessageType",
    "PunchState",
    "Refusal",
    "Result",
    "Role",
    "Sync",
    "codec",
    "decide",
    "refusal",
]
