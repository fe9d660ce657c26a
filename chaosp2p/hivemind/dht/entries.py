"""What one writer holds under one hivemind DHT key, and how several writers' holdings merge.

Theory of operation
-------------------
hivemind's DHT stores, under each key, either one *regular* value or a *dictionary* of subkeys,
each entry with its own absolute expiration time; any peer may add subkeys to a key, and a
``get`` merges what the replicas hold: subkeys by newest expiration each, a regular value by the
latest expiration overall. chaosp2p's DHT has no shared mutable dictionaries -- a signed record
under ``/pk/<writer>/<name>`` can only be written by its writer -- so the drop-in gives every
writer its own share of each key:

* a writer keeps its entries for key K in one :class:`Entries` (the same rules hivemind's local
  storage applies to one replica: a later expiration replaces, a subkey turns an older regular
  value into a dictionary, an expired entry is gone), publishes it as one signed record whose
  lifetime is the latest expiration in it, and announces itself as a provider of K;
* ``get(K)`` fetches the record of every provider of K and merges them with :func:`merge` (the
  rules of hivemind's search state), dropping what has expired on the DHT's clock.

This module is pure: bytes in, bytes out, the time passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from chaosp2p.errors import RemoteProtocolError

FORMAT = 1
"""Version of the record layout (``[FORMAT, regular or nil, [[subkey, value, expiration], ...]]``)."""
MAX_ENTRIES = 4096
"""Subkeys one writer may hold under one key (a record is also bounded by the DHT's value size)."""


@dataclass(slots=True)
class Entries:
    """One writer's entries under one key: a regular value or subkeys, each ``(value, expiration)``."""

    regular: tuple[bytes, float] | None = None
    subkeys: dict[bytes, tuple[bytes, float]] = field(default_factory=dict)
    """Serialized subkey -> (serialized value, expiration). Empty unless this is a dictionary."""
    dictionary_expiration: float = float("-inf")
    """The dictionary's own expiration (the latest any of its subkeys had), as hivemind keeps it."""

    @property
    def is_dictionary(self) -> bool:
        """Whether subkeys are held (otherwise a regular value, or nothing)."""
        return self.regular is None and self.dictionary_expiration > float("-inf")

    @property
    def expiration(self) -> float | None:
        """When the whole holding expires (None: nothing held)."""
        if self.regular is not None:
            return self.regular[1]
        if self.is_dictionary:
            return self.dictionary_expiration
        return None

    def prune(self, now: float) -> None:
        """Forget what expired before ``now``."""
        if self.regular is not None and self.regular[1] < now:
            self.regular = None
        for subkey in [k for k, (_, expiration) in self.subkeys.items() if expiration < now]:
            del self.subkeys[subkey]
        if self.dictionary_expiration < now:
            self.subkeys.clear()
            self.dictionary_expiration = float("-inf")

    def store(self, subkey: bytes | None, value: bytes, expiration: float, now: float) -> bool:
        """Add one entry by hivemind's rules; False if it is already expired or something newer is held."""
        self.prune(now)
        if expiration < now:
            return False
        held = self.expiration
        if subkey is None:
            if held is not None and held >= expiration:
                return False
            self.regular, self.subkeys, self.dictionary_expiration = (value, expiration), {}, float("-inf")
            return True
        if not self.is_dictionary:
            if held is not None and held >= expiration:
                return False  # a regular value that outlives this subkey stays
            self.regular, self.subkeys, self.dictionary_expiration = None, {}, expiration
        self.dictionary_expiration = max(self.dictionary_expiration, expiration)
        previous = self.subkeys.get(subkey)
        if previous is not None and previous[1] >= expiration:
            return False
        if previous is None and len(self.subkeys) >= MAX_ENTRIES:
            return False
        self.subkeys[subkey] = (value, expiration)
        return True

    def copy(self) -> Entries:
        """An independent copy."""
        return Entries(self.regular, dict(self.subkeys), self.dictionary_expiration)

    def encode(self) -> bytes:
        """The signed record's value."""
        regular = None if self.regular is None else list(self.regular)
        items = [[subkey, value, expiration] for subkey, (value, expiration) in self.subkeys.items()]
        packed: bytes = msgpack.packb([FORMAT, regular, items, self.dictionary_expiration], use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, raw: bytes) -> Entries:
        """Parse a writer's record; :class:`RemoteProtocolError` if it is not one."""
        try:
            body = msgpack.unpackb(raw, raw=False, use_list=True, max_array_len=MAX_ENTRIES + 8)
            version, regular, items, dictionary_expiration = body
            if version != FORMAT or not isinstance(items, list) or len(items) > MAX_ENTRIES:
                raise ValueError("unknown layout")
            entries = cls(dictionary_expiration=_time(dictionary_expiration))
            if regular is not None:
                value, expiration = regular
                entries.regular = (_bytes(value), _time(expiration))
            for subkey, value, expiration in items:
                entries.subkeys[_bytes(subkey)] = (_bytes(value), _time(expiration))
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise RemoteProtocolError(f"not a hivemind DHT record: {exc}") from None
        if entries.regular is not None and entries.subkeys:
            raise RemoteProtocolError("not a hivemind DHT record: both a regular value and subkeys")
        return entries


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError("expected bytes")
    return value


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise TypeError("expected a time")
    return float(value)


def merge(holdings: Iterable[Entries], now: float) -> Entries | None:
    """Merge writers' holdings of one key as hivemind merges replicas; None if nothing unexpired is left.

    Two dictionaries merge subkey by subkey (the later expiration wins each); otherwise the holding
    that expires last wins whole. The result's expiration is the latest of all.
    """
    best: Entries | None = None
    best_expiration = float("-inf")
    for holding in holdings:
        candidate = holding.copy()
        candidate.prune(now)
        expiration = candidate.expiration
        if expiration is None:
            continue
        if best is not None and best.is_dictionary and candidate.is_dictionary:
            for subkey, (value, entry_expiration) in candidate.subkeys.items():
                held = best.subkeys.get(subkey)
                if held is None or held[1] < entry_expiration:
                    best.subkeys[subkey] = (value, entry_expiration)
        elif expiration > best_expiration:
            best = candidate
        if expiration > best_expiration:
            best_expiration = expiration
            if best is not None and best.is_dictionary:
                best.dictionary_expiration = max(best.dictionary_expiration, expiration)
    return best


__all__ = ["FORMAT", "MAX_ENTRIES", "Entries", "merge"]
