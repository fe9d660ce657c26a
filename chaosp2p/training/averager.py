"""The averaging engine: weighted all-reduce of a flat float32 buffer over ``/chaos/average/1``.

Theory of operation
-------------------
:meth:`Averager.all_reduce` runs one *round* (identified by a :class:`RoundTag`) as a butterfly
(see :mod:`chaosp2p.protocols.averaging.plan` for why): the buffer is cut into one shard per member,
every member sends each owner its slice of that owner's shard, each owner validates and averages
what it received, and sends the averaged shard back to everyone. A member plays two roles at once:

* *contributor*, one task per other owner: open a stream, send a :class:`Contribution` header and
  the slice straight from the caller's buffer (a memoryview; the transport encrypts it into its
  record buffer), then read the owner's :class:`Result` and receive the averaged shard straight
  into the same slice of the caller's buffer (the connection decrypts records in place);
* *owner*: inbound streams arrive through the stream handler; their payloads are received into a
  preallocated staging array per contributor, chunk by chunk, and the
  :class:`~chaosp2p.protocols.averaging.shard_reduce.ShardReducer` reduces each chunk once all
  contributions of it are in. The averaged shard goes to every contributor -- the same bytes, so every member
  ends the round with an identical buffer.

Contributions that reach an owner before it started the round (members arrive at different
times) wait, if their tag is close ahead of the owner's latest round, with their bytes held by the
transport's flow control (at most one initial stream window each, a bounded number of them). Only
members of a run this peer trains may hold such a slot (the collaboration says who, through
:meth:`Averager.expect_run`), one per member and run: a stranger is answered before its header is
even decoded, and one member cannot crowd out the others.

Weights come from the agreed configuration: each owner refuses a contribution that states more
weight than the caller's ``max_weights`` allows its sender
(:func:`~chaosp2p.protocols.averaging.weights.weight_allowances`), so no contributor can outweigh
its share of the global batch.

Faults. A bad contribution (wrong length or dtype: ``REFUSED`` before its payload is read;
NaN/Inf: excluded after) is left out with a log line naming the peer; the round goes on and
every member learns the exclusions from the results (:attr:`RoundStats.excluded`). A contribution
excluded by one owner is excluded from the whole round: each answer lists the peers whose values
it holds, so every member knows, identically, which owners must send their shard again without
the excluded peers (a second answer on the same stream; nothing extra when nobody was excluded).
The culprit itself ends the round with the same buffer as everyone and finds itself in
``excluded``. :class:`ContributionRefused` is raised only on a member whose contribution most
owners refused outright (wrong length, dtype or weight); a minority of refusing owners are
named in :class:`RoundAborted` instead, since they are the odd ones. A member that
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
from chaosp2p.protocols.averaging.messages import (
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
from chaosp2p.protocols.averaging.plan import Shard, plan_shards
from chaosp2p.protocols.averaging.shard_reduce import all_finite, decode, storage_dtype
from chaosp2p.training.averager_config import AveragerConfig
from chaosp2p.training.owner_role import OwnerRole, as_bytes, send_array
from chaosp2p.training.pair_watch import unanswered, watch_pairs
from chaosp2p.training.relayed import Relays, reach
from chaosp2p.training.round_state import Inbound, RoundState, mismatch
from chaosp2p.training.waiting import Waiting, log_waits, silent_contributors, waiting_of
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
    invalid: tuple[PeerID, ...] = ()
    """Contributions this member, as the owner of a shard, found invalid itself (header refused, or
    NaN/Inf values), sorted: first-hand evidence, unlike ``excluded`` (what any owner reported)."""


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


class Averager:
    """Runs averaging rounds for one host; serves ``/chaos/average/1`` on it.

    Construct it before the host makes connections (protocols are advertised in each
    connection's Hello), e.g. in the node's constructor.
    """

    def __init__(self, host: Host, clock: Clock | None = None, *, config: AveragerConfig | None = None) -> None:
        self.host = host
        self.clock = clock or MonotonicClock()
        self.config = config or AveragerConfig.local()
        self._active: dict[str, RoundState] = {}
        self._expected: dict[str, Callable[[PeerID], bool]] = {}
        self._latest: dict[str, RoundTag] = {}
        self._pending: dict[RoundTag, dict[PeerID, Inbound]] = {}
        self._finished: OrderedDict[RoundTag, Result] = OrderedDict()
        self._scratch: dict[str, np.ndarray] = {}
        self._silent: dict[str, tuple[RoundTag, frozenset[PeerID], float, frozenset[PeerID]]] = {}
        self._completed = 0
        self._failed = 0
        self._excluded_here = 0
        self._held_early = 0
        self._unreachable: dict[str, tuple[RoundTag, frozenset[PeerID]]] = {}  # run -> its last round's
        host.set_stream_handler(PROTOCOL_ID, self._serve)

    # ------------------------------------------------------------------ public API
    async def all_reduce(
        self,
        tag: RoundTag,
        buffer: np.ndarray,
        *,
        weight: float,
        max_weights: Mapping[PeerID, float],
        members: Sequence[PeerID],
        addrs: AddressBook,
        bandwidth: Mapping[PeerID, float | None] | None = None,
        wire_dtype: str = "float32",
        timeout_s: float,
        relays: Relays | None = None,
    ) -> RoundStats:
        """Average ``buffer`` in place: ``sum(w_i x_i) / sum(w_i)`` over the valid contributions.

        ``members`` (including this peer, in the same order on every member) and ``bandwidth``
        decide the shards; ``addrs(peer)`` says where to dial a member not yet connected. A weight
        of 0 contributes nothing but receives the result. ``max_weights`` gives, for every member,
        the largest weight the agreed configuration allows its contribution (this peer's own
        ``weight`` included): as an owner, this peer refuses a contribution that states more.
        Raises :class:`RoundAborted` (naming the missing members) if a member fails or does not
        deliver within ``timeout_s``, :class:`RoundMismatch` if members disagree about the round,
        :class:`ContributionRefused` if the owners refused this peer's own contribution. After an
        error the buffer's contents are unspecified. ``relays``: the members to reach an owner through
        when the agreed link to it is down (:mod:`chaosp2p.training.relayed`).
        """
        me = self.host.peer_id
        wire = WireDtype.from_name(wire_dtype)
        self._check_call(tag, buffer, weight, members, timeout_s)
        allowances = self._allowances(weight, max_weights, members)
        plan = plan_shards(list(members), len(buffer), bandwidth)
        chunk_elements = self.config.chunk_bytes // 4
        round_ = RoundState(
            tag=tag,
            me=me,
            plan=plan,
            buffer=buffer,
            weight=weight,
            wire=wire,
            chunk_elements=chunk_elements,
            max_weights=allowances,
            started=self.clock.now(),
            relays=relays or {},
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

    def expect_run(self, run: str, admits: Callable[[PeerID], bool]) -> None:
        """Hold early contributions to rounds of ``run`` from the peers ``admits`` (until :meth:`forget_run`).

        A contribution that arrives before its round started here waits for it only if its run is
        expected and ``admits(sender)`` (typically: a member of the run's newest configuration, or
        of the one governing the current step). Anyone else is answered ``MISMATCH`` at once,
        without a slot. ``admits`` is called for every early contribution and every inbound
        stream: keep it cheap, and free of I/O.
        """
        self._expected[run] = admits

    def forget_run(self, run: str) -> None:
        """Free what this averager keeps for ``run`` (its scratch memory, its latest round), and stop
        expecting contributions to it."""
        self._expected.pop(run, None)
        if run in self._active:
            raise LocalProtocolError(f"run {run!r} has a round in progress")
        self._scratch.pop(run, None)
        self._latest.pop(run, None)
        self._silent.pop(run, None)
        self._unreachable.pop(run, None)

    def waiting(self, run: str) -> Waiting | None:
        """What the round of ``run`` in progress here waits for (None: no round in progress)."""
        round_ = self._active.get(run)
        return None if round_ is None else waiting_of(round_)

    def silent_in(self, tag: RoundTag) -> tuple[frozenset[PeerID], float]:
        """Of the aborted round ``tag`` here: the members that sent this peer no contribution at all
        (first-hand: not a byte of a header reached our shard), and how long the round waited."""
        last = self._silent.get(tag.run)
        if last is None or last[0] != tag:
            return frozenset(), 0.0
        return last[1], last[2]

    async def stopped_in(self, tag: RoundTag) -> frozenset[PeerID]:
        """Of the aborted round ``tag`` here: contributors stopped in the middle of their contribution.

        Part of it reached our shard (so :meth:`silent_in` does not name them), and now they do not
        answer a ping on their connection within ``pair_probe_timeout_s``. A slow link delivers part
        of a contribution too, but its sender is alive and answers; a SIGSTOPped process does not
        (its kernel still holds the connection). Pings only when asked: it takes up to that long.
        """
        last = self._silent.get(tag.run)
        if last is None or last[0] != tag or not last[3]:
            return frozenset()
        return await unanswered(self.host, last[3], self.config.pair_probe_timeout_s)

    def unreachable(self, tag: RoundTag) -> frozenset[PeerID]:
        """The peers round ``tag`` (the last of its run here) could not exchange with, first-hand.

        Dialling it failed, its connection closed, or on timeout its exchange with this member alone
        was missing while every other owner answered (``protocols/averaging.md`` section 4.5). Empty
        for a round that is not the run's last here, or whose failure was nobody's pair in particular.
        """
        last = self._unreachable.get(tag.run)
        return last[1] if last is not None and last[0] == tag else frozenset()

    def holds_early(self, run: str) -> bool:
        """Whether contributions to a round of ``run`` wait here for it to start (others wait on us)."""
        return any(tag.run == run and waiting for tag, waiting in self._pending.items())

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

    def _allowances(
        self, weight: float, max_weights: Mapping[PeerID, float], members: Sequence[PeerID]
    ) -> dict[PeerID, float]:
        allowances: dict[PeerID, float] = {}
        for peer in members:
            allowed = max_weights.get(peer)
            if allowed is None or not (math.isfinite(allowed) and 0 <= allowed <= self.config.max_weight):
                raise ConfigError(
                    f"max_weights must give every member a finite weight in 0..{self.config.max_weight:g}"
                )
            allowances[peer] = float(allowed)
        if weight > allowances[self.host.peer_id]:
            raise ConfigError(f"weight {weight:g} is above this peer's allowance {allowances[self.host.peer_id]:g}")
        return allowances

    def _adopt_pending(self, round_: RoundState) -> None:
        for tag in list(self._pending):
            if tag.run != round_.tag.run:
                continue
            if tag == round_.tag:
                for inbound in self._pending.pop(tag).values():
                    round_.accept(inbound)
                continue
            for inbound in list(self._pending[tag].values()):
                if not _ahead(tag, round_.tag):
                    del self._pending[tag][inbound.peer]
                    inbound.reply = mismatch(f"this peer is at round {round_.tag}, not {tag}")
                    inbound.assigned.set()
                elif inbound.peer in round_.member_set and round_.shard.size:  # it owes us a contribution
                    round_.fail("mismatch", frozenset(), f"{inbound.peer.short()} is already at round {tag}")
            if not self._pending[tag]:
                del self._pending[tag]

    async def _run(self, round_: RoundState, addrs: AddressBook, timeout_s: float) -> None:
        owner = OwnerRole(
            round_,
            staging=self._staging(round_.tag.run, OwnerRole.staging_bytes(round_)),
            clock=self.clock,
            window_bytes=self.config.window_bytes,
        )
        # A chaosp2p error escaping a task below reaches all_reduce's caller as itself (inside the
        # round's scope, so a cancellation beside it still goes to that scope alone).
        with round_.scope, unwrap_single_error():
            async with anyio.create_task_group() as outer:
                outer.start_soon(self._watchdog, round_, timeout_s)
                outer.start_soon(log_waits, round_, self.clock, self.config.waiting_log_interval_s)
                outer.start_soon(watch_pairs, round_, self.host, self.config.pair_probe_timeout_s, self._answer_all)
                # Phase 1: everyone contributes, every owner averages its shard and answers.
                async with anyio.create_task_group() as tg:
                    tg.start_soon(owner.run)
                    for shard in round_.plan.shards:
                        # Nothing goes to an owner of an empty shard (spec section 4.1): a member
                        # the link plan left without a shard needs no link to the other non-owners.
                        if shard.owner != round_.me and shard.size:
                            tg.start_soon(self._contribute, round_, shard, addrs)
                # Phase 2 (only after an exclusion): the owners whose shard holds values of a peer
                # that another owner excluded send that shard again without them.
                excluded = round_.round_exclusions()
                revising = round_.owners_to_revise(excluded)
                round_.excluded.update(excluded)
                round_.awaiting.update(p for p in revising if p != round_.me)
                async with anyio.create_task_group() as tg:
                    if round_.me in revising:
                        tg.start_soon(owner.revise, excluded)
                    for peer in revising:
                        if peer == round_.me:
                            continue
                        if round_.locally_failed:  # we fail anyway: refuse the revision (stream reset)
                            round_.finished_streams.discard(peer)
                            round_.awaiting.discard(peer)
                        else:
                            tg.start_soon(self._receive_revision, round_, peer)
                owner.publish()
                outer.cancel_scope.cancel()

    async def _watchdog(self, round_: RoundState, timeout_s: float) -> None:
        await anyio.sleep(timeout_s)
        round_.timed_out = True
        direct = round_.undelivered()
        log.info("round %s timed out after %.1f s; own shard lacks %s", round_.tag, timeout_s, _names(direct))
        # Tell our contributors first, so that they can name the same culprits as we do.
        notice = Result(status=ResultStatus.ABORTED, detail="timed out", missing=tuple(sorted(direct)))
        await self._answer_all(round_, notice)
        with anyio.move_on_after(min(self.config.abort_grace_s, timeout_s)):
            while any(p not in round_.reported for p in round_.awaiting):
                await round_.news.wait()
        reported = frozenset().union(*round_.reported.values()) if round_.reported else frozenset()
        silent = frozenset(p for p in round_.awaiting if p not in round_.reported)
        missing = (direct | reported) or silent
        round_.unreachable.update(round_.pair_suspects(direct))
        round_.fail("aborted", missing, f"timed out after {timeout_s:g} s waiting for {_names(missing)}")

    def _staging(self, run: str, size: int) -> np.ndarray:
        # One reusable scratch area per run (rounds of a run are sequential): a fresh 100 MB array
        # every round would cost its page faults every round.
        scratch = self._scratch.get(run)
        if scratch is None or len(scratch) < size:
            scratch = self._scratch[run] = np.empty(size, dtype=np.uint8)
        return scratch[:size]

    # ------------------------------------------------------------------ contributor role
    async def _contribute(self, round_: RoundState, shard: Shard, addrs: AddressBook) -> None:
        owner = shard.owner
        try:
            connection = await reach(self.host, owner, addrs, round_.relays)
            stream = connection.open_stream(PROTOCOL)
        except (ChaosError, ProtocolNotSupported) as exc:
            if not isinstance(exc, ProtocolNotSupported):
                round_.unreachable.add(owner)
            round_.fail("aborted", frozenset({owner}), f"cannot reach {owner.short()}: {exc}")
            return
        round_.owner_streams[owner] = stream
        await self._guarded(round_, owner, self._exchange(round_, shard, stream))

    async def _guarded(self, round_: RoundState, owner: PeerID, work: Awaitable[None]) -> None:
        """Run one exchange with ``owner``, turning its failures into the round's verdicts."""
        try:
            await work
        except (ConnectionClosed, StreamReset) as exc:
            if isinstance(exc, ConnectionClosed):
                round_.unreachable.add(owner)
            round_.fail("aborted", frozenset({owner}), f"{owner.short()}: {exc}")
        except ProtocolError as exc:
            log.warning("round %s: unusable answer from %s: %s", round_.tag, owner, exc)
            round_.unusable[owner] = str(exc)
            round_.awaiting.discard(owner)
            round_.news.notify()

    async def _exchange(self, round_: RoundState, shard: Shard, stream: Stream) -> None:
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
                answer = await self._read_answer(shard, stream, revision=0)
                if answer.status is not ResultStatus.OK:
                    tg.cancel_scope.cancel()
                else:
                    await sent.wait()  # the slice is ours to overwrite only once it has been sent
        if answer.status is not ResultStatus.OK:
            self._on_refusal(round_, owner, answer)
            return
        if failed:
            raise failed[0]
        log.debug("round %s: answer header from %s", round_.tag, owner.short())
        await self._receive_result(round_, stream, region, answer.wire_dtype)
        log.debug("round %s: answer from %s in", round_.tag, owner.short())
        round_.answers[owner] = answer
        round_.finished_streams.add(owner)
        round_.awaiting.discard(owner)
        round_.news.notify()

    async def _receive_revision(self, round_: RoundState, owner: PeerID) -> None:
        async def work() -> None:
            shard = round_.plan.shard_of(owner)
            stream = round_.owner_streams[owner]
            round_.finished_streams.discard(owner)
            answer = await self._read_answer(shard, stream, revision=1)
            if answer.status is not ResultStatus.OK:
                self._on_refusal(round_, owner, answer)
                return
            await self._receive_result(round_, stream, round_.buffer[shard.start : shard.stop], answer.wire_dtype)
            round_.finished_streams.add(owner)
            round_.awaiting.discard(owner)
            round_.news.notify()

        await self._guarded(round_, owner, work())

    async def _read_answer(self, shard: Shard, stream: Stream, *, revision: int) -> Result:
        answer = await stream.receive_message(codec)
        if answer is None:
            raise StreamReset(f"{shard.owner.short()} closed the stream without answering")
        if not isinstance(answer, Result):
            raise RemoteProtocolError(f"expected a Result, got {type(answer).__name__}")
        if answer.status is ResultStatus.OK:
            expected = (shard.start, shard.stop, shard.size * answer.wire_dtype.itemsize, revision)
            if not shard.size:  # an empty shard's position depends on the owner's length: nothing to check
                expected = (answer.start, answer.start, 0, revision)
            if (answer.start, answer.stop, answer.payload_bytes, answer.revision) != expected:
                raise RemoteProtocolError(
                    f"answer (revision {answer.revision}) for {answer.start}..{answer.stop} "
                    f"({answer.payload_bytes} bytes), expected revision {revision} of "
                    f"{expected[0]}..{expected[1]} ({expected[2]} bytes)"
                )
        return answer

    def _on_refusal(self, round_: RoundState, owner: PeerID, answer: Result) -> None:
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
            round_.awaiting.discard(owner)
            round_.news.notify()

    async def _send_contribution(
        self,
        round_: RoundState,
        stream: Stream,
        header: Contribution,
        region: np.ndarray | None,
        sent: anyio.Event,
        failed: list[ChaosError],
    ) -> None:
        try:
            await stream.send_message(codec, header, eof=region is None)
            if region is not None:
                await send_array(stream, region, round_.wire, round_.chunk_elements, eof=True)
                round_.bytes_sent += len(region) * round_.wire.itemsize
            log.debug("round %s: contribution to %s sent", round_.tag, stream.remote_peer.short())
        except (ConnectionClosed, StreamReset) as exc:
            failed.append(exc)  # the reader sees the same failure, or the owner's answer explaining it
        finally:
            sent.set()

    async def _receive_result(self, round_: RoundState, stream: Stream, region: np.ndarray, wire: WireDtype) -> None:
        # The window opens only now that a reader waits: bytes that arrive while nobody waits are
        # decrypted into a fresh buffer and copied, bytes that find a waiting reader are decrypted
        # straight into the caller's buffer.
        stream.set_receive_window(self.config.window_bytes)
        await self._receive_values(round_, stream, region, wire)
        # An owner averages validated contributions, so its shard is finite unless it is faulty or
        # malicious: never let such values into the caller's model.
        if not all_finite(region):
            raise RemoteProtocolError("non-finite values (NaN or infinity) in its averaged shard")

    async def _receive_values(self, round_: RoundState, stream: Stream, region: np.ndarray, wire: WireDtype) -> None:
        if wire is WireDtype.FLOAT32:
            # One wait for the whole shard: the rest of the region stays posted between records,
            # so no record can find the reader between two chunk-sized waits (it would go through
            # a fresh buffer and a copy). In practice trio rarely hit that gap (the share of
            # records decrypted in place did not change), but one wait is also less work.
            await stream.receive_into(as_bytes(region))
            round_.bytes_received += region.nbytes
            return
        step = round_.chunk_elements
        scratch = np.empty(min(step, len(region)), storage_dtype(wire))
        for start in range(0, len(region), step):
            chunk = region[start : start + step]
            encoded = scratch[: len(chunk)]
            await stream.receive_into(as_bytes(encoded))
            decode(encoded, chunk, wire)
            round_.bytes_received += len(chunk) * wire.itemsize

    # ------------------------------------------------------------------ the end of a round
    async def _finish(self, round_: RoundState) -> None:
        if round_.failure is None:
            notice = mismatch(f"round {round_.tag} already completed here")
        elif round_.failure[0] == "mismatch":
            notice = mismatch(round_.failure[2])
        else:
            notice = Result(
                status=ResultStatus.ABORTED, detail=round_.failure[2][:1024], missing=tuple(sorted(round_.failure[1]))
            )
        await self._answer_all(round_, notice)
        for inbound in round_.inbound.values():
            inbound.done.set()
        for owner, stream in round_.owner_streams.items():
            if owner not in round_.finished_streams:
                stream.reset()
        del self._active[round_.tag.run]
        if round_.failure is not None and round_.failure[0] == "aborted":
            partial = round_.partial() if round_.shard.size else frozenset()
            waited = self.clock.now() - round_.started
            self._silent[round_.tag.run] = (round_.tag, silent_contributors(round_), waited, partial)
        self._finished[round_.tag] = notice
        self._unreachable[round_.tag.run] = (round_.tag, frozenset(round_.unreachable - {round_.me, *round_.relays}))
        while len(self._finished) > self.config.history_rounds:
            self._finished.popitem(last=False)
        self._excluded_here += len(round_.excluded_here)
        if round_.failure is None and not round_.locally_failed:
            self._completed += 1
        else:
            self._failed += 1

    async def _answer_all(self, round_: RoundState, notice: Result) -> None:
        """Send ``notice`` to every contributor that has no answer yet (bounded, best effort)."""
        waiting = [i for i in round_.inbound.values() if not i.answered and not i.failed]
        if not waiting:
            return
        with anyio.move_on_after(self.config.abort_notice_timeout_s):
            async with anyio.create_task_group() as tg:
                for inbound in waiting:
                    inbound.answered = True
                    tg.start_soon(_send_quietly, inbound.stream, notice)

    def _outcome(self, round_: RoundState) -> RoundStats:
        tag = round_.tag
        if round_.failure is not None:
            kind, missing, detail = round_.failure
            if kind == "mismatch":
                raise RoundMismatch(f"round {tag}: {detail}", tag=tag)
            raise RoundAborted(f"round {tag} aborted: {detail}", missing=missing, tag=tag)
        if round_.refused_by:
            reasons = "; ".join(f"{p.short()}: {r}" for p, r in sorted(round_.refused_by.items()))
            loaded = [s.owner for s in round_.plan.shards if s.size and s.owner != round_.me]
            if 2 * len(round_.refused_by) > len(loaded):  # most owners disagree with us: we are the odd one
                raise ContributionRefused(
                    f"round {tag}: owners refused this peer's contribution ({reasons})",
                    by=frozenset(round_.refused_by),
                    tag=tag,
                )
            raise RoundAborted(
                f"round {tag}: a minority of owners refused this peer's contribution ({reasons})",
                missing=frozenset(round_.refused_by),
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
            invalid=tuple(sorted(round_.invalid_here, key=lambda p: p.raw)),
        )

    # ------------------------------------------------------------------ inbound streams
    async def _serve(self, stream: Stream) -> None:
        if not self._admitted_anywhere(stream.remote_peer):
            # The cheap check first: a peer that is a member of no run trained here gets no slot,
            # no wait and no decoding (issue 20, finding 5). A newcomer this peer does not know of
            # yet reads MISMATCH, as for any round it disagrees about, and retries.
            await _send_quietly(stream, mismatch(f"{stream.remote_peer.short()} is a member of no run trained here"))
            return
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
        inbound = Inbound(stream.remote_peer, stream, message)
        await self._route(inbound)
        if inbound.reply is not None:
            await _send_quietly(stream, inbound.reply)
            return
        await inbound.done.wait()

    async def _route(self, inbound: Inbound) -> None:
        """Hand ``inbound`` to its round (waiting for it if it is close ahead) or set a refusal."""
        tag, peer = inbound.header.tag, inbound.peer
        active = self._active.get(tag.run)
        if active is not None and active.tag == tag:
            active.accept(inbound)
            return
        if not self._admits(tag.run, peer, active):
            inbound.reply = mismatch(f"{peer.short()} is not a member of run {tag.run!r} here")
            return
        if active is not None and peer in active.member_set and not active.contributed(peer):
            if _ahead(tag, active.tag):
                # Proof of disagreement only if ``peer`` owes us a contribution: to an owner of an
                # empty shard nobody contributes, and ``peer`` may have completed the round.
                if active.shard.size:
                    active.fail("mismatch", frozenset(), f"{peer.short()} is already at round {tag}")
            elif tag.run == active.tag.run and tag.order == active.tag.order:
                active.fail("mismatch", frozenset(), f"{peer.short()} is in round {tag}, a different configuration")
        finished = self._finished.get(tag)
        if finished is not None:
            inbound.reply = finished
            return
        reference = active.tag if active is not None else self._latest.get(tag.run)
        if reference is not None and not self._may_wait(tag, reference):
            inbound.reply = mismatch(f"this peer is at round {reference}, not {tag}")
            return
        self._supersede(tag.run, peer)
        if sum(len(w) for w in self._pending.values()) >= self.config.max_pending_streams:
            inbound.reply = Result(status=ResultStatus.REFUSED, detail="too many early contributions")
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
            inbound.reply = mismatch(f"no round {tag} started here within {self.config.pending_wait_s:g} s")

    def _admits(self, run: str, peer: PeerID, active: RoundState | None) -> bool:
        """May ``peer`` contribute to rounds of ``run`` here (a member of its active round, or expected)?"""
        if active is not None and peer in active.member_set:
            return True
        admits = self._expected.get(run)
        return admits is not None and admits(peer)

    def _admitted_anywhere(self, peer: PeerID) -> bool:
        return any(peer in r.member_set for r in self._active.values()) or any(
            admits(peer) for admits in self._expected.values()
        )

    def _supersede(self, run: str, peer: PeerID) -> None:
        """One early slot per member and run: the member's newer contribution replaces its older one.

        Rounds of a run are sequential on every member, so an honest member that sends a new
        contribution has given up on the round of its older one; a dishonest one cannot hold more
        than one slot per run this way.
        """
        for tag in [t for t in self._pending if t.run == run]:
            waiting = self._pending[tag]
            older = waiting.pop(peer, None)
            if older is not None:
                older.reply = mismatch(f"superseded by a later contribution of {peer.short()} to run {run!r}")
                older.assigned.set()
                if not waiting:
                    del self._pending[tag]

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


def _names(peers: frozenset[PeerID]) -> str:
    return ", ".join(p.short() for p in sorted(peers)) or "nobody"
