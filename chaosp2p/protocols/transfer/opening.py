"""The OPENING phase of a pull and the leases it holds: lease the chosen snapshot, accept its manifest.

Theory of operation
-------------------
Every source that holds the chosen snapshot is asked for a lease (``GetManifest``); the best-known
one also sends the manifest body, a raw payload after its ``ManifestReply``. The body must hash to
the chosen digest and decode within the configured limits
(:func:`~chaosp2p.protocols.transfer.acceptance.accept_manifest`); a bad body drops its source and is
asked of another leased source instead (a renewal with the body). A reply that names another digest
means the source's snapshot changed since its version list: that source is dropped, not penalised.

The pull moves to READY once the manifest is accepted and no lease is still being opened; a resume
record for exactly this snapshot then vouches for the chunks it lists (``ManifestReady`` says how
many). Leases outlive OPENING: a leased source that has nothing outstanding is renewed every third
of its lease's lifetime (any request renews it, so a busy source needs no renewal), and one that is
granted mid-pull becomes a lane of the chunk scheduler.
"""

from __future__ import annotations

from chaosp2p.errors import RemoteProtocolError, TransferError
from chaosp2p.protocols.transfer.acceptance import ManifestDigestMismatch, accept_manifest
from chaosp2p.protocols.transfer.events import DropReason, ManifestReady, PenaltyReason, ResumeDiscarded
from chaosp2p.protocols.transfer.messages import GetManifest, ManifestReply
from chaosp2p.protocols.transfer.payload import PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.pull_core import PullCore
from chaosp2p.protocols.transfer.sources import Ask, SourceRecord
from chaosp2p.protocols.transfer.transitions import PullInput, PullState, SourceInput, SourceState


class Opening(PullCore):
    """Leases and the manifest of a :class:`~chaosp2p.protocols.transfer.pull.PullMachine`."""

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

    def _renew(self, now: float, src: SourceRecord, *, with_body: bool) -> None:
        """Renew ``src``'s lease (``with_body``: and ask it for the manifest body)."""
        chosen = self._chosen
        assert chosen is not None and src.lease_id is not None
        msg = GetManifest(
            request_id=self._book.new_id(),
            run=self.run,
            step=chosen.step,
            include_manifest=with_body,
            lease_id=src.lease_id,
        )
        self._book.ask(now, src, msg, Ask.RENEW, with_body)

    def _renew_idle_leases(self, now: float) -> None:
        """Renew the leases of sources with nothing outstanding, a third of a lease's life after the last ask."""
        scheduler = self._scheduler
        for src in list(self._sources.values()):
            # Requests renew a lease; only an idle source needs an explicit renewal (one queued behind
            # payloads on a busy stream could not be answered in time anyway).
            if src.status is not SourceState.LEASED or (scheduler is not None and scheduler.busy(src.peer)):
                continue
            if now >= src.last_sent + src.lease_ttl_s / 3 and src.lease_id is not None:
                self._renew(now, src, with_body=False)

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
                self._renew(now, leased[0], with_body=True)
                return
            if not any(s.status is SourceState.OPENING for s in self._sources.values()):
                self._fail(now, TransferError(f"no source supplied a valid manifest for run {self.run!r}"))
            return
        if any(s.status is SourceState.OPENING for s in self._sources.values()):
            return
        leased = self._active()
        if not leased:
            self._fail_before_pull(now)
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

    def _check_ready(self, now: float) -> None:
        """In READY (the driver is allocating staging): the pull fails if no leased source is left."""
        if not self._active():
            self._fail_before_pull(now)

    def _fail_before_pull(self, now: float) -> None:
        self._fail(now, TransferError(f"every source of run {self.run!r} failed before the pull began"))

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
