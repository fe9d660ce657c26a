"""How much a newcomer can stage: checked before a staging buffer is mapped, never after.

A snapshot's size comes from its sources. The protocol bounds it by ``max_state_bytes`` (1 TiB by
default, because real models are that large), so the newcomer also asks the machine: an in-memory
staging buffer may take at most ``max_staging_memory_fraction`` of the memory available now, and a
file-backed one (``--resume``) at most the free space of its file system. A snapshot that does not
fit fails the pull with a :class:`~chaosp2p.errors.TransferError` before anything is allocated --
not an OOM kill half-way through pre-faulting.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from chaosp2p.protocols.transfer.config import TransferConfig


def available_memory_bytes() -> int | None:
    """Memory the kernel can hand out now without swapping (``MemAvailable``), or ``None`` if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def staging_capacity(config: TransferConfig, path: Path | None = None) -> int:
    """The largest snapshot this peer can stage now, in memory (``path=None``) or in the file ``path``."""
    if path is None:
        memory = available_memory_bytes()
        if memory is None:
            return config.max_state_bytes
        return min(config.max_state_bytes, int(memory * config.max_staging_memory_fraction))
    folder = path.parent if path.parent != Path("") else Path(".")
    free = shutil.disk_usage(folder).free
    existing = path.stat().st_size if path.exists() else 0  # a resumed file is reused in place
    return min(config.max_state_bytes, free + existing)
