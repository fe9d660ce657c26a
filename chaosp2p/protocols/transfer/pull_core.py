"""Shared state and helpers of the pull machine (see :mod:`.pull` for the theory of operation).

:class:`PullCore` holds what every phase of a pull uses: the pull's state and its table, the
:class:`~chaosp2p.protocols.transfer.sources.SourceBook`, the version being pulled with its manifest
and chunk hash, the chunk scheduler once PULLING, the events, progress reports, and the one way a
source leaves a pull (``_drop``) and the one way a pull fails (``_fail``). The phases build on it --
the version vote (``querying.py``), leases and the manifest (``opening.py``) and the chunk transfer
(``pulling.py``) -- and ``pull.py`` puts them together behind the driver interface.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chaosp2p.errors import ConfigError, TransferError
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.events import (
    DropReason,
    Failed,
    PenaltyReason,
    PullEvent,
    SourceDropped,
    SourcePenalised,
    SourceProgress,
    TransferProgress,
)
from chaosp2p.protocols.transfer.messages import MANIFEST_DIGEST_BYTES, PROTOCOL, Hasher, Manifest, VersionInfo
from chaosp2p.protocols.transfer.planner import SchedulingPlanner, ShardPlanner, SourceEstimate
from chaosp2p.protocols.transfer.resume_record import ResumeRecord
from chaosp2p.protocols.transfer.scheduler import ChunkScheduler
from chaosp2p.protocols.transfer.sources import SourceBook, SourceRecord
from chaosp2p.protocols.transfer.transitions import (
    PULL_FINAL,
    PULL_TRANSITIONS,
    SOURCE_GONE,
    PullInput,
    PullState,
    SourceInput,
    SourceState,
    advance,
)
from chaosp2p.wire.identity import PeerID


class PullCore:
    """State and helpers shared by the parts of :class:`~chaosp2p.protocols.transfer.pull.PullMachine`."""

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

    # ------------------------------------------------------------------ provided by the machine
    def _after_change(self, now: float) -> None:
        """Move the machine on after a source changed (dropped, answered, finished a payload)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared helpers
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

    def _emit_progress(self, now: float, *, force: bool = False) -> None:
        if (
            not force
            and self._last_progress is not None
            and now - self._last_progress < self.config.progress_interval_s
        ):
            return
        self._last_progress = now
        self._events.append(self.progress(now))

    def _source_progress(self, src: SourceRecord) -> SourceProgress:
        active = src.status is SourceState.LEASED
        return (
            ChunkScheduler.idle_progress(src.peer, active)
            if self._scheduler is None
            else (self._scheduler.source_progress(src.peer, active))
        )
