"""Chunk scheduling of a pull in progress: which source sends which chunks, and when.

Theory of operation
-------------------
The scheduler runs while a :class:`~chaosp2p.protocols.transfer.pull.PullMachine` is PULLING. It
owns the chunk table (:class:`~chaosp2p.protocols.transfer.transitions.ChunkState`, one entry per
chunk, changed only through ``CHUNK_TRANSITIONS``), one
:class:`~chaosp2p.protocols.transfer.lanes.Lane` per leased source and every data request in
flight. It never waits for anything: inputs are headers, payloads, aborts and time.

* **Plan.** Missing chunks are split over the lanes with the shard planner, each lane's share a
  queue of contiguous chunks. Rates come from what the lane measured, else from the cluster
  monitor's estimate, else from the mean of the others (or a flat guess): a newcomer that knows
  nothing starts on an even split.
* **Measure and re-plan.** Each lane's rate is what it delivered over the time it had work
  (:class:`~chaosp2p.protocols.transfer.lanes.RateMeter`: recent payloads, the first round trip
  left out). Once a lane's measured rate differs from the rate its plan assumed by
  ``replan_factor``, the queued chunks are re-planned (at most every ``check_interval_s``,
  ``max_replans`` times). A lane that is dropped or that joins mid-pull always triggers a re-plan.
* **Batches and pipelining.** A request asks for a run of consecutive queued chunks sized to
  about ``request_target_s`` of the lane's rate (one chunk until it is measured, at most
  ``max_chunks_per_request``). Each lane keeps about ``pipeline_target_s`` of its capacity (the
  fastest it was seen to stream) outstanding (at least :data:`MIN_DEPTH_CHUNKS`, at most
  ``max_inflight_chunks_per_source``, in at most
  ``max_requests_per_source`` requests), so the source always has the next batch queued -- even
  when the newcomer is slow to answer (a loaded machine) -- and the tail a slow lane holds at the
  end stays short.
* **Stealing.** A lane whose queue is empty takes a batch from the tail of the queue that would
  finish last, if it would finish that batch sooner.
* **End game.** When no chunk is missing or queued, an idle lane re-requests an unstarted request of
  the lane that would deliver it last, if it would deliver it sooner. The first of the two whose
  header arrives writes into staging; the other is cancelled (``CancelRequest``; a source that
  already started it has its bytes read and discarded), so no chunk ever has two writers.

Safety rule: a chunk's staging bytes are written by at most one request at a time, and never
after the chunk is verified. A dropped lane's request whose payload had started keeps its chunks
(INFLIGHT, not re-requested) until the driver reports the payload aborted or
``stall_timeout_s`` passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from chaosp2p.errors import ConfigError, TransferError
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.events import Planned, PlanReason, PullEvent, SourceProgress
from chaosp2p.protocols.transfer.lanes import Lane, Request
from chaosp2p.protocols.transfer.messages import CancelRequest, DataHeader, GetChunks, Hasher, Manifest
from chaosp2p.protocols.transfer.payload import PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.planner import ShardPlanner, SourceEstimate
from chaosp2p.protocols.transfer.transitions import CHUNK_TRANSITIONS, ChunkInput, ChunkState, advance
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message

UNKNOWN_RATE_GUESS = 100e6
"""Rate assumed for a lane when no lane has a measurement or an estimate (only its ratio matters)."""
MIN_RATE = 1.0
"""Floor for any rate handed to the planner (bytes/s)."""
FIRST_PLAN_SAMPLES = 2
"""Payloads every lane must have delivered before the first measured re-plan. A lane's first
payload says little: a loaded newcomer (staging still faulting in, its CPU shared) reads it late,
the fastest source's most of all, and a plan on that one sample gave the slow sources the fast
one's chunks (issue 24). The rate meter leaves the first payload out once it has a second."""
MIN_DEPTH_CHUNKS = 4
"""Chunks kept outstanding on any lane at least (while its rate is unknown, exactly this)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadOutcome:
    """What a finished payload did: chunks verified, and chunks whose bytes failed their hash."""

    verified: int
    corrupt: tuple[int, ...]


class ChunkScheduler:
    """Plans, requests and verifies the chunks of one snapshot (see the module docstring)."""

    def __init__(
        self,
        *,
        run: str,
        step: int,
        manifest: Manifest,
        hasher: Hasher,
        config: TransferConfig,
        planner: ShardPlanner,
        work_stealing: bool,
        new_id: Callable[[], int],
        send: Callable[[float, PeerID, Message], None],
        emit: Callable[[PullEvent], None],
    ) -> None:
        self.run = run
        self.step = step
        self.manifest = manifest
        self.config = config
        self.planner = planner
        self.work_stealing = work_stealing
        self._hasher = hasher
        self._new_id = new_id
        self._send = send
        self._emit = emit
        self.chunk_state = bytearray(manifest.chunk_count)
        self._state_counts = [manifest.chunk_count, 0, 0, 0]
        """How many chunks are in each :class:`ChunkState` (the end game needs it at every dispatch)."""
        self.started = False
        self.lanes: dict[PeerID, Lane] = {}
        self._covering: dict[int, list[int]] = {}
        """Chunk -> ids of the requests that cover it (one, or two in the end game)."""
        self._requests: dict[int, Request] = {}
        self._orphans: list[int] = []
        self._attempts: dict[int, int] = {}
        self.verified_chunks = 0
        self.verified_bytes = 0
        self.resumed_bytes = 0
        self.replans = 0
        self._last_replan: float | None = None
        self._plan_dirty: PlanReason | None = None

    # ============================================================================ setup
    def mark_verified(self, chunks: list[int]) -> None:
        """Chunks a resume record vouches for (before :meth:`start`)."""
        for chunk in chunks:
            self._chunk_to(chunk, ChunkInput.RESUME)
            self.verified_bytes += self.manifest.chunk_range(chunk)[1]
        self.verified_chunks = len(chunks)
        self.resumed_bytes = self.verified_bytes

    def add_lane(self, now: float, peer: PeerID, lease_id: int, estimate: SourceEstimate) -> None:
        """A leased source joins (at the start, or mid-pull: then the missing chunks are re-planned)."""
        self.lanes[peer] = Lane(
            peer=peer,
            lease_id=lease_id,
            latency_s=estimate.latency_s,
            prior_rate=estimate.bytes_per_s,
            last_activity=now,
        )
        if self.started:
            self._plan_dirty = PlanReason.SOURCE_ADDED

    def start(self, now: float) -> None:
        """Plan every missing chunk and send the first requests."""
        self.started = True
        if self.complete:
            return
        self._replan(now, PlanReason.INITIAL)
        self.pump(now)

    @property
    def complete(self) -> bool:
        """Every chunk verified."""
        return self.verified_chunks >= self.manifest.chunk_count

    def verified_flags(self) -> bytes:
        """One 0/1 byte per chunk."""
        return bytes(1 if s == ChunkState.VERIFIED else 0 for s in self.chunk_state)

    # ============================================================================ inputs
    def request_of(self, peer: PeerID, request_id: int) -> Request | None:
        """The outstanding request ``request_id`` of ``peer``'s lane."""
        lane = self.lanes.get(peer)
        return None if lane is None else lane.requests.get(request_id)

    def header(self, now: float, peer: PeerID, msg: DataHeader) -> PayloadSlot | str:
        """A data header arrived: where its payload goes, or why it is a protocol violation."""
        lane = self.lanes.get(peer)
        request = None if lane is None else lane.requests.get(msg.request_id)
        if lane is None or request is None or request.started:
            return f"data for unknown request {msg.request_id}"
        if msg.offset != request.offset or msg.length != request.length:
            more = " (more than asked)" if msg.length > request.length else ""
            return f"announced bytes {msg.offset}+{msg.length}, asked {request.offset}+{request.length}{more}"
        request.header_at = now
        lane.last_activity = now
        lane.meter.header(now)
        twin = self._requests.get(request.twin) if request.twin is not None else None
        if request.cancelled or (twin is not None and twin.started and not twin.discard):
            # Lost the race (or cancelled too late): read the bytes and drop them.
            self._uncover(request)
            request.discard = True
            kind = PayloadKind.DISCARD
        else:
            if twin is not None:
                self._cancel(now, twin)  # first header wins: the twin must never write these chunks
            kind = PayloadKind.DATA
        return PayloadSlot(
            source=peer, request_id=request.request_id, kind=kind, offset=request.offset, length=request.length
        )

    def payload(self, now: float, peer: PeerID, slot: PayloadSlot, data: memoryview | bytes) -> PayloadOutcome:
        """The payload of ``slot`` arrived (for DATA, ``data`` is the staging slice itself)."""
        lane = self.lanes.get(peer)
        request = None if lane is None else lane.requests.get(slot.request_id)
        if lane is None or request is None or not request.started:
            return PayloadOutcome(verified=0, corrupt=())
        self._finish(lane, request)
        lane.meter.completed(now, request.length, still_busy=bool(lane.requests))
        lane.last_activity = now
        if request.discard or slot.kind is not PayloadKind.DATA:
            return PayloadOutcome(verified=0, corrupt=())
        manifest, hasher = self.manifest, self._hasher
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        verified = 0
        corrupt = []
        for chunk in request.chunks:
            self._remove_cover(chunk, request.request_id)
            if self.chunk_state[chunk] == ChunkState.VERIFIED:
                continue
            offset, length = manifest.chunk_range(chunk)
            start = offset - request.offset
            if hasher(view[start : start + length]) == manifest.chunk_hash(chunk):
                self._chunk_to(chunk, ChunkInput.VERIFY)
                self.verified_chunks += 1
                self.verified_bytes += length
                lane.bytes_verified += length
                verified += 1
            else:
                corrupt.append(chunk)
                self._attempts[chunk] = self._attempts.get(chunk, 0) + 1
                self._lose_if_uncovered(chunk)
        if request.twin is not None:
            twin = self._requests.get(request.twin)
            if twin is not None:
                self._cancel(now, twin)
        return PayloadOutcome(verified=verified, corrupt=tuple(corrupt))

    def aborted(self, now: float, peer: PeerID, slot: PayloadSlot) -> bool:
        """The driver stopped receiving ``slot`` part-way; True if it was a request of ours."""
        lane = self.lanes.get(peer)
        request = None if lane is None else lane.requests.get(slot.request_id)
        if lane is None or request is None or not request.started:
            return False
        self._finish(lane, request)
        self._uncover(request)
        return True

    def cancelled_reply(self, peer: PeerID, request_id: int) -> bool:
        """The source skipped ``request_id`` as asked; False if we never cancelled it."""
        lane = self.lanes.get(peer)
        request = None if lane is None else lane.requests.get(request_id)
        if lane is None or request is None or not request.cancelled or request.started:
            return False
        self._finish(lane, request)
        return True

    def note_activity(self, now: float, peer: PeerID) -> None:
        """Bytes are arriving from ``peer``."""
        lane = self.lanes.get(peer)
        if lane is not None:
            lane.last_activity = now

    def attempts(self, chunk: int) -> int:
        """How many times ``chunk`` failed its hash."""
        return self._attempts.get(chunk, 0)

    def drop_lane(self, now: float, peer: PeerID) -> None:
        """Stop using ``peer``: its queue and unstarted requests go back to the pool."""
        lane = self.lanes.get(peer)
        if lane is None or not lane.active:
            return
        lane.active = False
        for chunk in lane.queue:
            self._chunk_to(chunk, ChunkInput.UNASSIGN)
            self._orphans.append(chunk)
        lane.queue.clear()
        for request in list(lane.requests.values()):
            if request.started and not request.discard:
                continue  # bytes may still be landing in its chunks: quarantined (safety rule)
            self._finish(lane, request)
            self._uncover(request)
        if any(r.started and not r.discard for r in lane.requests.values()):
            lane.quarantine_until = now + self.config.stall_timeout_s
        self._plan_dirty = PlanReason.SOURCE_DROPPED

    def release_quarantine(self, now: float) -> bool:
        """Give up on quarantined payloads whose time is up; True if any chunk was freed."""
        freed = False
        for lane in self.lanes.values():
            if lane.quarantine_until is not None and lane.quarantine_until <= now:
                lane.quarantine_until = None
                for request in list(lane.requests.values()):
                    self._finish(lane, request)
                    self._uncover(request)
                    freed = True
        return freed

    def excuse(self, now: float, delay: float) -> None:
        """The newcomer was not running for ``delay`` s: no lane is judged stalled over that time."""
        for lane in self.lanes.values():
            lane.last_activity = min(now, lane.last_activity + delay)
            if lane.quarantine_until is not None:
                lane.quarantine_until += delay

    def quarantined(self) -> bool:
        """Some dropped lane may still write into staging."""
        return any(lane.quarantine_until is not None for lane in self.lanes.values())

    # ============================================================================ timing
    def busy(self, peer: PeerID) -> bool:
        """``peer``'s lane has requests outstanding."""
        lane = self.lanes.get(peer)
        return lane is not None and bool(lane.requests)

    def stalled(self, now: float) -> list[tuple[PeerID, float]]:
        """Active lanes with requests out and no progress for ``stall_timeout_s``."""
        limit = self.config.stall_timeout_s
        return [
            (lane.peer, now - lane.last_activity)
            for lane in self.lanes.values()
            if lane.active and lane.requests and now >= lane.last_activity + limit
        ]

    def deadlines(self) -> list[float]:
        """When :meth:`stalled` or :meth:`release_quarantine` may have news."""
        times = []
        for lane in self.lanes.values():
            if lane.quarantine_until is not None:
                times.append(lane.quarantine_until)
            if lane.active and lane.requests:
                times.append(lane.last_activity + self.config.stall_timeout_s)
        return times

    # ============================================================================ scheduling
    def pump(self, now: float) -> None:
        """Re-plan if something changed, give lost chunks an owner, and fill every lane's pipeline."""
        if self.complete:
            return
        if self._plan_dirty is not None:
            reason, self._plan_dirty = self._plan_dirty, None
            self._replan(now, reason)
        else:
            self._maybe_replan_on_rates(now)
        if self._orphans:
            self._assign_orphans()
        for lane in self._active():
            self._fill(now, lane)

    def needs_source(self) -> bool:
        """Chunks are missing and no active lane can fetch them (the pull may be lost)."""
        return not self._active() and not self.complete

    def missing_chunks(self) -> int:
        """Chunks not verified yet."""
        return self.manifest.chunk_count - self.verified_chunks

    def _active(self) -> list[Lane]:
        return [lane for lane in self.lanes.values() if lane.active]

    def _rate_for_planning(self, lane: Lane) -> float:
        rate = lane.rate
        if rate is None:
            known = [r for r in (other.rate for other in self._active()) if r is not None]
            rate = sum(known) / len(known) if known else UNKNOWN_RATE_GUESS
        return max(rate, MIN_RATE)

    def _replan(self, now: float, reason: PlanReason) -> None:
        active = self._active()
        for lane in active:
            while lane.queue:
                self._chunk_to(lane.queue.pop(), ChunkInput.UNASSIGN)
        self._orphans.clear()
        todo = [i for i, s in enumerate(self.chunk_state) if s == ChunkState.MISSING]
        self._last_replan = now
        for lane in active:
            lane.planned_rate = lane.rate
        if not todo or not active:
            self._orphans = todo
            return
        manifest = self.manifest
        estimates = []
        for lane in active:
            rate = self._rate_for_planning(lane)
            # The planner's latency is when the lane can start on new work: after what it still owes.
            busy_s = lane.outstanding_bytes() / rate
            estimates.append(SourceEstimate(peer=lane.peer, bytes_per_s=rate, latency_s=lane.latency_s + busy_s))
        try:
            assignments = self.planner.plan(
                _coalesce(todo, manifest), estimates, total_bytes=manifest.total_bytes, align_bytes=manifest.chunk_bytes
            )
        except (ValueError, ConfigError) as exc:
            raise TransferError(f"shard planner failed: {exc}") from None
        by_peer = {lane.peer: lane for lane in active}
        starts = sorted((o, n, p) for p, o, n in assignments if p in by_peer and n > 0)
        fastest = max(active, key=self._rate_for_planning)
        cursor = 0
        chunk_bytes = manifest.chunk_bytes
        for chunk in todo:
            start = chunk * chunk_bytes
            while cursor < len(starts) and starts[cursor][0] + starts[cursor][1] <= start:
                cursor += 1
            covered = cursor < len(starts) and starts[cursor][0] <= start
            owner = by_peer[starts[cursor][2]] if covered else fastest  # a gap must not leave a chunk unowned
            owner.queue.append(chunk)
            self._chunk_to(chunk, ChunkInput.ASSIGN)
        self._emit(
            Planned(
                reason=reason,
                chunks=len(todo),
                shares=tuple((lane.peer, len(lane.queue)) for lane in active),
                rates=tuple((e.peer, e.bytes_per_s or 0.0) for e in estimates),
            )
        )

    def _maybe_replan_on_rates(self, now: float) -> None:
        config = self.config
        if self.replans >= config.max_replans:
            return
        if self._last_replan is not None and now - self._last_replan < config.check_interval_s:
            return
        reason = None
        for lane in self._active():
            measured = lane.meter.rate
            if measured is None or not lane.queue:
                continue
            if lane.planned_rate is None:
                reason = PlanReason.MEASURED  # first measurement: the plan was a guess
                continue
            ratio = max(measured, MIN_RATE) / max(lane.planned_rate, MIN_RATE)
            if ratio > config.replan_factor or ratio < 1.0 / config.replan_factor:
                reason = reason or PlanReason.BEHIND_PLAN
        if reason is None:
            return
        if reason is PlanReason.MEASURED and any(
            lane.meter.samples < FIRST_PLAN_SAMPLES and lane.prior_rate is None for lane in self._active() if lane.queue
        ):
            # Wait until every lane that has work has measured itself (quick: a couple of chunks each).
            return
        self.replans += 1
        self._replan(now, reason)

    def _assign_orphans(self) -> None:
        """Give chunks lost outside a re-plan to the lanes that would finish them first."""
        orphans = sorted({c for c in self._orphans if self.chunk_state[c] == ChunkState.MISSING}, reverse=True)
        self._orphans = []
        active = self._active()
        if not orphans or not active:
            self._orphans = orphans
            return
        chunk_bytes = self.manifest.chunk_bytes

        def finish(lane: Lane) -> float:
            backlog = lane.outstanding_bytes() + (len(lane.queue) + 1) * chunk_bytes
            return lane.latency_s + backlog / self._rate_for_planning(lane)

        for chunk in orphans:
            owner = min(active, key=finish)
            owner.queue.appendleft(chunk)  # first: a lost chunk holds up completion
            self._chunk_to(chunk, ChunkInput.ASSIGN)

    def _depth_chunks(self, lane: Lane) -> int:
        """Chunks to keep outstanding on ``lane``: ``pipeline_target_s`` of its rate, at least a few."""
        config = self.config
        rate = lane.depth_rate
        wanted = 0 if rate is None else math.ceil(rate * config.pipeline_target_s / self.manifest.chunk_bytes)
        return min(max(MIN_DEPTH_CHUNKS, wanted), config.max_inflight_chunks_per_source)

    def _batch_chunks(self, lane: Lane) -> int:
        config, chunk_bytes = self.config, self.manifest.chunk_bytes
        rate = lane.depth_rate
        wanted = 1 if rate is None else math.ceil(rate * config.request_target_s / chunk_bytes)
        room = self._depth_chunks(lane) - lane.outstanding_chunks()
        return max(0, min(wanted, config.max_chunks_per_request, config.max_request_bytes // chunk_bytes, room))

    def _fill(self, now: float, lane: Lane) -> None:
        config = self.config
        while lane.active and len(lane.requests) < config.max_requests_per_source:
            size = self._batch_chunks(lane)
            if size <= 0:
                return
            if not lane.queue and not (self.work_stealing and self._steal(lane, size)):
                if not (self.work_stealing and self._duplicate(now, lane)):
                    return
                continue
            first = lane.queue.popleft()
            count = 1
            while count < size and lane.queue and lane.queue[0] == first + count:
                lane.queue.popleft()
                count += 1
            self._request(now, lane, first, count)

    def _request(self, now: float, lane: Lane, first: int, count: int, *, twin: Request | None = None) -> None:
        manifest = self.manifest
        offset = manifest.chunk_range(first)[0]
        last_offset, last_length = manifest.chunk_range(first + count - 1)
        request_id = self._new_id()
        request = Request(
            request_id=request_id,
            peer=lane.peer,
            first_chunk=first,
            count=count,
            offset=offset,
            length=last_offset + last_length - offset,
            sent_at=now,
        )
        if not lane.requests:
            lane.last_activity = now
        lane.requests[request_id] = request
        self._requests[request_id] = request
        for chunk in request.chunks:
            self._chunk_to(chunk, ChunkInput.DUPLICATE if twin is not None else ChunkInput.REQUEST)
            self._covering.setdefault(chunk, []).append(request_id)
        if twin is not None:
            twin.twin, request.twin = request_id, twin.request_id
        self._send(
            now,
            lane.peer,
            GetChunks(
                request_id=request_id,
                run=self.run,
                step=self.step,
                lease_id=lane.lease_id,
                first_chunk=first,
                chunk_count=count,
            ),
        )

    def _finish_s(self, lane: Lane, extra_bytes: int = 0) -> float:
        backlog = lane.outstanding_bytes() + len(lane.queue) * self.manifest.chunk_bytes + extra_bytes
        return backlog / self._rate_for_planning(lane)

    def _steal(self, thief: Lane, size: int) -> bool:
        """Move a tail batch of the lane that would finish last to ``thief``, if it is sooner there."""
        victim = max(
            (lane for lane in self._active() if lane is not thief and lane.queue),
            key=self._finish_s,
            default=None,
        )
        if victim is None:
            return False
        tail = [victim.queue[-1]]
        while len(tail) < min(size, len(victim.queue)) and victim.queue[-1 - len(tail)] == tail[-1] - 1:
            tail.append(victim.queue[-1 - len(tail)])
        nbytes = len(tail) * self.manifest.chunk_bytes
        if thief.latency_s + self._finish_s(thief, nbytes) >= self._finish_s(victim):
            return False
        for _ in tail:
            victim.queue.pop()
        thief.queue.extend(reversed(tail))
        return True

    def _duplicate(self, now: float, thief: Lane) -> bool:
        """End game: re-request the unstarted request that would arrive last, if ``thief`` is sooner."""
        if self._state_counts[ChunkState.MISSING] or self._state_counts[ChunkState.QUEUED]:
            return False  # not the end game yet: there is still fresh work
        best: Request | None = None
        best_at = 0.0
        for lane in self._active():
            if lane is thief:
                continue
            rate = self._rate_for_planning(lane)
            ahead = 0
            for request in lane.requests.values():
                ahead += request.length
                if request.started or request.cancelled or request.twin is not None:
                    continue
                arrives = ahead / rate
                if arrives > best_at:
                    best, best_at = request, arrives
        if best is None:
            return False
        if best.count > self._depth_chunks(thief) - thief.outstanding_chunks():
            return False
        if thief.latency_s + self._finish_s(thief, best.length) >= best_at:
            return False
        self._request(now, thief, best.first_chunk, best.count, twin=best)
        return True

    # ============================================================================ bookkeeping
    def _chunk_to(self, chunk: int, event: ChunkInput) -> None:
        old = ChunkState(self.chunk_state[chunk])
        new = advance(CHUNK_TRANSITIONS, old, event, f"chunk {chunk}")
        self.chunk_state[chunk] = new
        self._state_counts[old] -= 1
        self._state_counts[new] += 1

    def _finish(self, lane: Lane, request: Request) -> None:
        """``request`` is answered (or given up): it no longer occupies the lane."""
        lane.requests.pop(request.request_id, None)
        self._requests.pop(request.request_id, None)
        if request.twin is not None:
            twin = self._requests.get(request.twin)
            if twin is not None:
                twin.twin = None
        if not any(r.started and not r.discard for r in lane.requests.values()):
            lane.quarantine_until = None

    def _cancel(self, now: float, request: Request) -> None:
        """``request`` lost the race: it stops covering its chunks; ask its source to skip it."""
        if request.cancelled:
            return
        self._uncover(request)
        if request.started:
            request.discard = True
            return
        lane = self.lanes.get(request.peer)
        if lane is not None and lane.active:
            self._send(now, request.peer, CancelRequest(request_id=request.request_id))

    def _uncover(self, request: Request) -> None:
        request.cancelled = True
        for chunk in request.chunks:
            self._remove_cover(chunk, request.request_id)
            self._lose_if_uncovered(chunk)

    def _remove_cover(self, chunk: int, request_id: int) -> None:
        covering = self._covering.get(chunk)
        if covering is not None and request_id in covering:
            covering.remove(request_id)
            if not covering:
                del self._covering[chunk]

    def _lose_if_uncovered(self, chunk: int) -> None:
        if self.chunk_state[chunk] == ChunkState.INFLIGHT and chunk not in self._covering:
            self._chunk_to(chunk, ChunkInput.LOSE)
            self._orphans.append(chunk)

    # ============================================================================ reporting
    @staticmethod
    def idle_progress(peer: PeerID, active: bool) -> SourceProgress:
        """A source with no share (yet)."""
        return SourceProgress(
            peer=peer, active=active, bytes_done=0, rate_bytes_per_s=0.0, inflight_chunks=0, queued_chunks=0
        )

    def source_progress(self, peer: PeerID, active: bool) -> SourceProgress:
        """One source's share, for progress events."""
        lane = self.lanes.get(peer)
        if lane is None:
            return self.idle_progress(peer, active)
        return SourceProgress(
            peer=peer,
            active=active,
            bytes_done=lane.bytes_verified,
            rate_bytes_per_s=lane.meter.rate or 0.0,
            inflight_chunks=lane.outstanding_chunks(),
            queued_chunks=len(lane.queue),
        )


def _coalesce(chunks: list[int], manifest: Manifest) -> list[tuple[int, int]]:
    """Sorted chunk indices -> maximal contiguous byte ranges."""
    ranges: list[tuple[int, int]] = []
    chunk_bytes, total = manifest.chunk_bytes, manifest.total_bytes
    run_start = previous = chunks[0]
    for chunk in chunks[1:]:
        if chunk != previous + 1:
            start = run_start * chunk_bytes
            ranges.append((start, min((previous + 1) * chunk_bytes, total) - start))
            run_start = chunk
        previous = chunk
    start = run_start * chunk_bytes
    ranges.append((start, min((previous + 1) * chunk_bytes, total) - start))
    return ranges
