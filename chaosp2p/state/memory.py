"""Host memory for snapshots and staging buffers, faulted in up front.

Touching freshly mapped memory costs a page fault per 4 KiB page. For a 1 GiB staging buffer those
faults would otherwise land inside the transfer, one decrypted record at a time, on the event-loop
thread (measured here: about 2 s per GiB on demand, 0.7 s per GiB with ``MAP_POPULATE``, which also
runs in a worker thread while nothing else waits on it). Small buffers use ``np.empty``.
"""

from __future__ import annotations

import mmap

import numpy as np

POPULATE_MIN_BYTES = 64 << 20
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def allocate_bytes(size: int) -> np.ndarray:
    """A writable, contiguous ``uint8`` array of ``size`` bytes, pre-faulted when large (Linux)."""
    if size < POPULATE_MIN_BYTES or not _MAP_POPULATE:
        return np.empty(size, dtype=np.uint8)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE)
    return np.frombuffer(mapping, dtype=np.uint8)  # the array keeps the mapping alive
