"""Fan-out of typed events to any number of subscribers (``peer.events()``).

Each subscriber gets its own bounded buffer; a subscriber that stops reading loses the oldest
events (counted in ``dropped``) rather than stalling the peer that produces them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import anyio


class _Subscriber:
    __slots__ = ("buffer", "dropped", "event")

    def __init__(self) -> None:
        self.buffer: deque[Any] = deque()
        self.dropped = 0
        self.event = anyio.Event()


class EventHub:
    """Publish events; subscribers iterate them asynchronously."""

    def __init__(self, *, buffer_size: int = 1024) -> None:
        self._subscribers: list[_Subscriber] = []
        self._buffer_size = buffer_size

    def publish(self, event: Any) -> None:
        """Deliver ``event`` to every current subscriber (never blocks)."""
        for subscriber in self._subscribers:
            if len(subscriber.buffer) >= self._buffer_size:
                subscriber.buffer.popleft()
                subscriber.dropped += 1
            subscriber.buffer.append(event)
            subscriber.event.set()

    async def subscribe(self) -> AsyncIterator[Any]:
        """Yield events published from now on, until the caller stops iterating."""
        subscriber = _Subscriber()
        self._subscribers.append(subscriber)
        try:
            while True:
                while subscriber.buffer:
                    yield subscriber.buffer.popleft()
                subscriber.event = anyio.Event()
                await subscriber.event.wait()
        finally:
            self._subscribers.remove(subscriber)
