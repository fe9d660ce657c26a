"""Large buffers go back to the operating system when freed (glibc's ``mallopt``).

Why: a peer allocates and frees buffers of megabytes all the time -- a snapshot of the model and
optimizer for every newcomer, the rounds' shards, the chunks of a state pull. glibc serves a request
above its *mmap threshold* with a fresh mapping, returned to the kernel on ``free``; but each such
free raises the threshold to the freed size (up to 32 MiB on 64-bit), so from then on same-sized
buffers come from the heap, whose freed space a long-lived peer rarely gets back. In an hour's soak
(``benchmarks/soak.py``) the founder's RSS grew about 3 MB/min in steps at joins; the same 7-minute
churn, run side by side, grew +56 MB with glibc's defaults (420 -> 476 MB, +6.0 MB/min over its
second half) and stayed flat (396 -> 397 MB) with the threshold fixed at 128 KiB; fixed at 8 MiB
(the default, ``PeerConfig.mmap_threshold_bytes``: buffers of a few MiB, such as a pull's chunks,
keep reusing heap memory instead of faulting in fresh pages each time) it rose 401 -> 419 MB in the
first minutes and then held (+0.02 MB/min over the second half). Raw runs:
``benchmarks/results/soak_malloc_*.json``. Setting the threshold with ``mallopt`` also turns its
dynamic adjustment off.

:func:`keep_large_buffers_mapped` sets it once per process (the first peer of a process that asks
wins; later calls with another value change it again). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("chaosp2p.runtime")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_applied: int | None = None


def keep_large_buffers_mapped(threshold_bytes: int) -> bool:
    """Serve allocations of ``threshold_bytes`` or more from their own mappings (and keep the heap's
    free top at most that large), so freeing them returns the memory. 0 leaves the allocator as it
    is. True if glibc took the setting (now or before)."""
    global _applied
    if threshold_bytes <= 0 or not sys.platform.startswith("linux"):
        return False
    if _applied == threshold_bytes:
        return True
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; the mmap threshold is capped by glibc at 32 MiB.
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold_bytes))
    if ok:
        _applied = threshold_bytes
        log.debug("allocator: buffers of %d bytes or more are mapped on their own", threshold_bytes)
    return ok


__all__ = ["keep_large_buffers_mapped"]
