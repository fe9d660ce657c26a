"""Reachability by dial-back, ``/chaos/dialback/1``: does anyone reach this peer? (the pure pieces).

:mod:`.messages` is the wire format, :mod:`.config` the limits and timing, :mod:`.gate` the
server's admission (rate per requester, dials at once, only the requester's own observed IP),
:mod:`.machine` the requester's schedule and classification (public, private, unknown). The driver
is :mod:`chaosp2p.transport.reachability`; ``protocols/reachability.md`` is the normative
description, with test vectors.
"""

from __future__ import annotations

from chaosp2p.protocols.reachability.config import ReachabilityConfig
from chaosp2p.protocols.reachability.gate import DialBackGate, GateStatistics, eligible_addrs
from chaosp2p.protocols.reachability.machine import Answer, CheckState, Reachability, ReachabilityMachine
from chaosp2p.protocols.reachability.messages import (
    MAX_REQUEST_ADDRS,
    PROTOCOL,
    PROTOCOL_ID,
    DialBackCode,
    DialBackMessageType,
    DialRequest,
    DialResponse,
    answer,
    codec,
)

__all__ = [
    "MAX_REQUEST_ADDRS",
    "PROTOCOL",
    "PROTOCOL_ID",
    "Answer",
    "CheckState",
    "DialBackCode",
    "DialBackGate",
    "DialBackMessageType",
    "DialRequest",
    "DialResponse",
    "GateStatistics",
    "Reachability",
    "ReachabilityConfig",
    "ReachabilityMachine",
    "answer",
    "codec",
    "eligible_addrs",
]
