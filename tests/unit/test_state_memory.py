"""Large buffers are usable at once and the background pre-faulting never changes their contents."""

from __future__ import annotations

import threading

import numpy as np

from chaosp2p.state.memory import PREFAULT_MIN_BYTES, allocate_bytes


def test_small_buffers_are_plain_arrays() -> None:
    buffer = allocate_bytes(1000)
    assert buffer.shape == (1000,) and buffer.dtype == np.uint8 and buffer.flags.writeable


def test_writes_racing_the_prefault_thread_survive_it() -> None:
    size = PREFAULT_MIN_BYTES * 2
    buffer = allocate_bytes(size)
    pattern = np.arange(size // 4096, dtype=np.uint64).astype(np.uint8)
    buffer[::4096] = pattern  # written while the helper thread is still populating pages
    for thread in threading.enumerate():
        if thread.name == "chaosp2p prefault":
            thread.join(timeout=30)
    assert np.array_equal(buffer[::4096], pattern)
    assert buffer.flags.c_contiguous and buffer.flags.writeable and buffer.nbytes == size
