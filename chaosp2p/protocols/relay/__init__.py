"""The circuit relay, ``/chaos/relay/1``: how two peers without a direct link reach each other
through a third peer connected to both (the pure pieces, no I/O).

:mod:`.messages` is the wire format (HOP, STOP, STATUS, RESERVE, RESERVATION), :mod:`.config` the
limits a relay and a relayed peer apply, :mod:`.circuits` the table of open circuits that enforces
them, :mod:`.reservations` the slots a relay keeps for peers nobody can dial. The driver is
:mod:`chaosp2p.transport.relay`; ``protocols/relay.md`` is the normative description, with test
vectors.
"""

from __future__ import annotations

from chaosp2p.protocols.relay.circuits import Circuit, CircuitStatistics, CircuitTable, Refusal
from chaosp2p.protocols.relay.config import RelayConfig
from chaosp2p.protocols.relay.messages import (
    MAX_REASON_CHARS,
    MAX_RESERVATION_ADDRS,
    PROTOCOL,
    PROTOCOL_ID,
    Hop,
    RelayMessageType,
    Reservation,
    Reserve,
    Status,
    StatusCode,
    Stop,
    codec,
)
from chaosp2p.protocols.relay.reservations import ReservationTable

__all__ = [
    "MAX_REASON_CHARS",
    "MAX_RESERVATION_ADDRS",
    "PROTOCOL",
    "PROTOCOL_ID",
    "Circuit",
    "CircuitStatistics",
    "CircuitTable",
    "Hop",
    "Refusal",
    "RelayConfig",
    "RelayMessageType",
    "Reservation",
    "ReservationTable",
    "Reserve",
    "Status",
    "StatusCode",
    "Stop",
    "codec",
]
