"""Persisted pull progress, so a newcomer interrupted mid-pull resumes from its verified chunks.

The record names the snapshot (run, step, hash algorithm, manifest digest) and holds a bitmap of
verified chunks; a pull machine given the record applies it only if it ends up pulling exactly that
snapshot, so stale progress can never mix versions. Files are written atomically (a temporary file
created without following links, fsync, rename) with a checksum; a torn or foreign file is a clear
:class:`TransferError`.

Order matters: the staged bytes must be on disk before the record that vouches for them, which is
what :func:`checkpoint` does. :func:`reverify` re-hashes the claimed chunks after a crash, for
when the disk itself is in doubt.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import xxhash

from chaosp2p.atomic_file import write_bytes_atomically
from chaosp2p.errors import TransferError
from chaosp2p.protocols.transfer import PullMachine, ResumeRecord
from chaosp2p.state.buffers import StagingBuffer

MAGIC = b"chaosp2p-resume\x01"
"""File signature (the last byte is the format version)."""
MAX_RESUME_BYTES = 64 << 20
"""Largest resume file read (a bitmap of 2^29 chunks)."""


def encode_resume(record: ResumeRecord) -> bytes:
    """The file contents for ``record``."""
    body: bytes = msgpack.packb(
        [record.run, record.step, record.hash_algorithm, record.digest, record.chunk_count, record.verified],
        use_bin_type=True,
    )
    return MAGIC + xxhash.xxh3_128_digest(body) + body


def decode_resume(data: bytes) -> ResumeRecord:
    """Parse file contents; :class:`TransferError` if they are not an intact resume record."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 16:
        raise TransferError("not a chaosp2p resume file (or an unsupported version)")
    checksum, body = data[len(MAGIC) : len(MAGIC) + 16], data[len(MAGIC) + 16 :]
    if xxhash.xxh3_128_digest(body) != checksum:
        raise TransferError("resume file is damaged (checksum mismatch)")
    try:
        fields = msgpack.unpackb(body, raw=False, max_bin_len=len(body), max_str_len=len(body))
        run, step, algorithm, digest, chunk_count, verified = fields
        record = ResumeRecord(
            run=run, step=step, hash_algorithm=algorithm, digest=digest, chunk_count=chunk_count, verified=verified
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise TransferError(f"resume file is malformed: {exc}") from None
    types_ok = (
        type(record.run) is str
        and type(record.step) is int
        and type(record.hash_algorithm) is str
        and type(record.digest) is bytes
        and type(record.chunk_count) is int
        and type(record.verified) is bytes
    )
    if not types_ok or record.chunk_count < 0 or len(record.verified) != -(-record.chunk_count // 8):
        raise TransferError("resume file is malformed")
    return record


def save_resume(path: str | os.PathLike[str], record: ResumeRecord) -> None:
    """Atomically write ``record`` to ``path`` (a link planted at ``path + ".tmp"`` is refused)."""
    # Through PATH.tmp, created without following a link planted there (see atomic_file).
    write_bytes_atomically(path, encode_resume(record), suffix=".tmp")


def load_resume(path: str | os.PathLike[str]) -> ResumeRecord | None:
    """The record at ``path``, ``None`` if there is none; :class:`TransferError` if it is damaged."""
    target = Path(path)
    try:
        size = target.stat().st_size
    except FileNotFoundError:
        return None
    if size > MAX_RESUME_BYTES:
        raise TransferError(f"resume file of {size} bytes exceeds {MAX_RESUME_BYTES}")
    return decode_resume(target.read_bytes())


def checkpoint(machine: PullMachine, staging: StagingBuffer, path: str | os.PathLike[str]) -> ResumeRecord:
    """Flush the staged bytes, then persist which chunks are verified (in that order)."""
    staging.flush()
    record = machine.resume_record()
    save_resume(path, record)
    return record


def reverify(record: ResumeRecord, staging: StagingBuffer) -> ResumeRecord:
    """``record`` minus any claimed chunk whose staged bytes no longer match the manifest."""
    claimed = record.verified_chunks()
    bad = set(staging.verify(claimed))
    flags = bytearray(record.chunk_count)
    for chunk in claimed:
        if chunk not in bad:
            flags[chunk] = 1
    return ResumeRecord(
        run=record.run,
        step=record.step,
        hash_algorithm=record.hash_algorithm,
        digest=record.digest,
        chunk_count=record.chunk_count,
        verified=ResumeRecord.bitmap(flags, record.chunk_count),
    )
