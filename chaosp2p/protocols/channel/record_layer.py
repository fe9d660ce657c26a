"""The secure record layer: fixed headers, authenticated encryption, and nonce discipline.

Theory of operation
-------------------
After the Noise handshake every byte on the connection is a *record*::

    header (16 bytes, sent in clear, authenticated as AEAD associated data)
        u32 length     payload length in bytes (the ciphertext is length + 16)
        u8  type       FrameType
        u8  flags      Flag bits
        u16 reserved   must be zero
        u32 stream_id  0 for connection-level frames
        u32 value      window increment, ping opaque, or error code
    ciphertext (length + 16 bytes: AES-256-GCM of the payload, 16-byte tag)

Every record -- even a header-only WINDOW or PING -- carries a tag, so nothing on the connection is
unauthenticated, and each direction's nonce is a counter that both sides advance per record, so a
replayed, dropped or reordered record fails its tag. Putting the header in the associated data,
rather than in the ciphertext, lets a sender encrypt a tensor slice straight into the send buffer
and a receiver decrypt straight into a destination buffer: the payload is never concatenated or
re-encoded. What an on-path observer learns is the framing (sizes, stream ids), much as TCP ports
and lengths already show; the contents stay confidential.

``length`` is checked against the configured maximum before the receiver reads or allocates
anything for the body.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from chaosp2p.errors import RemoteProtocolError

HEADER = struct.Struct(">IBBHII")
HEADER_BYTES = HEADER.size
TAG_BYTES = 16
MAX_NONCE = (1 << 64) - 1


class FrameType(enum.IntEnum):
    """Record types. ONLY APPEND TO THIS LIST: the numbers are on the wire."""

    DATA = 0
    WINDOW = 1
    PING = 2
    GOAWAY = 3
    MESSAGE = 4
    HELLO = 5


class GoAwayCode(enum.IntEnum):
    """Why a GOAWAY record closes the connection (its ``value``). ONLY APPEND TO THIS LIST."""

    NORMAL = 0
    PROTOCOL_ERROR = 1
    IDLE = 2
    SHUTDOWN = 3
    DEAD = 4


class Flag(enum.IntFlag):
    """Record flag bits (meaningful on DATA; ACK on PING)."""

    NONE = 0
    SYN = 1
    FIN = 2
    RST = 4
    ACK = 8


_KNOWN_FLAGS = int(Flag.SYN | Flag.FIN | Flag.RST | Flag.ACK)


@dataclass(frozen=True, slots=True)
class RecordHeader:
    """A decoded, structurally valid record header."""

    length: int
    type: FrameType
    flags: Flag
    stream_id: int
    value: int

    def pack(self) -> bytes:
        """The 16 header bytes."""
        return HEADER.pack(self.length, self.type, self.flags, 0, self.stream_id, self.value)

    @property
    def body_bytes(self) -> int:
        """Bytes that follow the header on the wire (ciphertext plus tag)."""
        return self.length + TAG_BYTES


def parse_header(raw: bytes | bytearray | memoryview, *, max_record_bytes: int) -> RecordHeader:
    """Decode and sanity-check a header before any body is read or allocated."""
    length, type_number, flags, reserved, stream_id, value = HEADER.unpack(raw)
    if length > max_record_bytes:
        raise RemoteProtocolError(f"record of {length} bytes exceeds max_record_bytes={max_record_bytes}")
    if reserved != 0:
        raise RemoteProtocolError("record header reserved bits are set")
    try:
        frame_type = FrameType(type_number)
    except ValueError:
        raise RemoteProtocolError(f"unknown record type {type_number}") from None
    if flags & ~_KNOWN_FLAGS:
        raise RemoteProtocolError(f"unknown record flags {flags:#x}")
    return RecordHeader(length, frame_type, Flag(flags), stream_id, value)


def _nonce(counter: int) -> bytes:
    return b"\0\0\0\0" + counter.to_bytes(8, "big")


class RecordSealer:
    """Encrypts outgoing records for one direction of a connection."""

    __slots__ = ("_aead", "_counter")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0

    def seal_into(self, header: bytes, payload: bytes | bytearray | memoryview, out: memoryview) -> None:
        """Write ``payload``'s ciphertext and tag into ``out`` (exactly ``len(payload) + 16`` bytes)."""
        if self._counter >= MAX_NONCE:
            raise RemoteProtocolError("record nonce space exhausted; reconnect")
        self._aead.encrypt_into(_nonce(self._counter), payload, header, out)
        self._counter += 1


class RecordOpener:
    """Decrypts and authenticates incoming records for one direction of a connection."""

    __slots__ = ("_aead", "_counter")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0

    def open_into(self, header: bytes, ciphertext: bytes | bytearray | memoryview, out: memoryview) -> None:
        """Decrypt into ``out`` (``len(ciphertext) - 16`` bytes) after checking the tag.

        On a bad tag ``out`` may hold garbage: callers only decrypt into buffers that are not yet
        trusted (stream buffers, or a transfer's staging area whose chunk is then discarded).
        """
        try:
            self._aead.decrypt_into(_nonce(self._counter), ciphertext, header, out)
        except InvalidTag:
            raise RemoteProtocolError("record failed authentication (corrupted, replayed or forged bytes)") from None
        self._counter += 1
