"""Newcomer side of ``/chaos/transfer/1``: pull one snapshot from several sources at once.

Theory of operation
-------------------
The machine touches no socket, clock or bulk memory: the driver feeds decoded messages, raw-payload
completions and ``now`` in, and carries messages, payload slots and events out.

States (:data:`~chaosp2p.protocols.transfer.states.PULL_TRANSITIONS`)::

    IDLE --start--> QUERYING --version chosen--> OPENING --manifest verified--> READY
    READY --start_pull--> PULLING --every chunk verified--> COMPLETED
    any non-final state --fail--> FAILED, --abort--> ABORTED

* QUERYING: ask every source which versions of the run it holds, then vote
  (:mod:`.selection`): the ``(step, digest)`` most sources hold wins (a pinned step, digest or set
  of trusted sources narrows the vote), and a source offering something that contradicts the
  winner is reported (``SourceDropped``, reason ``CONFLICT``) and never used. Every byte then comes
  from the same (run, step, digest): a newcomer can never mix versions.
* OPENING: open a lease on each source holding the winner; the best-known one also sends the
  manifest body, which must hash to the digest and decode within the configured limits (counts are
  checked as it is decoded). A bad body is fetched elsewhere.
* READY: the driver allocates the staging buffer for the manifest, then calls ``start_pull``.
* PULLING: the :class:`~chaosp2p.protocols.transfer.scheduler.ChunkScheduler` plans, measures,
  re-plans, batches, steals and plays the end game (see there). A ``DataHeader`` is checked against
  the request it answers and turned into a :class:`PayloadSlot`; the driver receives the raw bytes
  straight into that slice of the staging buffer and hands the same memory back to
  ``payload_received``, which hashes each chunk exactly once, on the destination bytes. A hash
  mismatch, a protocol violation, an error reply, a stall or a failure drops the source for this
  transfer (penalised when it misbehaved) and re-plans its unfinished chunks over the others.
  ``Completed`` is emitted only when every chunk is verified.

Sources may be added at any time before the end (``add_source``): one that joins after the vote is
asked for its versions and used only if it holds exactly the chosen snapshot.

Per source (:data:`~chaosp2p.protocols.transfer.states.SOURCE_TRANSITIONS`)::

    QUERYING --versions--> ANSWERED --chosen--> OPENING --lease granted--> LEASED
    QUERYING/ANSWERED/OPENING/LEASED --set aside--> UNUSED, --drop--> DROPPED, --finish--> DONE

Safety rule for drivers: once a slot is handed out, the destination slice belongs to that source's
stream until the driver reports ``payload_received`` or ``payload_aborted`` for it. Chunks of a
dropped source whose payload had started stay quarantined (not re-requested) until then, or until
``stall_timeout_s`` passes, so no late write can land on a chunk after it was verified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chaosp2p.errors import (
    ChecksumMismatch,
    ConfigError,
    LocalProtocolError,
    RemoteProtocolError,
    TransferError,
)
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer.acceptance import ManifestDigestMismatch, accept_manifest, usable_versions
from chaosp2p.protocols.transfer.events import (
    Completed,
    DropReason,
    Failed,
    ManifestReady,
    PenaltyReason,
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
from chaosp2p.protocols.transfer.scheduler import ChunkScheduler
from chaosp2p.protocols.transfer.selection import choose_version, describe_conflict, late_conflict, nothing_eligible
from chaosp2p.protocols.transfer.sources import Ask, SourceBook, SourceRecord
from chaosp2p.protocols.transfer.states import (
    PULL_FINAL,
    PULL_TRANSITIONS,
    SOURCE_GONE,
    PullInput,
    PullState,
    SourceInput,
    SourceState,
    advance,
)
from chaosp2p.protocols.transfer_config import TransferConfig
from chaosp2p.protocols.transfer_messages import (
    MANIFEST_DIGEST_BYTES,
    PROTOCOL,
    DataHeader,
    ErrorReply,
    GetManifest,
    GetVersions,
    Hasher,
    Manifest,
    ManifestReply,
    TransferErrorCode,
    VersionInfo,
    VersionsReply,
    hash_function,
)
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class PullMachine:
    """Newcomer side: pulls one snapshot from several sources (see the module docstring).

    Driver order: ``start(now)``; feed every reply to ``receive`` and every announced payload to
    ``payload_received`` (or ``payload_aborted``); after each input send ``take_outgoing()`` (a
    ``ReleaseLease`` is the last message for a dropped source), then act on ``take_events()``
    (``SourceDropped``: close that source's stream); call ``handle_timeout(now)`` at
    ``next_deadline()``. On :class:`ManifestReady` allocate staging and call ``start_pull(now)``;
    commit on :class:`Completed` only.

    ``step`` and ``digest`` pin the snapshot; ``trusted`` limits the vote to versions those
    sources hold (other sources still serve chunks of it). ``max_staging_bytes`` is what the
    driver can stage (free memory or disk): a larger snapshot fails the pull before anything is
    allocated for it.
    """

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(
        self,
        *,
        run: str,
        sources: Sequence[SourceEstimate],
        config: TransferConfig,
        step: int | None = None,
        digest: bytes | None = None,
        trusted: frozenset[PeerID] = frozenset(),
        resume: ResumeRecord | None = None,
        planner: ShardPlanner | None = None,
        downlink_bytes_per_s: float | None = None,
        work_stealing: bool = True,
        max_staging_bytes: int | None = None,
    ) -> None:
        if not 1 <= len(run) <= config.max_name_chars:
            raise ConfigError(f"run id must have 1..{config.max_name_chars} characters")
        if step is not None and step < 0:
            raise ConfigError("step must be >= 0")
        if digest is not None and len(digest) != MANIFEST_DIGEST_BYTES:
            raise ConfigError(f"a snapshot digest has {MANIFEST_DIGEST_BYTES} bytes (got {len(digest)})")
        if not sources:
            raise ConfigError("a pull needs at least one source")
        if len({s.peer for s in sources}) != len(sources):
            raise ConfigError("sources must be distinct peers")
        self.run = run
        self.config = config
        self.requested_step = step
        self.requested_digest = digest
        self.trusted = trusted
        self.resume = resume
        self.max_staging_bytes = max_staging_bytes
        self.planner: ShardPlanner = planner or SchedulingPlanner(
            max_shards=config.max_shards,
            per_shard_overhead_s=config.per_shard_overhead_s,
            downlink_bytes_per_s=downlink_bytes_per_s,
        )
        self.work_stealing = work_stealing
        self.state = PullState.IDLE
        self._book = SourceBook(config.request_timeout_s)
        self._sources = self._book.records
        for estimate in sources:
            self._book.add(estimate)
        self._events: list[PullEvent] = []
        self._chosen: VersionInfo | None = None
        self._manifest: Manifest | None = None
        self._hasher: Hasher | None = None
        self._scheduler: ChunkScheduler | None = None
        self._resumed: list[int] = []
        self._pull_started: float | None = None
        self._next_check: float | None = None
        self._last_progress: float | None = None
        self._failure: TransferError | None = None
        self._promised: float | None = None

    # ================================================================== public driver interface
    @property
    def manifest(self) -> Manifest | None:
        """The verified manifest (from READY on)."""
        return self._manifest

    @property
    def chosen(self) -> VersionInfo | None:
        """The snapshot being pulled (from OPENING on)."""
        return self._chosen

    @property
    def failure(self) -> TransferError | None:
        """Why the pull failed (in FAILED)."""
        return self._failure

    def start(self, now: float) -> None:
        """Ask every source which versions of the run it holds."""
        self._transition(PullInput.START)
        for src in self._sources.values():
            self._book.ask(now, src, GetVersions(request_id=self._book.new_id(), run=self.run), Ask.VERSIONS, False)

    def add_source(self, now: float, source: SourceEstimate) -> bool:
        """Use one more source (found mid-pull); False if it is known already or the pull is over."""
        if self.state in PULL_FINAL or source.peer in self._sources:
            return False
        src = self._book.add(source)
        if self.state is not PullState.IDLE:
            self._book.ask(now, src, GetVersions(request_id=self._book.new_id(), run=self.run), Ask.VERSIONS, False)
        return True

    def start_pull(self, now: float) -> None:
        """Staging is allocated: plan the missing chunks and start requesting them."""
        manifest, chosen, hasher = self._manifest, self._chosen, self._hasher
        if manifest is None or chosen is None or hasher is None:
            raise LocalProtocolError(f"start_pull is not allowed in state {self.state.value}")
        self._transition(PullInput.START_PULL)
        self._pull_started = now
        self._last_progress = None
        scheduler = self._scheduler = ChunkScheduler(
            run=self.run,
            step=chosen.step,
            manifest=manifest,
            hasher=hasher,
            config=self.config,
            planner=self.planner,
            work_stealing=self.work_stealing,
            new_id=self._book.new_id,
            send=lambda at, peer, message: self._book.send(at, self._sources[peer], message),
            emit=lambda event: self._events.append(event),
        )
        scheduler.mark_verified(self._resumed)
        for src in self._active():
            assert src.lease_id is not None
            scheduler.add_lane(now, src.peer, src.lease_id, src.estimate)
        self._next_check = now + self.config.check_interval_s
        if self._check_complete(now):
            return
        self._schedule(now, lambda: scheduler.start(now))
        self._emit_progress(now, force=True)

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> PayloadSlot | None:
        """Handle a reply from ``sender``.

        Returns a :class:`PayloadSlot` when the reply announces raw bytes: receive exactly
        ``slot.length`` bytes into the slot (or, for ``DISCARD``, read and drop them) and call
        :meth:`payload_received`. ``None`` otherwise; if the source was dropped (a
        :class:`SourceDropped` event), close its stream without reading.
        """
        src = self._sources.get(sender)
        if protocol != PROTOCOL or src is None or self.state in PULL_FINAL or src.status in SOURCE_GONE:
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
        once. A chunk that fails its hash drops the source and is fetched elsewhere. For
        ``DISCARD`` slots ``data`` is ignored (pass ``b""``: the bytes were read and dropped).
        """
        if slot.kind is not PayloadKind.DISCARD and len(data) != slot.length:
            raise LocalProtocolError(f"payload for slot of {slot.length} bytes has {len(data)} bytes")
        src = self._sources.get(source)
        if src is None or self.state in PULL_FINAL:
            return
        src.last_activity = now
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
        scheduler = self._scheduler
        if scheduler is None or not scheduler.aborted(now, source, slot):
            return
        if src.status is SourceState.LEASED:
            self._drop(now, src, DropReason.FAILED, "payload aborted", None)
        else:
            self._after_change(now)

    def note_activity(self, now: float, source: PeerID) -> None:
        """Bytes are arriving from ``source`` (optional; keeps a slow link from looking stalled)."""
        src = self._sources.get(source)
        if src is not None:
            src.last_activity = now
            if self._scheduler is not None:
                self._scheduler.note_activity(now, source)

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
        times = [p.deadline for p in self._book.pending.values()]
        scheduler = self._scheduler
        if scheduler is not None:
            times.extend(scheduler.deadlines())
        for src in self._sources.values():
            if src.status is SourceState.LEASED and not (scheduler is not None and scheduler.busy(src.peer)):
                times.append(src.last_sent + src.lease_ttl_s / 3)
        if self.state is PullState.PULLING and self._next_check is not None:
            times.append(self._next_check)
        self._promised = min(times, default=None)
        return self._promised

    def handle_timeout(self, now: float) -> None:
        """Time out unanswered requests and stalled sources, renew leases, check measured rates.

        If this call comes well after the deadline :meth:`next_deadline` promised, the newcomer
        itself was not running (an overloaded machine): that time is not held against any source.
        """
        if self.state in PULL_FINAL:
            return
        late = 0.0 if self._promised is None else now - self._promised
        if late > self.config.check_interval_s:
            for pending in self._book.pending.values():
                pending.deadline += late
            if self._scheduler is not None:
                self._scheduler.excuse(now, late)
        for request_id, pending in list(self._book.pending.items()):
            if pending.deadline <= now and request_id in self._book.pending:
                del self._book.pending[request_id]
                src = self._sources[pending.peer]
                self._drop(now, src, DropReason.TIMEOUT, f"no answer to {pending.ask.value} request", None)
                if self.state in PULL_FINAL:
                    return
        scheduler = self._scheduler
        if scheduler is not None:
            if scheduler.release_quarantine(now):
                self._after_change(now)
                if self.state in PULL_FINAL:
                    return
            for peer, idle_s in scheduler.stalled(now):
                src = self._sources[peer]
                if src.status is SourceState.LEASED:
                    self._drop(now, src, DropReason.STALLED, f"no progress for {idle_s:.3g}s", None)
                    if self.state in PULL_FINAL:
                        return
        for src in list(self._sources.values()):
            # Requests renew a lease; only an idle source needs an explicit renewal (one queued behind
            # payloads on a busy stream could not be answered in time anyway).
            if src.status is not SourceState.LEASED or (scheduler is not None and scheduler.busy(src.peer)):
                continue
            if now >= src.last_sent + src.lease_ttl_s / 3 and src.lease_id is not None:
                chosen = self._chosen
                assert chosen is not None
                renew = GetManifest(
                    request_id=self._book.new_id(),
                    run=self.run,
                    step=chosen.step,
                    include_manifest=False,
                    lease_id=src.lease_id,
                )
                self._book.ask(now, src, renew, Ask.RENEW, False)
        if self.state is PullState.PULLING and self._next_check is not None and now >= self._next_check:
            self._next_check = now + self.config.check_interval_s
            self._after_change(now)

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return the messages to send (``to`` names the source)."""
        return self._book.take_outgoing()

    def take_events(self) -> list[PullEvent]:
        """Remove and return the events, in the order they happened."""
        out, self._events = self._events, []
        return out

    def progress(self, now: float) -> TransferProgress:
        """A progress snapshot at ``now``."""
        manifest, scheduler = self._manifest, self._scheduler
        total = manifest.total_bytes if manifest else 0
        done = scheduler.verified_bytes if scheduler else 0
        resumed = scheduler.resumed_bytes if scheduler else 0
        elapsed = 0.0 if self._pull_started is None else max(0.0, now - self._pull_started)
        rate = (done - resumed) / elapsed if elapsed > 0 else 0.0
        remaining = total - done
        eta = 0.0 if remaining == 0 else (remaining / rate if rate > 0 else None)
        sources = tuple(
            self._source_progress(src) for src in self._sources.values() if src.status is not SourceState.UNUSED
        )
        return TransferProgress(
            run=self.run,
            step=manifest.step if manifest else (self._chosen.step if self._chosen else -1),
            bytes_done=done,
            bytes_total=total,
            chunks_done=scheduler.verified_chunks if scheduler else 0,
            chunks_total=manifest.chunk_count if manifest else 0,
            resumed_bytes=resumed,
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
        if self._scheduler is not None:
            flags = bytearray(self._scheduler.verified_flags())
        else:
            flags = bytearray(manifest.chunk_count)
            for chunk in self._resumed:
                flags[chunk] = 1
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
        return src is not None and src.status not in SOURCE_GONE

    # ============================================================================ internals
    def _transition(self, event: PullInput) -> None:
        self.state = advance(PULL_TRANSITIONS, self.state, event, "pull")

    def _active(self) -> list[SourceRecord]:
        return self._book.in_state(SourceState.LEASED)

    def _schedule(self, now: float, action: Callable[[], None]) -> None:
        """Run a scheduler step; a planner failure fails the pull."""
        try:
            action()
        except TransferError as exc:
            self._fail(now, exc)

    def _fail(self, now: float, error: TransferError) -> None:
        if self.state in PULL_FINAL:
            return
        self._transition(PullInput.FAIL)
        self._failure = error
        self._release_all()
        self._events.append(Failed(error=error))

    def _release_all(self) -> None:
        for src in self._sources.values():
            self._book.release(src)
            if src.status not in SOURCE_GONE:
                self._book.move(src, SourceInput.FINISH)
        self._book.pending.clear()

    def _drop(
        self,
        now: float,
        src: SourceRecord,
        reason: DropReason,
        detail: str,
        penalty: PenaltyReason | None,
        *,
        release: bool = True,
    ) -> None:
        if src.status in SOURCE_GONE:
            return
        if release:
            self._book.release(src)
        self._book.move(src, SourceInput.SET_ASIDE if reason is DropReason.NO_VERSION else SourceInput.DROP)
        src.dropped_because = f"{reason.value}: {detail}" if detail else reason.value
        if penalty is not None:
            self._events.append(SourcePenalised(source=src.peer, reason=penalty, detail=detail))
        self._events.append(SourceDropped(source=src.peer, reason=reason, detail=detail))
        self._book.forget(src.peer)
        src.manifest_slot = None
        if self._scheduler is not None:
            self._scheduler.drop_lane(now, src.peer)
        self._after_change(now)

    def _after_change(self, now: float) -> None:
        """Move the machine on after a source changed (dropped, answered, finished a payload)."""
        if self.state is PullState.QUERYING:
            self._maybe_choose(now)
        elif self.state is PullState.OPENING:
            self._advance_opening(now)
        elif self.state is PullState.READY:
            if not self._active():
                self._fail(now, TransferError(f"every source of run {self.run!r} failed before the pull began"))
        elif self.state is PullState.PULLING:
            scheduler = self._scheduler
            assert scheduler is not None
            if self._check_complete(now):
                return
            self._schedule(now, lambda: scheduler.pump(now))
            if self.state is PullState.PULLING and scheduler.needs_source() and not scheduler.quarantined():
                self._fail_all_sources_gone(now)

    def _fail_all_sources_gone(self, now: float) -> None:
        scheduler = self._scheduler
        if any(
            s.status in (SourceState.QUERYING, SourceState.ANSWERED, SourceState.OPENING)
            for s in self._sources.values()
        ):
            return  # a late source may still join
        missing = scheduler.missing_chunks() if scheduler else 0
        why = "; ".join(
            f"{src.peer.short()} {src.dropped_because}" for src in self._sources.values() if src.dropped_because
        )
        self._fail(now, TransferError(f"all sources failed with {missing} chunks missing ({why})"))

    def _source_progress(self, src: SourceRecord) -> SourceProgress:
        active = src.status is SourceState.LEASED
        return (
            ChunkScheduler.idle_progress(src.peer, active)
            if self._scheduler is None
            else (self._scheduler.source_progress(src.peer, active))
        )

    # ------------------------------------------------------------------------- querying
    def _on_versions(self, now: float, src: SourceRecord, msg: VersionsReply) -> None:
        if self._book.take(src, msg.request_id) is None or src.status is not SourceState.QUERYING:
            return
        if msg.run != self.run:
            self._drop(now, src, DropReason.PROTOCOL, "versions for another run", PenaltyReason.PROTOCOL_VIOLATION)
            return
        src.versions = usable_versions(msg.versions, self.config)
        self._book.move(src, SourceInput.VERSIONS)
        if self.state is PullState.QUERYING:
            self._maybe_choose(now)
        else:
            self._late_source(now, src)

    def _maybe_choose(self, now: float) -> None:
        if self._book.waiting(Ask.VERSIONS):
            return
        answered = [s for s in self._sources.values() if s.status is SourceState.ANSWERED]
        choice = choose_version(
            {s.peer: s.versions for s in answered},
            step=self.requested_step,
            digest=self.requested_digest,
            trusted=self.trusted,
            rates={s.peer: s.estimate.bytes_per_s or 0.0 for s in answered},
        )
        if choice is None:
            why = nothing_eligible(self.run, self.requested_step, self.requested_digest, self.trusted)
            self._fail(now, TransferError(why))
            return
        chosen = self._chosen = choice.version
        if self.max_staging_bytes is not None and chosen.total_bytes > self.max_staging_bytes:
            self._fail(
                now,
                TransferError(
                    f"run {self.run!r} step {chosen.step} has {chosen.total_bytes} bytes; this peer can stage "
                    f"at most {self.max_staging_bytes} (free memory or disk)"
                ),
            )
            return
        try:
            self._hasher = hash_function(chosen.hash_algorithm)
        except ConfigError as exc:
            self._fail(now, TransferError(str(exc)))
            return
        self._transition(PullInput.VERSION_CHOSEN)
        for conflict in choice.conflicts:
            src = self._sources[conflict.peer]
            self._book.move(src, SourceInput.SET_ASIDE)
            detail = describe_conflict(conflict, chosen, len(answered))
            src.dropped_because = f"{DropReason.CONFLICT.value}: {detail}"
            self._events.append(SourceDropped(source=src.peer, reason=DropReason.CONFLICT, detail=detail))
        for peer in choice.others:
            self._book.move(self._sources[peer], SourceInput.SET_ASIDE)
            self._events.append(SourceDropped(source=peer, reason=DropReason.NO_VERSION, detail=f"step {chosen.step}"))
        for i, peer in enumerate(choice.supporters):
            self._open(now, self._sources[peer], with_body=i == 0)

    def _late_source(self, now: float, src: SourceRecord) -> None:
        """A source that answered after the vote: use it only if it holds exactly the chosen snapshot."""
        chosen = self._chosen
        assert chosen is not None
        if chosen in src.versions:
            self._open(now, src, with_body=False)
            return
        conflict = late_conflict(src.versions, chosen)
        reason = DropReason.NO_VERSION if conflict is None else DropReason.CONFLICT
        self._book.move(src, SourceInput.SET_ASIDE)
        self._events.append(SourceDropped(source=src.peer, reason=reason, detail=conflict or f"step {chosen.step}"))

    def _open(self, now: float, src: SourceRecord, *, with_body: bool) -> None:
        chosen = self._chosen
        assert chosen is not None
        self._book.move(src, SourceInput.CHOSEN)
        msg = GetManifest(request_id=self._book.new_id(), run=self.run, step=chosen.step, include_manifest=with_body)
        self._book.ask(now, src, msg, Ask.OPEN, with_body)

    # -------------------------------------------------------------------------- opening
    def _on_manifest_reply(self, now: float, src: SourceRecord, msg: ManifestReply) -> PayloadSlot | None:
        pending = self._book.take(src, msg.request_id)
        chosen = self._chosen
        if pending is None or chosen is None:
            if msg.manifest_bytes:
                # The payload that follows cannot be skipped safely: the stream is lost.
                self._drop(now, src, DropReason.PROTOCOL, "unrequested manifest body", PenaltyReason.PROTOCOL_VIOLATION)
            return None
        if msg.hash_algorithm != chosen.hash_algorithm or msg.digest != chosen.digest:
            self._drop(now, src, DropReason.VERSION_MISMATCH, "snapshot changed since its version list", None)
            return None
        if pending.ask is Ask.RENEW and msg.lease_id != src.lease_id:
            self._drop(
                now, src, DropReason.PROTOCOL, "renewal answered with another lease", PenaltyReason.PROTOCOL_VIOLATION
            )
            return None
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
            self._lease_granted(now, src)
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
        self._lease_granted(now, src)
        self._after_change(now)
        return None

    def _lease_granted(self, now: float, src: SourceRecord) -> None:
        if src.status is not SourceState.OPENING:
            return  # a renewal
        self._book.move(src, SourceInput.LEASE_GRANTED)
        src.last_activity = now
        scheduler = self._scheduler
        if scheduler is not None and self.state is PullState.PULLING:
            assert src.lease_id is not None
            scheduler.add_lane(now, src.peer, src.lease_id, src.estimate)

    def _on_manifest_body(self, now: float, src: SourceRecord, slot: PayloadSlot, data: memoryview | bytes) -> None:
        if src.manifest_slot != slot:
            return
        src.manifest_slot = None
        if self.state is not PullState.OPENING or self._manifest is not None:
            return
        chosen = self._chosen
        assert chosen is not None
        try:
            manifest = accept_manifest(data, run=self.run, chosen=chosen, config=self.config)
        except RemoteProtocolError as exc:
            reason = DropReason.CORRUPT if isinstance(exc, ManifestDigestMismatch) else DropReason.PROTOCOL
            self._drop(now, src, reason, str(exc), PenaltyReason.BAD_MANIFEST)
            return
        self._manifest = manifest
        self._advance_opening(now)

    def _advance_opening(self, now: float) -> None:
        if self._manifest is None:
            if any(s.manifest_slot is not None for s in self._sources.values()):
                return
            if any(p.wants_body for p in self._book.pending.values()):
                return
            leased = self._active()
            if leased:
                src = leased[0]
                chosen = self._chosen
                assert chosen is not None and src.lease_id is not None
                msg = GetManifest(
                    request_id=self._book.new_id(),
                    run=self.run,
                    step=chosen.step,
                    include_manifest=True,
                    lease_id=src.lease_id,
                )
                self._book.ask(now, src, msg, Ask.RENEW, True)
                return
            if not any(s.status is SourceState.OPENING for s in self._sources.values()):
                self._fail(now, TransferError(f"no source supplied a valid manifest for run {self.run!r}"))
            return
        if any(s.status is SourceState.OPENING for s in self._sources.values()):
            return
        leased = self._active()
        if not leased:
            self._fail(now, TransferError(f"every source of run {self.run!r} failed before the pull began"))
            return
        self._transition(PullInput.MANIFEST_ACCEPTED)
        resumed = self._apply_resume()
        chosen = self._chosen
        assert chosen is not None
        self._events.append(
            ManifestReady(
                manifest=self._manifest,
                digest=chosen.digest,
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
        self._resumed = record.verified_chunks()
        return len(self._resumed)

    # -------------------------------------------------------------------------- pulling
    def _on_data_header(self, now: float, src: SourceRecord, msg: DataHeader) -> PayloadSlot | None:
        scheduler = self._scheduler
        if self.state is not PullState.PULLING or scheduler is None or src.status is not SourceState.LEASED:
            result: PayloadSlot | str = f"data for unknown request {msg.request_id}"
        else:
            result = scheduler.header(now, src.peer, msg)
        if isinstance(result, str):
            self._drop(now, src, DropReason.PROTOCOL, result, PenaltyReason.PROTOCOL_VIOLATION)
            return None
        src.last_activity = now
        return result

    def _on_data(self, now: float, src: SourceRecord, slot: PayloadSlot, data: memoryview | bytes) -> None:
        scheduler, manifest = self._scheduler, self._manifest
        if scheduler is None or manifest is None:
            return
        outcome = scheduler.payload(now, src.peer, slot, data)
        if outcome.corrupt:
            chunk = outcome.corrupt[0]
            attempts = max(scheduler.attempts(c) for c in outcome.corrupt)
            detail = f"chunk {chunk} failed its {manifest.hash_algorithm} check"
            if attempts >= self.config.max_chunk_retries:
                self._events.append(SourcePenalised(source=src.peer, reason=PenaltyReason.CORRUPT_DATA, detail=detail))
                self._fail(now, ChecksumMismatch(f"{detail} {attempts} times; giving up"))
                return
            if src.status is SourceState.LEASED:
                self._drop(now, src, DropReason.CORRUPT, detail, PenaltyReason.CORRUPT_DATA)
                return
        if outcome.verified:
            self._emit_progress(now)
        self._after_change(now)

    def _check_complete(self, now: float) -> bool:
        scheduler, manifest, chosen = self._scheduler, self._manifest, self._chosen
        if scheduler is None or manifest is None or chosen is None or not scheduler.complete:
            return False
        self._transition(PullInput.ALL_VERIFIED)
        self._emit_progress(now, force=True)
        self._release_all()
        self._events.append(
            Completed(
                run=self.run,
                step=manifest.step,
                digest=chosen.digest,
                manifest=manifest,
                elapsed_s=0.0 if self._pull_started is None else max(0.0, now - self._pull_started),
                bytes_by_source=tuple(
                    (peer, lane.bytes_verified if (lane := scheduler.lanes.get(peer)) else 0) for peer in self._sources
                ),
            )
        )
        return True

    def _emit_progress(self, now: float, *, force: bool = False) -> None:
        if (
            not force
            and self._last_progress is not None
            and now - self._last_progress < self.config.progress_interval_s
        ):
            return
        self._last_progress = now
        self._events.append(self.progress(now))

    def _on_error(self, now: float, src: SourceRecord, msg: ErrorReply) -> None:
        pending = self._book.take(src, msg.request_id)
        if pending is not None and pending.ask is Ask.VERSIONS:
            if msg.code in (TransferErrorCode.UNKNOWN_RUN, TransferErrorCode.UNKNOWN_VERSION):
                self._drop(now, src, DropReason.NO_VERSION, f"source does not hold run {self.run!r}", None)
            else:
                self._drop(now, src, DropReason.REFUSED, f"{msg.code.name}: {msg.detail}", None)
            return
        scheduler = self._scheduler
        if pending is None:
            if scheduler is None or scheduler.request_of(src.peer, msg.request_id) is None:
                return  # a late answer to something already settled
            if msg.code is TransferErrorCode.CANCELLED and scheduler.cancelled_reply(src.peer, msg.request_id):
                self._after_change(now)
                return
        self._drop(now, src, DropReason.REFUSED, f"{msg.code.name}: {msg.detail}", None)
