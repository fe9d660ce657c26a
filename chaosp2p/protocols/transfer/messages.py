"""Wire format of the state-transfer protocol (``/chaos/transfer/1``) and of snapshot manifests.

Control messages are msgpack arrays ``[type, field1, ...]`` built by
:class:`~chaosp2p.wire.messages.MessageCodec`. Two replies announce a *raw payload* that follows
the header frame on the same stream, exactly ``length`` bytes, never msgpack-encoded:

* :class:`ManifestReply` is followed by the manifest body (``manifest_bytes`` bytes, the
  :func:`encode_manifest` form), so a manifest is not bound by the frame size limit;
* :class:`DataHeader` is followed by the snapshot bytes it describes.

A manifest describes one snapshot as a single logical byte space of ``total_bytes``: named buffers
at byte offsets (sorted, non-overlapping, gaps are zero bytes) and fixed-size chunks of
``chunk_bytes`` (the last one shorter) with one hash per chunk, concatenated in ``chunk_hashes``.
The snapshot's *digest* is SHA-256 of the encoded manifest body (:func:`manifest_digest`); sources
that hold the same (run, step) with the same digest serve byte-identical snapshots, so a newcomer
can mix their chunks, and a digest can be pinned by a user or signed by the members of a run.

``validate()`` on messages enforces only configuration-independent limits; :func:`check_manifest`
applies the configured ones. Decoding checks counts before it allocates: control frames go through
:func:`decode_message` (containers capped at what a transfer message can hold) and manifest bodies
through :func:`decode_manifest` (every count and size checked against the configuration from its
header, before msgpack builds the item). ``protocols/transfer.md`` is the normative description,
with test vectors.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.wire.framing import pack
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "transfer"
"""Protocol name machines register under."""
PROTOCOL_ID = ProtocolId(PROTOCOL, 1)
"""``/chaos/transfer/1``."""
MANIFEST_FORMAT = 1
"""First element of an encoded manifest body; bumped on an incompatible change."""

WIRE_MAX_U64 = (1 << 64) - 1
WIRE_MAX_RUN_CHARS = 1024
WIRE_MAX_VERSIONS = 64
WIRE_MAX_DIGEST_BYTES = 64
WIRE_MAX_ALGORITHM_CHARS = 32
WIRE_MAX_DETAIL_CHARS = 1024
WIRE_MAX_LEASE_TTL_S = 86_400.0
WIRE_MAX_FRAME_BYTES = 64 << 10
"""Largest transfer control frame (a full VersionsReply is about 6 KiB); bulk bytes are payloads."""
MANIFEST_DIGEST_BYTES = 32
"""Size of a snapshot digest (SHA-256 of the manifest body, whatever the chunk hash)."""

DIGEST_BYTES: dict[str, int] = {"xxh3_128": 16, "blake3": 32}
"""Digest size of each supported hash algorithm."""

DTYPE_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "uint16": 2,
    "int16": 2,
    "uint32": 4,
    "int32": 4,
    "uint64": 8,
    "int64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
"""Logical element types a buffer may have, with their size in bytes."""


class TransferMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    GET_VERSIONS = 1
    VERSIONS = 2
    GET_MANIFEST = 3
    MANIFEST = 4
    GET_CHUNKS = 5
    GET_RANGE = 6
    DATA = 7
    RELEASE_LEASE = 8
    ERROR = 9
    CANCEL = 10


class TransferErrorCode(enum.IntEnum):
    """Why a source refused a request. ONLY APPEND TO THIS LIST."""

    UNKNOWN_RUN = 1
    UNKNOWN_VERSION = 2
    OUT_OF_RANGE = 3
    BUSY = 4
    NO_LEASE = 5
    BAD_REQUEST = 6
    CANCELLED = 7
    """The newcomer cancelled the request before the source started answering it."""


codec = MessageCodec(PROTOCOL, TransferMessageType)
"""Encoder/decoder for every transfer message."""


def _reject(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"{PROTOCOL}: {message}")


def _check_u64(value: int, what: str) -> None:
    if not 0 <= value <= WIRE_MAX_U64:
        raise _reject(f"{what} out of range: {value}")


def _check_run(run: str) -> None:
    if not 1 <= len(run) <= WIRE_MAX_RUN_CHARS:
        raise _reject(f"run id must have 1..{WIRE_MAX_RUN_CHARS} characters (got {len(run)})")


# --------------------------------------------------------------------------------- nested records
@dataclass(frozen=True, slots=True, kw_only=True)
class VersionInfo:
    """One snapshot a source holds: its step, size, chunking and manifest digest."""

    step: int
    total_bytes: int
    chunk_bytes: int
    hash_algorithm: str
    digest: bytes

    def validate(self) -> None:
        """Hard limits (the newcomer checks the configured ones when it uses the version)."""
        _check_u64(self.step, "step")
        _check_u64(self.total_bytes, "total_bytes")
        if not 1 <= self.chunk_bytes <= WIRE_MAX_U64:
            raise _reject(f"chunk_bytes out of range: {self.chunk_bytes}")
        if len(self.hash_algorithm) > WIRE_MAX_ALGORITHM_CHARS:
            raise _reject("hash algorithm name too long")
        if not 1 <= len(self.digest) <= WIRE_MAX_DIGEST_BYTES:
            raise _reject(f"digest must have 1..{WIRE_MAX_DIGEST_BYTES} bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class BufferSpec:
    """One named buffer of a snapshot: element type, shape and its place in the byte space."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int

    @property
    def end(self) -> int:
        """One past the buffer's last byte."""
        return self.offset + self.length


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """The description of one snapshot (see the module docstring for the byte-space model)."""

    run: str
    step: int
    total_bytes: int
    chunk_bytes: int
    hash_algorithm: str
    buffers: tuple[BufferSpec, ...]
    chunk_hashes: bytes

    @property
    def chunk_count(self) -> int:
        """Number of chunks (0 for an empty snapshot)."""
        return -(-self.total_bytes // self.chunk_bytes)

    @property
    def digest_bytes(self) -> int:
        """Size of one chunk hash."""
        return DIGEST_BYTES[self.hash_algorithm]

    def chunk_range(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of chunk ``index``."""
        offset = index * self.chunk_bytes
        return offset, min(self.chunk_bytes, self.total_bytes - offset)

    def chunk_hash(self, index: int) -> bytes:
        """The expected hash of chunk ``index``."""
        size = self.digest_bytes
        return self.chunk_hashes[index * size : (index + 1) * size]

    def buffer(self, name: str) -> BufferSpec:
        """The spec named ``name`` (``KeyError`` if absent)."""
        for spec in self.buffers:
            if spec.name == name:
                return spec
        raise KeyError(name)


# ------------------------------------------------------------------------------------- messages
@codec.register(TransferMessageType.GET_VERSIONS)
@dataclass(frozen=True, slots=True, kw_only=True)
class GetVersions(Message):
    """Which snapshots of ``run`` do you hold?"""

    request_id: int
    run: str

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_run(self.run)


@codec.register(TransferMessageType.VERSIONS)
@dataclass(frozen=True, slots=True, kw_only=True)
class VersionsReply(Message):
    """The snapshots of ``run`` a source holds, newest step first."""

    request_id: int
    run: str
    versions: tuple[VersionInfo, ...]

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_run(self.run)
        if len(self.versions) > WIRE_MAX_VERSIONS:
            raise _reject(f"{len(self.versions)} versions exceed {WIRE_MAX_VERSIONS}")


@codec.register(TransferMessageType.GET_MANIFEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class GetManifest(Message):
    """Open (or, with ``lease_id``, renew) a lease on snapshot (run, step); optionally send its manifest.

    A lease pins the snapshot's memory on the source until it is released, expires, or the
    requester disconnects.
    """

    request_id: int
    run: str
    step: int
    include_manifest: bool = True
    lease_id: int | None = None

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_run(self.run)
        _check_u64(self.step, "step")
        if self.lease_id is not None:
            _check_u64(self.lease_id, "lease_id")


@codec.register(TransferMessageType.MANIFEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestReply(Message):
    """Lease granted; ``manifest_bytes`` raw bytes of manifest body follow (0: none)."""

    request_id: int
    lease_id: int
    lease_ttl_s: float
    hash_algorithm: str
    digest: bytes
    manifest_bytes: int

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_u64(self.lease_id, "lease_id")
        _check_u64(self.manifest_bytes, "manifest_bytes")
        if not 0.0 < self.lease_ttl_s <= WIRE_MAX_LEASE_TTL_S:
            raise _reject(f"lease_ttl_s out of range: {self.lease_ttl_s!r}")
        if len(self.hash_algorithm) > WIRE_MAX_ALGORITHM_CHARS:
            raise _reject("hash algorithm name too long")
        if not 1 <= len(self.digest) <= WIRE_MAX_DIGEST_BYTES:
            raise _reject(f"digest must have 1..{WIRE_MAX_DIGEST_BYTES} bytes")


@codec.register(TransferMessageType.GET_CHUNKS)
@dataclass(frozen=True, slots=True, kw_only=True)
class GetChunks(Message):
    """Send chunks ``first_chunk .. first_chunk + chunk_count - 1`` of the leased snapshot."""

    request_id: int
    run: str
    step: int
    lease_id: int
    first_chunk: int
    chunk_count: int

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_run(self.run)
        _check_u64(self.step, "step")
        _check_u64(self.lease_id, "lease_id")
        _check_u64(self.first_chunk, "first_chunk")
        if not 1 <= self.chunk_count <= WIRE_MAX_U64:
            raise _reject(f"chunk_count out of range: {self.chunk_count}")


@codec.register(TransferMessageType.GET_RANGE)
@dataclass(frozen=True, slots=True, kw_only=True)
class GetRange(Message):
    """Send bytes ``offset .. offset + length - 1`` of the leased snapshot."""

    request_id: int
    run: str
    step: int
    lease_id: int
    offset: int
    length: int

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_run(self.run)
        _check_u64(self.step, "step")
        _check_u64(self.lease_id, "lease_id")
        _check_u64(self.offset, "offset")
        if not 1 <= self.length <= WIRE_MAX_U64:
            raise _reject(f"length out of range: {self.length}")


@codec.register(TransferMessageType.DATA)
@dataclass(frozen=True, slots=True, kw_only=True)
class DataHeader(Message):
    """Reply to GetChunks/GetRange: exactly ``length`` raw bytes from ``offset`` follow."""

    request_id: int
    offset: int
    length: int

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        _check_u64(self.offset, "offset")
        if not 1 <= self.length <= WIRE_MAX_U64:
            raise _reject(f"length out of range: {self.length}")


@codec.register(TransferMessageType.RELEASE_LEASE)
@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseLease(Message):
    """The requester no longer needs the lease (no reply)."""

    lease_id: int

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.lease_id, "lease_id")


@codec.register(TransferMessageType.ERROR)
@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply(Message):
    """A request was refused."""

    request_id: int
    code: TransferErrorCode
    detail: str = ""

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")
        if len(self.detail) > WIRE_MAX_DETAIL_CHARS:
            raise _reject("error detail too long")


@codec.register(TransferMessageType.CANCEL)
@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequest(Message):
    """Do not answer request ``request_id`` if you have not started to (no reply of its own).

    The source answers a request it skips with ``ErrorReply(CANCELLED)`` in the request's place,
    so every request still gets exactly one answer, in order. One it already answers is unaffected.
    """

    request_id: int

    def validate(self) -> None:
        """Hard limits."""
        _check_u64(self.request_id, "request_id")


REQUEST_TYPES: tuple[type[Message], ...] = (
    GetVersions,
    GetManifest,
    GetChunks,
    GetRange,
    ReleaseLease,
    CancelRequest,
)
"""Messages a newcomer sends (a source receives)."""
REPLY_TYPES: tuple[type[Message], ...] = (VersionsReply, ManifestReply, DataHeader, ErrorReply)
"""Messages a source sends (a newcomer receives)."""


def decode_message(body: bytes | bytearray | memoryview) -> Message:
    """Decode one transfer control frame body with the protocol's own, tight container limits.

    No transfer message holds more than :data:`WIRE_MAX_VERSIONS` items in an array, a string
    longer than a run id or an error detail, or a byte string longer than a digest, so msgpack is
    told exactly that: an oversized count is refused from its header, before anything is built.
    """
    if len(body) > WIRE_MAX_FRAME_BYTES:
        raise _reject(f"frame of {len(body)} bytes exceeds {WIRE_MAX_FRAME_BYTES}")
    try:
        obj = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_array_len=max(WIRE_MAX_VERSIONS, 8),
            max_str_len=4 * max(WIRE_MAX_RUN_CHARS, WIRE_MAX_DETAIL_CHARS),
            max_bin_len=WIRE_MAX_DIGEST_BYTES,
            max_map_len=0,
            max_ext_len=0,
            timestamp=0,
        )
    except Exception as exc:  # msgpack raises many types (ValueError, ExtraData, StackError, ...)
        raise _reject(f"undecodable frame: {type(exc).__name__}: {exc}") from None
    return codec.from_obj(obj)


# ------------------------------------------------------------------------------------- hashing
Hasher = Callable[[Any], bytes]


def hash_function(algorithm: str) -> Hasher:
    """The digest function of ``algorithm`` (takes any contiguous buffer, returns the digest).

    Raises :class:`ConfigError` for an unknown algorithm or a missing optional package.
    """
    if algorithm == "xxh3_128":
        return _xxh3_128
    if algorithm == "blake3":
        try:
            import blake3
        except ImportError:
            raise ConfigError("hash algorithm blake3 needs the optional 'blake3' package") from None

        def _blake3(data: Any) -> bytes:
            return bytes(blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest())

        return _blake3
    raise ConfigError(f"unknown hash algorithm {algorithm!r} (known: {', '.join(DIGEST_BYTES)})")


def _xxh3_128(data: Any) -> bytes:
    return bytes(xxhash.xxh3_128_digest(data))


# ------------------------------------------------------------------------------ manifest codec
def manifest_to_obj(manifest: Manifest) -> list[Any]:
    """The msgpack-ready array form of a manifest body."""
    return [
        MANIFEST_FORMAT,
        manifest.run,
        manifest.step,
        manifest.total_bytes,
        manifest.chunk_bytes,
        manifest.hash_algorithm,
        [[b.name, b.dtype, list(b.shape), b.offset, b.length] for b in manifest.buffers],
        manifest.chunk_hashes,
    ]


def encode_manifest(manifest: Manifest) -> bytes:
    """The canonical manifest body (deterministic: equal manifests encode to equal bytes)."""
    return pack(manifest_to_obj(manifest))


def manifest_digest(body: bytes | bytearray | memoryview) -> bytes:
    """The snapshot's identity: SHA-256 of its encoded manifest body (32 bytes).

    Cryptographic whatever the chunk hash is, so the digest can be pinned by a user
    (``state pull --digest``) or signed by the members of a training run, and a source cannot
    craft another manifest with the same digest. Chunk hashes are listed inside the body, so the
    digest covers every byte of the snapshot -- as strongly as the chunk hash resists forgery
    (``xxh3_128`` catches corruption, not an adversary; use ``blake3`` chunks where sources may lie).
    """
    return hashlib.sha256(body).digest()


def decode_manifest(
    body: bytes | bytearray | memoryview, *, max_bytes: int, limits: TransferConfig | None = None
) -> Manifest:
    """Decode a manifest body; anything malformed or over a limit is a :class:`RemoteProtocolError`.

    Decoding streams through the body and checks every count and size *before* msgpack builds the
    object it describes: the buffer list against ``max_manifest_entries``, each shape against
    ``max_dims``, each name against ``max_name_chars``, ``total_bytes`` and ``chunk_bytes``
    against their maxima and the chunk-hash blob against the exact size they imply. A hostile
    body can therefore not make the newcomer allocate more than the body's own size. ``limits``
    defaults to the built-in :class:`TransferConfig`; :func:`check_manifest` then checks values.
    """
    view = memoryview(body).cast("B")
    if len(view) > max_bytes:
        raise _reject(f"manifest body of {len(view)} bytes exceeds the {max_bytes}-byte limit")
    reader = _StreamReader(view, limits or TransferConfig())
    try:
        return reader.manifest()
    except RemoteProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types (ValueError, OutOfData, StackError, ...)
        raise _reject(f"undecodable manifest: {type(exc).__name__}: {exc}") from None


class _StreamReader:
    """Walks a manifest body item by item, checking each header before msgpack reads the item."""

    def __init__(self, view: memoryview, limits: TransferConfig) -> None:
        self._view = view
        self._limits = limits
        # Containers are read with read_array_header, never built by msgpack, so these caps only
        # bound what a misplaced item (an array where a number belongs) could make it allocate.
        self._unpacker = msgpack.Unpacker(
            None,
            raw=False,
            max_buffer_size=max(1, len(view)),
            max_str_len=4 * limits.max_name_chars,
            max_bin_len=max(1, len(view)),
            max_array_len=8,
            max_map_len=0,
            max_ext_len=0,
            strict_map_key=True,
            timestamp=0,
        )
        self._unpacker.feed(view)

    def manifest(self) -> Manifest:
        limits = self._limits
        if self._array("manifest", 8) != 8:
            raise _reject("manifest must be an array of 8 items")
        fmt = self._int("manifest.format")
        if fmt != MANIFEST_FORMAT:
            raise _reject(f"unknown manifest format {fmt!r}")
        run = self._str("manifest.run", limits.max_name_chars)
        step = self._int("manifest.step")
        total = self._int("manifest.total_bytes")
        chunk = self._int("manifest.chunk_bytes")
        algorithm = self._str("manifest.hash_algorithm", WIRE_MAX_ALGORITHM_CHARS)
        if not 0 <= total <= limits.max_state_bytes:
            raise _reject(f"manifest total_bytes {total} outside 0..{limits.max_state_bytes}")
        if not 1 <= chunk <= limits.max_chunk_bytes:
            raise _reject(f"manifest chunk_bytes {chunk} outside 1..{limits.max_chunk_bytes}")
        digest_bytes = DIGEST_BYTES.get(algorithm)
        if digest_bytes is None:
            raise _reject(f"manifest names unknown hash algorithm {algorithm[:32]!r}")
        count = self._array("manifest.buffers", limits.max_manifest_entries)
        specs = []
        for i in range(count):
            where = f"manifest.buffers[{i}]"
            if self._array(where, 5) != 5:
                raise _reject(f"{where} must be an array of 5 items")
            name = self._str(f"{where}.name", limits.max_name_chars)
            dtype = self._str(f"{where}.dtype", WIRE_MAX_ALGORITHM_CHARS)
            dims = self._array(f"{where}.shape", limits.max_dims)
            shape = tuple(self._int(f"{where}.shape[]") for _ in range(dims))
            offset = self._int(f"{where}.offset")
            length = self._int(f"{where}.length")
            specs.append(BufferSpec(name=name, dtype=dtype, shape=shape, offset=offset, length=length))
        hashes = self._bin("manifest.chunk_hashes", -(-total // chunk) * digest_bytes)
        if self._unpacker.tell() != len(self._view):
            raise _reject("manifest body has trailing bytes")
        return Manifest(
            run=run,
            step=step,
            total_bytes=total,
            chunk_bytes=chunk,
            hash_algorithm=algorithm,
            buffers=tuple(specs),
            chunk_hashes=hashes,
        )

    # ------------------------------------------------------------------------------ items
    def _head(self, what: str) -> tuple[int, int]:
        """(type byte, position) of the next item."""
        position = self._unpacker.tell()
        if position >= len(self._view):
            raise _reject(f"{what}: manifest body ends early")
        return self._view[position], position

    def _length_after(self, position: int, size: int) -> int:
        end = position + 1 + size
        if end > len(self._view):
            raise _reject("manifest body ends inside an item header")
        return int.from_bytes(self._view[position + 1 : end], "big")

    def _array(self, what: str, max_items: int) -> int:
        byte, position = self._head(what)
        if 0x90 <= byte <= 0x9F:
            count = byte & 0x0F
        elif byte == 0xDC:
            count = self._length_after(position, 2)
        elif byte == 0xDD:
            count = self._length_after(position, 4)
        else:
            raise _reject(f"{what} must be an array")
        if count > max_items:
            raise _reject(f"{what} has {count} items (limit {max_items})")
        return int(self._unpacker.read_array_header())

    def _int(self, what: str) -> int:
        byte, _ = self._head(what)
        if not (byte <= 0x7F or byte >= 0xE0 or 0xCC <= byte <= 0xD3):
            raise _reject(f"{what}: expected int")
        value = self._unpacker.unpack()
        if type(value) is not int:
            raise _reject(f"{what}: expected int")
        return value

    def _str(self, what: str, max_chars: int) -> str:
        byte, position = self._head(what)
        if 0xA0 <= byte <= 0xBF:
            size = byte & 0x1F
        elif 0xD9 <= byte <= 0xDB:
            size = self._length_after(position, 1 << (byte - 0xD9))
        else:
            raise _reject(f"{what}: expected str")
        if size > 4 * max_chars:
            raise _reject(f"{what}: {size} bytes exceed {max_chars} characters")
        value = self._unpacker.unpack()
        if type(value) is not str:
            raise _reject(f"{what}: expected str")
        return value

    def _bin(self, what: str, expected: int) -> bytes:
        byte, position = self._head(what)
        if not 0xC4 <= byte <= 0xC6:
            raise _reject(f"{what}: expected bin")
        size = self._length_after(position, 1 << (byte - 0xC4))
        if size != expected:
            raise _reject(f"{what}: {size} bytes where the chunk count needs {expected}")
        value = self._unpacker.unpack()
        if type(value) is not bytes:
            raise _reject(f"{what}: expected bin")
        return value


def check_manifest(manifest: Manifest, config: TransferConfig) -> None:
    """Check a manifest's values against the configured limits and its own consistency.

    Raises :class:`RemoteProtocolError` naming the first problem: sizes out of range, unknown
    dtype or hash, names too long or repeated, a shape that does not match a length, buffers that
    overlap, are misaligned or leave the byte space, or a chunk-hash count that does not match.
    """
    m = manifest
    if not 1 <= len(m.run) <= config.max_name_chars:
        raise _reject(f"manifest run id must have 1..{config.max_name_chars} characters")
    if not 0 <= m.step <= WIRE_MAX_U64:
        raise _reject(f"manifest step out of range: {m.step}")
    if m.hash_algorithm not in DIGEST_BYTES:
        raise _reject(f"manifest names unknown hash algorithm {m.hash_algorithm[:32]!r}")
    if not 1 <= m.chunk_bytes <= config.max_chunk_bytes:
        raise _reject(f"manifest chunk_bytes {m.chunk_bytes} outside 1..{config.max_chunk_bytes}")
    if not 0 <= m.total_bytes <= config.max_state_bytes:
        raise _reject(f"manifest total_bytes {m.total_bytes} outside 0..{config.max_state_bytes}")
    if len(m.buffers) > config.max_manifest_entries:
        raise _reject(f"manifest lists {len(m.buffers)} buffers (limit {config.max_manifest_entries})")
    expected_hash_bytes = m.chunk_count * DIGEST_BYTES[m.hash_algorithm]
    if len(m.chunk_hashes) != expected_hash_bytes:
        raise _reject(
            f"manifest has {len(m.chunk_hashes)} bytes of chunk hashes; {m.chunk_count} chunks of "
            f"{m.hash_algorithm} need {expected_hash_bytes}"
        )
    names: set[str] = set()
    previous_end = 0
    for i, spec in enumerate(m.buffers):
        where = f"manifest buffer {i}"
        if not 1 <= len(spec.name) <= config.max_name_chars:
            raise _reject(f"{where}: name must have 1..{config.max_name_chars} characters")
        if spec.name in names:
            raise _reject(f"{where}: name {spec.name[:64]!r} appears twice")
        names.add(spec.name)
        itemsize = DTYPE_ITEMSIZE.get(spec.dtype)
        if itemsize is None:
            raise _reject(f"{where}: unknown dtype {spec.dtype[:32]!r}")
        if len(spec.shape) > config.max_dims:
            raise _reject(f"{where}: {len(spec.shape)} dimensions exceed {config.max_dims}")
        elements = 1
        for dim in spec.shape:
            if dim < 0:
                raise _reject(f"{where}: negative dimension {dim}")
            # Stop multiplying once past the limit so hostile shapes cannot build huge integers.
            elements = min(elements * dim, config.max_state_bytes + 1)
        if spec.length != elements * itemsize:
            raise _reject(
                f"{where} ({spec.name[:64]!r}): length {spec.length} does not match shape "
                f"{spec.shape[:8]} of {spec.dtype}"
            )
        if spec.offset < 0 or spec.offset % itemsize:
            raise _reject(f"{where}: offset {spec.offset} is negative or not aligned to {itemsize} bytes")
        if spec.offset < previous_end:
            raise _reject(f"{where}: overlaps the previous buffer or is out of offset order")
        if spec.offset + spec.length > m.total_bytes:
            raise _reject(f"{where}: bytes {spec.offset}..{spec.offset + spec.length} outside the snapshot")
        previous_end = spec.offset + spec.length
