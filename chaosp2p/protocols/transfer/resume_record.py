"""The resume record: which chunks of one snapshot are already verified in a staging buffer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeRecord:
    """Which chunks of one snapshot are verified in the staging buffer (persist it to resume)."""

    run: str
    step: int
    hash_algorithm: str
    digest: bytes
    chunk_count: int
    verified: bytes
    """Bitmap, chunk ``i`` is bit ``i % 8`` (least significant first) of byte ``i // 8``."""

    def verified_chunks(self) -> list[int]:
        """Indices of the verified chunks."""
        bits = np.unpackbits(np.frombuffer(self.verified, dtype=np.uint8), bitorder="little")
        return [int(i) for i in np.flatnonzero(bits[: self.chunk_count])]

    @staticmethod
    def bitmap(flags: bytes | bytearray, chunk_count: int) -> bytes:
        """Pack one 0/1 byte per chunk into the bitmap form."""
        array = np.frombuffer(bytes(flags[:chunk_count]), dtype=np.uint8)
        return bytes(np.packbits(array != 0, bitorder="little").tobytes())
