"""Destination staging for a pull: preallocated, separate from the live state until commit.

A :class:`StagingBuffer` is one contiguous uint8 buffer of the manifest's ``total_bytes`` --
in memory, in memory from a custom allocator (pinned host memory for GPU targets), or in a file
(``path=``, a memory map, so an interrupted pull can resume from what is already on disk). The
driver receives each payload straight into :meth:`StagingBuffer.slot_view`; the pull machine hashes
the same memory. Nothing reaches the live model or arrays until :meth:`commit` (views of the
verified buffer) or :meth:`commit_into` (copy into existing arrays, after checking every target
first so a mismatch leaves the live state untouched), and both demand the machine's
:class:`~chaosp2p.protocols.transfer.Completed` event for exactly this manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from chaosp2p.atomic_file import create_exclusive, open_existing_regular
from chaosp2p.errors import ConfigError, LocalProtocolError, TransferError
from chaosp2p.protocols.transfer import Completed, PayloadKind, PayloadSlot
from chaosp2p.protocols.transfer.messages import Manifest
from chaosp2p.state.manifest import FlatState, array_views, as_bytes, verify_chunks
from chaosp2p.state.snapshot import Allocator, default_allocator


class StagingBuffer:
    """Where a pull writes the snapshot's bytes before they are verified and committed."""

    def __init__(
        self,
        manifest: Manifest,
        *,
        path: str | os.PathLike[str] | None = None,
        allocator: Allocator | None = None,
    ) -> None:
        self.manifest = manifest
        self.path = Path(path) if path is not None else None
        self.reused_file = False
        """True if ``path`` already held a staging file of the right size (resume case)."""
        self._committed = False
        total = manifest.total_bytes
        if self.path is not None:
            self.data: np.ndarray = self._map_file(self.path, total)
        else:
            self.data = (allocator or default_allocator)(total)
            if self.data.dtype != np.uint8 or self.data.shape != (total,) or not self.data.flags.c_contiguous:
                raise ConfigError("the allocator must return a contiguous 1-D uint8 array of the requested size")
        self._view = as_bytes(self.data)

    def _map_file(self, path: Path, total: int) -> np.ndarray:
        """``path`` mapped: reused if it holds ``total`` bytes (resume), else created afresh.

        The staging file sits at a predictable name: it is opened without following links and
        created exclusively (:mod:`chaosp2p.atomic_file`), so a link planted there is refused.
        """
        fd = open_existing_regular(path)
        if fd is not None and os.fstat(fd).st_size != total:  # another snapshot's bytes: start over
            os.close(fd)
            fd = None
        self.reused_file = fd is not None
        if fd is None:
            fd = create_exclusive(path, mode=0o600, read=True)  # removes a leftover regular file first
            os.ftruncate(fd, total)
        with os.fdopen(fd, "r+b") as handle:  # the map keeps its own reference to the file
            if total == 0:
                return np.empty(0, dtype=np.uint8)
            return np.memmap(handle, dtype=np.uint8, mode="r+", shape=(total,))

    @property
    def total_bytes(self) -> int:
        """Size of the snapshot."""
        return self.manifest.total_bytes

    def view(self, offset: int, length: int) -> memoryview:
        """Writable memory for bytes ``offset .. offset+length`` (receive straight into it)."""
        if self._committed:
            raise LocalProtocolError("staging buffer already committed")
        if offset < 0 or length < 0 or offset + length > self.manifest.total_bytes:
            raise LocalProtocolError(f"bytes {offset}+{length} outside the {self.manifest.total_bytes}-byte snapshot")
        return self._view[offset : offset + length]

    def slot_view(self, slot: PayloadSlot) -> memoryview:
        """The destination of a ``DATA`` payload slot."""
        if slot.kind is not PayloadKind.DATA:
            raise LocalProtocolError("only DATA slots go to the staging buffer")
        return self.view(slot.offset, slot.length)

    def chunk_view(self, index: int) -> memoryview:
        """The bytes of chunk ``index``."""
        offset, length = self.manifest.chunk_range(index)
        return self.view(offset, length)

    def verify(self, chunks: Iterable[int] | None = None) -> list[int]:
        """Chunks (default all) whose bytes here do not match the manifest -- e.g. after a crash."""
        return verify_chunks(self.manifest, self.data, chunks)

    def flush(self) -> None:
        """Push a file-backed buffer's pages to the file (call before persisting resume progress)."""
        if isinstance(self.data, np.memmap):
            self.data.flush()

    def arrays(self) -> dict[str, np.ndarray]:
        """Read-only views of every buffer (for inspection; not verified unless the pull completed)."""
        views = array_views(self.manifest, self.data)
        for array in views.values():
            array.flags.writeable = False
        return views

    def commit(self, completed: Completed) -> FlatState:
        """The verified snapshot as named arrays (views of this buffer, which becomes theirs)."""
        self._check_completed(completed)
        self._committed = True
        return FlatState(array_views(self.manifest, self.data), {s.name: s.dtype for s in self.manifest.buffers})

    def commit_into(self, completed: Completed, targets: Mapping[str, np.ndarray], *, strict: bool = True) -> None:
        """Copy the verified snapshot into existing arrays.

        Every target is checked (name present, shape and dtype itemsize equal, writable) before the
        first byte is copied, so a mismatch raises :class:`TransferError` with the targets untouched.
        With ``strict`` the names must match exactly; otherwise only common names are copied.
        """
        self._check_completed(completed)
        views = array_views(self.manifest, self.data)
        if strict and set(views) != set(targets):
            missing, extra = sorted(set(targets) - set(views)), sorted(set(views) - set(targets))
            raise TransferError(f"snapshot and targets differ: missing {missing[:5]}, unexpected {extra[:5]}")
        pairs = []
        for name, target in targets.items():
            source = views.get(name)
            if source is None:
                continue
            if target.shape != source.shape or target.dtype.itemsize != source.dtype.itemsize:
                raise TransferError(
                    f"{name!r}: snapshot has {source.shape} x {source.dtype}, target {target.shape} x {target.dtype}"
                )
            if not target.flags.writeable:
                raise TransferError(f"{name!r}: target array is read-only")
            pairs.append((target, source if target.dtype == source.dtype else source.view(target.dtype)))
        for target, source in pairs:
            np.copyto(target, source, casting="no")
        self._committed = True

    def close(self) -> None:
        """Drop the memory (a file-backed buffer keeps its file)."""
        self.flush()
        self._view.release()
        self.data = np.empty(0, dtype=np.uint8)
        self._view = as_bytes(self.data)

    def remove_file(self) -> None:
        """Delete the backing file (after a commit, or to discard the staged bytes)."""
        self.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _check_completed(self, completed: Completed) -> None:
        if not isinstance(completed, Completed) or completed.manifest != self.manifest:
            raise LocalProtocolError("commit needs the Completed event of the pull that filled this buffer")
        if self._committed:
            raise LocalProtocolError("staging buffer already committed")
