"""Snapshots: copy-on-snapshot immutability, versions, retention, leases and memory release."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.state.manifest import (
    ALIGN_BYTES,
    FlatState,
    array_views,
    check_manifest,
    layout_buffers,
    verify_chunks,
)
from chaosp2p.state.snapshot import SnapshotStore

CONFIG = TransferConfig(chunk_bytes=1024)


def live_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((50, 40)).astype(np.float32),
        "b": rng.standard_normal(40),
        "count": np.array(3, dtype=np.int64),
        "flags": np.array([True, False, True]),
        "nothing": np.zeros((0,), dtype=np.int32),
        "c": (rng.standard_normal(5) + 1j).astype(np.complex64),
    }


def snapshot_arrays(store: SnapshotStore, run: str, step: int) -> dict[str, np.ndarray]:
    lease = store.lease(run, step)
    assert lease is not None
    data = np.frombuffer(lease.data, dtype=np.uint8)
    return {k: v.copy() for k, v in array_views(lease.manifest, data).items()}


def test_snapshot_is_immutable_while_training_mutates_live_arrays() -> None:
    store = SnapshotStore(CONFIG)
    live = live_state()
    before = {k: v.copy() for k, v in live.items()}
    info = store.publish("r", 1, live)
    lease = store.lease("r", 1)
    assert lease is not None
    for _ in range(3):  # "training" keeps going
        live["w"] *= 1.5
        live["b"] += 1
        live["count"] += 1
    served = snapshot_arrays(store, "r", 1)
    for name, array in before.items():
        assert served[name].tobytes() == array.tobytes(), name
        assert served[name].dtype == array.dtype and served[name].shape == array.shape
    assert verify_chunks(info.manifest, lease.data) == []
    assert lease.data.readonly
    with pytest.raises(TypeError):
        lease.data[0] = 1  # type: ignore[index]


def test_manifest_is_consistent_and_layout_deterministic() -> None:
    a, b = SnapshotStore(CONFIG), SnapshotStore(CONFIG)
    state = live_state()
    reordered = dict(reversed(list(state.items())))
    info_a, info_b = a.publish("r", 1, state), b.publish("r", 1, reordered)
    assert info_a.digest == info_b.digest and info_a.manifest == info_b.manifest
    check_manifest(info_a.manifest, CONFIG)
    assert [s.name for s in info_a.manifest.buffers] == sorted(state)
    assert all(s.offset % ALIGN_BYTES == 0 for s in info_a.manifest.buffers)
    assert info_a.chunk_count == -(-info_a.total_bytes // 1024)
    different = SnapshotStore(CONFIG).publish("r", 1, live_state(seed=1))
    assert different.digest != info_a.digest


def test_versions_newest_first_and_retention() -> None:
    store = SnapshotStore(CONFIG, keep_latest=2)
    assert store.versions("r") is None
    for step in (1, 2, 3):
        store.publish("r", step, live_state(step))
    versions = store.versions("r")
    assert versions is not None and [v.step for v in versions] == [3, 2]
    assert store.lease("r", 1) is None  # retired and unpinned: gone
    latest = store.latest("r")
    assert latest is not None and latest.step == 3
    assert store.versions("other") is None


def test_published_steps_are_immutable() -> None:
    store = SnapshotStore(CONFIG)
    store.publish("r", 1, live_state())
    with pytest.raises(ConfigError, match="immutable"):
        store.publish("r", 1, live_state())
    with pytest.raises(ConfigError):
        store.publish("", 1, live_state())
    with pytest.raises(ConfigError):
        store.publish("r", -1, live_state())
    with pytest.raises(ConfigError):
        store.publish("r", 2, {"x": np.zeros(2, dtype=object)})
    # a failed publish leaves no half-built snapshot behind and the step free
    store.publish("r", 2, live_state())


def test_lease_keeps_a_retired_snapshot_and_release_frees_it() -> None:
    store = SnapshotStore(CONFIG)
    store.publish("r", 1, live_state())
    lease = store.lease("r", 1)
    assert lease is not None
    buffer_ref = weakref.ref(lease.data.obj.base)  # the snapshot buffer behind the lease's exporter
    expected = bytes(lease.data)
    held = store.bytes_held
    store.publish("r", 2, live_state(2))  # retires step 1
    assert store.lease("r", 1) is None  # no new leases on a retired step
    assert bytes(lease.data) == expected  # but the held one stays valid
    assert store.bytes_held > held
    lease.release()
    lease.release()  # idempotent
    del lease
    gc.collect()
    assert buffer_ref() is None
    assert store.bytes_held == store.latest("r").total_bytes  # type: ignore[union-attr]
    assert [s.step for s in store.statistics()] == [2]


def test_retire_whole_run() -> None:
    store = SnapshotStore(CONFIG, keep_latest=3)
    store.publish("r", 1, live_state())
    store.publish("r", 2, live_state())
    with store.lease("r", 2) as lease:  # type: ignore[union-attr]
        store.retire("r")
        assert store.versions("r") is None
        assert store.bytes_held == lease.manifest.total_bytes
    assert store.bytes_held == 0


def test_flat_state_with_logical_dtypes() -> None:
    store = SnapshotStore(CONFIG)
    raw = np.arange(6, dtype=np.uint16).reshape(2, 3)
    info = store.publish("r", 1, FlatState({"bf": raw}, {"bf": "bfloat16"}))
    spec = info.manifest.buffers[0]
    assert (spec.dtype, spec.shape, spec.length) == ("bfloat16", (2, 3), 12)
    assert snapshot_arrays(store, "r", 1)["bf"].tobytes() == raw.tobytes()
    with pytest.raises(ConfigError):
        store.publish("r", 2, FlatState({"bf": np.zeros(3, dtype=np.float32)}, {"bf": "bfloat16"}))


def test_builder_misuse() -> None:
    store = SnapshotStore(CONFIG)
    builder = store.begin("r", 1, [("x", "float32", (4,))])
    with pytest.raises(ConfigError):
        store.begin("r", 1, [("x", "float32", (4,))])  # reserved while building
    builder.view("x")[:] = 1.0
    builder.seal()
    with pytest.raises(LocalProtocolError):
        builder.seal()
    with pytest.raises(ConfigError):
        store.begin("r", 2, [("x", "float32", (4,))], allocator=lambda n: np.empty(n + 1, dtype=np.uint8))
    store.begin("r", 2, [("x", "float32", (4,))]).abort()
    store.begin("r", 2, [("x", "float32", (4,))])  # free again after abort


def test_layout_rejects_bad_entries() -> None:
    with pytest.raises(ConfigError):
        layout_buffers([("a", "float32", (1,)), ("a", "float32", (1,))])
    with pytest.raises(ConfigError):
        layout_buffers([("a", "float128", (1,))])
    with pytest.raises(ConfigError):
        layout_buffers([("a", "float32", (-1,))])
    specs, total = layout_buffers([("b", "int8", (3,)), ("a", "float64", ())])
    assert [(s.name, s.offset, s.length) for s in specs] == [("a", 0, 8), ("b", 64, 3)] and total == 67


def test_limits_are_enforced_on_publish() -> None:
    store = SnapshotStore(TransferConfig(chunk_bytes=1024, max_state_bytes=1000, max_manifest_entries=2))
    with pytest.raises(ConfigError, match="max_state_bytes"):
        store.publish("r", 1, {"x": np.zeros(2000, dtype=np.uint8)})
    with pytest.raises(ConfigError, match="max_manifest_entries"):
        store.publish("r", 1, {k: np.zeros(1) for k in "abc"})


def test_concurrent_publish_and_lease() -> None:
    store = SnapshotStore(CONFIG, keep_latest=1)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for _ in range(300):
                versions = store.versions("r")
                if versions:
                    lease = store.lease("r", versions[0].step)
                    if lease is not None:
                        assert verify_chunks(lease.manifest, lease.data) == []
                        lease.release()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for step in range(50):
        store.publish("r", step, live_state(step))
    thread.join()
    assert errors == []
    gc.collect()
    assert [s.step for s in store.statistics()] == [49]


def address(lease: object) -> int:
    return int(lease.data.obj.base.__array_interface__["data"][0])  # type: ignore[attr-defined]


def test_spare_buffer_is_reused_by_the_next_publish() -> None:
    store = SnapshotStore(CONFIG, spare_buffers=1)
    store.publish("r", 1, live_state(1))
    lease = store.lease("r", 1)
    first = address(lease)
    lease.release()  # type: ignore[union-attr]
    del lease
    store.publish("r", 2, live_state(2))  # retires 1 -> its buffer becomes the spare
    assert store.spare_bytes == store.latest("r").total_bytes  # type: ignore[union-attr]
    store.publish("r", 3, live_state(3))  # reuses it
    lease = store.lease("r", 3)
    assert address(lease) == first
    assert snapshot_arrays(store, "r", 3)["w"].tobytes() == live_state(3)["w"].tobytes()
    assert verify_chunks(lease.manifest, lease.data) == []  # type: ignore[union-attr]


def test_buffer_is_not_reused_while_a_payload_slice_is_alive() -> None:
    store = SnapshotStore(CONFIG, spare_buffers=1)
    store.publish("r", 1, live_state(1))
    lease = store.lease("r", 1)
    assert lease is not None
    payload = lease.data[100:200]  # what a driver might still be sending
    expected = bytes(payload)
    lease.release()
    del lease
    store.publish("r", 2, live_state(2))
    assert store.spare_bytes == 0  # step 1 is retired but still observable
    store.publish("r", 3, live_state(3))  # must not overwrite step 1's memory
    assert bytes(payload) == expected
    del payload
    gc.collect()
    assert store.spare_bytes > 0
