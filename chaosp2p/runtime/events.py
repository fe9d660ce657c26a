"""Fan-out of typed events to any number of subscribers (``peer.events()``).

A subscription is registered the moment it is created -- not at its first ``__anext__`` -- so a
caller can take a view of the swarm and subscribe in one synchronous step and miss nothing in
between (``node.subscribe_with_view()``). Each subscriber gets its own bounded buffer; a subscriber
that stops reading loses the oldest events rather than stalling the peer that produces them, and
the loss is counted: ``subscription.dropped`` and, summed over all subscribers, ``hub.dropped``.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

import anyio


class Subscription:
    """An async iterator over the events published after it was created.

    Use it as ``async for event in subscription`` (or ``async with`` to unsubscribe on exit);
    ``dropped`` counts events this subscriber lost because its buffer was full.
    """

    __slots__ = ("__weakref__", "_buffer", "_closed", "_event", "_hub", "dropped")

    def __init__(self, hub: EventHub) -> None:
        self._hub = hub
        self._buffer: deque[Any] = deque()
        self._event = anyio.Event()
        self._closed = False
        self.dropped = 0

    def _offer(self, event: Any, limit: int) -> None:
        if len(self._buffer) >= limit:
            self._buffer.popleft()
            self.dropped += 1
            self._hub.dropped += 1
        self._buffer.append(event)
        self._event.set()

    def drain(self) -> list[Any]:
        """Take every event received so far without waiting."""
        taken = list(self._buffer)
        self._buffer.clear()
        return taken

    def pending(self) -> int:
        """Events received and not yet taken."""
        return len(self._buffer)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Any:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._event = anyio.Event()
            await self._event.wait()
        return self._buffer.popleft()

    def close(self) -> None:
        """Stop receiving events (an iteration in progress ends once the buffer is drained)."""
        if not self._closed:
            self._closed = True
            self._hub._remove(self)
            self._event.set()

    async def aclose(self) -> None:
        """Same as :meth:`close` (for ``contextlib.aclosing``)."""
        self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()


class EventHub:
    """Publish events; subscribers iterate them asynchronously."""

    def __init__(self, *, buffer_size: int = 1024) -> None:
        # Weak: a subscription its owner dropped (``break`` out of ``async for``) goes away with it.
        self._subscribers: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._buffer_size = buffer_size
        self.dropped = 0
        """Events lost by slow subscribers, over all subscribers."""

    def publish(self, event: Any) -> None:
        """Deliver ``event`` to every current subscriber (never blocks)."""
        for subscriber in list(self._subscribers):
            subscriber._offer(event, self._buffer_size)

    def subscribe(self) -> Subscription:
        """A subscription to events published from now on (registered immediately)."""
        subscription = Subscription(self)
        self._subscribers.add(subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)
