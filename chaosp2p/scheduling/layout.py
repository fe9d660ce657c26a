"""Mapping between the planner's "virtual" byte line and the real missing ranges.

The planner works on one contiguous line ``[0, M)`` that concatenates the missing ranges in offset
order; a plan from scratch has a single range ``(0, S)``. Chunk-aligned plans count in *units*: the
pieces of the missing ranges cut at every multiple of ``align_bytes`` of the real offset, so that a
shard made of whole units starts and ends on chunk boundaries (or on a range's own ends).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence

import numpy as np

from chaosp2p.errors import ConfigError
from chaosp2p.scheduling.kernel import IntArray
from chaosp2p.scheduling.model import Assignment


class Segments:
    """Sorted, non-overlapping, merged missing ranges and their prefix sums."""

    __slots__ = ("_unit_starts", "align", "cum_bytes", "cum_units", "lengths", "offsets", "total", "units")

    def __init__(self, ranges: Sequence[tuple[int, int]], align: int | None) -> None:
        cleaned: list[tuple[int, int]] = []
        for item in ranges:
            try:
                offset, length = item
            except (TypeError, ValueError):
                raise ConfigError(f"a missing range must be (offset, length) (got {item!r})") from None
            for value, what in ((offset, "offset"), (length, "length")):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"missing range {what} must be an int >= 0 (got {item!r})")
            if length:
                cleaned.append((int(offset), int(length)))
        cleaned.sort()
        merged: list[list[int]] = []
        for offset, length in cleaned:
            if merged and offset < merged[-1][0] + merged[-1][1]:
                raise ConfigError(f"missing ranges overlap at offset {offset}")
            if merged and offset == merged[-1][0] + merged[-1][1]:
                merged[-1][1] += length
            else:
                merged.append([offset, length])
        self.offsets = [m[0] for m in merged]
        self.lengths = [m[1] for m in merged]
        self.cum_bytes = [0]
        for length in self.lengths:
            self.cum_bytes.append(self.cum_bytes[-1] + length)
        self.total = self.cum_bytes[-1]
        self.align = align
        self.cum_units = [0]
        self._unit_starts: list[int] = []
        if align is not None:
            for offset, length in zip(self.offsets, self.lengths, strict=True):
                first = offset // align
                self._unit_starts.append(first)
                self.cum_units.append(self.cum_units[-1] + (offset + length + align - 1) // align - first)
        self.units = self.cum_units[-1]

    def unit_bounds_to_virtual(self, bounds: IntArray) -> IntArray:
        """Virtual byte positions of unit boundaries (``bounds`` sorted, in ``[0, units]``)."""
        align = self.align
        assert align is not None
        if len(self.offsets) == 1 and self.offsets[0] % align == 0:
            # A single range starting on a chunk boundary: units are whole chunks but the last.
            return np.minimum(bounds * align, self.total)
        cum_units = np.asarray(self.cum_units, dtype=np.int64)
        seg = np.searchsorted(cum_units, bounds, side="right") - 1
        seg = np.minimum(seg, len(self.offsets) - 1)
        offsets = np.asarray(self.offsets, dtype=np.int64)[seg]
        lengths = np.asarray(self.lengths, dtype=np.int64)[seg]
        firsts = np.asarray(self._unit_starts, dtype=np.int64)[seg]
        within = bounds - cum_units[seg]
        real = np.where(within == 0, offsets, np.minimum(offsets + lengths, (firsts + within) * align))
        return np.asarray(np.asarray(self.cum_bytes, dtype=np.int64)[seg] + real - offsets, dtype=np.int64)

    def materialize(self, bounds: Sequence[int], owners: Sequence[Hashable]) -> list[Assignment]:
        """Real ``(peer, offset, length)`` entries of shards ``[bounds[j], bounds[j+1])`` of ``owners[j]``."""
        if len(self.offsets) == 1:
            base = self.offsets[0]
            starts = [b + base for b in bounds[:-1]] if base else list(bounds[:-1])
            lengths = [b - a for a, b in itertools.pairwise(bounds)]
            return list(zip(owners, starts, lengths, strict=True))
        out: list[Assignment] = []
        cum = self.cum_bytes
        seg = 0
        for j, owner in enumerate(owners):
            lo, hi = bounds[j], bounds[j + 1]
            while lo < hi:
                while cum[seg + 1] <= lo:
                    seg += 1
                take = min(hi, cum[seg + 1]) - lo
                out.append((owner, self.offsets[seg] + lo - cum[seg], take))
                lo += take
        return out
