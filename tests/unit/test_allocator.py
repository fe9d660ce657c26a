"""Freed large buffers go back to the OS (chaosp2p/runtime/allocator.py), in a fresh interpreter each.

glibc raises its mmap threshold to the size of each mapped buffer freed, so the next buffer of that
size comes from the heap and stays in the process's RSS after it is freed: a long-lived peer grew
at every snapshot it served (the one-hour soak). With the threshold fixed, it does not.
"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from chaosp2p.runtime.allocator import keep_large_buffers_mapped

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None, reason="glibc only"
)

CYCLES = """
import sys
from chaosp2p.runtime.allocator import keep_large_buffers_mapped

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6

if sys.argv[1] == "fixed":
    assert keep_large_buffers_mapped(8 << 20)
before = rss_mb()
for _ in range(3):
    buffer = b"\\x01" * 20_000_000  # a snapshot-sized buffer, every page touched
    del buffer
print(rss_mb() - before)
"""


def _growth_mb(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def test_a_freed_snapshot_sized_buffer_leaves_the_rss_where_it_was() -> None:
    assert _growth_mb("fixed") < 5.0


def test_without_it_glibc_keeps_the_second_buffer_in_the_heap() -> None:
    # What the setting is for (and proof the check above can fail): glibc's own behaviour.
    assert _growth_mb("default") > 15.0


def test_zero_leaves_the_allocator_alone() -> None:
    assert keep_large_buffers_mapped(0) is False
