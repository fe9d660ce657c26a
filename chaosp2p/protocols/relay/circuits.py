"""The table of open circuits: admission against the limits, byte accounting, deadlines (pure).

Theory of operation
-------------------
A relay admits a circuit (source, target) when it takes circuits at all, the total is below
``max_circuits`` and neither end is already an end of ``max_circuits_per_peer`` circuits; the
table then holds it until :meth:`CircuitTable.close`. Each circuit has a byte budget
(``max_circuit_bytes``, both directions together) charged by the driver as it copies, and a
deadline (``max_circuit_duration_s`` after it opened, from the time the driver passes in); the
driver closes a circuit whose budget or deadline ran out. A relayed target keeps a table of its
own (the connections it accepted through relays), admitted by the same rule counting only the
source per peer (``count_target=False``: the target is always itself).
No clock is read here: time is an argument.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from chaosp2p.protocols.relay.config import RelayConfig
from chaosp2p.protocols.relay.messages import StatusCode
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a circuit was not admitted."""

    code: StatusCode
    reason: str


@dataclass(slots=True, eq=False)
class Circuit:
    """One admitted circuit."""

    number: int
    source: PeerID
    target: PeerID
    opened_at: float
    deadline: float
    """Time (the caller's clock) at which the circuit must close."""
    bytes_left: int
    """Bytes it may still carry."""


@dataclass(frozen=True, slots=True)
class CircuitStatistics:
    """Counters of a circuit table."""

    open: int
    opened: int
    refused: int
    closed_at_byte_cap: int
    bytes_relayed: int


class CircuitTable:
    """Open circuits and the limits they are admitted under (see the module docstring)."""

    def __init__(self, config: RelayConfig, *, enabled: bool, count_target: bool = True) -> None:
        self.config = config
        self.enabled = enabled
        self._count_target = count_target
        self._open: dict[Circuit, None] = {}
        self._per_peer: dict[PeerID, int] = {}
        self._numbers = itertools.count(1)
        self._opened = 0
        self._refused = 0
        self._capped = 0
        self._bytes = 0

    def admit(self, source: PeerID, target: PeerID, now: float) -> Circuit | Refusal:
        """Admit a circuit from ``source`` to ``target`` at time ``now``, or say why not."""
        refusal = self._check(source, target)
        if refusal is not None:
            self._refused += 1
            return refusal
        config = self.config
        circuit = Circuit(
            number=next(self._numbers),
            source=source,
            target=target,
            opened_at=now,
            deadline=now + config.max_circuit_duration_s,
            bytes_left=config.max_circuit_bytes,
        )
        self._open[circuit] = None
        for peer in self._ends(source, target):
            self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        self._opened += 1
        return circuit

    def _check(self, source: PeerID, target: PeerID) -> Refusal | None:
        config = self.config
        if not self.enabled:
            return Refusal(StatusCode.DISABLED, "this peer takes no circuits")
        if source == target:
            return Refusal(StatusCode.MALFORMED, "a circuit from a peer to itself")
        if len(self._open) >= config.max_circuits:
            return Refusal(StatusCode.RESOURCE_LIMIT, f"{config.max_circuits} circuits open (max_circuits)")
        for peer in self._ends(source, target):
            if self._per_peer.get(peer, 0) >= config.max_circuits_per_peer:
                return Refusal(
                    StatusCode.RESOURCE_LIMIT,
                    f"{peer.short()} is an end of {config.max_circuits_per_peer} circuits (max_circuits_per_peer)",
                )
        return None

    def charge(self, circuit: Circuit, count: int) -> bool:
        """Count ``count`` bytes copied on ``circuit``; False once it exceeded its byte budget."""
        circuit.bytes_left -= count
        self._bytes += count
        if circuit.bytes_left < 0:
            self._capped += 1
            return False
        return True

    def close(self, circuit: Circuit) -> None:
        """Forget ``circuit`` (idempotent)."""
        if circuit not in self._open:
            return
        del self._open[circuit]
        for peer in self._ends(circuit.source, circuit.target):
            left = self._per_peer[peer] - 1
            if left:
                self._per_peer[peer] = left
            else:
                del self._per_peer[peer]

    def _ends(self, source: PeerID, target: PeerID) -> tuple[PeerID, ...]:
        """The peers a circuit counts against in the per-peer limit."""
        return (source, target) if self._count_target else (source,)

    def circuits(self) -> list[Circuit]:
        """The open circuits, oldest first."""
        return list(self._open)

    def statistics(self) -> CircuitStatistics:
        """Counters."""
        return CircuitStatistics(
            open=len(self._open),
            opened=self._opened,
            refused=self._refused,
            closed_at_byte_cap=self._capped,
            bytes_relayed=self._bytes,
        )
