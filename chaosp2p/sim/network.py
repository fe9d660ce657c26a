"""A deterministic discrete-event network for sans-I/O protocol machines.

Theory of operation: the simulator owns a virtual clock and one priority queue of events --
message deliveries and machine timers -- ordered by (time, sequence number). Popping an event sets
the clock, hands the message (or the timeout) to the machine, then collects the machine's queued
outgoing messages and schedules their delivery after the link's latency, unless the link drops them.
Nothing here is threaded or async, and all randomness comes from one seeded ``random.Random``, so a
run is a pure function of its seed: a failing simulation replays exactly.

Faults a test can inject, mirroring what the real runtime sees:

* ``crash(peer)``   -- like ``kill -9``: the peer vanishes; senders learn ``peer_unreachable`` after
  one link latency (the real kernel answers a dead port with RST).
* ``stall(peer)``   -- like SIGSTOP: the peer neither runs timers nor reads; messages to it queue and
  are delivered when ``resume(peer)`` is called, just as TCP buffers them.
* ``partition([...])`` / ``heal()`` -- messages across groups are silently lost.
* per-link latency, jitter and loss via :class:`LinkProfile` (set per pair, or computed by a
  ``link_fn(a, b)`` for large swarms with a latency model).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaosp2p.clock import VirtualClock
from chaosp2p.protocols.base import MessageMachine
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    """Delay and loss of a directed link (defaults apply to every link not set explicitly)."""

    latency_s: float = 0.0005
    jitter_s: float = 0.0
    loss: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """A record of one delivered message (kept only when ``record=True``)."""

    at: float
    sender: PeerID
    receiver: PeerID
    protocol: str
    message: Message


@dataclass(slots=True)
class _Node:
    machine: MessageMachine
    stalled: bool = False
    backlog: list[tuple[PeerID, str, Message]] = field(default_factory=list)
    scheduled_deadline: float | None = None


@dataclass(slots=True)
class SimStatistics:
    """Counters of what crossed the simulated network."""

    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    bytes_sent: int = 0
    bytes_by_sender: dict[PeerID, int] = field(default_factory=dict)


class SimNetwork:
    """An in-memory network of protocol machines driven by a virtual clock."""

    def __init__(
        self,
        *,
        seed: int = 0,
        default_link: LinkProfile | None = None,
        codecs: Mapping[str, MessageCodec] | None = None,
        record: bool = False,
        start_time: float = 0.0,
        link_fn: Callable[[PeerID, PeerID], LinkProfile] | None = None,
    ) -> None:
        self.clock = VirtualClock(start_time)
        self.random = random.Random(seed)
        self.default_link = default_link or LinkProfile()
        self.stats = SimStatistics()
        self.deliveries: list[Delivery] = []
        self.events: list[tuple[float, PeerID, Any]] = []
        self._codecs = dict(codecs or {})
        self._record = record
        self._nodes: dict[PeerID, _Node] = {}
        self._links: dict[tuple[PeerID, PeerID], LinkProfile] = {}
        self._link_fn = link_fn
        self._groups: dict[PeerID, int] | None = None
        self._queue: list[tuple[float, int, str, Any]] = []
        self._sequence = 0

    # ----------------------------------------------------------------- membership of the network
    @property
    def now(self) -> float:
        """The current virtual time."""
        return self.clock.now()

    def add(self, peer: PeerID, machine: MessageMachine) -> None:
        """Attach a machine; it starts receiving messages and timers at once."""
        if peer in self._nodes:
            raise ValueError(f"{peer} is already on the network")
        self._nodes[peer] = _Node(machine)
        self._after_call(peer)

    def machine(self, peer: PeerID) -> MessageMachine:
        """The machine attached as ``peer``."""
        return self._nodes[peer].machine

    def peers(self) -> list[PeerID]:
        """Peers currently attached (crashed ones are gone)."""
        return list(self._nodes)

    def crash(self, peer: PeerID) -> None:
        """Remove ``peer`` abruptly, as ``kill -9`` would."""
        self._nodes.pop(peer, None)

    def stall(self, peer: PeerID) -> None:
        """Freeze ``peer`` (SIGSTOP): no timers run and incoming messages queue up."""
        self._nodes[peer].stalled = True

    def resume(self, peer: PeerID) -> None:
        """Unfreeze ``peer`` (SIGCONT): it processes its backlog now, then its overdue timers."""
        node = self._nodes[peer]
        node.stalled = False
        backlog, node.backlog = node.backlog, []
        for sender, protocol, message in backlog:
            node.machine.receive(self.now, sender, protocol, message)
        self._after_call(peer)

    def set_link(self, a: PeerID, b: PeerID, profile: LinkProfile, *, both_ways: bool = True) -> None:
        """Give the link a→b (and b→a) its own latency and loss."""
        self._links[(a, b)] = profile
        if both_ways:
            self._links[(b, a)] = profile

    def partition(self, groups: Iterable[Iterable[PeerID]]) -> None:
        """Drop every message between peers of different groups (peers in no group are isolated)."""
        self._groups = {peer: index for index, group in enumerate(groups) for peer in group}

    def heal(self) -> None:
        """End any partition."""
        self._groups = None

    # ----------------------------------------------------------------- running
    def run_until(self, when: float) -> None:
        """Process every event due up to virtual time ``when``, then set the clock to ``when``."""
        while self._queue and self._queue[0][0] <= when:
            at, _, kind, payload = heapq.heappop(self._queue)
            self.clock.set(max(at, self.now))
            if kind == "deliver":
                self._deliver(*payload)
            elif kind == "timer":
                self._fire_timer(payload)
            elif kind == "unreachable":
                self._notify_unreachable(*payload)
        self.clock.set(max(when, self.now))

    def run_for(self, seconds: float) -> None:
        """Advance virtual time by ``seconds``, processing everything due."""
        self.run_until(self.now + seconds)

    def run_until_true(self, condition: Callable[[], bool], *, timeout_s: float, step_s: float = 0.01) -> bool:
        """Run until ``condition()`` holds (checked every ``step_s``) or ``timeout_s`` passes."""
        deadline = self.now + timeout_s
        while not condition():
            if self.now >= deadline:
                return False
            self.run_until(min(deadline, self.now + step_s))
        return True

    def call(self, peer: PeerID, action: Callable[[MessageMachine, float], Any]) -> Any:
        """Run ``action(machine, now)`` on ``peer``'s machine as a driver would, then carry out its output.

        This is how a test or harness starts operations (``start_get``, ``add_contact``, ...)
        between deliveries.
        """
        node = self._nodes[peer]
        result = action(node.machine, self.now)
        self._after_call(peer)
        return result

    def poke(self, peer: PeerID) -> None:
        """Collect output and re-arm timers after code outside the simulator touched ``peer``'s machine."""
        self._after_call(peer)

    def inject(self, sender: PeerID, receiver: PeerID, protocol: str, message: Message) -> None:
        """Deliver ``message`` as if ``sender`` had sent it (for hostile-input tests)."""
        self._schedule_delivery(sender, receiver, protocol, message)

    # ----------------------------------------------------------------- internals
    def _push(self, at: float, kind: str, payload: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._queue, (at, self._sequence, kind, payload))

    def _link(self, a: PeerID, b: PeerID) -> LinkProfile:
        link = self._links.get((a, b))
        if link is not None:
            return link
        return self.default_link if self._link_fn is None else self._link_fn(a, b)

    def _schedule_delivery(self, sender: PeerID, receiver: PeerID, protocol: str, message: Message) -> None:
        self.stats.sent += 1
        if self._codecs:
            codec = self._codecs.get(protocol)
            if codec is not None:
                size = len(codec.encode(message))
                self.stats.bytes_sent += size
                self.stats.bytes_by_sender[sender] = self.stats.bytes_by_sender.get(sender, 0) + size
        link = self._link(sender, receiver)
        if self._groups is not None and self._groups.get(sender, -1) != self._groups.get(receiver, -2):
            self.stats.dropped += 1
            return
        if link.loss and self.random.random() < link.loss:
            self.stats.dropped += 1
            return
        delay = link.latency_s + (self.random.uniform(0, link.jitter_s) if link.jitter_s else 0.0)
        self._push(self.now + delay, "deliver", (sender, receiver, protocol, message))

    def _deliver(self, sender: PeerID, receiver: PeerID, protocol: str, message: Message) -> None:
        node = self._nodes.get(receiver)
        if node is None:
            self.stats.dropped += 1
            if sender in self._nodes:
                self._push(self.now + self._link(receiver, sender).latency_s, "unreachable", (sender, receiver))
            return
        if node.stalled:
            node.backlog.append((sender, protocol, message))
            return
        self.stats.delivered += 1
        if self._record:
            self.deliveries.append(
                Delivery(at=self.now, sender=sender, receiver=receiver, protocol=protocol, message=message)
            )
        node.machine.receive(self.now, sender, protocol, message)
        self._after_call(receiver)

    def _notify_unreachable(self, peer: PeerID, unreachable: PeerID) -> None:
        node = self._nodes.get(peer)
        if node is None or node.stalled:
            return
        node.machine.peer_unreachable(self.now, unreachable)
        self._after_call(peer)

    def _fire_timer(self, peer: PeerID) -> None:
        node = self._nodes.get(peer)
        if node is None:
            return
        if node.scheduled_deadline is not None and self.now < node.scheduled_deadline:
            # A stale event: the machine was re-armed earlier since. Re-arming here again would
            # keep every stale event alive (one more per early re-arm, for ever): ignore it.
            return
        node.scheduled_deadline = None
        if node.stalled:
            return
        deadline = node.machine.next_deadline()
        if deadline is not None and deadline <= self.now:
            node.machine.handle_timeout(self.now)
        self._after_call(peer)

    def _after_call(self, peer: PeerID) -> None:
        node = self._nodes.get(peer)
        if node is None:
            return
        for out in node.machine.take_outgoing():
            self._schedule_delivery(peer, out.to, out.protocol, out.message)
        take_events = getattr(node.machine, "take_events", None)
        if take_events is not None:
            for event in take_events():
                self.events.append((self.now, peer, event))
        deadline = node.machine.next_deadline()
        if deadline is None:
            return
        deadline = max(deadline, self.now)
        if node.scheduled_deadline is None or deadline < node.scheduled_deadline:
            node.scheduled_deadline = deadline
            self._push(deadline, "timer", peer)
