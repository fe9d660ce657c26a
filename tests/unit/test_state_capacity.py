"""A newcomer knows how much it can stage before it maps anything."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.state.capacity import available_memory_bytes, staging_capacity


def test_memory_capacity_is_a_share_of_what_is_available_now() -> None:
    memory = available_memory_bytes()
    assert memory is not None and memory > 0
    config = dataclasses.replace(TransferConfig(), max_staging_memory_fraction=0.5)
    capacity = staging_capacity(config)
    # Other processes allocate meanwhile: compare with a margin, not exactly.
    assert 0 < capacity <= 0.6 * memory
    tight = dataclasses.replace(TransferConfig(), max_state_bytes=1 << 20)
    assert staging_capacity(tight) == 1 << 20  # the protocol limit still applies


def test_file_capacity_is_the_free_disk_plus_a_file_being_resumed(tmp_path: Path) -> None:
    config = TransferConfig()
    free = shutil.disk_usage(tmp_path).free
    target = tmp_path / "staging.data"
    assert abs(staging_capacity(config, target) - free) < 64 << 20
    target.write_bytes(bytes(1 << 20))
    assert staging_capacity(config, target) >= 1 << 20
