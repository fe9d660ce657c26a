"""Host memory for snapshots and staging buffers, faulted in by a helper thread.

Touching freshly mapped memory costs a page fault per 4 KiB page. For a 1 GiB staging buffer those
faults would otherwise land inside the transfer, one decrypted record at a time, on the event-loop
thread (measured here: about 2 s per GiB on demand). Large buffers are therefore mapped lazily and
handed to a background thread that asks the kernel to populate them (``MADV_POPULATE_WRITE``,
about 0.5 s per GiB here), *concurrently* with their first use: the call goes through ctypes,
which releases the GIL, so it runs on another core while the event loop keeps serving, and it
never changes the contents, so racing with writers is safe. On kernels without it (before 5.14)
pages are simply faulted on demand. Small buffers use ``np.empty``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
import threading
import weakref

import numpy as np

PREFAULT_MIN_BYTES = 64 << 20
PREFAULT_SLICE_BYTES = 64 << 20
MADV_POPULATE_WRITE = 23  # linux/mman.h, Linux 5.14+

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None


def allocate_bytes(size: int) -> np.ndarray:
    """A writable, contiguous ``uint8`` array of ``size`` bytes; large ones are pre-faulted in the background."""
    if size < PREFAULT_MIN_BYTES or _libc is None:
        return np.empty(size, dtype=np.uint8)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    array = np.frombuffer(mapping, dtype=np.uint8)  # the array keeps the mapping alive
    threading.Thread(target=_prefault, args=(weakref.ref(array),), name="chaosp2p prefault", daemon=True).start()
    return array


def _prefault(buffer: weakref.ref[np.ndarray]) -> None:
    # The thread holds the buffer only while one slice is being populated: once its owner drops it
    # (a pull that failed or was cancelled), the thread stops at the next slice and the memory is
    # unmapped, instead of being kept -- and faulted in -- until the whole buffer is done.
    assert _libc is not None
    offset = 0
    while True:
        array = buffer()
        if array is None or offset >= array.nbytes:
            return
        length = min(PREFAULT_SLICE_BYTES, array.nbytes - offset)
        address = array.ctypes.data + offset
        if _libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_POPULATE_WRITE) != 0:
            return  # unsupported kernel: the pages fault in on first use instead
        del array
        offset += length
