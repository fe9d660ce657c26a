"""Transmit-limited broadcast queue (memberlist's ``TransmitLimitedQueue``, in spirit).

Each piece of news (one membership update or one info record per subject) waits here until it has
been piggybacked ``limit`` times. A newer item about the same subject replaces the older one (and
starts its count again), so the queue holds at most one item per subject. Order: fresh news goes
to the front and is sent first; after that items take turns round-robin, so transmissions stay
balanced -- the same effect as "least transmitted first" without sorting or moving items between
buckets on every message. ``take`` costs O(items taken) deque operations.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class _Entry(Generic[T]):
    __slots__ = ("item", "sends", "size", "version")

    def __init__(self, item: T, size: int, version: int) -> None:
        self.item = item
        self.size = size
        self.sends = 0
        self.version = version


class BroadcastQueue(Generic[T]):
    """News keyed by subject, each sent at most ``limit`` times (the limit is given per ``take``).

    Keys are the subjects' raw PeerID bytes (bytes cache their hash, which keeps ``take`` cheap).
    """

    __slots__ = ("_items", "_order", "_version")

    def __init__(self) -> None:
        # The order deque holds (key, version); entries whose version no longer matches the item
        # (replaced or discarded news) are skipped lazily.
        self._items: dict[bytes, _Entry[T]] = {}
        self._order: deque[tuple[bytes, int]] = deque()
        self._version = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: bytes) -> bool:
        return key in self._items

    def put(self, key: bytes, item: T, size: int) -> None:
        """Queue ``item`` (about ``key``) at the front, replacing older news about the same subject."""
        self._version += 1
        self._items[key] = _Entry(item, size, self._version)
        self._order.appendleft((key, self._version))
        if len(self._order) > 4 * len(self._items) + 64:
            self._compact()

    def discard(self, key: bytes) -> None:
        """Drop any news about ``key``."""
        self._items.pop(key, None)

    def take(self, *, max_items: int, max_bytes: int, limit: int, skip: bytes | None = None) -> list[T]:
        """Up to ``max_items`` items (about ``max_bytes`` in total), fresh news first.

        Each returned item counts one transmission; items reaching ``limit`` are dropped. News about
        ``skip`` is left out (the caller adds its own item about the destination).
        """
        items = self._items
        order = self._order
        if not items:
            order.clear()
            return []
        out: list[T] = []
        budget = max_bytes
        held: tuple[bytes, int] | None = None
        remaining = len(order)  # look at each queued entry at most once per call
        while remaining and len(out) < max_items and budget > 0:
            remaining -= 1
            key, version = order.popleft()
            entry = items.get(key)
            if entry is None or entry.version != version:
                continue
            if key == skip:
                held = (key, version)
                continue
            if entry.size > budget and out:
                order.appendleft((key, version))
                break
            out.append(entry.item)
            budget -= entry.size
            entry.sends += 1
            if entry.sends >= limit:
                del items[key]
            else:
                order.append((key, version))
        if held is not None:
            order.appendleft(held)
        return out

    def _compact(self) -> None:
        items = self._items
        self._order = deque(
            (key, version) for key, version in self._order if key in items and items[key].version == version
        )
