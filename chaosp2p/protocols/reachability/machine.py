"""The requester's side of reachability: when to check, whom to ask, what the answers mean.

Theory of operation
-------------------
The machine is idle until its deadline (``first_probe_delay_s`` after start, then
``probe_interval_s`` after a check that got answers, ``retry_interval_s`` after one that got none or
had nobody to ask). At the deadline the driver passes the peers it could ask (connected directly,
speaking ``/chaos/dialback/1``); :meth:`ReachabilityMachine.handle_timeout` picks up to
``probe_peers`` of them, those asked longest ago first, and the machine is *checking* until every one
of them is :meth:`~ReachabilityMachine.record`-ed (an answer, or ``None`` for no answer).

Only two answers count: ``OK`` (the server reached us at the address it names) and ``DIAL_FAILED``
(it tried every eligible address and could not). Refusals (rate, busy, bad request, disabled) and
errors say nothing about us. The newest counting answer of each server is kept (one server counts
once, however often it answers), and the classification is derived from them:

* **public** -- at least ``need`` servers reached us;
* **private** -- at least ``need`` servers could not, and none could;
* **unknown** -- otherwise (no answers yet, or too few to decide),

where ``need`` is ``min_confirmations``, lowered to the number of peers the last check could ask
when fewer were there (a peer behind a NAT may know only its bootstrap peer). The machine reads
no clock: times are passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from chaosp2p.errors import LocalProtocolError
from chaosp2p.protocols.reachability.config import ReachabilityConfig
from chaosp2p.protocols.reachability.messages import DialBackCode, DialResponse
from chaosp2p.wire.identity import PeerID


class Reachability(enum.Enum):
    """What this peer concluded about inbound connections to it."""

    UNKNOWN = "unknown"
    PUBLIC = "public"
    PRIVATE = "private"


class CheckState(enum.Enum):
    """Whether a check is under way."""

    IDLE = "idle"
    CHECKING = "checking"


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One server's newest counting answer."""

    server: PeerID
    reached: bool
    addr: str
    at: float


class ReachabilityMachine:
    """Schedules checks and classifies this peer from the servers' answers (see the module docstring)."""

    def __init__(self, config: ReachabilityConfig, *, now: float) -> None:
        self.config = config
        self.state = CheckState.IDLE
        self._deadline: float | None = now + config.first_probe_delay_s if config.probe else None
        self._asked: dict[PeerID, float] = {}
        self._waiting: set[PeerID] = set()
        self._counted_this_check = False
        self._answers: dict[PeerID, Answer] = {}
        self._askable = 0
        self.checks = 0
        """Checks started."""
        self.last_check_at: float | None = None

    def next_deadline(self) -> float | None:
        """When the next check is due (None: checking now, or background checks are off)."""
        return self._deadline if self.state is CheckState.IDLE else None

    def handle_timeout(self, now: float, candidates: Sequence[PeerID]) -> list[PeerID]:
        """Start the due check: the servers to ask now (empty: nobody to ask, retried later)."""
        if self._deadline is None or now < self._deadline or self.state is CheckState.CHECKING:
            return []
        return self.start_check(now, candidates)

    def start_check(self, now: float, candidates: Sequence[PeerID]) -> list[PeerID]:
        """Start a check now (also on demand): the servers to ask, each to be :meth:`record`-ed."""
        if self.state is CheckState.CHECKING:
            raise LocalProtocolError("a reachability check is already under way")
        unique = list(dict.fromkeys(candidates))
        # Those asked longest ago (or never) first; ties by PeerID so the choice is reproducible.
        unique.sort(key=lambda p: (self._asked.get(p, float("-inf")), p.raw))
        chosen = unique[: self.config.probe_peers]
        self._askable = len(unique)
        self.last_check_at = now
        if not chosen:
            self._deadline = now + self.config.retry_interval_s
            return []
        self.checks += 1
        self.state = CheckState.CHECKING
        self._waiting = set(chosen)
        self._counted_this_check = False
        for peer in chosen:
            self._asked[peer] = now
        return chosen

    def record(self, server: PeerID, response: DialResponse | None, now: float) -> None:
        """``server``'s answer to this check (``None``: no answer or an error)."""
        if server not in self._waiting:
            raise LocalProtocolError(f"no reachability request to {server.short()} is under way")
        self._waiting.discard(server)
        if response is not None and response.code in (DialBackCode.OK, DialBackCode.DIAL_FAILED):
            reached = response.code == DialBackCode.OK
            self._answers[server] = Answer(server=server, reached=reached, addr=response.addr, at=now)
            self._counted_this_check = True
        if not self._waiting:
            self.state = CheckState.IDLE
            interval = self.config.probe_interval_s if self._counted_this_check else self.config.retry_interval_s
            self._deadline = now + interval if self.config.probe else None

    def forget(self, server: PeerID) -> None:
        """Drop ``server``'s answer (it left the swarm: its view of us is stale)."""
        self._answers.pop(server, None)
        self._asked.pop(server, None)

    @property
    def needed(self) -> int:
        """Agreeing answers needed to decide."""
        return max(1, min(self.config.min_confirmations, self._askable))

    @property
    def reachability(self) -> Reachability:
        """The classification from the answers kept."""
        reached = sum(1 for a in self._answers.values() if a.reached)
        failed = len(self._answers) - reached
        if reached >= self.needed:
            return Reachability.PUBLIC
        if failed >= self.needed and reached == 0:
            return Reachability.PRIVATE
        return Reachability.UNKNOWN

    def confirmed_addrs(self) -> list[str]:
        """Addresses servers reached this peer at, newest answer first, deduplicated."""
        ordered = sorted((a for a in self._answers.values() if a.reached), key=lambda a: -a.at)
        return list(dict.fromkeys(a.addr for a in ordered if a.addr))

    def working_addrs(self) -> list[str]:
        """Addresses that at least ``min_confirmations`` distinct servers reached this peer at: the
        ones worth announcing. One server's word is not enough, since a server chooses the IP it
        says it saw us at, and an address we announced would make others dial whoever holds it."""
        servers: dict[str, int] = {}
        for a in sorted(self._answers.values(), key=lambda a: -a.at):
            if a.reached and a.addr:
                servers[a.addr] = servers.get(a.addr, 0) + 1
        return [addr for addr, count in servers.items() if count >= self.config.min_confirmations]

    def answers(self) -> list[Answer]:
        """The newest counting answer of each server."""
        return list(self._answers.values())
