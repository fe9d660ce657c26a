"""The newcomer side of catch-up: receiving a sponsor's averaged updates while loading a snapshot.

:class:`UpdateReceiver` opens an observe stream to the sponsor (see :mod:`chaosp2p.training.feed`)
and receives updates in the background into a bounded queue, each into a fresh float32 array of the
size the newcomer's own model has -- a sponsor announcing any other size is refused before a byte of
payload is read. Updates must arrive for consecutive steps; a gap, a stream that ends, or a queue
that overflows ends the catch-up with a :class:`~chaosp2p.errors.TransferError`, and the newcomer
starts its join again (with another sponsor if this one failed).
"""

from __future__ import annotations

from collections import deque

import anyio
import anyio.abc
import numpy as np

from chaosp2p.errors import ChaosError, RemoteProtocolError, TransferError
from chaosp2p.protocols.collab.messages import ObserveAccepted, ObserveRequest, Refused, Ticket, UpdateHeader, codec
from chaosp2p.transport.stream import Stream


class UpdateReceiver:
    """Averaged updates streamed by a sponsor, queued in step order."""

    def __init__(
        self, stream: Stream, *, numel: int, completed: int, max_queued: int, ticket: Ticket | None = None
    ) -> None:
        self._stream = stream
        self._numel = numel
        self.sponsor_completed = completed
        """The newest step the sponsor had completed when it accepted us."""
        self.ticket = ticket
        """The sponsor's ticket, shown to the members with our snapshot requests (None from a
        sponsor that gives none)."""
        self._max_queued = max_queued
        self._queue: deque[tuple[UpdateHeader, np.ndarray]] = deque()
        self._arrived = anyio.Event()
        self._error: ChaosError | None = None
        self.latest: int | None = None
        """The newest step received so far."""

    @classmethod
    async def open(cls, stream: Stream, *, run: str, layout: bytes, numel: int, max_queued: int) -> UpdateReceiver:
        """Ask the sponsor on ``stream`` to stream its updates to us."""
        await stream.send_message(codec, ObserveRequest(run=run, layout=layout))
        reply = await stream.receive_message(codec)
        if isinstance(reply, Refused):
            raise TransferError(f"{stream.remote_peer} will not stream updates: {reply.reason}")
        if not isinstance(reply, ObserveAccepted):
            raise RemoteProtocolError(f"expected ObserveAccepted, got {type(reply).__name__}")
        if reply.numel != numel:
            raise TransferError(f"{stream.remote_peer} trains a model of {reply.numel} parameters, ours has {numel}")
        ticket = reply.ticket
        if ticket is not None and (ticket.sponsor != stream.remote_peer or ticket.newcomer == ticket.sponsor):
            raise RemoteProtocolError(f"{stream.remote_peer} sent a ticket that is not its own")
        return cls(stream, numel=numel, completed=reply.completed, max_queued=max_queued, ticket=ticket)

    async def run(self) -> None:
        """Receive updates until the stream ends or fails (run it in a task group)."""
        try:
            while True:
                header = await self._stream.receive_message(codec)
                if header is None:
                    raise TransferError(f"sponsor {self._stream.remote_peer} ended the update stream")
                if not isinstance(header, UpdateHeader):
                    raise RemoteProtocolError(f"expected UpdateHeader, got {type(header).__name__}")
                if header.numel != self._numel:
                    raise RemoteProtocolError(f"update of {header.numel} values, the model has {self._numel}")
                if self.latest is not None and header.step != self.latest + 1:
                    raise TransferError(f"update stream skipped from step {self.latest} to {header.step}")
                if len(self._queue) >= self._max_queued:
                    raise TransferError(f"catch-up fell more than {self._max_queued} updates behind the sponsor")
                update = np.empty(self._numel, dtype=np.float32)
                await self._stream.receive_into(update.data.cast("B"))
                self._queue.append((header, update))
                self.latest = header.step
                self._arrived.set()
        except ChaosError as exc:
            self._error = exc if isinstance(exc, TransferError) else TransferError(f"update stream failed: {exc}")
            self._arrived.set()

    async def next(self) -> tuple[UpdateHeader, np.ndarray]:
        """The oldest update not yet taken (waits for one)."""
        while not self._queue:
            if self._error is not None:
                raise self._error
            self._arrived = anyio.Event()
            await self._arrived.wait()
        return self._queue.popleft()

    def pending(self) -> int:
        """Updates received and not yet taken."""
        return len(self._queue)

    async def aclose(self) -> None:
        """Stop observing."""
        self._stream.reset()
