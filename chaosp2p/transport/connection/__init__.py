"""A secure, multiplexed connection to one authenticated peer.

:class:`Connection` is assembled in :mod:`.lifecycle` (start there for the theory of operation)
from role modules on :mod:`.core`: :mod:`.writer` (records out), :mod:`.flow` (stream data and
windows), :mod:`.handlers` (inbound streams), :mod:`.keepalive` (liveness and RTT), :mod:`.reader`
(records in) and :mod:`.rpc` (request/response).
"""

from __future__ import annotations

from chaosp2p.protocols.channel.record_layer import GoAwayCode
from chaosp2p.transport.connection.core import UNASSIGNED_STREAM_ID, ConnectionStatistics
from chaosp2p.transport.connection.lifecycle import Connection, MessageHandler
from chaosp2p.transport.connection.rpc import ReplyStatus

__all__ = [
    "UNASSIGNED_STREAM_ID",
    "Connection",
    "ConnectionStatistics",
    "GoAwayCode",
    "MessageHandler",
    "ReplyStatus",
]
