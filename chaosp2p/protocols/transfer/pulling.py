"""The PULLING phase of a pull: chunks requested, received into staging, verified, until all are.

Theory of operation
-------------------
Once the driver has allocated staging (``start_pull``), a
:class:`~chaosp2p.protocols.transfer.scheduler.ChunkScheduler` gets one lane per leased source and
decides which source sends which chunks (plans, batches, pipelining, stealing, end game: see
there). This module is the pull's side of that conversation. A ``DataHeader`` is checked against
the request it answers and becomes a :class:`~chaosp2p.protocols.transfer.payload.PayloadSlot`; the
driver receives the raw bytes straight into that slice of staging and hands the same memory back,
where each chunk is hashed exactly once. A chunk that fails its hash drops its source (penalised)
and is fetched elsewhere; one that failed ``max_chunk_retries`` times fails the pull. After every
change the scheduler is pumped; when no source is left, none is still joining and no dropped
source may still write into staging, the pull fails with what each source died of. ``Completed``
is emitted only when every chunk is verified, after every lease is released.
"""

from __future__ import annotations

from chaosp2p.errors import ChecksumMismatch, TransferError
from chaosp2p.protocols.transfer.events import Completed, DropReason, PenaltyReason, SourcePenalised
from chaosp2p.protocols.transfer.messages import DataHeader, Hasher, Manifest, VersionInfo
from chaosp2p.protocols.transfer.payload import PayloadSlot
from chaosp2p.protocols.transfer.pull_core import PullCore
from chaosp2p.protocols.transfer.scheduler import ChunkScheduler
from chaosp2p.protocols.transfer.sources import SourceRecord
from chaosp2p.protocols.transfer.transitions import PullInput, PullState, SourceState


class Pulling(PullCore):
    """The chunk transfer of a :class:`~chaosp2p.protocols.transfer.pull.PullMachine`."""

    def _start_scheduler(self, now: float, manifest: Manifest, chosen: VersionInfo, hasher: Hasher) -> None:
        """Give every leased source a lane, plan the chunks not resumed and send the first requests."""
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

    def _pump(self, now: float) -> None:
        """After a change while PULLING: complete, or fill the pipelines (and fail if nobody can)."""
        scheduler = self._scheduler
        assert scheduler is not None
        if self._check_complete(now):
            return
        self._schedule(now, lambda: scheduler.pump(now))
        if self.state is PullState.PULLING and scheduler.needs_source() and not scheduler.quarantined():
            self._fail_all_sources_gone(now)

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
