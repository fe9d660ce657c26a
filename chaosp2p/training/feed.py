"""The member side of catch-up: streaming averaged updates to newcomers, snapshots on request.

Theory of operation
-------------------
A newcomer cannot stop the run while it downloads a snapshot of the model, so it *observes*: it
asks one member (its sponsor) for the averaged update of every step that member completes from now
on, pulls a snapshot of an agreed step ``s`` from every member in parallel, and replays the updates
after ``s`` on top of it. Replaying an update means doing exactly what the members did with it
(``.grad = update; optimizer.step()``), so the newcomer's state is bit-identical to theirs.

:class:`UpdateFeed` is the sponsor's half: one bounded queue per observer, filled by
:meth:`UpdateFeed.publish` after every completed step (the update is shared, not copied, whatever the
number of observers) and drained by one sender task per observer. An observer that
falls ``max_queued`` updates behind is cut off (it will start its join again) rather than making the
member hold unbounded memory or wait. An observer's snapshot request names the step its replay
starts after (:meth:`UpdateFeed.skip_through`): as long as nothing was sent to it yet, the updates
up to that step are not sent at all -- the newcomer would only discard them, and each one costs
the sponsor and the newcomer a model's worth of encryption while the members train.
:class:`SnapshotWaiters` remembers which steps newcomers want a snapshot of; the collaboration
publishes one when it completes such a step.
"""

from __future__ import annotations

import logging
from collections import deque

import anyio
import numpy as np

from chaosp2p.errors import ChaosError
from chaosp2p.protocols.collab.messages import UpdateHeader, codec
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")


class Observer:
    """One newcomer observing this member: its stream and the updates queued for it."""

    __slots__ = ("cut", "queue", "sent", "skip_through", "stream", "wake")

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.queue: deque[tuple[UpdateHeader, np.ndarray]] = deque()
        self.wake = anyio.Event()
        self.cut = False
        self.sent = False
        """Whether an update went out: from then on every step is sent (the receiver wants no gaps)."""
        self.skip_through = -1
        """Updates of steps up to this one are not sent while ``sent`` is False."""


class UpdateFeed:
    """Averaged updates of completed steps, streamed to the newcomers observing this member."""

    def __init__(self, *, max_queued: int) -> None:
        self._observers: list[Observer] = []
        self._max_queued = max_queued
        self.last_published: int | None = None
        """The newest step whose update was published (None: none yet). An observer registered now
        gets every update after it -- and only those: tell it this step, not the member's step
        counter, which moves on only after the update is applied."""
        self.cut_off = 0
        """Observers dropped for falling too far behind."""
        self.skipped = 0
        """Updates not sent to an observer because they precede the snapshot it replays from."""

    @property
    def observing(self) -> int:
        """Newcomers currently observing."""
        return len(self._observers)

    def publish(self, *, step: int, epoch: int, config_digest: bytes, update: np.ndarray) -> None:
        """Queue the averaged ``update`` of ``step`` for every observer.

        ``update`` is shared by every observer's queue, not copied: the caller must not modify it
        afterwards (the collaboration averages each step into a fresh buffer).
        """
        self.last_published = step
        if not self._observers:
            return
        shared = update
        header = UpdateHeader(step=step, epoch=epoch, config_digest=config_digest, numel=int(shared.size))
        for observer in list(self._observers):
            if not observer.sent and step <= observer.skip_through:
                self.skipped += 1
                continue
            if len(observer.queue) >= self._max_queued:
                # Removed and reset now: its sender may be blocked on the stream (a newcomer behind a
                # slow relay) and notice the cut only much later -- meanwhile every step cut it off
                # again, one warning per step (issue 21's runs logged hundreds).
                self.cut_off += 1
                log.warning(
                    "newcomer %s fell %d updates behind: cut off", observer.stream.remote_peer, self._max_queued
                )
                self.drop(observer.stream.remote_peer)
                observer.stream.reset()
            else:
                observer.queue.append((header, shared))
            observer.wake.set()

    def skip_through(self, peer: PeerID, step: int) -> None:
        """``peer`` replays from a snapshot of ``step``: do not send it updates up to ``step``
        (unless some update already went out to it; then it gets every step, without gaps)."""
        for observer in self._observers:
            if observer.stream.remote_peer == peer and not observer.sent and step > observer.skip_through:
                observer.skip_through = step
                while observer.queue and observer.queue[0][0].step <= step:
                    observer.queue.popleft()
                    self.skipped += 1
                log.info("newcomer %s replays from step %d: not sending it the updates before", peer, step + 1)

    def watch(self, stream: Stream) -> Observer:
        """Register the observer on ``stream`` (its updates are queued from now on; send them with
        :meth:`serve`). An earlier observer of the same peer is cut off: a newcomer observes once."""
        self.drop(stream.remote_peer)
        observer = Observer(stream)
        self._observers.append(observer)
        return observer

    def drop(self, peer: PeerID) -> None:
        """Cut off ``peer``'s observers now (their streams are reset)."""
        for observer in [o for o in self._observers if o.stream.remote_peer == peer]:
            observer.cut = True
            observer.wake.set()
            self._observers.remove(observer)

    def forget(self, observer: Observer) -> None:
        """Stop queueing updates for ``observer`` (its stream ended before :meth:`serve`)."""
        if observer in self._observers:
            self._observers.remove(observer)

    async def serve(self, observer: Observer) -> None:
        """Send queued updates to one observer until it goes away (runs in its stream handler)."""
        stream = observer.stream
        try:
            while not observer.cut:
                while observer.queue and not observer.cut:
                    header, update = observer.queue.popleft()
                    observer.sent = True
                    await stream.send_message(codec, header)
                    await stream.send(update.data.cast("B"))
                if observer.cut:
                    break
                observer.wake = anyio.Event()
                await observer.wake.wait()
        except ChaosError as exc:
            log.info("observer %s went away: %s", stream.remote_peer, exc)
        finally:
            self.forget(observer)
            if observer.cut:
                stream.reset()


class SnapshotWaiters:
    """Steps newcomers asked this member to snapshot, and who waits for each."""

    def __init__(self) -> None:
        self._wanted: dict[int, anyio.Event] = {}
        self._published: dict[int, bool] = {}

    def want(self, step: int) -> anyio.Event:
        """Register interest in a snapshot of ``step``; the event is set once it is served."""
        return self._wanted.setdefault(step, anyio.Event())

    def wanted(self, step: int) -> bool:
        """Whether a newcomer waits for a snapshot of ``step``."""
        return step in self._wanted

    def done(self, step: int, ok: bool) -> None:
        """The snapshot of ``step`` is served (``ok``) or cannot be (the step was skipped)."""
        event = self._wanted.pop(step, None)
        self._published[step] = ok
        while len(self._published) > 64:
            self._published.pop(next(iter(self._published)))
        if event is not None:
            event.set()

    def outcome(self, step: int) -> bool:
        """Whether the snapshot of ``step`` was served."""
        return self._published.get(step, False)

    def give_up_before(self, step: int) -> None:
        """Steps below ``step`` will never be snapshotted: release their waiters."""
        for wanted in [s for s in self._wanted if s < step]:
            self.done(wanted, False)
