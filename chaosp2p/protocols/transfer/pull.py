"""Newcomer side of ``/chaos/transfer/1``: pull one snapshot from several sources at once.

Theory of operation
-------------------
The machine touches no socket, clock or bulk memory: the driver feeds decoded messages, raw-payload
completions and ``now`` in, and carries messages, payload slots and events out.

States (:data:`~chaosp2p.protocols.transfer.transitions.PULL_TRANSITIONS`)::

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

Per source (:data:`~chaosp2p.protocols.transfer.transitions.SOURCE_TRANSITIONS`)::

    QUERYING --versions--> ANSWERED --chosen--> OPENING --lease granted--> LEASED
    QUERYING/ANSWERED/OPENING/LEASED --set aside--> UNUSED, --drop--> DROPPED, --finish--> DONE

Safety rule for drivers: once a slot is handed out, the destination slice belongs to that source's
stream until the driver reports ``payload_received`` or ``payload_aborted`` for it. Chunks of a
dropped source whose payload had started stay quarantined (not re-requested) until then, or until
``stall_timeout_s`` passes, so no late write can land on a chunk after it was verified.

Layout: :class:`PullMachine` is this module's driver interface over four parts -- the shared state
(:mod:`.pull_core`), the version vote (:mod:`.querying`), leases and the manifest
(:mod:`.opening`) and the chunk transfer (:mod:`.pulling`). Replies are dispatched by message type
and the "something changed" step by pull state, each through one table at the end of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaosp2p.errors import LocalProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer.events import DropReason, PenaltyReason, PullEvent
from chaosp2p.protocols.transfer.messages import (
    PROTOCOL,
    DataHeader,
    ErrorReply,
    ManifestReply,
    TransferErrorCode,
    VersionsReply,
)
from chaosp2p.protocols.transfer.opening import Opening
from chaosp2p.protocols.transfer.payload import PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.planner import SourceEstimate
from chaosp2p.protocols.transfer.pulling import Pulling
from chaosp2p.protocols.transfer.querying import Querying
from chaosp2p.protocols.transfer.resume_record import ResumeRecord
from chaosp2p.protocols.transfer.sources import Ask, SourceRecord
from chaosp2p.protocols.transfer.transitions import PULL_FINAL, SOURCE_GONE, PullInput, PullState, SourceState
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class PullMachine(Querying, Opening, Pulling):
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

    def start(self, now: float) -> None:
        """Ask every source which versions of the run it holds."""
        self._transition(PullInput.START)
        for src in self._sources.values():
            self._query(now, src)

    def add_source(self, now: float, source: SourceEstimate) -> bool:
        """Use one more source (found mid-pull); False if it is known already or the pull is over."""
        if self.state in PULL_FINAL or source.peer in self._sources:
            return False
        src = self._book.add(source)
        if self.state is not PullState.IDLE:
            self._query(now, src)
        return True

    def start_pull(self, now: float) -> None:
        """Staging is allocated: plan the missing chunks and start requesting them."""
        manifest, chosen, hasher = self._manifest, self._chosen, self._hasher
        if manifest is None or chosen is None or hasher is None:
            raise LocalProtocolError(f"start_pull is not allowed in state {self.state.value}")
        self._transition(PullInput.START_PULL)
        self._start_scheduler(now, manifest, chosen, hasher)

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
        handler = _ON_REPLY.get(type(message))
        if handler is None:
            self._drop(
                now, src, DropReason.PROTOCOL, f"unexpected {type(message).__name__}", PenaltyReason.PROTOCOL_VIOLATION
            )
            return None
        return handler(self, now, src, message)

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
        self._renew_idle_leases(now)
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
    def _after_change(self, now: float) -> None:
        """Move the machine on after a source changed (dropped, answered, finished a payload)."""
        step = _ON_CHANGE.get(self.state)
        if step is not None:
            step(self, now)

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


_ON_REPLY: dict[type[Message], Callable[[PullMachine, float, SourceRecord, Any], PayloadSlot | None]] = {
    VersionsReply: Querying._on_versions,
    ManifestReply: Opening._on_manifest_reply,
    DataHeader: Pulling._on_data_header,
    ErrorReply: PullMachine._on_error,
}
"""The handler of each reply a source may send; any other message drops the source. Plain functions,
not bound methods kept on each machine, so a machine is no reference cycle."""

_ON_CHANGE: dict[PullState, Callable[[PullMachine, float], None]] = {
    PullState.QUERYING: Querying._maybe_choose,
    PullState.OPENING: Opening._advance_opening,
    PullState.READY: Opening._check_ready,
    PullState.PULLING: Pulling._pump,
}
"""What moves the pull on after a change, in each state that has something to do."""
