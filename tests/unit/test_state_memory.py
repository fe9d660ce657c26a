"""Large buffers are usable at once and the background pre-faulting never changes their contents."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from chaosp2p.state import memory
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


class _GatedLibc:
    """Stands in for libc: each madvise call waits until the test lets it finish."""

    def __init__(self) -> None:
        self.calls = 0
        self.inside = threading.Event()
        self.gate = threading.Semaphore(0)

    def madvise(self, address: object, length: object, advice: int) -> int:
        self.calls += 1
        self.inside.set()
        self.gate.acquire(timeout=10)
        return 0


def test_the_prefault_thread_does_not_outlive_its_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped buffer (a cancelled pull) is unmapped at once, not kept until every page is faulted in."""
    libc = _GatedLibc()
    monkeypatch.setattr(memory, "_libc", libc)
    monkeypatch.setattr(memory, "PREFAULT_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(memory, "PREFAULT_SLICE_BYTES", 64 << 10)
    before = set(threading.enumerate())
    buffer = memory.allocate_bytes(1 << 20)  # 16 slices
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "chaosp2p prefault"]
    assert libc.inside.wait(5)  # the thread is populating the first slice
    alive = weakref.ref(buffer)
    del buffer
    gc.collect()
    libc.gate.release()  # let the first slice finish
    thread.join(5)
    assert not thread.is_alive()
    assert libc.calls == 1  # it stopped instead of faulting in the other 15 slices
    assert alive() is None  # and nothing kept the buffer alive
