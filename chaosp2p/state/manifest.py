"""Snapshot manifests: laying out named arrays in one byte space, chunk hashing and verification.

The manifest dataclasses and their wire codec live in :mod:`chaosp2p.protocols.transfer.messages`
(the protocol layer needs them and may not import this package); this module re-exports them and
adds what only a peer with real arrays needs: a deterministic layout (names sorted, each buffer
aligned to :data:`ALIGN_BYTES`, gaps zero), chunk hashing over a contiguous buffer, and typed
views of a buffer's arrays.

Hashing runs the C hash over whole chunks of a contiguous buffer: no per-byte Python work, so a
GiB hashes at the hash function's own speed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.transfer.messages import (
    DIGEST_BYTES,
    DTYPE_ITEMSIZE,
    BufferSpec,
    Manifest,
    check_manifest,
    decode_manifest,
    encode_manifest,
    hash_function,
    manifest_digest,
)

__all__ = [
    "ALIGN_BYTES",
    "DIGEST_BYTES",
    "DTYPE_ITEMSIZE",
    "BufferSpec",
    "FlatState",
    "Manifest",
    "array_views",
    "as_bytes",
    "build_manifest",
    "check_manifest",
    "decode_manifest",
    "dtype_name_of",
    "encode_manifest",
    "hash_chunks",
    "layout_buffers",
    "manifest_digest",
    "storage_dtype",
    "verify_chunks",
]

ALIGN_BYTES = 64
"""Every buffer starts at a multiple of this (cache line; satisfies every dtype's alignment)."""

_STORAGE = {"bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def as_bytes(data: np.ndarray | memoryview) -> memoryview:
    """A flat byte memoryview of a C-contiguous array or buffer (no copy)."""
    view = data.data if isinstance(data, np.ndarray) else data
    return view.cast("B")


def storage_dtype(dtype: str) -> np.dtype[np.generic]:
    """The numpy dtype that holds ``dtype``'s bytes (same itemsize; raw integers for types numpy lacks)."""
    if dtype not in DTYPE_ITEMSIZE:
        raise ConfigError(f"unsupported dtype {dtype!r} (supported: {', '.join(DTYPE_ITEMSIZE)})")
    return np.dtype(_STORAGE.get(dtype, dtype))


def dtype_name_of(array: np.ndarray) -> str:
    """The manifest dtype name of a numpy array (``ConfigError`` if it has no manifest equivalent)."""
    name = str(array.dtype.name)
    if name not in DTYPE_ITEMSIZE or array.dtype.itemsize != DTYPE_ITEMSIZE[name]:
        raise ConfigError(f"arrays of dtype {array.dtype} cannot be put in a snapshot")
    return name


@dataclass(frozen=True, slots=True)
class FlatState:
    """Named arrays plus each one's logical dtype (when it differs from the array's own).

    ``arrays`` hold the bytes with their numpy storage dtype (e.g. a ``bfloat16`` tensor arrives as
    a ``uint16`` array with ``dtypes[name] == "bfloat16"``).
    """

    arrays: Mapping[str, np.ndarray]
    dtypes: Mapping[str, str]

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> FlatState:
        """Wrap plain numpy arrays (their dtypes are their logical dtypes)."""
        return cls(dict(arrays), {name: dtype_name_of(a) for name, a in arrays.items()})

    def dtype(self, name: str) -> str:
        """The logical dtype of array ``name``."""
        return self.dtypes.get(name) or dtype_name_of(self.arrays[name])


def layout_buffers(entries: Iterable[tuple[str, str, tuple[int, ...]]]) -> tuple[tuple[BufferSpec, ...], int]:
    """Place ``(name, dtype, shape)`` entries in one byte space; returns the specs and total bytes.

    Deterministic: sorted by name, each aligned to :data:`ALIGN_BYTES`, so two peers with the same
    state compute the same layout (and, with the same chunking, the same digest).
    """
    specs = []
    offset = 0
    seen: set[str] = set()
    for name, dtype, shape in sorted(entries, key=lambda e: e[0]):
        if not name or name in seen:
            raise ConfigError(f"buffer names must be non-empty and unique (got {name!r})")
        seen.add(name)
        itemsize = DTYPE_ITEMSIZE.get(dtype)
        if itemsize is None:
            raise ConfigError(f"unsupported dtype {dtype!r} for {name!r}")
        if any(type(d) is not int or d < 0 for d in shape):
            raise ConfigError(f"invalid shape {shape!r} for {name!r}")
        length = math.prod(shape) * itemsize
        offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
        specs.append(BufferSpec(name=name, dtype=dtype, shape=tuple(shape), offset=offset, length=length))
        offset += length
    return tuple(specs), offset


def hash_chunks(data: np.ndarray | memoryview, chunk_bytes: int, algorithm: str) -> bytes:
    """Concatenated digests of consecutive ``chunk_bytes`` chunks of a contiguous byte buffer."""
    view = as_bytes(data)
    hasher = hash_function(algorithm)
    return b"".join(hasher(view[i : i + chunk_bytes]) for i in range(0, len(view), chunk_bytes))


def build_manifest(
    run: str,
    step: int,
    data: np.ndarray | memoryview,
    buffers: Sequence[BufferSpec],
    *,
    chunk_bytes: int,
    hash_algorithm: str,
) -> Manifest:
    """The manifest of a filled snapshot buffer (hashes every chunk once)."""
    view = as_bytes(data)
    return Manifest(
        run=run,
        step=step,
        total_bytes=len(view),
        chunk_bytes=chunk_bytes,
        hash_algorithm=hash_algorithm,
        buffers=tuple(buffers),
        chunk_hashes=hash_chunks(view, chunk_bytes, hash_algorithm),
    )


def verify_chunks(manifest: Manifest, data: np.ndarray | memoryview, chunks: Iterable[int] | None = None) -> list[int]:
    """Indices (among ``chunks``, default all) whose bytes in ``data`` do not match the manifest."""
    view = as_bytes(data)
    if len(view) != manifest.total_bytes:
        raise ConfigError(f"buffer has {len(view)} bytes, the manifest {manifest.total_bytes}")
    hasher = hash_function(manifest.hash_algorithm)
    bad = []
    for index in range(manifest.chunk_count) if chunks is None else chunks:
        offset, length = manifest.chunk_range(index)
        if hasher(view[offset : offset + length]) != manifest.chunk_hash(index):
            bad.append(index)
    return bad


def array_views(manifest: Manifest, data: np.ndarray) -> dict[str, np.ndarray]:
    """Typed, shaped numpy views (storage dtypes) of every buffer in the byte buffer ``data``."""
    if data.dtype != np.uint8 or data.ndim != 1 or data.shape[0] != manifest.total_bytes:
        raise ConfigError("data must be a 1-D uint8 array of the manifest's total_bytes")
    out = {}
    for spec in manifest.buffers:
        raw = data[spec.offset : spec.end]
        out[spec.name] = raw.view(storage_dtype(spec.dtype)).reshape(spec.shape)
    return out
