"""Staging buffers and resume records: bounds, commit only on Completed, targets untouched on mismatch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from chaosp2p.errors import ConfigError, LocalProtocolError, TransferError
from chaosp2p.protocols.transfer import Completed, PayloadKind, PayloadSlot, ResumeRecord
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.state.buffers import StagingBuffer
from chaosp2p.state.manifest import Manifest
from chaosp2p.state.progress import format_bytes, format_progress
from chaosp2p.state.resume import decode_resume, encode_resume, load_resume, reverify, save_resume
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.wire.identity import Identity

CONFIG = TransferConfig(chunk_bytes=1024)
SOURCE = Identity.from_seed(b"s" * 32).peer_id


def published() -> tuple[Manifest, bytes, dict[str, np.ndarray]]:
    state = {"w": np.arange(600, dtype=np.float32).reshape(20, 30), "n": np.array(5, dtype=np.int64)}
    store = SnapshotStore(CONFIG)
    info = store.publish("r", 1, state)
    lease = store.lease("r", 1)
    assert lease is not None
    return info.manifest, bytes(lease.data), state


def completed(manifest: Manifest) -> Completed:
    return Completed(run="r", step=1, digest=b"d" * 16, manifest=manifest, elapsed_s=0.0, bytes_by_source=())


def filled(manifest: Manifest, data: bytes, **kwargs: object) -> StagingBuffer:
    staging = StagingBuffer(manifest, **kwargs)  # type: ignore[arg-type]
    for index in range(manifest.chunk_count):
        offset, length = manifest.chunk_range(index)
        staging.chunk_view(index)[:] = data[offset : offset + length]
    return staging


def test_views_are_bounded_and_writable() -> None:
    manifest, _, _ = published()
    staging = StagingBuffer(manifest)
    view = staging.view(0, 10)
    view[:] = b"x" * 10
    assert bytes(staging.data[:10]) == b"x" * 10
    for offset, length in [(-1, 1), (0, manifest.total_bytes + 1), (manifest.total_bytes, 1)]:
        with pytest.raises(LocalProtocolError):
            staging.view(offset, length)
    slot = PayloadSlot(source=SOURCE, request_id=1, kind=PayloadKind.DATA, offset=1024, length=1024)
    assert len(staging.slot_view(slot)) == 1024
    with pytest.raises(LocalProtocolError):
        staging.slot_view(PayloadSlot(source=SOURCE, request_id=1, kind=PayloadKind.MANIFEST, offset=0, length=5))


def test_commit_needs_the_matching_completed_event() -> None:
    manifest, data, state = published()
    staging = filled(manifest, data)
    assert staging.verify() == []
    with pytest.raises(LocalProtocolError):
        staging.commit(completed(dataclasses.replace(manifest, step=2)))  # another pull's event
    with pytest.raises(LocalProtocolError):
        staging.commit(object())  # type: ignore[arg-type]
    flat = staging.commit(completed(manifest))
    for name, array in state.items():
        assert flat.arrays[name].tobytes() == array.tobytes()
        assert flat.dtype(name) == array.dtype.name
    with pytest.raises(LocalProtocolError):
        staging.commit(completed(manifest))  # once only
    with pytest.raises(LocalProtocolError):
        staging.view(0, 1)  # no more writes after commit


def test_commit_into_checks_every_target_before_copying() -> None:
    manifest, data, state = published()
    staging = filled(manifest, data)
    targets = {"w": np.zeros((20, 30), dtype=np.float32), "n": np.zeros((), dtype=np.int64)}
    bad = {"w": np.zeros((20, 30), dtype=np.float32), "n": np.zeros((2,), dtype=np.int64)}
    with pytest.raises(TransferError, match="'n'"):
        staging.commit_into(completed(manifest), bad)
    assert not bad["w"].any()  # untouched although 'w' came first
    with pytest.raises(TransferError, match="differ"):
        staging.commit_into(completed(manifest), {"w": targets["w"]})
    readonly = {"w": np.zeros((20, 30), dtype=np.float32), "n": np.zeros((), dtype=np.int64)}
    readonly["n"].flags.writeable = False
    with pytest.raises(TransferError, match="read-only"):
        staging.commit_into(completed(manifest), readonly)
    staging.commit_into(completed(manifest), targets)
    for name, array in state.items():
        assert targets[name].tobytes() == array.tobytes()


def test_verify_finds_damaged_chunks() -> None:
    manifest, data, _ = published()
    staging = filled(manifest, data)
    staging.view(1500, 1)[:] = bytes([data[1500] ^ 1])
    assert staging.verify() == [1]
    assert staging.verify([0]) == []


def test_file_backed_staging_survives_a_restart(tmp_path: Path) -> None:
    manifest, data, _ = published()
    path = tmp_path / "stage.bin"
    staging = filled(manifest, data, path=path)
    assert not staging.reused_file
    staging.close()
    again = StagingBuffer(manifest, path=path)
    assert again.reused_file and again.verify() == []
    again.remove_file()
    assert not path.exists()


def test_allocator_result_is_checked() -> None:
    manifest, _, _ = published()
    with pytest.raises(ConfigError):
        StagingBuffer(manifest, allocator=lambda n: np.empty(n, dtype=np.float32))
    StagingBuffer(manifest, allocator=lambda n: np.zeros(n, dtype=np.uint8))


def record(verified: list[int], chunk_count: int = 10) -> ResumeRecord:
    flags = bytearray(chunk_count)
    for i in verified:
        flags[i] = 1
    return ResumeRecord(
        run="r",
        step=1,
        hash_algorithm="xxh3_128",
        digest=b"d" * 16,
        chunk_count=chunk_count,
        verified=ResumeRecord.bitmap(flags, chunk_count),
    )


def test_resume_record_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "p.resume"
    assert load_resume(path) is None
    rec = record([0, 3, 9])
    assert rec.verified_chunks() == [0, 3, 9] and len(rec.verified) == 2
    save_resume(path, rec)
    assert load_resume(path) == rec
    save_resume(path, record([1]))  # overwrite atomically
    assert load_resume(path) == record([1])
    assert not (tmp_path / "p.resume.tmp").exists()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:-1],
        lambda b: b[:10],
        lambda b: b"garbage" + b,
        lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:],
        lambda b: b"",
    ],
)
def test_damaged_resume_files_are_transfer_errors(mutate: object) -> None:
    raw = encode_resume(record([2]))
    with pytest.raises(TransferError):
        decode_resume(mutate(raw))  # type: ignore[operator]


def test_resume_body_with_wrong_fields_is_rejected() -> None:
    import msgpack
    import xxhash

    from chaosp2p.state.resume import MAGIC

    for fields in (["r", 1, "xxh3_128", b"d", 10, b"\0"], ["r", "1", "xxh3_128", b"d", 10, b"\0\0"], [1, 2, 3]):
        body = msgpack.packb(fields, use_bin_type=True)
        with pytest.raises(TransferError):
            decode_resume(MAGIC + xxhash.xxh3_128_digest(body) + body)


def test_reverify_drops_chunks_whose_bytes_changed() -> None:
    manifest, data, _ = published()
    staging = filled(manifest, data)
    staging.view(0, 1)[:] = bytes([data[0] ^ 1])
    rec = ResumeRecord(
        run="r",
        step=1,
        hash_algorithm="xxh3_128",
        digest=b"d" * 16,
        chunk_count=manifest.chunk_count,
        verified=ResumeRecord.bitmap(b"\1" * manifest.chunk_count, manifest.chunk_count),
    )
    assert reverify(rec, staging).verified_chunks() == list(range(1, manifest.chunk_count))


def test_progress_formatting() -> None:
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(10) == "10 B" and format_bytes(3 << 40) == "3.0 TiB"
    from chaosp2p.protocols.transfer import TransferProgress

    line = format_progress(
        TransferProgress(
            run="r",
            step=1,
            bytes_done=512,
            bytes_total=1024,
            chunks_done=1,
            chunks_total=2,
            resumed_bytes=0,
            elapsed_s=1.0,
            rate_bytes_per_s=512.0,
            eta_s=1.0,
            sources=(),
        )
    )
    assert "50.0%" in line and "ETA 1.0s" in line
