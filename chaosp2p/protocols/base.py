"""The shape every message-oriented protocol machine shares.

A machine is sans-I/O (see h11): the runtime, or the simulator, hands it decoded messages with the
sender and the current time, and calls ``handle_timeout(now)`` once ``now >= next_deadline()``. The
machine never sends anything itself: it queues :class:`Outgoing` instructions and typed events, and
the driver takes them with ``take_outgoing()`` / ``take_events()``. Because of that the same machine
runs unchanged over real TCP connections and over :mod:`chaosp2p.sim`'s in-memory network.

Messages between machines are datagrams: each is delivered whole or not at all, possibly late, out
of order or lost. Request/response pairs carry a request id chosen by the requester.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


@dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    """An instruction from a machine: send ``message`` to ``to`` on ``protocol``."""

    to: PeerID
    protocol: str
    message: Message


class MessageMachine(Protocol):
    """The interface :mod:`chaosp2p.sim` and the runtime drivers use to run a protocol machine."""

    protocols: Sequence[str]
    """Protocol names (``"dht"``, ``"membership"``, …) whose messages this machine receives."""

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """Handle one message from ``sender``."""
        ...

    def handle_timeout(self, now: float) -> None:
        """Run whatever timers are due at ``now``."""
        ...

    def next_deadline(self) -> float | None:
        """The earliest time ``handle_timeout`` has work to do, or ``None``."""
        ...

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the queued outgoing messages."""
        ...

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """The driver could not deliver to ``peer`` (no connection, dial failed, connection lost)."""
        ...
