"""The owner's arithmetic: a weighted average of validated contributions, chunk by chunk (pure numpy).

Theory of operation
-------------------
An owner holds every contribution to its shard in its own array (received straight into it) and
reduces the shard in chunks as they complete, so the reduce of chunk *i* overlaps the receipt of
chunk *i + 1*. Each chunk is ``sum_i (w_i / W) * x_i`` over the included contributions, always in
the same order (sorted by peer id), accumulated in float32 -- so the result does not depend on the
order in which the bytes arrived, and the all-gather then hands these exact bytes to everyone.

Validation rides on the accumulator: the coefficients are finite and sum to 1, so a chunk's
accumulated values are all finite exactly when every contribution's chunk is (a NaN or an infinity
propagates; a convex combination of finite float32 values cannot overflow except by rounding at
the very edge of the range, which the float64 fallback below handles). One float64 sum of the
accumulated chunk is therefore the whole check in the common case. When it fails, each contribution's
chunk is checked on its own, the culprits are excluded, ``W`` changes, and every chunk reduced so
far is recomputed without them -- the owner still holds all the inputs, and nothing has been sent
yet, since results go out only once the whole shard is done.

Wire formats: ``float16`` is numpy's IEEE half; ``bfloat16`` (no numpy type) is the upper half of a
float32, rounded to nearest (ties away from zero: three cheap passes instead of seven for ties to
even), held in ``uint16`` arrays. Values a format cannot hold become
infinities, which the owner then excludes like any non-finite contribution.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chaosp2p.protocols.averaging.messages import WireDtype
from chaosp2p.wire.identity import PeerID

_NUMPY_STORAGE: dict[WireDtype, type[np.generic]] = {
    WireDtype.FLOAT32: np.float32,
    WireDtype.FLOAT16: np.float16,
    WireDtype.BFLOAT16: np.uint16,
}
BLOCK_ELEMENTS = 1 << 16
"""The reduce works through a chunk in blocks of this many elements (256 KiB of float32)."""
_BF16_NAN_SAFE_MAX = np.uint32(0xFFFF7FFF)
"""Largest bit pattern whose rounding increment cannot wrap around 2**32 (everything above is a NaN)."""
_UPPER_HALF = 1 if sys.byteorder == "little" else 0
"""Index of a float32's upper 16 bits among its two uint16 halves."""


def all_finite(values: np.ndarray) -> bool:
    """No NaN or infinity in ``values`` (a float32 sum first, ~8 ms per 100 MB; only a non-finite
    sum, which large finite values can also give, is checked element by element)."""
    return math.isfinite(float(values.sum())) or bool(np.isfinite(values).all())


def storage_dtype(wire: WireDtype) -> type[np.generic]:
    """The numpy type that holds ``wire`` elements."""
    return _NUMPY_STORAGE[wire]


def encode(source: np.ndarray, out: np.ndarray, wire: WireDtype, scratch: np.ndarray | None = None) -> None:
    """Write float32 ``source`` into ``out`` (storage of ``wire``, same length).

    bfloat16 rounds to nearest, ties away from zero (three passes: clamp, add half an ulp, take
    the upper halves); ``scratch`` (uint32, at least as long) avoids an allocation.
    """
    if wire is WireDtype.FLOAT32:
        np.copyto(out, source)
    elif wire is WireDtype.FLOAT16:
        with np.errstate(over="ignore"):  # out of float16's range: infinity, excluded by the owner
            np.copyto(out, source, casting="same_kind")
    else:
        bits = np.empty(len(source), dtype=np.uint32) if scratch is None else scratch[: len(source)]
        np.minimum(source.view(np.uint32), _BF16_NAN_SAFE_MAX, out=bits)
        bits += np.uint32(0x8000)
        np.copyto(out, bits.view(np.uint16)[_UPPER_HALF::2])


def decode(source: np.ndarray, out: np.ndarray, wire: WireDtype) -> None:
    """Write ``source`` (storage of ``wire``) into float32 ``out`` of the same length."""
    if wire is WireDtype.BFLOAT16:
        bits = out.view(np.uint32)
        np.copyto(bits, source)
        np.left_shift(bits, 16, out=bits)
    else:
        np.copyto(out, source)


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """One contribution to a shard: who sent it, its weight (> 0) and its values (``wire`` storage)."""

    peer: PeerID
    weight: float
    values: np.ndarray
    wire: WireDtype = WireDtype.FLOAT32


class ShardReducer:
    """Weighted average of ``parts`` into float32 ``out``, one chunk at a time, in chunk order."""

    def __init__(self, parts: Sequence[Part], out: np.ndarray, *, chunk_elements: int) -> None:
        if chunk_elements < 1:
            raise ValueError("chunk_elements must be >= 1")
        size = len(out)
        for part in parts:
            if part.values.shape != (size,) or not part.weight > 0:
                raise ValueError(f"part from {part.peer} has shape {part.values.shape} and weight {part.weight}")
        self._parts = sorted(parts, key=lambda part: part.peer)
        self._out = out
        self._chunk = chunk_elements
        self._done = 0
        """Chunks reduced so far (with the current set of included parts)."""
        self._stale = False
        self.excluded: dict[PeerID, str] = {}
        """Peers left out, with the reason (set by :meth:`reduce_chunk` or :meth:`exclude`)."""
        scratch = min(size, chunk_elements, BLOCK_ELEMENTS)
        self._tmp = np.empty(scratch, dtype=np.float32)
        self._decoded = np.empty(scratch, dtype=np.float32)
        self._wide = np.empty(scratch, dtype=np.float64)

    @property
    def chunk_count(self) -> int:
        """Number of chunks of the shard."""
        return -(-len(self._out) // self._chunk)

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """Elements ``start, stop`` of chunk ``index``."""
        start = index * self._chunk
        return start, min(len(self._out), start + self._chunk)

    @property
    def included(self) -> tuple[PeerID, ...]:
        """Peers whose contribution is in the average, in reduce order."""
        return tuple(part.peer for part in self._parts if part.peer not in self.excluded)

    @property
    def total_weight(self) -> float:
        """Sum of the included weights (0 when nothing valid is left)."""
        return float(sum(part.weight for part in self._parts if part.peer not in self.excluded))

    def exclude(self, peer: PeerID, reason: str) -> None:
        """Leave ``peer`` out from now on; chunks already reduced are redone at the next call."""
        if peer not in self.excluded and any(part.peer == peer for part in self._parts):
            self.excluded[peer] = reason
            self._stale = True

    def reduce_chunk(self, index: int) -> list[PeerID]:
        """Reduce chunk ``index`` (chunks go in order); return peers newly excluded for non-finite values."""
        if index != self._done:
            raise ValueError(f"chunk {index} out of order (next is {self._done})")
        newly: list[PeerID] = []
        if self._stale:
            self._stale = False
            for earlier in range(index):
                newly += self._reduce(earlier)
        while True:
            found = self._reduce(index)
            newly += found
            if not found:
                break
            for earlier in range(index):  # the weights changed: redo what is already reduced
                newly += self._reduce(earlier)
        self._done = index + 1
        return newly

    def recompute(self) -> list[PeerID]:
        """Reduce every chunk again with the current set of included parts (after :meth:`exclude`)."""
        self._done = 0
        self._stale = False
        newly: list[PeerID] = []
        for index in range(self.chunk_count):
            newly += self.reduce_chunk(index)
        return newly

    def _reduce(self, index: int) -> list[PeerID]:
        # Bad inputs are expected here (that is what the check finds): no warnings for inf - inf.
        with np.errstate(over="ignore", invalid="ignore"):
            return self._reduce_checked(index)

    def _reduce_checked(self, index: int) -> list[PeerID]:
        start, stop = self.chunk_bounds(index)
        parts = [part for part in self._parts if part.peer not in self.excluded]
        total = sum(part.weight for part in parts)
        if not parts or total <= 0:
            self._out[start:stop].fill(0.0)
            return []
        coefficients = [np.float32(part.weight / total) for part in parts]
        check = 0.0
        # Blocks small enough to stay in the L2 cache across the passes over them.
        for low in range(start, stop, BLOCK_ELEMENTS):
            high = min(stop, low + BLOCK_ELEMENTS)
            out = self._out[low:high]
            tmp = self._tmp[: high - low]
            for position, (part, coefficient) in enumerate(zip(parts, coefficients, strict=True)):
                values = self._float_values(part, low, high)
                if position == 0:
                    np.multiply(values, coefficient, out=out)
                else:
                    np.multiply(values, coefficient, out=tmp)
                    np.add(out, tmp, out=out)
            check += float(np.add.reduce(out, dtype=np.float64))
        if np.isfinite(check):
            return []
        culprits = []
        for part in parts:
            if not all(
                np.isfinite(
                    np.add.reduce(self._float_values(part, low, min(stop, low + BLOCK_ELEMENTS)), dtype=np.float64)
                )
                for low in range(start, stop, BLOCK_ELEMENTS)
            ):
                culprits.append(part.peer)
                self.excluded[part.peer] = "non-finite values (NaN or infinity)"
        if not culprits:  # finite inputs that rounded past float32's range: redo this chunk wide
            for low in range(start, stop, BLOCK_ELEMENTS):
                high = min(stop, low + BLOCK_ELEMENTS)
                wide = self._wide[: high - low]
                wide.fill(0.0)
                for part in parts:
                    wide += self._float_values(part, low, high).astype(np.float64) * (part.weight / total)
                np.copyto(self._out[low:high], wide, casting="same_kind")
        return culprits

    def _float_values(self, part: Part, start: int, stop: int) -> np.ndarray:
        values = part.values[start:stop]
        if part.wire is WireDtype.BFLOAT16:
            decoded = self._decoded[: stop - start]
            decode(values, decoded, WireDtype.BFLOAT16)
            return decoded
        return values
