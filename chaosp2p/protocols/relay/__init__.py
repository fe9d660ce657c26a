"""The circuit relay, ``/chaos/relay/1``: how two peers without a direct link reach each other
through a third peer connected to both (the pure pieces, no I/O).

:mod:`.messages` is the wire format (HOP, STOP, STATUS), :mod:`.config` the limits a relay and a
relayed peer apply, :mod:`.circuits` the table of open circuits that enforces them. The driver is
:mod:`chaosp2p.transport.relay`; ``protocols/relay.md`` is the normative description, with test
vectors.
"""

from __future__ import annotations

from chaosp2p.protocols.relay.circuits import Circuit, CircuitStatistics, CircuitTable, Refusal
from chaosp2p.protocols.relay.config import RelayConfig
from chaosp2p.protocols.relay.messages import (
    MAX_REASON_CHARS,
    PROTOCOL,
    PROTOCOL_ID,
    Hop,
    RelayMessageType,
    Status,
    StatusCode,
    Stop,
    codec,
)

__all__ = [
    "MAX_REASON_CHARS",
    "PROTOCOL",
    "PROTOCOL_ID",
    "Circuit",
    "CircuitStatistics",
    "CircuitTable",
    "Hop",
    "Refusal",
    "RelayConfig",
    "RelayMessageType",
    "Status",
    "StatusCode",
    "Stop",
    "codec",
]
