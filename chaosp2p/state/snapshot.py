"""Immutable, versioned snapshots of training state, served while training goes on.

A :class:`SnapshotStore` is the state provider a source serves from (it implements the
:class:`~chaosp2p.protocols.transfer.SnapshotCatalog` the :class:`SourceSession` asks). Publishing
step ``s`` of run ``r`` copies the live arrays once into a fresh contiguous buffer
(copy-on-snapshot), hashes it in chunks, builds the manifest and marks the buffer read-only; the
training loop is free to mutate its arrays the moment ``publish`` returns. Newer snapshots retire
older ones beyond ``keep_latest``: a retired snapshot is no longer offered, and its memory is
released as soon as the last lease (pin) on it is released -- never while a transfer still reads it.

The store is thread-safe: the training thread publishes while the network thread pins and
releases. Copying and hashing happen outside the lock.

Double buffering (``spare_buffers=1``): a freed snapshot buffer of the same size is kept and reused
by the next publish, which then copies into memory that is already mapped -- on this kind of
machine first-touch page faults cost more than the copy itself. A buffer is recycled only when no
byte of it can still be observed: every lease hands out its own read-only exporter array, and the
store waits (weak references) until every exporter -- and so every payload ``memoryview`` sliced
from it that a driver may still be sending -- is gone.

Reused blocks (``begin(..., reuse=True)``): memory that is costly to allocate -- pinned host memory
for staging device tensors, which the driver page-locks on every allocation -- is kept the same way
whatever ``spare_buffers`` says: per allocator, the largest freed block waits for the next snapshot
that fits in it (unchanged state size: every one), and a new block is sized to the largest
snapshot seen from that allocator, so a state that shrinks and grows back allocates nothing more.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.transfer import PinnedSnapshot, SnapshotCatalog
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import BufferSpec, Manifest, VersionInfo, encode_manifest, manifest_digest
from chaosp2p.state.manifest import FlatState, as_bytes, build_manifest, layout_buffers, storage_dtype
from chaosp2p.state.memory import allocate_bytes

StateProvider = SnapshotCatalog
"""What ``serve_state`` accepts: anything that lists versions and pins snapshots."""

Allocator = Callable[[int], np.ndarray]
"""Returns a writable, C-contiguous 1-D uint8 array of the given size (e.g. pinned host memory)."""


def default_allocator(size: int) -> np.ndarray:
    """Plain host memory, pre-faulted when large (see :mod:`chaosp2p.state.memory`)."""
    return allocate_bytes(size)


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
    """A published snapshot's identity."""

    run: str
    step: int
    digest: bytes
    total_bytes: int
    chunk_count: int
    manifest: Manifest


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotStatus:
    """One held snapshot, for ``statistics()``."""

    run: str
    step: int
    total_bytes: int
    pins: int
    retired: bool


class _Snapshot:
    __slots__ = (
        "allocator",
        "block",
        "body",
        "buffer",
        "digest",
        "exporters",
        "manifest",
        "pins",
        "retired",
        "reuse",
        "run",
        "step",
        "version",
    )

    def __init__(
        self,
        manifest: Manifest,
        body: bytes,
        digest: bytes,
        buffer: np.ndarray,
        allocator: Allocator,
        block: np.ndarray | None = None,
    ) -> None:
        self.run = manifest.run
        self.step = manifest.step
        self.manifest = manifest
        self.body = body
        self.digest = digest
        self.buffer: np.ndarray | None = buffer
        self.allocator = allocator
        self.block: np.ndarray | None = buffer if block is None else block
        """The allocation ``buffer`` is the start of (itself unless a reused block is larger)."""
        self.reuse = block is not None
        """Its block is kept for the next snapshot of the allocator (``begin(..., reuse=True)``)."""
        self.exporters = 0
        self.pins = 0
        self.retired = False
        self.version = VersionInfo(
            step=manifest.step,
            total_bytes=manifest.total_bytes,
            chunk_bytes=manifest.chunk_bytes,
            hash_algorithm=manifest.hash_algorithm,
            digest=digest,
        )


class SnapshotLease:
    """A pin on one snapshot: its memory stays valid until :meth:`release` (idempotent)."""

    __slots__ = ("_released", "_snapshot", "_store", "data", "digest", "manifest", "manifest_body")

    def __init__(self, store: SnapshotStore, snapshot: _Snapshot, data: memoryview) -> None:
        self._store = store
        self._snapshot = snapshot
        self._released = False
        self.manifest: Manifest = snapshot.manifest
        self.manifest_body: bytes = snapshot.body
        self.digest: bytes = snapshot.digest
        self.data: memoryview = data
        """The snapshot's bytes, read-only (slices of it keep the memory valid on their own)."""

    def release(self) -> None:
        """Drop the pin; a retired snapshot's memory goes when its last pin does."""
        if not self._released:
            self._released = True
            self._store._unpin(self._snapshot)

    def __enter__(self) -> SnapshotLease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class SnapshotBuilder:
    """A snapshot being filled: write every buffer through :meth:`view`, then :meth:`seal`.

    Views obtained from the builder must not be kept after :meth:`seal` (the memory may be reused
    once the snapshot is freed).
    """

    def __init__(
        self,
        store: SnapshotStore,
        run: str,
        step: int,
        specs: tuple[BufferSpec, ...],
        buffer: np.ndarray,
        allocator: Allocator,
        block: np.ndarray | None = None,
    ) -> None:
        self._store = store
        self._allocator = allocator
        self._block = block
        self.run = run
        self.step = step
        self.specs = specs
        self.buffer = buffer
        self._by_name = {spec.name: spec for spec in specs}
        self._done = False

    def view(self, name: str) -> np.ndarray:
        """Writable, shaped view of buffer ``name`` (its storage dtype)."""
        spec = self._by_name[name]
        return self.buffer[spec.offset : spec.end].view(storage_dtype(spec.dtype)).reshape(spec.shape)

    def raw(self, name: str) -> np.ndarray:
        """Writable 1-D uint8 view of buffer ``name``'s bytes."""
        spec = self._by_name[name]
        return self.buffer[spec.offset : spec.end]

    def seal(self) -> SnapshotInfo:
        """Hash, freeze and publish the snapshot; older ones beyond ``keep_latest`` are retired."""
        if self._done:
            raise LocalProtocolError("snapshot already sealed or aborted")
        self._done = True
        cursor = 0
        for spec in self.specs:  # zero the alignment gaps so equal states hash equally everywhere
            self.buffer[cursor : spec.offset] = 0
            cursor = spec.end
        self.buffer[cursor:] = 0
        self.buffer.flags.writeable = False
        config = self._store.config
        manifest = build_manifest(
            self.run,
            self.step,
            self.buffer,
            self.specs,
            chunk_bytes=config.chunk_bytes,
            hash_algorithm=config.hash_algorithm,
        )
        body = encode_manifest(manifest)
        digest = manifest_digest(body)
        return self._store._register(_Snapshot(manifest, body, digest, self.buffer, self._allocator, self._block))

    def abort(self) -> None:
        """Give up on this snapshot."""
        if not self._done:
            self._done = True
            self._store._forget_building(self.run, self.step)


class SnapshotStore:
    """Holds immutable snapshots per (run, step) and hands out leases on them."""

    def __init__(
        self,
        config: TransferConfig | None = None,
        *,
        keep_latest: int = 1,
        allocator: Allocator | None = None,
        spare_buffers: int = 0,
    ) -> None:
        if keep_latest < 1:
            raise ConfigError("keep_latest must be >= 1")
        if spare_buffers < 0:
            raise ConfigError("spare_buffers must be >= 0")
        self.config = config or TransferConfig()
        self.keep_latest = keep_latest
        self.allocator = allocator or default_allocator
        self._lock = threading.Lock()
        self._snapshots: dict[tuple[str, int], _Snapshot] = {}
        self._building: set[tuple[str, int]] = set()
        self.spare_buffers = spare_buffers
        self._spares: list[tuple[Allocator, np.ndarray]] = []
        self._kept: dict[Allocator, np.ndarray] = {}  # per reusing allocator, its largest free block
        self._largest: dict[Allocator, int] = {}  # per reusing allocator, the largest snapshot it held
        self._orphaned: list[_Snapshot] = []  # freed but still observable through an exporter
        self._exits: deque[_Snapshot] = deque()

    # ---------------------------------------------------------------------------- publishing
    def begin(
        self,
        run: str,
        step: int,
        entries: Sequence[tuple[str, str, tuple[int, ...]]],
        *,
        allocator: Allocator | None = None,
        reuse: bool = False,
    ) -> SnapshotBuilder:
        """Reserve (run, step) and allocate its buffer for ``(name, dtype, shape)`` entries.

        ``reuse``: the memory is costly to allocate (pinned): take the block of an earlier snapshot
        of ``allocator`` that nothing observes any more, and keep this one's for the next (see the
        module docstring).
        """
        if not 1 <= len(run) <= self.config.max_name_chars:
            raise ConfigError(f"run id must have 1..{self.config.max_name_chars} characters")
        if type(step) is not int or step < 0:
            raise ConfigError(f"step must be an int >= 0 (got {step!r})")
        specs, total = layout_buffers(entries)
        if len(specs) > self.config.max_manifest_entries:
            raise ConfigError(f"{len(specs)} buffers exceed max_manifest_entries={self.config.max_manifest_entries}")
        if any(len(spec.name) > self.config.max_name_chars for spec in specs):
            raise ConfigError(f"a buffer name is longer than max_name_chars={self.config.max_name_chars}")
        if total > self.config.max_state_bytes:
            raise ConfigError(f"snapshot of {total} bytes exceeds max_state_bytes={self.config.max_state_bytes}")
        key = (run, step)
        with self._lock:
            if key in self._snapshots or key in self._building:
                raise ConfigError(f"run {run!r} step {step} is already published (snapshots are immutable)")
            self._building.add(key)
        allocate = allocator or self.allocator
        block = None
        try:
            if reuse:
                block = self._take_kept(allocate, total)
                buffer = block[:total]
            else:
                spare = self._take_spare(allocate, total)
                buffer = _checked(allocate(total), total) if spare is None else spare
        except BaseException:
            self._forget_building(run, step)
            raise
        return SnapshotBuilder(self, run, step, specs, buffer, allocate, block)

    def publish(self, run: str, step: int, state: Mapping[str, np.ndarray] | FlatState) -> SnapshotInfo:
        """Copy ``state`` into a new immutable snapshot (run, step) and offer it."""
        flat = state if isinstance(state, FlatState) else FlatState.from_arrays(state)
        entries = [(name, flat.dtype(name), tuple(int(d) for d in a.shape)) for name, a in flat.arrays.items()]
        builder = self.begin(run, step, entries)
        try:
            for name, array in flat.arrays.items():
                dest = builder.view(name)
                if array.dtype != dest.dtype:
                    if array.dtype.itemsize != dest.dtype.itemsize:
                        raise ConfigError(f"array {name!r} of {array.dtype} cannot hold {flat.dtype(name)}")
                    array = np.asarray(array, order="C").view(dest.dtype)
                np.copyto(dest, array, casting="no")
            return builder.seal()
        except BaseException:
            builder.abort()
            raise

    # ------------------------------------------------------------------- SnapshotCatalog API
    def versions(self, run: str) -> list[VersionInfo] | None:
        """Offered snapshots of ``run``, newest first; ``None`` if none is offered."""
        with self._lock:
            found = [s for s in self._snapshots.values() if s.run == run and not s.retired]
        if not found:
            return None
        return [s.version for s in sorted(found, key=lambda s: -s.step)]

    def pin(self, run: str, step: int) -> PinnedSnapshot | None:
        """A lease on (run, step), or ``None`` if it is not offered (unknown or retired)."""
        return self.lease(run, step)

    def lease(self, run: str, step: int) -> SnapshotLease | None:
        """Like :meth:`pin`, typed as the concrete :class:`SnapshotLease`."""
        with self._lock:
            snapshot = self._snapshots.get((run, step))
            if snapshot is None or snapshot.retired or snapshot.buffer is None:
                return None
            snapshot.pins += 1
            snapshot.exporters += 1
            exporter = snapshot.buffer.view()
        exporter.flags.writeable = False
        weakref.finalize(exporter, self._exporter_gone, snapshot)
        return SnapshotLease(self, snapshot, as_bytes(exporter))

    # ---------------------------------------------------------------------------- management
    def latest(self, run: str) -> SnapshotInfo | None:
        """The newest offered snapshot of ``run``."""
        with self._lock:
            found = [s for s in self._snapshots.values() if s.run == run and not s.retired]
        if not found:
            return None
        return _info(max(found, key=lambda s: s.step))

    def retire(self, run: str, step: int | None = None) -> None:
        """Stop offering (run, step) -- or every step of ``run`` -- and free what nobody pins."""
        with self._lock:
            for snapshot in list(self._snapshots.values()):
                if snapshot.run == run and (step is None or snapshot.step == step):
                    snapshot.retired = True
                    self._free_if_unused(snapshot)

    @property
    def bytes_held(self) -> int:
        """Bytes of snapshot memory the store still references (offered or pinned), spares excluded."""
        with self._lock:
            return sum(s.manifest.total_bytes for s in self._snapshots.values())

    @property
    def spare_bytes(self) -> int:
        """Bytes kept for reuse by the next publish (``spare_buffers``, and reused blocks)."""
        with self._lock:
            self._drain_exits()
            blocks = [buffer for _, buffer in self._spares] + list(self._kept.values())
            return sum(int(block.shape[0]) for block in blocks)

    def statistics(self) -> list[SnapshotStatus]:
        """Every held snapshot with its pin count."""
        with self._lock:
            return [
                SnapshotStatus(
                    run=s.run, step=s.step, total_bytes=s.manifest.total_bytes, pins=s.pins, retired=s.retired
                )
                for s in sorted(self._snapshots.values(), key=lambda s: (s.run, s.step))
            ]

    # ------------------------------------------------------------------------------ internals
    def _register(self, snapshot: _Snapshot) -> SnapshotInfo:
        key = (snapshot.run, snapshot.step)
        with self._lock:
            self._building.discard(key)
            self._snapshots[key] = snapshot
            offered = sorted(
                (s for s in self._snapshots.values() if s.run == snapshot.run and not s.retired),
                key=lambda s: -s.step,
            )
            for old in offered[self.keep_latest :]:
                old.retired = True
                self._free_if_unused(old)
        return _info(snapshot)

    def _forget_building(self, run: str, step: int) -> None:
        with self._lock:
            self._building.discard((run, step))

    def _unpin(self, snapshot: _Snapshot) -> None:
        with self._lock:
            snapshot.pins -= 1
            self._free_if_unused(snapshot)

    def _free_if_unused(self, snapshot: _Snapshot) -> None:
        # Caller holds the lock. Dropping our references frees the memory once no payload slice
        # handed to a driver is still alive (memoryviews keep their buffer alive on their own).
        self._drain_exits()
        if snapshot.retired and snapshot.pins == 0 and self._snapshots.get((snapshot.run, snapshot.step)) is snapshot:
            del self._snapshots[(snapshot.run, snapshot.step)]
            if snapshot.exporters == 0:
                self._recycle(snapshot)
            elif self.spare_buffers or snapshot.reuse:
                self._orphaned.append(snapshot)  # recycle when its last exporter dies
            else:
                snapshot.buffer = snapshot.block = None

    def _exporter_gone(self, snapshot: _Snapshot) -> None:
        # Runs wherever the exporter dies -- possibly inside the garbage collector while this thread
        # holds the lock -- so it only records the fact (deque.append is atomic).
        self._exits.append(snapshot)

    def _drain_exits(self) -> None:
        # Caller holds the lock.
        while self._exits:
            snapshot = self._exits.popleft()
            snapshot.exporters -= 1
            if snapshot.exporters == 0 and snapshot in self._orphaned:
                self._orphaned.remove(snapshot)
                self._recycle(snapshot)

    def _recycle(self, snapshot: _Snapshot) -> None:
        # Caller holds the lock; nobody can observe the buffer any more.
        buffer, block, snapshot.buffer, snapshot.block = snapshot.buffer, snapshot.block, None, None
        if snapshot.reuse:
            kept = self._kept.get(snapshot.allocator)
            if block is not None and (kept is None or kept.shape[0] < block.shape[0]):
                self._kept[snapshot.allocator] = block
        elif buffer is not None and len(self._spares) < self.spare_buffers:
            self._spares.append((snapshot.allocator, buffer))

    def _take_kept(self, allocator: Allocator, size: int) -> np.ndarray:
        """A block of ``allocator`` holding at least ``size`` bytes: the kept one, or a new one sized
        to the largest snapshot seen (a smaller kept block is dropped)."""
        with self._lock:
            self._drain_exits()
            block = self._kept.pop(allocator, None)
            largest = self._largest[allocator] = max(size, self._largest.get(allocator, 0))
        if block is not None and block.shape[0] >= size:
            block.flags.writeable = True
            return block
        return _checked(allocator(largest), largest)

    def _take_spare(self, allocator: Allocator, size: int) -> np.ndarray | None:
        with self._lock:
            self._drain_exits()
            for i, (owner, buffer) in enumerate(self._spares):
                if owner is allocator and buffer.shape[0] == size:
                    del self._spares[i]
                    buffer.flags.writeable = True
                    return buffer
        return None


def _checked(buffer: np.ndarray, size: int) -> np.ndarray:
    """``buffer`` if it is what an allocator must return for ``size`` bytes."""
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or buffer.shape[0] != size:
        raise ConfigError("the allocator must return a 1-D uint8 array of the requested size")
    if not buffer.flags.c_contiguous or not buffer.flags.writeable:
        raise ConfigError("the allocator must return writable contiguous memory")
    return buffer


def _info(snapshot: _Snapshot) -> SnapshotInfo:
    return SnapshotInfo(
        run=snapshot.run,
        step=snapshot.step,
        digest=snapshot.digest,
        total_bytes=snapshot.manifest.total_bytes,
        chunk_count=snapshot.manifest.chunk_count,
        manifest=snapshot.manifest,
    )
