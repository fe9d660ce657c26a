"""A fake peer for unit tests of the collaboration: a ``TrainingPort`` and an averager, no sockets.

:class:`FakePort` serves :class:`chaosp2p.training.port.TrainingPort` from plain data: its gates
(:class:`FakeGates`) hold configurations a test builds with the negotiation helpers and installs,
gates or removes by hand; its clock is a :class:`~tests.unit.stepped_clock.SteppedClock` (virtual
time the test advances; a task that sleeps on it wakes only then); its streams are
scripted (:class:`FakeStream`: what a remote peer answers, in order). :class:`FakeAverager` stands
in for :class:`chaosp2p.training.averager.Averager`: every ``all_reduce`` is recorded, and the next
entry of its script decides the round (edit the buffer, raise ``RoundAborted``...).

Every fake records the calls made on it, so tests assert what the collaboration did, not only what
it returned.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import numpy as np

from chaosp2p.errors import LocalProtocolError, PeerUnreachable, RunRemoved
from chaosp2p.protocols.averaging.messages import RoundTag
from chaosp2p.protocols.negotiation import Configuration, NegotiationConfig, RunInfo, RunParams
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry, genesis_configuration, make_configuration
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.training.averager import RoundStats
from chaosp2p.training.collaboration import AsyncCollaboration
from chaosp2p.training.config import CollaborationConfig
from chaosp2p.training.service import TrainingService
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr
from tests.unit.stepped_clock import SteppedClock

RUN = "fake-run"
HOLD = object()
"""A stream reply that never comes: the remote peer keeps the stream open and silent."""
WAIT_BOUND_S = 5.0
"""Longest a task waits in ``FakeGates.wait_changed`` before the test fails (no test hangs)."""


def identities(count: int, base: int = 0) -> list[Identity]:
    """``count`` deterministic identities, sorted by PeerID (the order configurations keep)."""
    found = [Identity.from_seed(bytes([base + i + 1]) * 32) for i in range(count)]
    return sorted(found, key=lambda identity: identity.peer_id.raw)


def configuration(
    peers: Sequence[PeerID],
    *,
    run: str = RUN,
    epoch: int = 0,
    activation_step: int = 0,
    global_batch: int = 12,
    mode: str = "sync",
    local_steps: int = 1,
    throughputs: Sequence[float] | None = None,
    since_steps: Sequence[int] | None = None,
    links: Sequence[LinkEntry] = (),
    seed: int = 7,
) -> Configuration:
    """A configuration of ``peers`` (sorted here), as negotiation would agree it."""
    order = sorted(range(len(peers)), key=lambda i: peers[i].raw)
    return make_configuration(
        run=run,
        epoch=epoch,
        activation_step=activation_step,
        peers=[peers[i] for i in order],
        incarnations=[1] * len(peers),
        throughputs=[1.0] * len(peers) if throughputs is None else [throughputs[i] for i in order],
        links=links,
        params=RunParams(global_batch=global_batch, mode=mode, local_steps=local_steps),
        seed=seed,
        since_steps=None if since_steps is None else [since_steps[i] for i in order],
    )


# ---------------------------------------------------------------------------------- gates
class FakeGates:
    """:class:`~chaosp2p.training.port.RunGates` over configurations the test installs.

    ``governing(run, step)`` is the newest installed configuration activated at or before
    ``step``, or None while the run is gated at ``step`` (:meth:`gate`).
    """

    def __init__(self, local: PeerID) -> None:
        self.local = local
        self.config = NegotiationConfig()
        self.configurations: dict[str, list[Configuration]] = {}
        self.gated_from: dict[str, int] = {}
        self.removed: dict[str, tuple[str, int]] = {}
        self.resync: dict[str, int] = {}
        self.created: list[tuple[str, RunParams]] = []
        self.reported: list[tuple[str, int]] = []
        """("entered" | "completed", step) in call order."""
        self.throughputs: list[tuple[str, float]] = []
        self.evictions: list[tuple[str, PeerID]] = []
        self.stalls: list[tuple[str, PeerID]] = []
        self.link_failures: list[tuple[str, PeerID]] = []
        self.announced: list[str] = []
        self.leave_accepted = True
        """What ``announce_leave`` answers (False: this peer is no member anyway)."""
        self.leave_takes_effect_at: int | None = None
        """If set, ``announce_leave`` removes this peer from that step on (a committed LEAVE)."""
        self.forgotten_removals: list[str] = []
        self.run_infos: dict[PeerID, RunInfo | BaseException] = {}
        self.queried: list[tuple[PeerID, float]] = []
        self.joins: list[dict[str, Any]] = []
        self.admission: Configuration | None = None
        self._changed: anyio.Event | None = None
        self._waiter: anyio.Event | None = None

    # ------------------------------------------------------------------ test side
    def install(self, config: Configuration) -> Configuration:
        """The run agreed on ``config`` (wakes whoever waits for a change)."""
        self.configurations.setdefault(config.run, []).append(config)
        self.changed()
        return config

    def gate(self, run: str, from_step: int) -> None:
        """A pending change gates ``from_step`` and later steps."""
        self.gated_from[run] = from_step
        self.changed()

    def ungate(self, run: str) -> None:
        """The pending change is decided."""
        self.gated_from.pop(run, None)
        self.changed()

    def remove(self, run: str, reason: str, from_step: int) -> None:
        """This peer no longer takes part in ``run`` from ``from_step`` on."""
        self.removed[run] = (reason, from_step)
        self.changed()

    def changed(self) -> None:
        """Wake ``wait_changed``."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def someone_waits(self) -> None:
        """Return once a task is blocked in ``wait_changed``."""
        if self._waiter is None:
            self._waiter = anyio.Event()
        await self._waiter.wait()

    # ------------------------------------------------------------------ RunGates
    def create_run(self, run: str, params: RunParams) -> Configuration:
        """Found ``run``: the genesis configuration, this peer alone."""
        params.validate()
        self.created.append((run, params))
        return self.install(genesis_configuration(run, self.local, incarnation=0, throughput=1.0, params=params))

    def configuration(self, run: str) -> Configuration | None:
        """The newest installed configuration."""
        found = self.configurations.get(run)
        return found[-1] if found else None

    def governing(self, run: str, step: int) -> Configuration | None:
        """The newest configuration activated at or before ``step``; None while gated."""
        gate = self.gated_from.get(run)
        if gate is not None and step >= gate:
            return None
        candidates = [c for c in self.configurations.get(run, ()) if c.activation_step <= step]
        return max(candidates, key=lambda c: c.epoch) if candidates else None

    async def configuration_for_step(self, run: str, step: int) -> Configuration:
        """As the runtime's negotiation service: wait while gated, raise once removed."""
        while True:
            removed = self.removed.get(run)
            if removed is not None and step >= removed[1]:
                raise RunRemoved(f"removed from run {run!r} from step {removed[1]}: {removed[0]}")
            found = self.governing(run, step)
            if found is not None:
                return found
            await self.wait_changed()

    def report_step(self, run: str, *, entered: int | None = None, completed: int | None = None) -> None:
        """Recorded in ``reported``."""
        if entered is not None:
            self.reported.append(("entered", entered))
        if completed is not None:
            self.reported.append(("completed", completed))

    def set_throughput(self, run: str, samples_per_s: float) -> None:
        """Recorded in ``throughputs``."""
        self.throughputs.append((run, samples_per_s))

    def evict(self, run: str, peer: PeerID) -> bool:
        """Recorded in ``evictions``."""
        self.evictions.append((run, peer))
        return True

    def stall(self, run: str, peer: PeerID) -> bool:
        """Recorded in ``stalls``."""
        self.stalls.append((run, peer))

    def link_failed(self, run: str, peer: PeerID) -> bool:
        """Recorded in ``link_failures``."""
        self.link_failures.append((run, peer))
        return True

    def announce_leave(self, run: str) -> bool:
        """Recorded; removes this peer at ``leave_takes_effect_at`` if set."""
        self.announced.append(run)
        if self.leave_takes_effect_at is not None:
            self.remove(run, "left", self.leave_takes_effect_at)
        return self.leave_accepted

    def removed_from_step(self, run: str) -> int | None:
        """The step this peer was removed from."""
        removed = self.removed.get(run)
        return None if removed is None else removed[1]

    def removed_reason(self, run: str) -> str | None:
        """Why this peer was removed."""
        removed = self.removed.get(run)
        return None if removed is None else removed[0]

    def forget_removal(self, run: str) -> None:
        """Recorded in ``forgotten_removals``."""
        self.forgotten_removals.append(run)
        self.removed.pop(run, None)

    def take_resync(self, run: str) -> int | None:
        """The step set in ``resync``, once."""
        return self.resync.pop(run, None)

    async def query_run(self, run: str, peer: PeerID, *, timeout_s: float) -> RunInfo:
        """``run_infos[peer]`` (raised if an exception; not a member if absent)."""
        self.queried.append((peer, timeout_s))
        answer = self.run_infos.get(peer)
        if isinstance(answer, BaseException):
            raise answer
        return answer or RunInfo(run=run, configuration=None, step=-1, from_peer=peer)

    async def join(
        self, run: str, sponsor: PeerID, *, incarnation: int, throughput: float, timeout_s: float
    ) -> Configuration:
        """Recorded; installs and returns ``admission`` (waits for the test to set one)."""
        self.joins.append({"run": run, "sponsor": sponsor, "incarnation": incarnation, "throughput": throughput})
        while self.admission is None:
            await self.wait_changed()
        return self.install(self.admission)  # as the runtime: the admitting configuration is now ours

    async def wait_changed(self) -> None:
        """Until the test installs, gates, ungates or removes something."""
        if self._changed is None:
            self._changed = anyio.Event()
        changed = self._changed
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None
        with anyio.move_on_after(WAIT_BOUND_S) as bound:
            await changed.wait()
        if bound.cancelled_caught:  # a test that forgot to change anything fails instead of hanging
            raise AssertionError(f"fake gates: nothing changed for {WAIT_BOUND_S} s")


# ---------------------------------------------------------------------------------- streams
class FakeStream:
    """A stream to ``remote_peer`` whose answers are scripted: each ``receive_*`` takes the next
    reply (a message for ``receive_message``, bytes for ``receive_into``; an exception is raised; a
    function is called, then the reply after it is taken; :data:`HOLD` waits forever)."""

    def __init__(self, remote_peer: PeerID, protocol: str, replies: Iterable[Any] = ()) -> None:
        self.remote_peer = remote_peer
        self.protocol = protocol
        self.replies: deque[Any] = deque(replies)
        self.sent: list[Any] = []
        """Messages (and raw payloads, as bytes) sent on the stream, in order."""
        self.eof_sent = False
        self.closed = False
        self.was_reset = False

    async def __aenter__(self) -> FakeStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.closed = True

    async def send_message(self, codec: Any, message: Any, *, eof: bool = False) -> None:
        """Recorded in ``sent`` (checked against its codec's limits, as the transport would)."""
        message.validate()
        self.sent.append(message)
        self.eof_sent = self.eof_sent or eof

    async def send(self, data: bytes | bytearray | memoryview, *, eof: bool = False) -> None:
        """Recorded in ``sent`` as bytes."""
        self.sent.append(bytes(data))
        self.eof_sent = self.eof_sent or eof

    async def _next(self) -> Any:
        if not self.replies:
            return None
        if self.replies[0] is HOLD:
            await anyio.sleep_forever()
        reply = self.replies.popleft()
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):  # something that happens meanwhile (the test's hook), then the next reply
            reply()
            return await self._next()
        return reply

    async def receive_message(self, codec: Any) -> Any:
        """The next scripted reply (None once the script ran out: the stream ended)."""
        return await self._next()

    async def receive_into(self, view: memoryview | bytearray, **_: Any) -> None:
        """Fill ``view`` with the next scripted bytes (which must fit exactly)."""
        payload = await self._next()
        target = memoryview(view).cast("B")
        assert payload is not None and len(payload) == len(target), "scripted payload of the wrong size"
        target[:] = payload

    def reset(self) -> None:
        """Recorded."""
        self.was_reset = True

    async def aclose(self) -> None:
        """Recorded."""
        self.closed = True


class FakeEvents:
    """A subscription: events the test publishes, drained without waiting."""

    def __init__(self) -> None:
        self.queued: list[Any] = []

    def drain(self) -> list[Any]:
        """The events published since the last call."""
        drained, self.queued = self.queued, []
        return drained


# ---------------------------------------------------------------------------------- the port
class FakePort:
    """:class:`~chaosp2p.training.port.TrainingPort` of a peer that exists only in this process."""

    def __init__(self, identity: Identity | None = None, *, profile: str = "local") -> None:
        self.identity = identity or identities(1, base=200)[0]
        self.peer_id = self.identity.peer_id
        self.clock = SteppedClock(100.0)
        self.profile = profile
        self.runs = FakeGates(self.peer_id)
        self.subscriptions: list[FakeEvents] = []
        self.addresses: dict[PeerID, list[Multiaddr]] = {}
        self.contacts: list[PeerID] = []
        self.incarnation = 3
        self.scripts: dict[PeerID, deque[list[Any]]] = {}
        self.dialled: list[tuple[PeerID, str]] = []
        """Every ``open_stream`` call, answered or not."""
        self.opened: list[FakeStream] = []
        self.handlers: list[tuple[str, Any, float | None]] = []
        self.served_state: list[tuple[SnapshotStore, list[str]]] = []
        self.served_to: Any = None
        """The ``allow`` predicate of the last ``serve_state``."""
        self.loads: list[dict[str, Any]] = []
        self.loadable: dict[tuple[str, int], Any] = {}
        """(run, step) -> the ``LoadedState`` that ``load_state`` hands back."""
        self.spawned: list[str] = []
        self.task_group: anyio.abc.TaskGroup | None = None
        """Where ``spawn`` starts tasks (a test that wants the collaboration's watcher sets it)."""

    def spawn(self, function: Any, *, name: str) -> None:
        """Recorded in ``spawned``; started in ``task_group`` if the test set one (else never run)."""
        self.spawned.append(name)
        if self.task_group is not None:
            self.task_group.start_soon(function, name=name)

    async def sleep(self, seconds: float) -> None:
        """Until the test advances ``clock`` by ``seconds`` (``clock.settled()`` waits for the look after it)."""
        await self.clock.sleep(seconds)

    def subscribe(self) -> FakeEvents:
        """A new subscription (``publish`` feeds every one)."""
        queue = FakeEvents()
        self.subscriptions.append(queue)
        return queue

    def publish(self, *events: Any) -> None:
        """Test side: the peer emits ``events``."""
        for queue in self.subscriptions:
            queue.queued.extend(events)

    def dial_addrs(self, peer: PeerID) -> Sequence[Multiaddr]:
        """``addresses[peer]``, or nothing."""
        return self.addresses.get(peer, [])

    def run_contacts(self) -> list[PeerID]:
        """``contacts``."""
        return list(self.contacts)

    def own_incarnation(self) -> int:
        """``incarnation``."""
        return self.incarnation

    def answer(self, peer: PeerID, *replies: Any) -> None:
        """Test side: the next stream opened to ``peer`` gets ``replies`` (in order)."""
        self.scripts.setdefault(peer, deque()).append(list(replies))

    async def open_stream(self, peer: PeerID, protocol: str) -> FakeStream:
        """A stream following the next script for ``peer``; ``PeerUnreachable`` if there is none."""
        self.dialled.append((peer, protocol))
        scripts = self.scripts.get(peer)
        if not scripts:
            raise PeerUnreachable(f"fake: no stream scripted to {peer}")
        stream = FakeStream(peer, protocol, scripts.popleft())
        self.opened.append(stream)
        return stream

    def serve_streams(self, protocol: Any, handler: Any, *, idle_timeout_s: float | None) -> None:
        """Recorded in ``handlers``."""
        self.handlers.append((str(protocol), handler, idle_timeout_s))

    async def serve_state(self, store: SnapshotStore, *, runs: Iterable[str], allow: Any = None) -> None:
        """Recorded in ``served_state`` (and who may load, in ``served_to``)."""
        self.served_state.append((store, list(runs)))
        self.served_to = allow

    async def load_state(self, run: str, *, step: int, sources: Sequence[str], digest: bytes | None) -> Any:
        """Recorded; ``loadable[(run, step)]`` (``PeerUnreachable`` if the test put nothing there)."""
        self.loads.append({"run": run, "step": step, "sources": list(sources), "digest": digest})
        await anyio.lowlevel.checkpoint()
        found = self.loadable.get((run, step))
        if found is None:
            raise PeerUnreachable("fake: no state to load")
        return found


# ---------------------------------------------------------------------------------- the averager
@dataclass
class AverageCall:
    """One ``all_reduce`` as the collaboration asked for it (``contribution``: the buffer on entry)."""

    tag: RoundTag
    contribution: np.ndarray
    weight: float
    max_weights: dict[PeerID, float]
    members: list[PeerID]
    addrs: Callable[[PeerID], Sequence[Multiaddr]]
    bandwidth: Mapping[PeerID, float | None] | None
    wire_dtype: str
    timeout_s: float


RoundScript = Callable[[np.ndarray, AverageCall], "Mapping[str, Any] | None"] | BaseException
"""One round's outcome: an exception to raise, or a function that edits the buffer in place (the
"average") and may return ``RoundStats`` fields to override (``invalid``, ``excluded``...)."""


@dataclass
class FakeAverager:
    """Stands in for :class:`~chaosp2p.training.averager.Averager`: rounds follow ``script``
    (one entry per round, in order; an empty script completes a round leaving the buffer as is,
    which is the average of a member alone)."""

    script: deque[RoundScript] = field(default_factory=deque)
    calls: list[AverageCall] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    expected: dict[str, Callable[[PeerID], bool]] = field(default_factory=dict)
    """What ``expect_run`` was given: per run, who may contribute early."""
    busy_runs: set[str] = field(default_factory=set)
    """Runs ``forget_run`` refuses (a round still in progress)."""
    bytes_sent: int = 111
    bytes_received: int = 222
    seconds: float = 0.5
    silent: dict[RoundTag, tuple[frozenset[PeerID], float]] = field(default_factory=dict)
    """What ``silent_in`` answers per aborted round (members that sent nothing, seconds waited)."""

    def silent_in(self, tag: RoundTag) -> tuple[frozenset[PeerID], float]:
        """The scripted ``silent`` entry of ``tag`` (nobody silent by default)."""
        return self.silent.get(tag, (frozenset(), 0.0))

    stopped: dict[RoundTag, frozenset[PeerID]] = field(default_factory=dict)
    """What ``stopped_in`` answers per aborted round (members stopped mid-send)."""

    async def stopped_in(self, tag: RoundTag) -> frozenset[PeerID]:
        """The scripted ``stopped`` entry of ``tag`` (nobody by default)."""
        return self.stopped.get(tag, frozenset())

    unreachable_peers: dict[RoundTag, frozenset[PeerID]] = field(default_factory=dict)
    """What ``unreachable(tag)`` answers (a test sets it from a scripted round)."""

    def unreachable(self, tag: RoundTag) -> frozenset[PeerID]:
        """``unreachable_peers[tag]``, empty by default."""
        return self.unreachable_peers.get(tag, frozenset())

    early: set[str] = field(default_factory=set)
    """Runs for which others' contributions wait here (what ``holds_early`` answers)."""

    def holds_early(self, run: str) -> bool:
        """Whether ``run`` is in ``early``."""
        return run in self.early

    def then(self, *rounds: RoundScript) -> FakeAverager:
        """Append rounds to the script."""
        self.script.extend(rounds)
        return self

    async def all_reduce(self, tag: RoundTag, buffer: np.ndarray, **options: Any) -> RoundStats:
        """Record the call (the averager's keyword arguments, as the collaboration passed them),
        then play the next scripted round."""
        bandwidth = options.get("bandwidth")
        call = AverageCall(
            tag=tag,
            contribution=buffer.copy(),
            weight=options["weight"],
            max_weights=dict(options["max_weights"]),
            members=list(options["members"]),
            addrs=options["addrs"],
            bandwidth=None if bandwidth is None else dict(bandwidth),
            wire_dtype=options.get("wire_dtype", "float32"),
            timeout_s=options["timeout_s"],
        )
        self.calls.append(call)
        await anyio.lowlevel.checkpoint()
        entry = self.script.popleft() if self.script else None
        if isinstance(entry, BaseException):
            raise entry
        overrides = entry(buffer, call) if entry is not None else None
        if inspect.isawaitable(overrides):  # a round that takes time (a test may supersede it meanwhile)
            overrides = await overrides
        fields: dict[str, Any] = {
            "tag": tag,
            "members": tuple(call.members),
            "wire_dtype": call.wire_dtype,
            "elements": int(buffer.size),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "seconds": self.seconds,
            "reduce_scatter_s": self.seconds / 2,
            "all_gather_s": self.seconds / 2,
            "reduce_s": 0.0,
            "excluded": (),
            "total_weight": call.weight,
        }
        fields.update(overrides or {})
        return RoundStats(**fields)

    def expect_run(self, run: str, admits: Callable[[PeerID], bool]) -> None:
        """Recorded in ``expected``."""
        self.expected[run] = admits

    def forget_run(self, run: str) -> None:
        """Recorded in ``forgotten`` (refused for ``busy_runs``, as the real one refuses during a round)."""
        self.expected.pop(run, None)
        if run in self.busy_runs:
            raise LocalProtocolError(f"run {run!r} has a round in progress")
        self.forgotten.append(run)


# ---------------------------------------------------------------------------------- a collaboration on them
@dataclass
class Rig:
    """A collaboration wired to fakes, and the fakes."""

    collab: AsyncCollaboration
    port: FakePort
    averager: FakeAverager
    service: TrainingService
    store: SnapshotStore

    @property
    def gates(self) -> FakeGates:
        """The port's gates."""
        return self.port.runs


def rig(model: Any, optimizer: Any, *, port: FakePort | None = None, run: str = RUN, **config: Any) -> Rig:
    """``AsyncCollaboration(run, model, optimizer)`` on a :class:`FakePort` and a :class:`FakeAverager`.

    ``config`` overrides ``CollaborationConfig.local()``; by default the global batch is 4, a round
    times out after 1 s, a failed round waits 50 ms (real time) for a new configuration, and a
    (re)join -- which cannot succeed on the fake -- gives up after 1 s instead of 10 minutes.
    """
    port = port or FakePort()
    averager = FakeAverager()
    store = SnapshotStore(keep_latest=2)
    service = TrainingService(port, averager=averager, store=store)  # type: ignore[arg-type]
    chosen = CollaborationConfig.local(
        **{"global_batch": 4, "round_timeout_min_s": 1.0, "retry_wait_s": 0.05, "join_timeout_s": 1.0, **config}
    )
    collab = AsyncCollaboration(port, service, run=run, model=model, optimizer=optimizer, config=chosen)  # type: ignore[arg-type]
    return Rig(collab=collab, port=port, averager=averager, service=service, store=store)
