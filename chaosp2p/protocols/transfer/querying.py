"""The QUERYING phase of a pull: ask every source for its versions, then vote on one.

Theory of operation
-------------------
Every source is asked which versions of the run it holds (``GetVersions``); the versions this
newcomer cannot use are ignored (:func:`~chaosp2p.protocols.transfer.acceptance.usable_versions`).
Once no query is outstanding -- answered, refused or timed out -- the vote of :mod:`.selection`
picks one ``(step, digest)``; the pull then moves to OPENING and asks a lease of every source that
holds the winner (the best-known one also sends the manifest body). Sources that contradict the
winner are set aside as conflicting, the others that lack it as unused. A source that answers
after the vote (added mid-pull) is used only if it holds exactly the chosen snapshot.
"""

from __future__ import annotations

from chaosp2p.errors import ConfigError, TransferError
from chaosp2p.protocols.transfer.acceptance import usable_versions
from chaosp2p.protocols.transfer.events import DropReason, PenaltyReason, SourceDropped
from chaosp2p.protocols.transfer.messages import GetManifest, GetVersions, VersionsReply, hash_function
from chaosp2p.protocols.transfer.pull_core import PullCore
from chaosp2p.protocols.transfer.selection import choose_version, describe_conflict, late_conflict, nothing_eligible
from chaosp2p.protocols.transfer.sources import Ask, SourceRecord
from chaosp2p.protocols.transfer.transitions import PullInput, PullState, SourceInput, SourceState


class Querying(PullCore):
    """The version query and the vote of a :class:`~chaosp2p.protocols.transfer.pull.PullMachine`."""

    def _query(self, now: float, src: SourceRecord) -> None:
        """Ask ``src`` which versions of the run it holds."""
        self._book.ask(now, src, GetVersions(request_id=self._book.new_id(), run=self.run), Ask.VERSIONS, False)

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
        """Ask ``src`` for a lease on the chosen snapshot (and, ``with_body``, for its manifest)."""
        chosen = self._chosen
        assert chosen is not None
        self._book.move(src, SourceInput.CHOSEN)
        msg = GetManifest(request_id=self._book.new_id(), run=self.run, step=chosen.step, include_manifest=with_body)
        self._book.ask(now, src, msg, Ask.OPEN, with_body)
