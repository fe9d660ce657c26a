"""Newcomer side of ``/chaos/transfer/1``: pull one snapshot from several sources at once.

Theory of operation
-------------------
The machine touches no socket, clock or bulk memory: the driver feeds decoded messages, raw-payload
completions and ``now`` in, and carries messages, payload slots and events out.

States (:data:`~chaosp2p.protocols.transfer.states.PULL_TRANSITIONS`)::

    IDLE --start--> QUERYING --version chosen--> OPENING --manifest verified--> READY
    READY --start_pull--> PULLING --every chunk verified--> COMPLETED
    any non-final state --fail--> FAILED, --abort--> ABORTED

* QUERYING: ask every source which versions of the run it holds; choose the pinned step, or else
  the newest, and among sources holding it the digest group with the most sources (then the most
  bandwidth). Only sources
  in that group are used, so every byte comes from the same (run, step, manifest digest): a
  newcomer can never mix versions.
* OPENING: open a lease on each chosen source; the fastest also sends the manifest body, which must
  hash to the advertised digest and pass :func:`check_manifest`. A bad body is fetched elsewhere.
* READY: the driver allocates the staging buffer for the manifest, then calls ``start_pull``.
* PULLING: the missing chunks are planned over the sources (``ShardPlanner``, aligned to chunks);
  each source gets up to ``max_inflight_chunks_per_source`` one-chunk requests in flight. A
  ``DataHeader`` is checked against the request it answers (offset and length exactly as asked) and
  turned into a :class:`PayloadSlot`: the driver receives the raw bytes straight into that slice of
  the staging buffer and hands the same memory back to ``payload_received``, which hashes each
  chunk exactly once, on the destination bytes. A hash mismatch, a protocol violation, an error
  reply, a stall or a failure drops the source for this transfer (penalised when it misbehaved) and
  replans its unfinished chunks over the others; a source that falls behind its planned rate by
  ``behind_plan_factor`` triggers a replan with its measured rate; an idle source steals queued
  chunks from the tail of the slowest one. ``Completed`` is emitted only when every chunk is verified.

Safety rule for drivers: once a slot is handed out, the destination slice belongs to that source's
stream until the driver reports ``payload_received`` or ``payload_aborted`` for it. Chunks of a
dropped source whose payload had started stay quarantined (not re-requested) until then, or until
``stall_timeout_s`` passes, so no late write can land on a chunk after it was verified.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from chaosp2p.errors import (
    ChecksumMismatch,
    ConfigError,
    LocalProtocolError,
    RemoteProtocolError,
    TransferError,
)
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer.events import (
    Completed,
    DropReason,
    Failed,
    ManifestReady,
    PenaltyReason,
    Planned,
    PlanReason,
    PullEvent,
    ResumeDiscarded,
    SourceDropped,
    SourcePenalised,
    SourceProgress,
    TransferProgress,
)
from chaosp2p.protocols.transfer.payload import PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.planner import SchedulingPlanner, ShardPlanner, SourceEstimate
from chaosp2p.protocols.transfer.resume_record import ResumeRecord
from chaosp2p.protocols.transfer.states import (
    CHUNK_TRANSITIONS,
    PULL_FINAL,
    PULL_TRANSITIONS,
    SOURCE_GONE,
    SOURCE_TRANSITIONS,
    ChunkInput,
    ChunkState,
    PullInput,
    PullState,
    SourceInput,
    SourceState,
    advance,
)
from chaosp2p.protocols.transfer_config import TransferConfig
from chaosp2p.protocols.transfer_messages import (
    DIGEST_BYTES,
    PROTOCOL,
    DataHeader,
    ErrorReply,
    GetChunks,
    GetManifest,
    GetVersions,
    Hasher,
    Manifest,
    ManifestReply,
    ReleaseLease,
    TransferErrorCode,
    VersionInfo,
    VersionsReply,
    check_manifest,
    decode_manifest,
    hash_function,
)
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message

_MIN_RATE = 1.0
"""Floor for a measured rate handed to the planner (bytes/s); the planner needs positive rates."""
UNKNOWN_RATE_GUESS = 100e6
"""Rate assumed for a source nobody has measured yet, until its own chunks tell."""


class _Ask(enum.Enum):
    VERSIONS = "versions"
    OPEN = "open"
    RENEW = "renew"


@dataclass(slots=True)
class _Pending:
    peer: PeerID
    ask: _Ask
    wants_body: bool
    deadline: float


@dataclass(slots=True)
class _Request:
    request_id: int
    chunk: int
    offset: int
    length: int
    started: bool = False


@dataclass(slots=True)
class _Source:
    estimate: SourceEstimate
    rate: float
    status: SourceState = SourceState.QUERYING
    versions: dict[int, VersionInfo] = field(default_factory=dict)
    lease_id: int | None = None
    lease_ttl_s: float = 0.0
    last_sent: float = 0.0
    last_activity: float = 0.0
    queue: deque[int] = field(default_factory=deque)
    inflight: dict[int, _Request] = field(default_factory=dict)
    manifest_slot: PayloadSlot | None = None
    quarantine_until: float | None = None
    window_start: float = 0.0
    window_bytes: int = 0
    planned_rate: float = 0.0
    bytes_verified: int = 0
    dropped_because: str = ""

    @property
    def peer(self) -> PeerID:
        return self.estimate.peer


class PullMachine:
    """Newcomer side: pulls one snapshot from several sources (see the module docstring).

    Driver order: ``start(now)``; feed every reply to ``receive`` and every announced payload to
    ``payload_received`` (or ``payload_aborted``); after each input send ``take_outgoing()`` (a
    ``ReleaseLease`` is the last message for a dropped source), then act on ``take_events()``
    (``SourceDropped``: close that source's stream); call ``handle_timeout(now)`` at
    ``next_deadline()``. On :class:`ManifestReady` allocate staging and call ``start_pull(now)``;
    commit on :class:`Completed` only.
    """

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(
        self,
        *,
        run: str,
        sources: Sequence[SourceEstimate],
        config: TransferConfig,
        step: int | None = None,
        resume: ResumeRecord | None = None,
        planner: ShardPlanner | None = None,
        downlink_bytes_per_s: float | None = None,
        work_stealing: bool = True,
    ) -> None:
        if not 1 <= len(run) <= config.max_name_chars:
            raise ConfigError(f"run id must have 1..{config.max_name_chars} characters")
        if step is not None and step < 0:
            raise ConfigError("step must be >= 0")
        if not sources:
            raise ConfigError("a pull needs at least one source")
        if len({s.peer for s in sources}) != len(sources):
            raise ConfigError("sources must be distinct peers")
        self.run = run
        self.config = config
        self.requested_step = step
        self.resume = resume
        self.planner: ShardPlanner = planner or SchedulingPlanner(
            max_shards=config.max_shards,
            per_shard_overhead_s=config.per_shard_overhead_s,
            downlink_bytes_per_s=downlink_bytes_per_s,
        )
        self.work_stealing = work_stealing
        self.state = PullState.IDLE
        self._sources: dict[PeerID, _Source] = {
            s.peer: _Source(estimate=s, rate=s.bytes_per_s or UNKNOWN_RATE_GUESS) for s in sources
        }
        self._pending: dict[int, _Pending] = {}
        self._next_request = 1
        self._outgoing: list[Outgoing] = []
        self._events: list[PullEvent] = []
        self._chosen: VersionInfo | None = None
        self._group: list[PeerID] = []
        self._manifest: Manifest | None = None
        self._hasher: Hasher | None = None
        self._chunk_state = bytearray()
        self._attempts: dict[int, int] = {}
        self._orphans: list[int] = []
        self._verified_chunks = 0
        self._verified_bytes = 0
        self._resumed_bytes = 0
        self._replans = 0
        self._pull_started: float | None = None
        self._next_check: float | None = None
        self._last_progress: float | None = None
        self._failure: TransferError | None = None

    # ================================================================== public driver interface
    @property
    def manifest(self) -> Manifest | None:
        """The verified manifest (from READY on)."""
        return self._manifest

    @property
    def failure(self) -> TransferError | None:
        """Why the pull failed (in FAILED)."""
        return self._failure

    def start(self, now: float) -> None:
        """Ask every source which versions of the run it holds."""
        self._transition(PullInput.START)
        for src in self._sources.values():
            self._ask(now, src, GetVersions(request_id=self._new_id(), run=self.run), _Ask.VERSIONS, False)

    def start_pull(self, now: float) -> None:
        """Staging is allocated: plan the missing chunks and start requesting them."""
        self._transition(PullInput.START_PULL)
        self._pull_started = now
        self._last_progress = None
        for src in self._active():
            src.last_activity = now
        self._next_check = now + self.config.check_interval_s
        if self._check_complete(now):
            return
        self._replan(now, PlanReason.INITIAL)
        self._dispatch(now)
        self._emit_progress(now, force=True)

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> PayloadSlot | None:
        """Handle a reply from ``sender``.

        Returns a :class:`PayloadSlot` when the reply announces raw bytes we accept: receive exactly
        ``slot.length`` bytes into the slot and call :meth:`payload_received`. ``None`` otherwise;
        if the source was dropped (a :class:`SourceDropped` event), close its stream without reading.
        """
        src = self._sources.get(sender)
        if protocol != PROTOCOL or src is None or self.state in PULL_FINAL:
            return None
        if src.status in (SourceState.DROPPED, SourceState.DONE, SourceState.UNUSED):
            return None
        if isinstance(message, VersionsReply):
            self._on_versions(now, src, message)
        elif isinstance(message, ManifestReply):
            return self._on_manifest_reply(now, src, message)
        elif isinstance(message, DataHeader):
            return self._on_data_header(now, src, message)
        elif isinstance(message, ErrorReply):
            self._on_error(now, src, message)
        else:
            self._drop(
                now, src, DropReason.PROTOCOL, f"unexpected {type(message).__name__}", PenaltyReason.PROTOCOL_VIOLATION
            )
        return None

    def payload_received(self, now: float, source: PeerID, slot: PayloadSlot, data: memoryview | bytes) -> None:
        """The ``slot.length`` bytes announced by ``slot`` are in ``data``.

        For ``DATA`` slots ``data`` must be the staging slice itself: each chunk is hashed there,
        once. A chunk that fails its hash drops the source and is fetched elsewhere.
        """
        if len(data) != slot.length:
            raise LocalProtocolError(f"payload for slot of {slot.length} bytes has {len(data)} bytes")
        src = self._sources.get(source)
        if src is None or self.state in PULL_FINAL:
            return
        if slot.kind is PayloadKind.MANIFEST:
            self._on_manifest_body(now, src, slot, data)
        else:
            self._on_data(now, src, slot, data)

    def payload_aborted(self, now: float, source: PeerID, slot: PayloadSlot) -> None:
        """The driver stopped receiving ``slot`` part-way (stream closed): nothing more lands there."""
        src = self._sources.get(source)
        if src is None or self.state in PULL_FINAL:
            return
        if slot.kind is PayloadKind.MANIFEST:
            if src.manifest_slot == slot:
                src.manifest_slot = None
                self._drop(now, src, DropReason.FAILED, "manifest transfer aborted", None)
            return
        request = src.inflight.get(slot.request_id)
        if request is None or not request.started:
            return
        if src.status is SourceState.LEASED:
            self._drop(now, src, DropReason.FAILED, "payload aborted", None)
        self._release_request(src, request)
        self._after_change(now)

    def note_activity(self, now: float, source: PeerID) -> None:
        """Bytes are arriving from ``source`` (optional; keeps a slow link from looking stalled)."""
        src = self._sources.get(source)
        if src is not None:
            src.last_activity = now

    def source_failed(self, now: float, source: PeerID, detail: str = "") -> None:
        """The stream or connection to ``source`` failed (not its fault as far as we know)."""
        src = self._sources.get(source)
        if src is not None and self.state not in PULL_FINAL:
            self._drop(now, src, DropReason.FAILED, detail or "connection failed", None)

    def source_misbehaved(self, now: float, source: PeerID, error: Exception) -> None:
        """``source`` sent something undecodable or unrequested (e.g. bytes beyond a payload)."""
        src = self._sources.get(source)
        if src is not None and self.state not in PULL_FINAL:
            self._drop(now, src, DropReason.PROTOCOL, str(error), PenaltyReason.PROTOCOL_VIOLATION)

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """:class:`MessageMachine` name for :meth:`source_failed`."""
        src = self._sources.get(peer)
        if src is not None and self.state not in PULL_FINAL:
            self._drop(now, src, DropReason.FAILED, "unreachable", None, release=False)

    def abort(self, now: float) -> None:
        """Stop: release every lease; the staging buffer must not be committed."""
        if self.state in PULL_FINAL:
            return
        self._transition(PullInput.ABORT)
        self._release_all()

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`handle_timeout` has work."""
        if self.state in PULL_FINAL:
            return None
        times = [p.deadline for p in self._pending.values()]
        for src in self._sources.values():
            if src.quarantine_until is not None:
                times.append(src.quarantine_until)
            if src.status is not SourceState.LEASED:
                continue
            if self.state is PullState.PULLING and src.inflight:
                times.append(src.last_activity + self.config.stall_timeout_s)
            elif not src.inflight:
                times.append(src.last_sent + src.lease_ttl_s / 3)
        if self.state is PullState.PULLING and self._next_check is not None:
            times.append(self._next_check)
        return min(times, default=None)

    def handle_timeout(self, now: float) -> None:
        """Time out unanswered requests and stalled sources, renew leases, compare with the plan."""
        if self.state in PULL_FINAL:
            return
        for request_id, pending in list(self._pending.items()):
            if pending.deadline <= now and request_id in self._pending:
                del self._pending[request_id]
                src = self._sources[pending.peer]
                self._drop(now, src, DropReason.TIMEOUT, f"no answer to {pending.ask.value} request", None)
                if self.state in PULL_FINAL:
                    return
        for src in list(self._sources.values()):
            if src.quarantine_until is not None and src.quarantine_until <= now:
                for request in [r for r in src.inflight.values() if r.started]:
                    self._release_request(src, request)
                src.quarantine_until = None
                self._after_change(now)
                if self.state in PULL_FINAL:
                    return
            if src.status is not SourceState.LEASED:
                continue
            if (
                self.state is PullState.PULLING
                and src.inflight
                and now >= src.last_activity + self.config.stall_timeout_s
            ):
                self._drop(now, src, DropReason.STALLED, f"no progress for {now - src.last_activity:.3g}s", None)
                if self.state in PULL_FINAL:
                    return
                continue
            # Requests renew a lease; only an idle source needs an explicit renewal (one queued behind
            # payloads on a busy stream could not be answered in time anyway).
            if not src.inflight and now >= src.last_sent + src.lease_ttl_s / 3 and src.lease_id is not None:
                chosen = self._chosen
                assert chosen is not None
                renew = GetManifest(
                    request_id=self._new_id(),
                    run=self.run,
                    step=chosen.step,
                    include_manifest=False,
                    lease_id=src.lease_id,
                )
                self._ask(now, src, renew, _Ask.RENEW, False)
        if self.state is PullState.PULLING and self._next_check is not None and now >= self._next_check:
            self._next_check = now + self.config.check_interval_s
            self._check_behind_plan(now)

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the messages to send (``to`` names the source)."""
        out, self._outgoing = self._outgoing, []
        return out

    def take_events(self) -> list[PullEvent]:
        """Remove and return the events, in the order they happened."""
        out, self._events = self._events, []
        return out

    def progress(self, now: float) -> TransferProgress:
        """A progress snapshot at ``now``."""
        manifest = self._manifest
        total = manifest.total_bytes if manifest else 0
        elapsed = 0.0 if self._pull_started is None else max(0.0, now - self._pull_started)
        pulled = self._verified_bytes - self._resumed_bytes
        rate = pulled / elapsed if elapsed > 0 else 0.0
        remaining = total - self._verified_bytes
        eta = 0.0 if remaining == 0 else (remaining / rate if rate > 0 else None)
        sources = tuple(
            SourceProgress(
                peer=src.peer,
                active=src.status is SourceState.LEASED,
                bytes_done=src.bytes_verified,
                rate_bytes_per_s=src.bytes_verified / elapsed if elapsed > 0 else 0.0,
                inflight_chunks=len(src.inflight),
                queued_chunks=len(src.queue),
            )
            for src in self._sources.values()
        )
        return TransferProgress(
            run=self.run,
            step=manifest.step if manifest else (self._chosen.step if self._chosen else -1),
            bytes_done=self._verified_bytes,
            bytes_total=total,
            chunks_done=self._verified_chunks,
            chunks_total=manifest.chunk_count if manifest else 0,
            resumed_bytes=self._resumed_bytes,
            elapsed_s=elapsed,
            rate_bytes_per_s=rate,
            eta_s=eta,
            sources=sources,
        )

    def resume_record(self) -> ResumeRecord:
        """Which chunks are verified now (persist after flushing the staging buffer)."""
        manifest, chosen = self._manifest, self._chosen
        if manifest is None or chosen is None:
            raise LocalProtocolError("no manifest yet: nothing to resume")
        flags = bytes(1 if s == ChunkState.VERIFIED else 0 for s in self._chunk_state)
        return ResumeRecord(
            run=self.run,
            step=manifest.step,
            hash_algorithm=manifest.hash_algorithm,
            digest=chosen.digest,
            chunk_count=manifest.chunk_count,
            verified=ResumeRecord.bitmap(flags, manifest.chunk_count),
        )

    def is_active(self, source: PeerID) -> bool:
        """True while ``source`` is used (its replies should keep being read)."""
        src = self._sources.get(source)
        return src is not None and src.status not in (
            SourceState.DROPPED,
            SourceState.DONE,
            SourceState.UNUSED,
        )

    # ============================================================================ internals
    def _transition(self, event: PullInput) -> None:
        self.state = advance(PULL_TRANSITIONS, self.state, event, "pull")

    def _source_to(self, src: _Source, event: SourceInput) -> None:
        src.status = advance(SOURCE_TRANSITIONS, src.status, event, f"source {src.peer.short()}")

    def _chunk_to(self, chunk: int, event: ChunkInput) -> None:
        self._chunk_state[chunk] = advance(
            CHUNK_TRANSITIONS, ChunkState(self._chunk_state[chunk]), event, f"chunk {chunk}"
        )

    def _new_id(self) -> int:
        request_id = self._next_request
        self._next_request += 1
        return request_id

    def _send(self, now: float, src: _Source, message: Message) -> None:
        src.last_sent = now
        self._outgoing.append(Outgoing(to=src.peer, protocol=PROTOCOL, message=message))

    def _ask(self, now: float, src: _Source, message: Message, ask: _Ask, wants_body: bool) -> None:
        request_id = getattr(message, "request_id")  # noqa: B009 - every request type has one
        self._pending[request_id] = _Pending(src.peer, ask, wants_body, now + self.config.request_timeout_s)
        self._send(now, src, message)

    def _take_pending(self, src: _Source, request_id: int) -> _Pending | None:
        pending = self._pending.get(request_id)
        if pending is None or pending.peer != src.peer:
            return None
        del self._pending[request_id]
        return pending

    def _active(self) -> list[_Source]:
        return [s for s in self._sources.values() if s.status is SourceState.LEASED]

    def _fail(self, now: float, error: TransferError) -> None:
        if self.state in PULL_FINAL:
            return
        self._transition(PullInput.FAIL)
        self._failure = error
        self._release_all()
        self._events.append(Failed(error=error))

    def _release_all(self) -> None:
        for src in self._sources.values():
            if src.status in (SourceState.LEASED, SourceState.OPENING) and src.lease_id is not None:
                self._outgoing.append(
                    Outgoing(to=src.peer, protocol=PROTOCOL, message=ReleaseLease(lease_id=src.lease_id))
                )
            if src.status not in SOURCE_GONE:
                self._source_to(src, SourceInput.FINISH)
        self._pending.clear()

    def _drop(
        self,
        now: float,
        src: _Source,
        reason: DropReason,
        detail: str,
        penalty: PenaltyReason | None,
        *,
        release: bool = True,
    ) -> None:
        if src.status in (SourceState.DROPPED, SourceState.DONE, SourceState.UNUSED):
            return
        if release and src.lease_id is not None and src.status in (SourceState.LEASED, SourceState.OPENING):
            self._outgoing.append(Outgoing(to=src.peer, protocol=PROTOCOL, message=ReleaseLease(lease_id=src.lease_id)))
        self._source_to(src, SourceInput.SET_ASIDE if reason is DropReason.NO_VERSION else SourceInput.DROP)
        src.dropped_because = f"{reason.value}: {detail}" if detail else reason.value
        if penalty is not None:
            self._events.append(SourcePenalised(source=src.peer, reason=penalty, detail=detail))
        self._events.append(SourceDropped(source=src.peer, reason=reason, detail=detail))
        for request_id in [rid for rid, p in self._pending.items() if p.peer == src.peer]:
            del self._pending[request_id]
        src.manifest_slot = None
        for chunk in src.queue:
            if self._chunk_state[chunk] == ChunkState.QUEUED:
                self._chunk_to(chunk, ChunkInput.UNASSIGN)
        src.queue.clear()
        for request in list(src.inflight.values()):
            if not request.started:
                self._release_request(src, request)
        if src.inflight:
            # Bytes may still be landing in these slices: keep them out of reach (safety rule).
            src.quarantine_until = now + self.config.stall_timeout_s
        self._after_change(now, replan=True)

    def _release_request(self, src: _Source, request: _Request) -> None:
        src.inflight.pop(request.request_id, None)
        if self._chunk_state and self._chunk_state[request.chunk] == ChunkState.INFLIGHT:
            self._chunk_to(request.chunk, ChunkInput.LOSE)
            self._orphans.append(request.chunk)
        if not src.inflight:
            src.quarantine_until = None

    def _after_change(self, now: float, *, replan: bool = False) -> None:
        """Move the machine on after a source changed (dropped, answered, finished a payload)."""
        if self.state is PullState.QUERYING:
            self._maybe_choose(now)
        elif self.state is PullState.OPENING:
            self._advance_opening(now)
        elif self.state is PullState.READY:
            if not self._active():
                self._fail(now, TransferError(f"every source of run {self.run!r} failed before the pull began"))
        elif self.state is PullState.PULLING:
            if self._check_complete(now):
                return
            if replan:
                self._replan(now, PlanReason.SOURCE_DROPPED)
            elif self._orphans:
                self._assign_orphans(now)
            if self.state is PullState.PULLING:
                self._dispatch(now)

    # ------------------------------------------------------------------------- querying
    def _on_versions(self, now: float, src: _Source, msg: VersionsReply) -> None:
        if self._take_pending(src, msg.request_id) is None or self.state is not PullState.QUERYING:
            return
        if msg.run != self.run:
            self._drop(now, src, DropReason.PROTOCOL, "versions for another run", PenaltyReason.PROTOCOL_VIOLATION)
            return
        for info in msg.versions:
            if (
                _hash_available(info.hash_algorithm)
                and len(info.digest) == DIGEST_BYTES[info.hash_algorithm]
                and info.total_bytes <= self.config.max_state_bytes
                and info.chunk_bytes <= self.config.max_chunk_bytes
            ):
                src.versions.setdefault(info.step, info)
        self._source_to(src, SourceInput.VERSIONS)
        self._maybe_choose(now)

    def _maybe_choose(self, now: float) -> None:
        if any(p.ask is _Ask.VERSIONS for p in self._pending.values()):
            return
        answered = [s for s in self._sources.values() if s.status is SourceState.ANSWERED]
        steps = {step for s in answered for step in s.versions}
        if self.requested_step is not None:
            steps &= {self.requested_step}
        if not steps:
            which = f"step {self.requested_step}" if self.requested_step is not None else "any step"
            self._fail(now, TransferError(f"no reachable source holds run {self.run!r} at {which}"))
            return
        step = max(steps)
        groups: dict[tuple[str, bytes], list[_Source]] = {}
        for s in answered:
            info = s.versions.get(step)
            if info is not None:
                groups.setdefault((info.hash_algorithm, info.digest), []).append(s)
        key = max(
            groups,
            key=lambda k: (len(groups[k]), sum(s.rate for s in groups[k]), k[1]),
        )
        chosen_group = sorted(groups[key], key=lambda s: -s.rate)
        self._chosen = chosen_group[0].versions[step]
        try:
            self._hasher = hash_function(self._chosen.hash_algorithm)
        except ConfigError as exc:
            self._fail(now, TransferError(str(exc)))
            return
        self._transition(PullInput.VERSION_CHOSEN)
        self._group = [s.peer for s in chosen_group]
        for s in answered:
            if s not in chosen_group:
                reason = DropReason.NO_VERSION if step not in s.versions else DropReason.VERSION_MISMATCH
                self._source_to(s, SourceInput.SET_ASIDE)
                self._events.append(SourceDropped(source=s.peer, reason=reason, detail=f"step {step}"))
        for i, s in enumerate(chosen_group):
            self._source_to(s, SourceInput.CHOSEN)
            msg = GetManifest(request_id=self._new_id(), run=self.run, step=step, include_manifest=i == 0)
            self._ask(now, s, msg, _Ask.OPEN, i == 0)

    # -------------------------------------------------------------------------- opening
    def _on_manifest_reply(self, now: float, src: _Source, msg: ManifestReply) -> PayloadSlot | None:
        pending = self._take_pending(src, msg.request_id)
        chosen = self._chosen
        if pending is None or chosen is None:
            if msg.manifest_bytes:
                # The payload that follows cannot be skipped safely: the stream is lost.
                self._drop(now, src, DropReason.PROTOCOL, "unrequested manifest body", PenaltyReason.PROTOCOL_VIOLATION)
            return None
        if msg.hash_algorithm != chosen.hash_algorithm or msg.digest != chosen.digest:
            self._drop(now, src, DropReason.VERSION_MISMATCH, "snapshot changed since its version list", None)
            return None
        if pending.ask is _Ask.RENEW and msg.lease_id != src.lease_id:
            self._drop(
                now, src, DropReason.PROTOCOL, "renewal answered with another lease", PenaltyReason.PROTOCOL_VIOLATION
            )
            return None
        if src.status is SourceState.OPENING:
            self._source_to(src, SourceInput.LEASE_GRANTED)
            src.last_activity = now
        src.lease_id = msg.lease_id
        src.lease_ttl_s = msg.lease_ttl_s
        if pending.wants_body:
            if not 1 <= msg.manifest_bytes <= self.config.max_manifest_bytes:
                self._drop(
                    now,
                    src,
                    DropReason.PROTOCOL,
                    f"manifest of {msg.manifest_bytes} bytes (limit {self.config.max_manifest_bytes})",
                    PenaltyReason.BAD_MANIFEST,
                )
                return None
            slot = PayloadSlot(
                source=src.peer,
                request_id=msg.request_id,
                kind=PayloadKind.MANIFEST,
                offset=0,
                length=msg.manifest_bytes,
            )
            src.manifest_slot = slot
            return slot
        if msg.manifest_bytes:
            self._drop(now, src, DropReason.PROTOCOL, "unrequested manifest body", PenaltyReason.PROTOCOL_VIOLATION)
            return None
        self._after_change(now)
        return None

    def _on_manifest_body(self, now: float, src: _Source, slot: PayloadSlot, data: memoryview | bytes) -> None:
        if src.manifest_slot != slot:
            return
        src.manifest_slot = None
        if self.state is not PullState.OPENING or self._manifest is not None:
            return
        chosen, hasher = self._chosen, self._hasher
        assert chosen is not None and hasher is not None
        if hasher(data) != chosen.digest:
            self._drop(now, src, DropReason.CORRUPT, "manifest does not match its digest", PenaltyReason.BAD_MANIFEST)
            return
        try:
            manifest = decode_manifest(data, max_bytes=self.config.max_manifest_bytes)
            check_manifest(manifest, self.config)
            if (manifest.run, manifest.step) != (self.run, chosen.step):
                raise RemoteProtocolError("manifest is for another snapshot")
            if (
                manifest.hash_algorithm != chosen.hash_algorithm
                or manifest.total_bytes != chosen.total_bytes
                or manifest.chunk_bytes != chosen.chunk_bytes
            ):
                raise RemoteProtocolError("manifest disagrees with the advertised version")
        except RemoteProtocolError as exc:
            self._drop(now, src, DropReason.PROTOCOL, str(exc), PenaltyReason.BAD_MANIFEST)
            return
        self._manifest = manifest
        self._chunk_state = bytearray(manifest.chunk_count)
        self._advance_opening(now)

    def _advance_opening(self, now: float) -> None:
        group = [self._sources[p] for p in self._group]
        if self._manifest is None:
            if any(s.manifest_slot is not None for s in group):
                return
            if any(p.wants_body for p in self._pending.values()):
                return
            leased = [s for s in group if s.status is SourceState.LEASED]
            if leased:
                src = leased[0]
                chosen = self._chosen
                assert chosen is not None and src.lease_id is not None
                msg = GetManifest(
                    request_id=self._new_id(),
                    run=self.run,
                    step=chosen.step,
                    include_manifest=True,
                    lease_id=src.lease_id,
                )
                self._ask(now, src, msg, _Ask.RENEW, True)
                return
            if not any(s.status is SourceState.OPENING for s in group):
                self._fail(now, TransferError(f"no source supplied a valid manifest for run {self.run!r}"))
            return
        if any(s.status is SourceState.OPENING for s in group):
            return
        leased = [s for s in group if s.status is SourceState.LEASED]
        if not leased:
            self._fail(now, TransferError(f"every source of run {self.run!r} failed before the pull began"))
            return
        self._transition(PullInput.MANIFEST_ACCEPTED)
        resumed = self._apply_resume()
        self._events.append(
            ManifestReady(
                manifest=self._manifest,
                digest=self._chosen.digest if self._chosen else b"",
                sources=tuple(s.peer for s in leased),
                resumed_chunks=resumed,
            )
        )

    def _apply_resume(self) -> int:
        record, manifest, chosen = self.resume, self._manifest, self._chosen
        if record is None or manifest is None or chosen is None:
            return 0
        expected = (self.run, manifest.step, manifest.hash_algorithm, chosen.digest, manifest.chunk_count)
        actual = (record.run, record.step, record.hash_algorithm, record.digest, record.chunk_count)
        if expected != actual or len(record.verified) != -(-manifest.chunk_count // 8):
            self._events.append(ResumeDiscarded(reason="the resume record is for another snapshot"))
            return 0
        chunks = record.verified_chunks()
        for chunk in chunks:
            self._chunk_to(chunk, ChunkInput.RESUME)
            self._verified_bytes += manifest.chunk_range(chunk)[1]
        self._verified_chunks = len(chunks)
        self._resumed_bytes = self._verified_bytes
        return len(chunks)

    # -------------------------------------------------------------------------- pulling
    def _on_data_header(self, now: float, src: _Source, msg: DataHeader) -> PayloadSlot | None:
        request = src.inflight.get(msg.request_id) if self.state is PullState.PULLING else None
        if request is None or request.started or src.status is not SourceState.LEASED:
            self._drop(
                now,
                src,
                DropReason.PROTOCOL,
                f"data for unknown request {msg.request_id}",
                PenaltyReason.PROTOCOL_VIOLATION,
            )
            return None
        if msg.offset != request.offset or msg.length != request.length:
            more = " (more than asked)" if msg.length > request.length else ""
            self._drop(
                now,
                src,
                DropReason.PROTOCOL,
                f"announced bytes {msg.offset}+{msg.length}, asked {request.offset}+{request.length}{more}",
                PenaltyReason.PROTOCOL_VIOLATION,
            )
            return None
        request.started = True
        src.last_activity = now
        return PayloadSlot(
            source=src.peer,
            request_id=request.request_id,
            kind=PayloadKind.DATA,
            offset=request.offset,
            length=request.length,
        )

    def _on_data(self, now: float, src: _Source, slot: PayloadSlot, data: memoryview | bytes) -> None:
        request = src.inflight.get(slot.request_id)
        manifest, hasher = self._manifest, self._hasher
        if request is None or not request.started or manifest is None or hasher is None:
            return
        del src.inflight[slot.request_id]
        if not src.inflight:
            src.quarantine_until = None
        chunk = request.chunk
        if self._chunk_state[chunk] == ChunkState.VERIFIED:
            self._after_change(now)
            return
        if hasher(data) == manifest.chunk_hash(chunk):
            self._chunk_to(chunk, ChunkInput.VERIFY)
            self._verified_chunks += 1
            self._verified_bytes += request.length
            src.bytes_verified += request.length
            src.window_bytes += request.length
            src.last_activity = now
            if not self._check_complete(now):
                self._emit_progress(now)
                self._dispatch(now)
            return
        self._chunk_to(chunk, ChunkInput.LOSE)
        self._orphans.append(chunk)
        attempts = self._attempts[chunk] = self._attempts.get(chunk, 0) + 1
        detail = f"chunk {chunk} failed its {manifest.hash_algorithm} check"
        if attempts >= self.config.max_chunk_retries:
            self._events.append(SourcePenalised(source=src.peer, reason=PenaltyReason.CORRUPT_DATA, detail=detail))
            self._fail(now, ChecksumMismatch(f"{detail} {attempts} times; giving up"))
        elif src.status is SourceState.LEASED:
            self._drop(now, src, DropReason.CORRUPT, detail, PenaltyReason.CORRUPT_DATA)
        else:
            self._after_change(now)

    def _check_complete(self, now: float) -> bool:
        manifest = self._manifest
        if manifest is None or self._verified_chunks < manifest.chunk_count:
            return False
        self._transition(PullInput.ALL_VERIFIED)
        self._emit_progress(now, force=True)
        self._release_all()
        self._events.append(
            Completed(
                run=self.run,
                step=manifest.step,
                digest=self._chosen.digest if self._chosen else b"",
                manifest=manifest,
                elapsed_s=0.0 if self._pull_started is None else max(0.0, now - self._pull_started),
                bytes_by_source=tuple((s.peer, s.bytes_verified) for s in self._sources.values()),
            )
        )
        return True

    def _replan(self, now: float, reason: PlanReason) -> None:
        manifest = self._manifest
        assert manifest is not None
        active = self._active()
        self._orphans.clear()
        for src in active:
            src.queue.clear()
        states = self._chunk_state
        for i, s in enumerate(states):
            if s == ChunkState.QUEUED:
                self._chunk_to(i, ChunkInput.UNASSIGN)
        todo = [i for i, s in enumerate(states) if s == ChunkState.MISSING]
        if not todo:
            return
        if not active:
            self._orphans = todo
            self._fail_unless_quarantined(now)
            return
        ranges = _coalesce(todo, manifest)
        estimates = [
            SourceEstimate(peer=s.peer, bytes_per_s=max(s.rate, _MIN_RATE), latency_s=s.estimate.latency_s)
            for s in active
        ]
        try:
            assignments = self.planner.plan(
                ranges, estimates, total_bytes=manifest.total_bytes, align_bytes=manifest.chunk_bytes
            )
        except (ValueError, ConfigError) as exc:
            self._fail(now, TransferError(f"shard planner failed: {exc}"))
            return
        by_peer = {s.peer: s for s in active}
        starts = sorted(
            (offset, length, peer) for peer, offset, length in assignments if peer in by_peer and length > 0
        )
        cursor = 0
        chunk_bytes = manifest.chunk_bytes
        fastest = max(active, key=lambda s: s.rate)
        for chunk in todo:
            start = chunk * chunk_bytes
            while cursor < len(starts) and starts[cursor][0] + starts[cursor][1] <= start:
                cursor += 1
            covered = cursor < len(starts) and starts[cursor][0] <= start
            # A gap in the plan must not leave a chunk unowned: give it to the fastest source.
            owner = by_peer[starts[cursor][2]] if covered else fastest
            owner.queue.append(chunk)
            self._chunk_to(chunk, ChunkInput.ASSIGN)
        for src in active:
            src.window_start = now
            src.window_bytes = 0
            src.planned_rate = src.rate
        self._events.append(
            Planned(reason=reason, chunks=len(todo), shares=tuple((s.peer, len(s.queue)) for s in active))
        )

    def _fail_unless_quarantined(self, now: float) -> None:
        # Quarantined payloads may still verify their chunks; only give up once they are settled.
        if not any(s.quarantine_until is not None for s in self._sources.values()):
            missing = sum(1 for state in self._chunk_state if state != ChunkState.VERIFIED)
            why = "; ".join(
                f"{src.peer.short()} {src.dropped_because}" for src in self._sources.values() if src.dropped_because
            )
            self._fail(now, TransferError(f"all sources failed with {missing} chunks missing ({why})"))

    def _assign_orphans(self, now: float) -> None:
        """Give chunks freed outside a replan to the sources that would finish them first."""
        manifest = self._manifest
        assert manifest is not None
        orphans = sorted({c for c in self._orphans if self._chunk_state[c] == ChunkState.MISSING}, reverse=True)
        self._orphans = []
        if not orphans:
            return
        active = self._active()
        if not active:
            self._orphans = orphans
            self._fail_unless_quarantined(now)
            return
        chunk_bytes = manifest.chunk_bytes

        def finish(src: _Source) -> float:
            backlog = len(src.queue) + len(src.inflight) + 1
            return src.estimate.latency_s + backlog * chunk_bytes / max(src.rate, _MIN_RATE)

        for chunk in orphans:
            owner = min(active, key=finish)
            owner.queue.appendleft(chunk)  # first: a lost chunk holds up completion
            self._chunk_to(chunk, ChunkInput.ASSIGN)

    def _dispatch(self, now: float) -> None:
        manifest = self._manifest
        chosen = self._chosen
        assert manifest is not None and chosen is not None
        cap = self.config.max_inflight_chunks_per_source
        for src in self._active():
            while len(src.inflight) < cap:
                if not src.queue and not (self.work_stealing and self._steal(src)):
                    break
                chunk = src.queue.popleft()
                offset, length = manifest.chunk_range(chunk)
                request_id = self._new_id()
                if not src.inflight:
                    src.last_activity = now
                src.inflight[request_id] = _Request(request_id, chunk, offset, length)
                self._chunk_to(chunk, ChunkInput.REQUEST)
                assert src.lease_id is not None
                self._send(
                    now,
                    src,
                    GetChunks(
                        request_id=request_id,
                        run=self.run,
                        step=chosen.step,
                        lease_id=src.lease_id,
                        first_chunk=chunk,
                        chunk_count=1,
                    ),
                )

    def _steal(self, thief: _Source) -> bool:
        """Move the last queued chunk of the source that would reach it latest, if ``thief`` is sooner."""
        manifest = self._manifest
        assert manifest is not None
        chunk_bytes = manifest.chunk_bytes
        best: _Source | None = None
        best_finish = 0.0
        for src in self._active():
            if src is thief or len(src.queue) < 2:
                continue
            finish = (len(src.queue) + len(src.inflight)) * chunk_bytes / max(src.rate, _MIN_RATE)
            if finish > best_finish:
                best, best_finish = src, finish
        if best is None:
            return False
        thief_finish = thief.estimate.latency_s + (len(thief.inflight) + 1) * chunk_bytes / max(thief.rate, _MIN_RATE)
        if thief_finish >= best_finish:
            return False
        thief.queue.append(best.queue.pop())
        return True

    def _check_behind_plan(self, now: float) -> None:
        if self._replans >= self.config.max_replans:
            return
        manifest = self._manifest
        assert manifest is not None
        behind = []
        for src in self._active():
            elapsed = now - src.window_start
            if not src.queue or elapsed < self.config.behind_plan_min_s:
                continue
            promised = src.planned_rate * max(0.0, elapsed - src.estimate.latency_s)
            if (src.window_bytes + manifest.chunk_bytes) * self.config.behind_plan_factor < promised:
                behind.append((src, src.window_bytes / elapsed))
        if not behind:
            return
        for src, measured in behind:
            src.rate = max(measured, _MIN_RATE)
        self._replans += 1
        self._replan(now, PlanReason.BEHIND_PLAN)
        self._dispatch(now)

    def _emit_progress(self, now: float, *, force: bool = False) -> None:
        if (
            not force
            and self._last_progress is not None
            and now - self._last_progress < self.config.progress_interval_s
        ):
            return
        self._last_progress = now
        self._events.append(self.progress(now))

    def _on_error(self, now: float, src: _Source, msg: ErrorReply) -> None:
        pending = self._take_pending(src, msg.request_id)
        if pending is not None and pending.ask is _Ask.VERSIONS:
            if msg.code in (TransferErrorCode.UNKNOWN_RUN, TransferErrorCode.UNKNOWN_VERSION):
                self._drop(now, src, DropReason.NO_VERSION, f"source does not hold run {self.run!r}", None)
            else:
                self._drop(now, src, DropReason.REFUSED, f"{msg.code.name}: {msg.detail}", None)
            return
        if pending is None and msg.request_id not in src.inflight:
            return  # a late answer to something already settled
        self._drop(now, src, DropReason.REFUSED, f"{msg.code.name}: {msg.detail}", None)


def _hash_available(algorithm: str) -> bool:
    """Known and installed (``blake3`` is optional): versions we cannot verify are ignored."""
    if algorithm not in DIGEST_BYTES:
        return False
    try:
        hash_function(algorithm)
    except ConfigError:
        return False
    return True


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
