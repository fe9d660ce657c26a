"""Newcomer side of ``/chaos/transfer/1``: pull one snapshot from several sources at once.

Theory of operation: the :class:`~chaosp2p.protocols.transfer.PullMachine` decides everything --
which version, which source sends which chunks, when a source is too slow, failed or lying. This
driver only moves bytes. It keeps one stream per source with a *reader* task (header frames in;
announced payloads read straight into the staging buffer, where the connection decrypts them in
place) and a *sender* task (the machine's requests out, in order), plus one *timer* task for the
machine's deadlines. After every input the driver pumps the machine's output: messages to the
senders, events to the right place (allocate staging on ``ManifestReady``, reset a dropped
source's stream at once so nothing more is written into staging, progress to the callback).

Sources found after the pull began (``rediscover``: the run's providers are looked up again
every ``REDISCOVER_INTERVAL_S`` while the pull runs) are handed to the machine, which uses them if
they hold exactly the chosen snapshot. Payloads the machine no longer wants (``DISCARD``: the loser
of an end-game race) are read into a small scratch buffer and dropped.

The staging buffer is separate from any live state; the caller commits it only after
``Completed``, so a failed or interrupted pull never touches what the newcomer already had. Its
size is checked against free memory (or disk) before the pull even opens a lease.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup

from chaosp2p.clock import Clock
from chaosp2p.errors import ChaosError, RemoteProtocolError, TransferError
from chaosp2p.protocols.transfer import (
    Completed,
    Failed,
    ManifestReady,
    PayloadKind,
    PayloadSlot,
    Planned,
    PullMachine,
    ShardPlanner,
    SourceDropped,
    SourceEstimate,
    SourcePenalised,
    TransferProgress,
)
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import codec as TRANSFER_CODEC
from chaosp2p.state.buffers import StagingBuffer
from chaosp2p.state.capacity import staging_capacity
from chaosp2p.state.frames import receive_transfer_message
from chaosp2p.state.manifest import Manifest
from chaosp2p.state.resume import checkpoint, load_resume
from chaosp2p.transport.groups import chaos_errors_beside_cancellation, unwrap_single_error
from chaosp2p.transport.host import Host
from chaosp2p.transport.reach import reach
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.circuit_addr import Dialable
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message

log = logging.getLogger("chaosp2p.state")

T = TypeVar("T")
ProgressCallback = Callable[[TransferProgress], None]
StagingFactory = Callable[[Manifest], StagingBuffer]
Rediscover = Callable[[], Awaitable[Sequence["SourceAddress"]]]
"""Looks the run's sources up again (the driver adds the new ones to a running pull)."""
REDISCOVER_INTERVAL_S = 1.0
DISCARD_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class PullResult:
    """A completed, fully verified pull: commit ``staging`` with ``completed``."""

    completed: Completed
    staging: StagingBuffer
    penalised: tuple[SourcePenalised, ...]
    dropped: tuple[SourceDropped, ...]
    verify_s: float = 0.0
    """Time the driver spent handing received chunks to the machine, which hashes and checks them
    (it overlaps the data phase: a chunk is verified as soon as it arrived)."""
    plans: tuple[PlanRecord, ...] = ()
    """Every (re)plan of the chunks, in order (what a slow pull is compared with a fast one by)."""
    source_rates: tuple[tuple[PeerID, float], ...] = ()
    """Each source's rate as the pull measured it last (bytes/s; 0 if it never delivered)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRecord:
    """One :class:`Planned` event, stamped with when it happened."""

    at_s: float
    """Seconds since the data phase began (``start_pull``; 0 for the initial plan)."""
    plan: Planned


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceAddress:
    """A source to pull from: who, where, and what the cluster monitor knows of the link.

    ``bytes_per_s=None`` (the default) means nothing is known: the pull measures the link itself.
    """

    peer: PeerID
    addrs: tuple[Dialable, ...] = ()
    """Where to reach it: its addresses, and relay addresses if it is private (tried after them)."""
    bytes_per_s: float | None = None
    latency_s: float = 0.001

    def estimate(self) -> SourceEstimate:
        """The machine's view of this source."""
        return SourceEstimate(peer=self.peer, bytes_per_s=self.bytes_per_s, latency_s=self.latency_s)


class _SourceLink:
    """The stream to one source and the messages waiting to go out on it."""

    def __init__(self, source: SourceAddress) -> None:
        self.source = source
        self.stream: Stream | None = None
        self.outbox: list[Message] = []
        self.wake = anyio.Event()
        self.dropped = False
        self.scope = anyio.CancelScope()
        self.scratch: memoryview | None = None


class PullDriver:
    """Runs one :class:`PullMachine` over real streams. Use :func:`pull_state`."""

    def __init__(
        self,
        *,
        host: Host,
        clock: Clock,
        machine: PullMachine,
        sources: Sequence[SourceAddress],
        make_staging: StagingFactory,
        progress: ProgressCallback | None,
        window_bytes: int,
        resume_path: Path | None,
        rediscover: Rediscover | None = None,
    ) -> None:
        self._host = host
        self._clock = clock
        self.machine = machine
        self._links = {s.peer: _SourceLink(s) for s in sources}
        self._make_staging = make_staging
        self._progress = progress
        self._window_bytes = window_bytes
        self._resume_path = resume_path
        self._rediscover = rediscover
        self._wake_timer = anyio.Event()
        self._finished = anyio.Event()
        self.staging: StagingBuffer | None = None
        self.completed: Completed | None = None
        self.error: TransferError | None = None
        self.penalised: list[SourcePenalised] = []
        self.dropped: list[SourceDropped] = []
        self.plans: list[PlanRecord] = []
        self.verify_s = 0.0
        self._data_started: float | None = None
        self._last_progress: TransferProgress | None = None
        self._task_group: anyio.abc.TaskGroup | None = None

    async def run(self) -> PullResult:
        """Pull until the machine completes or fails."""
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                for link in self._links.values():
                    tg.start_soon(self._run_link, link, name=f"chaosp2p pull from {link.source.peer.short()}")
                tg.start_soon(self._timer)
                if self._rediscover is not None:
                    tg.start_soon(self._look_for_sources, self._rediscover)
                self._input(self.machine.start)
                await self._finished.wait()
                tg.cancel_scope.cancel()
        finally:
            # End every source's stream, finished or not: the source then releases the leases
            # this pull held at once, instead of keeping the snapshot pinned until they expire.
            for link in self._links.values():
                if link.stream is not None:
                    link.stream.reset()
            self._save_progress()
        if self.error is not None:
            raise self.error
        if self.completed is None or self.staging is None:
            raise TransferError("the pull ended without completing")
        return PullResult(
            completed=self.completed,
            staging=self.staging,
            penalised=tuple(self.penalised),
            dropped=tuple(self.dropped),
            verify_s=self.verify_s,
            plans=tuple(self.plans),
            source_rates=self._source_rates(),
        )

    def _source_rates(self) -> tuple[tuple[PeerID, float], ...]:
        last = self._last_progress
        if last is None:
            return ()
        return tuple((s.peer, s.rate_bytes_per_s) for s in last.sources)

    # ------------------------------------------------------------------ machine input and output
    def _input(self, method: Callable[..., T], *args: Any) -> T:
        """Call ``method(now, *args)`` on the machine, then carry out what it produced."""
        result = method(self._clock.now(), *args)
        self._pump()
        return result

    def _pump(self) -> None:
        for out in self.machine.take_outgoing():
            link = self._links.get(out.to)
            if link is not None and not link.dropped:
                link.outbox.append(out.message)
                link.wake.set()
        for event in self.machine.take_events():
            self._on_event(event)
        self._wake_timer.set()

    def _on_event(self, event: object) -> None:
        if isinstance(event, ManifestReady):
            assert self._task_group is not None
            self._task_group.start_soon(self._prepare_staging, event)
        elif isinstance(event, SourceDropped):
            self.dropped.append(event)
            log.info("dropping source %s: %s %s", event.source.short(), event.reason.value, event.detail)
            link = self._links.get(event.source)
            if link is not None:
                link.dropped = True
                link.wake.set()
                if link.stream is not None:
                    # Stops any further decryption into staging at once, and fails the link's reader
                    # and sender with StreamReset, which ends the link. (Cancelling its scope as well
                    # would race that error with a cancellation and leave an ungroupable mix.)
                    link.stream.reset()
                else:
                    link.scope.cancel()  # still dialing: nothing was written yet
        elif isinstance(event, Planned):
            now = self._clock.now()
            at = 0.0 if self._data_started is None else now - self._data_started
            self.plans.append(PlanRecord(at_s=at, plan=event))
            rates = dict(event.rates)
            shares = ", ".join(
                f"{peer.short()} {count} at {rates.get(peer, 0.0) / 1e6:.0f} MB/s" for peer, count in event.shares
            )
            log.info("plan at %+.2f s (%s) of %d chunks: %s", at, event.reason.value, event.chunks, shares)
        elif isinstance(event, SourcePenalised):
            self.penalised.append(event)
            log.warning("source %s misbehaved (%s): %s", event.source, event.reason.value, event.detail)
        elif isinstance(event, TransferProgress):
            self._last_progress = event
            if self._progress is not None:
                try:
                    self._progress(event)
                except Exception:
                    log.exception("progress callback failed")
        elif isinstance(event, Completed):
            self.completed = event
            for peer, rate in self._source_rates():
                log.info("source %s delivered at %.1f MB/s (as measured by this pull)", peer.short(), rate / 1e6)
            self._finished.set()
        elif isinstance(event, Failed):
            self.error = event.error
            self._finished.set()

    def add_source(self, source: SourceAddress) -> bool:
        """Offer one more source to the running pull; False if it is known already or the pull ended."""
        if source.peer in self._links or self._task_group is None or self._finished.is_set():
            return False
        link = self._links[source.peer] = _SourceLink(source)
        self._task_group.start_soon(self._run_link, link, name=f"chaosp2p pull from {source.peer.short()}")
        return bool(self._input(self.machine.add_source, source.estimate()))

    async def _look_for_sources(self, rediscover: Rediscover) -> None:
        while True:
            await anyio.sleep(REDISCOVER_INTERVAL_S)
            try:
                found = await rediscover()
            except ChaosError as exc:
                log.debug("looking for more sources failed: %s", exc)
                continue
            for source in found:
                if self.add_source(source):
                    log.info("adding source %s to the running pull", source.peer.short())

    async def _prepare_staging(self, event: ManifestReady) -> None:
        # Allocating (and faulting in) a large staging buffer takes a while: do it off the event
        # loop, so the connections keep being served meanwhile.
        try:
            self.staging = await anyio.to_thread.run_sync(self._make_staging, event.manifest)
        except (ChaosError, OSError, MemoryError) as exc:
            size = event.manifest.total_bytes
            self.error = exc if isinstance(exc, TransferError) else TransferError(f"cannot stage {size} bytes: {exc}")
            self._input(self.machine.abort)
            self._finished.set()
            return
        log.info(
            "pulling %s step %d: %.1f MiB from %d sources",
            self.machine.run,
            event.manifest.step,
            event.manifest.total_bytes / 2**20,
            len(event.sources),
        )
        self._data_started = self._clock.now()
        self._input(self.machine.start_pull)

    async def _timer(self) -> None:
        while True:
            self._wake_timer = anyio.Event()
            deadline = self.machine.next_deadline()
            now = self._clock.now()
            if deadline is not None and deadline <= now:
                self._input(self.machine.handle_timeout)
                await anyio.lowlevel.checkpoint()
                continue
            with anyio.move_on_after(math.inf if deadline is None else deadline - now):
                await self._wake_timer.wait()

    # ------------------------------------------------------------------ one source
    async def _run_link(self, link: _SourceLink) -> None:
        peer = link.source.peer
        with link.scope:
            try:
                while not link.outbox:  # connect only once the machine has something to ask
                    link.wake = anyio.Event()
                    await link.wake.wait()
                    if link.dropped:
                        return
                # Through a relay when the source cannot be dialled (behind NAT): same bytes, pinned digest.
                connection = await reach(self._host, peer, link.source.addrs)
                link.stream = connection.open_stream("transfer")
                link.stream.set_receive_window(self._window_bytes)
                with unwrap_single_error():
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._send_loop, link)
                        tg.start_soon(self._watch_progress, link.stream, peer)
                        await self._read_loop(link)
                        tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The stream failed just as the pull was being cancelled: let the cancellation
                # through, and treat the errors like any other failure of this source.
                with chaos_errors_beside_cancellation() as errors:
                    raise group
                if errors and not link.dropped:
                    self._input(self.machine.source_failed, peer, str(errors[0]))
            except RemoteProtocolError as exc:
                if not link.dropped:
                    self._input(self.machine.source_misbehaved, peer, exc)
            except ChaosError as exc:
                if not link.dropped:
                    self._input(self.machine.source_failed, peer, str(exc))

    async def _watch_progress(self, stream: Stream, peer: PeerID) -> None:
        """Tell the machine that bytes keep arriving while a long payload is being received.

        The machine judges a source stalled when nothing it can see happens for
        ``stall_timeout_s``; a payload is one step for it, however long a slow link needs for it.
        """
        seen = stream.last_activity
        interval = self.machine.config.stall_timeout_s / 3
        while True:
            await anyio.sleep(interval)
            if stream.last_activity != seen:
                seen = stream.last_activity
                self._input(self.machine.note_activity, peer)

    async def _send_loop(self, link: _SourceLink) -> None:
        assert link.stream is not None
        while True:
            while link.outbox:
                await link.stream.send_message(TRANSFER_CODEC, link.outbox.pop(0))
            link.wake = anyio.Event()
            await link.wake.wait()

    async def _read_loop(self, link: _SourceLink) -> None:
        stream = link.stream
        assert stream is not None
        peer = link.source.peer
        while True:
            message = await receive_transfer_message(stream)
            if message is None:
                raise ChaosError("the source closed the transfer stream")
            slot = self._input(self.machine.receive, peer, "transfer", message)
            if isinstance(slot, PayloadSlot):
                await self._receive_payload(link, stream, slot)

    async def _receive_payload(self, link: _SourceLink, stream: Stream, slot: PayloadSlot) -> None:
        peer = link.source.peer
        if slot.kind is PayloadKind.DISCARD:
            await self._discard(link, stream, slot)
            return
        if slot.kind is PayloadKind.DATA:
            assert self.staging is not None
            buffer: memoryview | bytearray = self.staging.slot_view(slot)
        else:
            buffer = bytearray(slot.length)
        try:
            await stream.receive_into(buffer)
        except BaseException:
            self._input(self.machine.payload_aborted, peer, slot)
            raise
        began = self._clock.now()
        self._input(self.machine.payload_received, peer, slot, memoryview(buffer))
        if slot.kind is PayloadKind.DATA:
            self.verify_s += self._clock.now() - began

    async def _discard(self, link: _SourceLink, stream: Stream, slot: PayloadSlot) -> None:
        """Read a payload nobody wants any more (its chunks came from elsewhere) and drop it."""
        scratch = link.scratch
        if scratch is None:
            scratch = link.scratch = memoryview(bytearray(min(slot.length, DISCARD_BUFFER_BYTES)))
        left = slot.length
        try:
            while left:
                piece = scratch[: min(left, len(scratch))]
                await stream.receive_into(piece)
                left -= len(piece)
        except BaseException:
            self._input(self.machine.payload_aborted, link.source.peer, slot)
            raise
        self._input(self.machine.payload_received, link.source.peer, slot, b"")

    def _save_progress(self) -> None:
        if self._resume_path is None or self.staging is None or self.completed is not None:
            return
        try:
            checkpoint(self.machine, self.staging, self._resume_path)
            log.info("saved pull progress to %s; run again to resume", self._resume_path)
        except (OSError, ChaosError) as exc:
            log.warning("could not save pull progress to %s: %s", self._resume_path, exc)


async def pull_state(
    host: Host,
    *,
    run: str,
    sources: Sequence[SourceAddress],
    config: TransferConfig,
    clock: Clock,
    step: int | None = None,
    make_staging: StagingFactory | None = None,
    progress: ProgressCallback | None = None,
    resume_path: str | Path | None = None,
    downlink_bytes_per_s: float | None = None,
    planner: ShardPlanner | None = None,
    work_stealing: bool = True,
    digest: bytes | None = None,
    trusted: frozenset[PeerID] = frozenset(),
    rediscover: Rediscover | None = None,
) -> PullResult:
    """Pull run ``run`` from ``sources`` into a staging buffer.

    The snapshot is the one most sources agree on (see :mod:`chaosp2p.protocols.transfer.selection`);
    ``step``, ``digest`` and ``trusted`` pin it. With ``resume_path``, verified chunks are
    remembered there (and the staging data next to it), so an interrupted pull continues where it
    stopped. ``rediscover`` is called every second while pulling to find more sources.
    ``planner`` and ``work_stealing`` exist for benchmarks that compare the adaptive pull with
    static plans; leave them alone otherwise.
    """
    for source in sources:
        known = "unknown (measured)" if source.bytes_per_s is None else f"{source.bytes_per_s / 1e6:.0f} MB/s"
        log.debug("source %s: link estimate %s", source.peer.short(), known)
    path = Path(resume_path) if resume_path is not None else None
    resume = load_resume(path) if path is not None and path.exists() else None
    capacity: int | None = None
    if make_staging is None:
        staging_path = None if path is None else path.with_suffix(path.suffix + ".data")
        capacity = staging_capacity(config, staging_path)

        def make_staging(manifest: Manifest) -> StagingBuffer:
            return StagingBuffer(manifest, path=staging_path)

    machine = PullMachine(
        run=run,
        sources=[s.estimate() for s in sources],
        config=config,
        step=step,
        digest=digest,
        trusted=trusted,
        resume=resume,
        downlink_bytes_per_s=downlink_bytes_per_s,
        planner=planner,
        work_stealing=work_stealing,
        max_staging_bytes=capacity,
    )
    window = min(host.config.max_window_bytes, config.chunk_bytes * (config.max_inflight_chunks_per_source + 1))
    driver = PullDriver(
        host=host,
        clock=clock,
        machine=machine,
        sources=sources,
        make_staging=make_staging,
        progress=progress,
        window_bytes=window,
        resume_path=path,
        rediscover=rediscover,
    )
    result = await driver.run()
    if path is not None:
        path.unlink(missing_ok=True)
    return result
