"""The averaging engine: weighted all-reduce of a flat float32 buffer over ``/chaos/average/1``.

Theory of operation
-------------------
:meth:`Averager.all_reduce` runs one *round* (identified by a :class:`RoundTag`) as a butterfly
(see :mod:`chaosp2p.training.reduce_plan` for why): the buffer is cut into one shard per member,
every member sends each owner its slice of that owner's shard, each owner validates and averages
what it received, and sends the averaged shard back to everyone. A member plays two roles at once:

* *contributor*, one task per other owner: open a stream, send a :class:`Contribution` header and
  the slice straight from the caller's buffer (a memoryview; the transport encrypts it into its
  record buffer), then read the owner's :class:`Result` and receive the averaged shard straight
  into the same slice of the caller's buffer (the connection decrypts records in place);
* *owner*: inbound streams arrive through the stream handler; their payloads are received into a
  preallocated staging array per contributor, chunk by chunk, and
  :class:`~chaosp2p.training.shard_reduce.ShardReducer` reduces each chunk once all contributions
  of it are in. The averaged shard goes to every contributor -- the same bytes, so every member
  ends the round with an identical buffer.

Contributions that reach an owner before it started the round (members arrive at different
times) wait, if their tag is close ahead of the owner's latest round, with their bytes held by the
transport's flow control (at most one initial stream window each, a bounded number of them).

Faults. A bad contribution (wrong length or dtype: ``REFUSED`` before its payload is read;
NaN/Inf: excluded after) is left out with a log line naming the peer; the round goes on and
every member learns the exclusions from the results (:attr:`RoundStats.excluded`). A member that
is unreachable, whose connection closes or that resets a stream makes the round fail at once with
:class:`RoundAborted` naming it; an owner that fails tells its contributors why (``ABORTED`` with
the missing members), so members do not blame each other for a third member's fault. On timeout
each member first reports the contributors its own shard still lacks, then waits a short grace for
the other owners' reports before naming anyone. A different tag from a member of the round means
the members disagree about the round: :class:`RoundMismatch`.

Rounds of one run are sequential on each member (a second concurrent call for the same run is a
:class:`LocalProtocolError`); that is what makes "a member sent a later tag before contributing
to this round" proof of disagreement.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc
import numpy as np

from chaosp2p.clock import Clock, MonotonicClock
from chaosp2p.errors import (
    ChaosError,
    ConfigError,
    ConnectionClosed,
    ContributionRefused,
    LocalProtocolError,
    ProtocolError,
    ProtocolNotSupported,
    RemoteProtocolError,
    RoundAborted,
    RoundMismatch,
    StreamReset,
)
from chaosp2p.training.average_messages import (
    PROTOCOL,
    PROTOCOL_ID,
    Contribution,
    Exclusion,
    Result,
    ResultStatus,
    RoundTag,
    WireDtype,
    codec,
)
from chaosp2p.training.averager_config import AveragerConfig
from chaosp2p.training.reduce_plan import ReducePlan, Shard, plan_shards
from chaosp2p.training.shard_reduce import Part, ShardReducer, decode, encode, storage_dtype
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.transport.host import Host
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.training")

AddressBook = Callable[[PeerID], Sequence[Multiaddr]]

__all__ = ["Averager", "AveragerConfig", "Exclusion", "RoundStats", "RoundTag"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundStats:
    """What one successful round did (``excluded`` is identical on every member)."""

    tag: RoundTag
    members: tuple[PeerID, ...]
    wire_dtype: str
    elements: int
    bytes_sent: int
    """Payload and header bytes this member sent (before encryption overhead)."""
    bytes_received: int
    seconds: float
    reduce_scatter_s: float
    """From the start until this member's own shard was averaged."""
    all_gather_s: float
    """From then until every shard was in the buffer."""
    reduce_s: float
    """Time spent in the arithmetic of the reduce (part of ``reduce_scatter_s``)."""
    excluded: tuple[Exclusion, ...]
    """Contributions some owner left out, sorted by peer."""
    total_weight: float
    """Sum of the weights included in this member's own shard."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AveragerStatistics:
    """Counters of one averager since it started."""

    rounds_completed: int
    rounds_failed: int
    contributions_excluded: int
    """Contributions this peer, as an owner, left out of its shard (refused or non-finite)."""
    early_contributions_held: int
    """Contributions that arrived before their round started here and waited for it."""
    early_contributions_waiting: int
    """Of those, how many are waiting right now."""


class _Beacon:
    """Wakes every task waiting for "something changed"; waiters re-check their condition."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def notify(self) -> None:
        """Wake the current waiters."""
        self._event.set()
        self._event = anyio.Event()

    async def wait(self) -> None:
        """Wait for the next :meth:`notify`."""
        await self._event.wait()


class _Inbound:
    """A contribution stream at its owner: header read, waiting for or used by a round."""

    def __init__(self, peer: PeerID, stream: Stream, header: Contribution) -> None:
        self.peer = peer
        self.stream = stream
        self.header = header
        self.assigned = anyio.Event()
        self.done = anyio.Event()
        self.reply: Result | None = None
        """An immediate answer (refusal) for the handler to send instead of joining a round."""
        self.values: np.ndarray | None = None
        self.received = 0
        self.answered = False
        self.failed = False


class _Round:
    """Book-keeping of one local all-reduce."""

    def __init__(
        self,
        *,
        tag: RoundTag,
        me: PeerID,
        plan: ReducePlan,
        buffer: np.ndarray,
        weight: float,
        wire: WireDtype,
        chunk_elements: int,
        started: float,
    ) -> None:
        self.tag = tag
        self.me = me
        self.plan = plan
        self.members = plan.members
        self.shard = plan.shard_of(me)
        self.buffer = buffer
        self.weight = weight
        self.wire = wire
        self.chunk_elements = chunk_elements
        self.started = started
        self.inbound: dict[PeerID, _Inbound] = {}
        self.arrived = _Beacon()
        self.progress = _Beacon()
        """Contribution bytes arrived or a contribution failed (wakes the reducer)."""
        self.news = _Beacon()
        """An owner's result or report arrived (wakes the watchdog)."""
        self.failure: tuple[str, frozenset[PeerID], str] | None = None
        self.scope = anyio.CancelScope()
        self.timed_out = False
        self.refused_by: dict[PeerID, str] = {}
        self.unusable: dict[PeerID, str] = {}
        self.reported: dict[PeerID, frozenset[PeerID]] = {}
        self.results: set[PeerID] = set()
        self.excluded: dict[PeerID, str] = {}
        """Exclusions anywhere in the round (ours and those the results reported)."""
        self.excluded_here: set[PeerID] = set()
        """Contributions this member, as owner, left out."""
        self.outbound: list[Stream] = []
        self.bytes_sent = 0
        self.bytes_received = 0
        self.shard_done_at: float | None = None
        self.reduce_s = 0.0
        self.total_weight = 0.0
        self.finished_streams: set[int] = set()
        """ids of outbound streams whose exchange completed (they need no reset)."""

    def fail(self, kind: str, missing: frozenset[PeerID], detail: str) -> None:
        """End the round: ``kind`` is ``"aborted"`` or ``"mismatch"``; the first failure stands."""
        if self.failure is None:
            self.failure = (kind, missing - {self.me}, detail)
            log.info("round %s failed (%s): %s", self.tag, kind, detail)
        self.scope.cancel()

    def contributed(self, peer: PeerID) -> bool:
        """True once ``peer``'s contribution stream reached this owner."""
        return peer in self.inbound

    def accept(self, inbound: _Inbound, *, max_weight: float) -> None:
        """Take a contribution stream into this round, or set the refusal to answer it with."""
        peer, header = inbound.peer, inbound.header
        if peer not in self.members or peer == self.me:
            inbound.reply = _mismatch(f"{peer.short()} is not a member of round {self.tag} here")
        elif peer in self.inbound:
            inbound.reply = Result(status=ResultStatus.REFUSED, detail="duplicate contribution")
        else:
            problem = self._check(header, max_weight)
            self.inbound[peer] = inbound
            if problem is not None:
                log.warning("excluding %s from round %s: %s", peer, self.tag, problem)
                self.excluded[peer] = problem
                self.excluded_here.add(peer)
                inbound.reply = Result(status=ResultStatus.REFUSED, detail=problem)
                inbound.answered = True
            self.arrived.notify()
        inbound.assigned.set()

    def _check(self, header: Contribution, max_weight: float) -> str | None:
        shard = self.shard
        if header.wire_dtype is not self.wire:
            return f"wire dtype {header.wire_dtype.name.lower()}, the round uses {self.wire.name.lower()}"
        if shard.size and (header.total_elements, header.start, header.stop) != (
            self.plan.length,
            shard.start,
            shard.stop,
        ):
            return (
                f"contribution for elements {header.start}..{header.stop} of {header.total_elements}, "
                f"this owner averages {shard.start}..{shard.stop} of {self.plan.length}"
            )
        if not (math.isfinite(header.weight) and 0 <= header.weight <= max_weight):
            return f"weight {header.weight!r} is not a finite number in 0..{max_weight:g}"
        expected = shard.size * self.wire.itemsize if header.weight > 0 else 0
        if header.payload_bytes != expected:
            return f"payload of {header.payload_bytes} bytes, expected {expected}"
        return None


def _mismatch(detail: str) -> Result:
    return Result(status=ResultStatus.MISMATCH, detail=detail)


class Averager:
    """Runs averaging rounds for one host; serves ``/chaos/average/1`` on it.

    Construct it before the host makes connections (protocols are advertised in each
    connection's Hello), e.g. in the node's constructor.
    """

    def __init__(self, host: Host, clock: Clock | None = None, *, config: AveragerConfig | None = None) -> None:
        self.host = host
        self.clock = clock or MonotonicClock()
        self.config = config or AveragerConfig.local()
        self._active: dict[str, _Round] = {}
        self._latest: dict[str, RoundTag] = {}
        self._pending: dict[RoundTag, dict[PeerID, _Inbound]] = {}
        self._finished: OrderedDict[RoundTag, Result] = OrderedDict()
        self._scratch: dict[str, np.ndarray] = {}
        self._completed = 0
        self._failed = 0
        self._excluded_here = 0
        self._held_early = 0
        host.set_stream_handler(PROTOCOL_ID, self._serve)

    # ------------------------------------------------------------------ public API
    async def all_reduce(
        self,
        tag: RoundTag,
        buffer: np.ndarray,
        *,
        weight: float,
        members: Sequence[PeerID],
        addrs: AddressBook,
        bandwidth: Mapping[PeerID, float | None] | None = None,
        wire_dtype: str = "float32",
        timeout_s: float,
    ) -> RoundStats:
        """Average ``buffer`` in place: ``sum(w_i x_i) / sum(w_i)`` over the valid contributions.

        ``members`` (including this peer, in the same order on every member) and ``bandwidth``
        decide the shards; ``addrs(peer)`` says where to dial a member not yet connected. A weight
        of 0 contributes nothing but receives the result. Raises :class:`RoundAborted` (naming the
        missing members) if a member fails or does not deliver within ``timeout_s``,
        :class:`RoundMismatch` if members disagree about the round, :class:`ContributionRefused`
        if the owners refused this peer's own contribution. After an error the buffer's contents
        are unspecified.
        """
        me = self.host.peer_id
        wire = WireDtype.from_name(wire_dtype)
        self._check_call(tag, buffer, weight, members, timeout_s)
        plan = plan_shards(list(members), len(buffer), bandwidth)
        chunk_elements = self.config.chunk_bytes // 4
        round_ = _Round(
            tag=tag,
            me=me,
            plan=plan,
            buffer=buffer,
            weight=weight,
            wire=wire,
            chunk_elements=chunk_elements,
            started=self.clock.now(),
        )
        self._active[tag.run] = round_
        self._latest[tag.run] = tag
        try:
            self._adopt_pending(round_)
            if round_.failure is None:
                await self._run(round_, addrs, timeout_s)
        except BaseException:
            if round_.failure is None:
                round_.failure = ("aborted", frozenset({me}), "the round was cancelled on this member")
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await self._finish(round_)
        return self._outcome(round_)

    def statistics(self) -> AveragerStatistics:
        """Counters: rounds, exclusions, early contributions."""
        return AveragerStatistics(
            rounds_completed=self._completed,
            rounds_failed=self._failed,
            contributions_excluded=self._excluded_here,
            early_contributions_held=self._held_early,
            early_contributions_waiting=sum(len(w) for w in self._pending.values()),
        )

    # ------------------------------------------------------------------ the round
    def _check_call(
        self, tag: RoundTag, buffer: np.ndarray, weight: float, members: Sequence[PeerID], timeout_s: float
    ) -> None:
        if not isinstance(buffer, np.ndarray) or buffer.dtype != np.float32 or buffer.ndim != 1:
            raise ConfigError("buffer must be a 1-D float32 numpy array")
        if not buffer.flags.c_contiguous or not buffer.flags.writeable:
            raise ConfigError("buffer must be contiguous and writable (it is averaged in place)")
        if not (math.isfinite(weight) and 0 <= weight <= self.config.max_weight):
            raise ConfigError(f"weight must be a finite number in 0..{self.config.max_weight:g} (got {weight!r})")
        if self.host.peer_id not in members:
            raise ConfigError("members must include this peer")
        if not timeout_s > 0:
            raise ConfigError("timeout_s must be > 0")
        tag.validate()
        if tag.run in self._active:
            raise LocalProtocolError(f"run {tag.run!r} already has a round in progress ({self._active[tag.run].tag})")
        if tag in self._finished:
            raise LocalProtocolError(f"round {tag} already ran here")

    def _adopt_pending(self, round_: _Round) -> None:
        for tag in list(self._pending):
            if tag.run != round_.tag.run:
                continue
            if tag == round_.tag:
                for inbound in self._pending.pop(tag).values():
                    round_.accept(inbound, max_weight=self.config.max_weight)
                continue
            for inbound in list(self._pending[tag].values()):
                if not _ahead(tag, round_.tag):
                    del self._pending[tag][inbound.peer]
                    inbound.reply = _mismatch(f"this peer is at round {round_.tag}, not {tag}")
                    inbound.assigned.set()
                elif inbound.peer in round_.members:
                    round_.fail("mismatch", frozenset(), f"{inbound.peer.short()} is already at round {tag}")
            if not self._pending[tag]:
                del self._pending[tag]

    async def _run(self, round_: _Round, addrs: AddressBook, timeout_s: float) -> None:
        with round_.scope:
            async with anyio.create_task_group() as outer:
                outer.start_soon(self._watchdog, round_, timeout_s)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._own_shard, round_)
                    for shard in round_.plan.shards:
                        if shard.owner != round_.me:
                            tg.start_soon(self._contribute, round_, shard, addrs)
                outer.cancel_scope.cancel()

    async def _watchdog(self, round_: _Round, timeout_s: float) -> None:
        await anyio.sleep(timeout_s)
        round_.timed_out = True
        direct = self._undelivered(round_)
        log.info("round %s timed out after %.1f s; own shard lacks %s", round_.tag, timeout_s, _names(direct))
        # Tell our contributors first, so that they can name the same culprits as we do.
        notice = Result(status=ResultStatus.ABORTED, detail="timed out", missing=tuple(sorted(direct)))
        await self._answer_all(round_, notice)
        waiting = [p for p in round_.members if p != round_.me and p not in round_.results]
        with anyio.move_on_after(min(self.config.abort_grace_s, timeout_s)):
            while any(p not in round_.reported and p not in round_.results for p in waiting):
                await round_.news.wait()
        reported = frozenset().union(*round_.reported.values()) if round_.reported else frozenset()
        silent = frozenset(p for p in waiting if p not in round_.reported and p not in round_.results)
        missing = (direct | reported) or silent
        round_.fail("aborted", missing, f"timed out after {timeout_s:g} s waiting for {_names(missing)}")

    def _undelivered(self, round_: _Round) -> frozenset[PeerID]:
        """Contributors whose contribution to our shard is not (completely) in."""
        missing = set()
        for peer in round_.members:
            if peer == round_.me:
                continue
            inbound = round_.inbound.get(peer)
            incomplete = inbound is not None and inbound.values is not None and inbound.received < len(inbound.values)
            if inbound is None or (incomplete and not inbound.failed):
                missing.add(peer)
        return frozenset(missing)

    # ------------------------------------------------------------------ owner role
    async def _own_shard(self, round_: _Round) -> None:
        shard = round_.shard
        others = [p for p in round_.members if p != round_.me]
        slot_bytes = shard.size * round_.wire.itemsize
        staging = self._staging(round_.tag.run, len(others) * slot_bytes + shard.size * 4)
        result = staging[len(others) * slot_bytes :].view(np.float32)
        slots = {
            peer: staging[i * slot_bytes : (i + 1) * slot_bytes].view(storage_dtype(round_.wire))
            for i, peer in enumerate(others)
        }
        started: set[PeerID] = set()
        async with anyio.create_task_group() as tg:
            # Start a receiver for each contribution as it arrives; go on once all have arrived.
            while True:
                for peer, inbound in list(round_.inbound.items()):
                    if peer in started:
                        continue
                    started.add(peer)
                    if inbound.reply is None and inbound.header.weight > 0 and shard.size:
                        inbound.values = slots[peer]
                        tg.start_soon(self._receive_contribution, round_, inbound)
                if len(started) == len(others):
                    break
                await round_.arrived.wait()
            parts = []
            if round_.weight > 0 and shard.size:
                parts.append(Part(peer=round_.me, weight=round_.weight, values=round_.buffer[shard.start : shard.stop]))
            for inbound in round_.inbound.values():
                if inbound.values is not None:
                    parts.append(
                        Part(peer=inbound.peer, weight=inbound.header.weight, values=inbound.values, wire=round_.wire)
                    )
            reducer = ShardReducer(parts, result, chunk_elements=round_.chunk_elements)
            for index in range(reducer.chunk_count):
                _, stop = reducer.chunk_bounds(index)
                while True:
                    for inbound in round_.inbound.values():
                        if inbound.failed and inbound.peer not in reducer.excluded:
                            reducer.exclude(inbound.peer, round_.excluded[inbound.peer])
                    if all(i.values is None or i.failed or i.received >= stop for i in round_.inbound.values()):
                        break
                    await round_.progress.wait()
                began = self.clock.now()
                for peer in reducer.reduce_chunk(index):
                    log.warning("excluding %s from round %s: %s", peer, round_.tag, reducer.excluded[peer])
                round_.reduce_s += self.clock.now() - began
                await anyio.lowlevel.checkpoint()
        round_.excluded.update(reducer.excluded)
        round_.excluded_here.update(reducer.excluded)
        round_.total_weight = reducer.total_weight if shard.size else 0.0
        if shard.size and round_.total_weight <= 0:
            round_.fail("aborted", frozenset(), f"no valid contribution for the shard of {round_.me.short()}")
            return
        payload = self._publish_shard(round_, result)
        round_.shard_done_at = self.clock.now()
        round_.results.add(round_.me)
        answer = Result(
            status=ResultStatus.OK,
            start=shard.start,
            stop=shard.stop,
            wire_dtype=round_.wire,
            payload_bytes=payload.nbytes,
            total_weight=round_.total_weight,
            excluded=tuple(Exclusion(peer=p, reason=r[:1024]) for p, r in sorted(round_.excluded.items())),
        )
        async with anyio.create_task_group() as tg:
            for inbound in round_.inbound.values():
                if not inbound.answered and not inbound.failed:
                    tg.start_soon(self._send_result, round_, inbound, answer, payload)

    def _publish_shard(self, round_: _Round, result: np.ndarray) -> np.ndarray:
        """Put the averaged shard into the buffer exactly as it goes on the wire; return the wire array."""
        shard = round_.shard
        target = round_.buffer[shard.start : shard.stop]
        if round_.wire is WireDtype.FLOAT32:
            np.copyto(target, result)
            return target
        wire = np.empty(shard.size, dtype=storage_dtype(round_.wire))
        encode(result, wire, round_.wire)
        decode(wire, target, round_.wire)
        return wire

    async def _receive_contribution(self, round_: _Round, inbound: _Inbound) -> None:
        values = inbound.values
        assert values is not None
        stream = inbound.stream
        stream.set_receive_window(self.config.window_bytes)
        try:
            for start in range(0, len(values), round_.chunk_elements):
                chunk = values[start : start + round_.chunk_elements]
                await stream.receive_into(_bytes(chunk))
                inbound.received = start + len(chunk)
                round_.bytes_received += chunk.nbytes
                round_.progress.notify()
        except ConnectionClosed as exc:
            round_.fail("aborted", frozenset({inbound.peer}), f"{inbound.peer.short()}: {exc}")
        except (StreamReset, RemoteProtocolError) as exc:
            # A reset with the connection still up: the contributor gave up on the round (its owner
            # role tells us why); its contribution is simply left out of this shard.
            reason = f"contribution abandoned: {exc}"
            log.warning("excluding %s from round %s: %s", inbound.peer, round_.tag, reason)
            round_.excluded[inbound.peer] = reason
            inbound.failed = True
            round_.progress.notify()

    async def _send_result(self, round_: _Round, inbound: _Inbound, answer: Result, payload: np.ndarray) -> None:
        stream = inbound.stream
        try:
            await stream.send_message(codec, answer)
            view = _bytes(payload)
            step = round_.chunk_elements * round_.wire.itemsize
            for start in range(0, len(view), step):
                await stream.send(view[start : start + step])
            round_.bytes_sent += len(view)
        except ConnectionClosed as exc:
            round_.fail("aborted", frozenset({inbound.peer}), f"{inbound.peer.short()}: {exc}")
        except StreamReset:
            pass  # the contributor gave up on the round; nothing left to tell it
        finally:
            inbound.answered = True
            inbound.done.set()

    def _staging(self, run: str, size: int) -> np.ndarray:
        # One reusable scratch area per run (rounds of a run are sequential): a fresh 100 MB array
        # every round would cost its page faults every round.
        scratch = self._scratch.get(run)
        if scratch is None or len(scratch) < size:
            scratch = self._scratch[run] = np.empty(size, dtype=np.uint8)
        return scratch[:size]

    # ------------------------------------------------------------------ contributor role
    async def _contribute(self, round_: _Round, shard: Shard, addrs: AddressBook) -> None:
        owner = shard.owner
        try:
            connection = await self.host.connection_to(owner, list(addrs(owner)))
            stream = connection.open_stream(PROTOCOL)
        except (ChaosError, ProtocolNotSupported) as exc:
            round_.fail("aborted", frozenset({owner}), f"cannot reach {owner.short()}: {exc}")
            return
        round_.outbound.append(stream)
        stream.set_receive_window(self.config.window_bytes)
        try:
            await self._exchange(round_, shard, stream)
            round_.finished_streams.add(id(stream))
        except (ConnectionClosed, StreamReset) as exc:
            round_.fail("aborted", frozenset({owner}), f"{owner.short()}: {exc}")
        except ProtocolError as exc:
            log.warning("round %s: unusable answer from %s: %s", round_.tag, owner, exc)
            round_.unusable[owner] = str(exc)
            stream.reset()

    async def _exchange(self, round_: _Round, shard: Shard, stream: Stream) -> None:
        owner = shard.owner
        wire = round_.wire
        region = round_.buffer[shard.start : shard.stop]
        sends_values = round_.weight > 0 and shard.size > 0
        header = Contribution(
            tag=round_.tag,
            total_elements=len(round_.buffer),
            start=shard.start,
            stop=shard.stop,
            wire_dtype=wire,
            weight=round_.weight,
            payload_bytes=shard.size * wire.itemsize if sends_values else 0,
        )
        sent = anyio.Event()
        failed: list[ChaosError] = []
        with unwrap_single_error():
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    self._send_contribution, round_, stream, header, region if sends_values else None, sent, failed
                )
                answer = await self._read_answer(shard, stream)
                if answer.status is not ResultStatus.OK:
                    tg.cancel_scope.cancel()
                else:
                    await sent.wait()  # the slice is ours to overwrite only once it has been sent
        if answer.status is not ResultStatus.OK:
            self._on_refusal(round_, owner, answer)
            return
        if failed:
            raise failed[0]
        await self._receive_result(round_, stream, region, answer.wire_dtype)
        for exclusion in answer.excluded:
            round_.excluded.setdefault(exclusion.peer, exclusion.reason)
        round_.results.add(owner)
        round_.news.notify()

    async def _read_answer(self, shard: Shard, stream: Stream) -> Result:
        answer = await stream.receive_message(codec)
        if answer is None:
            raise StreamReset(f"{shard.owner.short()} closed the stream without answering")
        if not isinstance(answer, Result):
            raise RemoteProtocolError(f"expected a Result, got {type(answer).__name__}")
        if answer.status is ResultStatus.OK:
            expected = (shard.start, shard.stop, shard.size * answer.wire_dtype.itemsize)
            if not shard.size:  # an empty shard's position depends on the owner's length: nothing to check
                expected = (answer.start, answer.start, 0)
            if (answer.start, answer.stop, answer.payload_bytes) != expected:
                raise RemoteProtocolError(
                    f"result for {answer.start}..{answer.stop} ({answer.payload_bytes} bytes), "
                    f"expected {expected[0]}..{expected[1]} ({expected[2]} bytes)"
                )
        return answer

    def _on_refusal(self, round_: _Round, owner: PeerID, answer: Result) -> None:
        if answer.status is ResultStatus.MISMATCH:
            round_.fail("mismatch", frozenset(), f"{owner.short()}: {answer.detail}")
        elif answer.status is ResultStatus.ABORTED:
            missing = frozenset(answer.missing)
            round_.reported[owner] = missing
            round_.news.notify()
            if not round_.timed_out:
                round_.fail("aborted", missing, f"{owner.short()} aborted the round: {answer.detail}")
        else:
            log.warning("round %s: %s refused our contribution: %s", round_.tag, owner, answer.detail)
            round_.refused_by[owner] = answer.detail
            round_.results.add(owner)
            round_.news.notify()

    async def _send_contribution(
        self,
        round_: _Round,
        stream: Stream,
        header: Contribution,
        region: np.ndarray | None,
        sent: anyio.Event,
        failed: list[ChaosError],
    ) -> None:
        try:
            await stream.send_message(codec, header, eof=region is None)
            if region is not None:
                step = round_.chunk_elements
                wire = round_.wire
                scratch = None if wire is WireDtype.FLOAT32 else np.empty(min(step, len(region)), storage_dtype(wire))
                for start in range(0, len(region), step):
                    chunk = region[start : start + step]
                    last = start + step >= len(region)
                    if scratch is not None:
                        encoded = scratch[: len(chunk)]
                        encode(chunk, encoded, wire)
                        chunk = encoded
                    await stream.send(_bytes(chunk), eof=last)
                    round_.bytes_sent += chunk.nbytes
        except (ConnectionClosed, StreamReset) as exc:
            failed.append(exc)  # the reader sees the same failure, or the owner's answer explaining it
        finally:
            sent.set()

    async def _receive_result(self, round_: _Round, stream: Stream, region: np.ndarray, wire: WireDtype) -> None:
        step = round_.chunk_elements
        scratch = None if wire is WireDtype.FLOAT32 else np.empty(min(step, len(region)), storage_dtype(wire))
        for start in range(0, len(region), step):
            chunk = region[start : start + step]
            if scratch is None:
                await stream.receive_into(_bytes(chunk))
            else:
                encoded = scratch[: len(chunk)]
                await stream.receive_into(_bytes(encoded))
                decode(encoded, chunk, wire)
            round_.bytes_received += len(chunk) * wire.itemsize

    # ------------------------------------------------------------------ the end of a round
    async def _finish(self, round_: _Round) -> None:
        if round_.failure is None:
            notice = _mismatch(f"round {round_.tag} already completed here")
        elif round_.failure[0] == "mismatch":
            notice = _mismatch(round_.failure[2])
        else:
            notice = Result(
                status=ResultStatus.ABORTED, detail=round_.failure[2][:1024], missing=tuple(sorted(round_.failure[1]))
            )
        await self._answer_all(round_, notice)
        for inbound in round_.inbound.values():
            inbound.done.set()
        for stream in round_.outbound:
            if id(stream) not in round_.finished_streams:
                stream.reset()
        del self._active[round_.tag.run]
        self._finished[round_.tag] = notice
        self._excluded_here += len(round_.excluded_here)
        if round_.failure is None and not round_.refused_by and not round_.unusable:
            self._completed += 1
        else:
            self._failed += 1
        while len(self._finished) > self.config.history_rounds:
            self._finished.popitem(last=False)

    async def _answer_all(self, round_: _Round, notice: Result) -> None:
        """Send ``notice`` to every contributor that has no answer yet (bounded, best effort)."""
        waiting = [i for i in round_.inbound.values() if not i.answered and not i.failed]
        if not waiting:
            return
        with anyio.move_on_after(self.config.abort_notice_timeout_s):
            async with anyio.create_task_group() as tg:
                for inbound in waiting:
                    inbound.answered = True
                    tg.start_soon(_send_quietly, inbound.stream, notice)

    def _outcome(self, round_: _Round) -> RoundStats:
        tag = round_.tag
        if round_.failure is not None:
            kind, missing, detail = round_.failure
            if kind == "mismatch":
                raise RoundMismatch(f"round {tag}: {detail}", tag=tag)
            raise RoundAborted(f"round {tag} aborted: {detail}", missing=missing, tag=tag)
        if round_.refused_by:
            reasons = "; ".join(f"{p.short()}: {r}" for p, r in sorted(round_.refused_by.items()))
            raise ContributionRefused(
                f"round {tag}: owners refused this peer's contribution ({reasons})",
                by=frozenset(round_.refused_by),
                tag=tag,
            )
        if round_.unusable:
            reasons = "; ".join(f"{p.short()}: {r}" for p, r in sorted(round_.unusable.items()))
            raise RoundAborted(
                f"round {tag}: unusable results ({reasons})", missing=frozenset(round_.unusable), tag=tag
            )
        now = self.clock.now()
        shard_done = round_.shard_done_at if round_.shard_done_at is not None else now
        return RoundStats(
            tag=tag,
            members=round_.members,
            wire_dtype=round_.wire.name.lower(),
            elements=len(round_.buffer),
            bytes_sent=round_.bytes_sent,
            bytes_received=round_.bytes_received,
            seconds=now - round_.started,
            reduce_scatter_s=shard_done - round_.started,
            all_gather_s=now - shard_done,
            reduce_s=round_.reduce_s,
            excluded=tuple(Exclusion(peer=p, reason=r) for p, r in sorted(round_.excluded.items())),
            total_weight=round_.total_weight,
        )

    # ------------------------------------------------------------------ inbound streams
    async def _serve(self, stream: Stream) -> None:
        message = None
        received = False
        with anyio.move_on_after(self.config.header_timeout_s):
            message = await stream.receive_message(codec)
            received = True
        if not received:
            raise RemoteProtocolError(f"no contribution header within {self.config.header_timeout_s:g} s")
        if message is None:
            return
        if not isinstance(message, Contribution):
            raise RemoteProtocolError(f"expected a Contribution, got {type(message).__name__}")
        inbound = _Inbound(stream.remote_peer, stream, message)
        await self._route(inbound)
        if inbound.reply is not None:
            await _send_quietly(stream, inbound.reply)
            return
        await inbound.done.wait()

    async def _route(self, inbound: _Inbound) -> None:
        """Hand ``inbound`` to its round (waiting for it if it is close ahead) or set a refusal."""
        tag, peer = inbound.header.tag, inbound.peer
        active = self._active.get(tag.run)
        if active is not None and active.tag == tag:
            active.accept(inbound, max_weight=self.config.max_weight)
            return
        if active is not None and peer in active.members and not active.contributed(peer):
            if _ahead(tag, active.tag):
                active.fail("mismatch", frozenset(), f"{peer.short()} is already at round {tag}")
            elif tag.run == active.tag.run and tag.order == active.tag.order:
                active.fail("mismatch", frozenset(), f"{peer.short()} is in round {tag}, a different configuration")
        finished = self._finished.get(tag)
        if finished is not None:
            inbound.reply = finished
            return
        reference = active.tag if active is not None else self._latest.get(tag.run)
        if reference is not None and not self._may_wait(tag, reference):
            inbound.reply = _mismatch(f"this peer is at round {reference}, not {tag}")
            return
        held = sum(len(w) for w in self._pending.values())
        if peer in self._pending.get(tag, {}) or held >= self.config.max_pending_streams:
            inbound.reply = Result(status=ResultStatus.REFUSED, detail="duplicate or too many early contributions")
            return
        waiting = self._pending.setdefault(tag, {})
        waiting[peer] = inbound
        self._held_early += 1
        try:
            with anyio.move_on_after(self.config.pending_wait_s):
                await inbound.assigned.wait()
        finally:
            if not inbound.assigned.is_set():
                waiting.pop(peer, None)
                if not waiting and self._pending.get(tag) is waiting:
                    del self._pending[tag]
        if not inbound.assigned.is_set():
            inbound.reply = _mismatch(f"no round {tag} started here within {self.config.pending_wait_s:g} s")

    def _may_wait(self, tag: RoundTag, reference: RoundTag) -> bool:
        return (
            _ahead(tag, reference)
            and tag.epoch - reference.epoch <= self.config.max_epochs_ahead
            and tag.step - reference.step <= self.config.max_steps_ahead
        )


def _ahead(tag: RoundTag, reference: RoundTag) -> bool:
    """``tag`` is a later round of the same run than ``reference``."""
    return tag.run == reference.run and tag.order > reference.order


async def _send_quietly(stream: Stream, message: Result) -> None:
    try:
        await stream.send_message(codec, message)
    except ChaosError:
        pass  # the contributor is gone; it learns the outcome from the others or its own timeout


def _bytes(array: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, without a copy."""
    return array.data.cast("B")


def _names(peers: frozenset[PeerID]) -> str:
    return ", ".join(p.short() for p in sorted(peers)) or "nobody"
