"""``hivemind.utils.timed_storage``: the DHT's clock and values that carry their expiration time.

hivemind's DHT clock is the wall clock (``time.time``), weakly synchronised between peers; records
expire at an absolute time on it. chaosp2p's DHT also bounds a record's life by wall-clock time
(``issued_at + ttl``), so the drop-in keeps hivemind's clock as it is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

ValueType = TypeVar("ValueType")

DHTExpiration = float
"""An absolute time on the DHT's clock (seconds since the epoch, as ``get_dht_time()``)."""

MAX_DHT_TIME_DISCREPANCY_SECONDS = 3
"""How far two peers' DHT clocks may disagree (hivemind's constant)."""


def get_dht_time() -> DHTExpiration:
    """The DHT's clock: wall-clock seconds, the same as hivemind's ``get_dht_time``."""
    return time.time()


@dataclass(init=True, repr=True, frozen=True)
class ValueWithExpiration(Generic[ValueType]):
    """A value and the DHT time it expires at; unpacks as ``value, expiration_time = ...``."""

    value: ValueType
    expiration_time: DHTExpiration

    def __iter__(self) -> Iterator[Any]:
        return iter((self.value, self.expiration_time))

    def __getitem__(self, item: int | str) -> Any:
        if item == 0:
            return self.value
        if item == 1:
            return self.expiration_time
        return getattr(self, str(item))

    def __eq__(self, other: object) -> bool:
        # hivemind compares equal to a plain (value, expiration) tuple too
        if isinstance(other, ValueWithExpiration):
            return bool(self.value == other.value and self.expiration_time == other.expiration_time)
        if isinstance(other, tuple):
            return (self.value, self.expiration_time) == other
        return False

    def __hash__(self) -> int:
        return hash((self.expiration_time,))


__all__ = ["MAX_DHT_TIME_DISCREPANCY_SECONDS", "DHTExpiration", "ValueWithExpiration", "get_dht_time"]
