"""Peer identities: Ed25519 keys and libp2p-style PeerIDs.

A PeerID is the identity multihash of the protobuf-encoded public key, exactly as libp2p defines it
for Ed25519 keys, so its base58 text starts with ``12D3KooW``. Because the multihash is the identity
function, the PeerID *contains* the public key: anyone can verify a signature made by a peer from
its PeerID alone, which is what signed DHT records and the handshake rely on.

This module is pure computation (no files, no sockets); reading and writing key files lives in
``chaosp2p.transport.keyfile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from chaosp2p.errors import ConfigError
from chaosp2p.wire.base58 import b58decode, b58encode

# protobuf PublicKey{Type: Ed25519 (1), Data: 32 bytes}: field 1 varint, field 2 length-delimited.
_ED25519_PROTOBUF_PREFIX = bytes([0x08, 0x01, 0x12, 0x20])
# multihash: code 0x00 (identity), length 36 (the protobuf above).
_IDENTITY_MULTIHASH_PREFIX = bytes([0x00, 0x24])
PEER_ID_BYTES = len(_IDENTITY_MULTIHASH_PREFIX) + len(_ED25519_PROTOBUF_PREFIX) + 32


@dataclass(frozen=True, slots=True, order=True)
class PeerID:
    """A peer's identity, derived from its Ed25519 public key.

    Compare, hash and sort PeerIDs freely; ``str(peer_id)`` gives the ``12D3KooW…`` form.
    """

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != PEER_ID_BYTES or not self.raw.startswith(
            _IDENTITY_MULTIHASH_PREFIX + _ED25519_PROTOBUF_PREFIX
        ):
            raise ValueError("not an Ed25519 identity-multihash PeerID")

    @classmethod
    def from_public_key(cls, key: Ed25519PublicKey) -> PeerID:
        """Derive the PeerID of a public key."""
        raw_key = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(_IDENTITY_MULTIHASH_PREFIX + _ED25519_PROTOBUF_PREFIX + raw_key)

    @classmethod
    def from_public_bytes(cls, raw_key: bytes) -> PeerID:
        """Derive the PeerID from a raw 32-byte Ed25519 public key."""
        if len(raw_key) != 32:
            raise ValueError("an Ed25519 public key is 32 bytes")
        return cls(_IDENTITY_MULTIHASH_PREFIX + _ED25519_PROTOBUF_PREFIX + raw_key)

    @classmethod
    def from_raws(cls, raws: Sequence[object]) -> tuple[PeerID, ...]:
        """Many PeerIDs at once, with the constructor's check; ValueError if any is not one.

        About 2x faster than one constructor call each (a newcomer decodes a configuration of
        ~1000 members): the checks run column-wise in C and the per-object dataclass
        ``__init__`` / ``__post_init__`` is skipped.
        """
        n = len(raws)
        if n == 0:
            return ()
        if set(map(type, raws)) != {bytes} or set(map(len, raws)) != {PEER_ID_BYTES}:  # type: ignore[arg-type]
            raise ValueError("not an Ed25519 identity-multihash PeerID")
        joined = b"".join(raws)  # type: ignore[arg-type]
        prefix = _IDENTITY_MULTIHASH_PREFIX + _ED25519_PROTOBUF_PREFIX
        for i, byte in enumerate(prefix):  # byte i of every id, one strided slice each
            if joined[i::PEER_ID_BYTES] != bytes((byte,)) * n:
                raise ValueError("not an Ed25519 identity-multihash PeerID")
        peers = list(map(object.__new__, repeat(cls, n)))
        for _ in map(object.__setattr__, peers, repeat("raw"), raws):
            pass
        return tuple(peers)

    @classmethod
    def parse(cls, text: str) -> PeerID:
        """Parse the base58 form; raise :class:`ConfigError` if it is not a valid Ed25519 PeerID."""
        try:
            return cls(b58decode(text, max_len=64))
        except ValueError as exc:
            raise ConfigError(f"invalid PeerID {text!r}: {exc}") from None

    @property
    def public_bytes(self) -> bytes:
        """The raw 32-byte Ed25519 public key inside this PeerID."""
        return self.raw[-32:]

    def public_key(self) -> Ed25519PublicKey:
        """The Ed25519 public key inside this PeerID."""
        return Ed25519PublicKey.from_public_bytes(self.public_bytes)

    def verify(self, signature: bytes, data: bytes) -> bool:
        """True if ``signature`` is this peer's Ed25519 signature over ``data``."""
        if len(signature) != 64:
            return False
        try:
            self.public_key().verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def __hash__(self) -> int:
        # PeerIDs key the hottest maps (routing tables, member lists); hash the bytes directly
        # instead of the dataclass's generated tuple hash.
        return hash(self.raw)

    def short(self) -> str:
        """A short form for logs and tables: the last 8 characters."""
        return "…" + str(self)[-8:]

    def __str__(self) -> str:
        return b58encode(self.raw)

    def __repr__(self) -> str:
        return f"PeerID({self!s})"


class Identity:
    """A peer's private Ed25519 key together with its PeerID."""

    __slots__ = ("_key", "peer_id")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.peer_id = PeerID.from_public_key(key.public_key())

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """A deterministic identity from a 32-byte seed (for tests and simulations only)."""
        if len(seed) != 32:
            raise ConfigError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def sign(self, data: bytes) -> bytes:
        """Sign ``data`` with the private key (64-byte Ed25519 signature)."""
        return self._key.sign(data)

    def private_key(self) -> Ed25519PrivateKey:
        """The underlying private key (for serialization)."""
        return self._key

    def __repr__(self) -> str:
        return f"Identity({self.peer_id!s})"
