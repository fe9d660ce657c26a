"""Reused snapshot blocks (``SnapshotStore.begin(..., reuse=True)``), as ``publish_torch`` uses them
for pinned staging memory: allocated once per state size, not once per snapshot.

A block comes back only once nothing can observe its snapshot (no pin, no payload slice); a new
block is sized to the largest snapshot seen, so a state that shrinks reuses the bigger one.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.state.manifest import array_views
from chaosp2p.state.snapshot import SnapshotStore

CONFIG = TransferConfig(chunk_bytes=1024)


class CountingAllocator:
    """Plain memory that records every allocation's size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, size: int) -> np.ndarray:
        self.sizes.append(size)
        return np.zeros(size, dtype=np.uint8)


def state(step: int, floats: int = 1000) -> dict[str, np.ndarray]:
    return {"w": np.full(floats, step, dtype=np.float32), "step": np.array(step, dtype=np.int64)}


def publish(store: SnapshotStore, step: int, arrays: dict[str, np.ndarray], allocate: CountingAllocator) -> None:
    entries = [(name, str(a.dtype), a.shape) for name, a in arrays.items()]
    builder = store.begin("r", step, entries, allocator=allocate, reuse=True)
    for name, array in arrays.items():
        np.copyto(builder.view(name), array)
    builder.seal()


def read(store: SnapshotStore, step: int) -> dict[str, np.ndarray]:
    lease = store.lease("r", step)
    assert lease is not None
    with lease:
        return {k: v.copy() for k, v in array_views(lease.manifest, np.frombuffer(lease.data, np.uint8)).items()}


def test_an_unchanged_state_size_allocates_two_blocks_for_any_number_of_snapshots() -> None:
    store, allocate = SnapshotStore(CONFIG, keep_latest=1), CountingAllocator()
    for step in range(8):
        publish(store, step, state(step), allocate)
        assert read(store, step)["w"][0] == step
    # The offered snapshot's block and the one being filled: the retired one's is taken back.
    assert len(allocate.sizes) == 2
    assert store.spare_bytes == allocate.sizes[0]


def test_a_block_still_observed_is_not_reused() -> None:
    store, allocate = SnapshotStore(CONFIG, keep_latest=1), CountingAllocator()
    publish(store, 1, state(1), allocate)
    with store.lease("r", 1) as lease:  # type: ignore[union-attr]
        payload = lease.data[64:128]  # what a driver may still be sending, after the pin is gone
    expected = bytes(payload)
    del lease
    for step in range(2, 6):
        publish(store, step, state(step), allocate)
    assert bytes(payload) == expected  # step 1's memory was not written to
    assert len(allocate.sizes) == 3
    del payload
    gc.collect()
    publish(store, 6, state(6), allocate)  # step 1's block came back (only the largest free one is kept)
    assert len(allocate.sizes) == 3


def test_new_blocks_are_sized_to_the_largest_snapshot_seen() -> None:
    store, allocate = SnapshotStore(CONFIG, keep_latest=1), CountingAllocator()
    publish(store, 0, state(0, floats=4000), allocate)
    publish(store, 1, state(1, floats=100), allocate)  # smaller, but its new block fits the larger
    assert allocate.sizes[1] == allocate.sizes[0]
    for step in range(2, 6):  # shrinking and growing back allocates nothing more
        publish(store, step, state(step, floats=4000 if step % 2 else 100), allocate)
        assert read(store, step)["w"].shape == ((4000,) if step % 2 else (100,))
    assert len(allocate.sizes) == 2


def test_publish_torch_stages_into_reused_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from chaosp2p.state import torch_adapter

    allocate = CountingAllocator()
    monkeypatch.setattr(torch_adapter, "pinned_allocator", allocate)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    staged, plain = SnapshotStore(CONFIG, keep_latest=1), SnapshotStore(CONFIG, keep_latest=1)
    for step in range(6):
        model(torch.randn(4, 16)).sum().backward()
        optimizer.step()
        info: Any = torch_adapter.publish_torch(staged, "r", step, model, optimizer, force_staging=True)
        assert info.digest == torch_adapter.publish_torch(plain, "r", step, model, optimizer).digest
    assert len(allocate.sizes) == 2  # was one per snapshot
