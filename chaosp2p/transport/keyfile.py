"""Identity and swarm-key files.

An identity file is the peer's Ed25519 private key in PKCS#8 PEM, created with mode 0600 and reused
on every start so the PeerID stays stable. A swarm key file uses libp2p's pre-shared-key format
(``/key/swarm/psk/1.0.0/`` + ``/base16/`` + 64 hex digits) so existing tooling can make one; a bare
line of 64 hex digits is accepted too.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import Identity

SWARM_KEY_HEADER = "/key/swarm/psk/1.0.0/"
MAX_KEY_FILE_BYTES = 4096


def load_or_create_identity(path: str | os.PathLike[str]) -> Identity:
    """Load the identity at ``path``, or create one there (mode 0600) if the file does not exist."""
    file = Path(path)
    if file.exists():
        return load_identity(file)
    identity = Identity.generate()
    save_identity(identity, file)
    return identity


def load_identity(path: str | os.PathLike[str]) -> Identity:
    """Load an identity file; refuse one that other users can read."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"identity file {file} is readable by others (mode {mode & 0o777:o}); chmod 600 it")
        data = file.read_bytes()[: MAX_KEY_FILE_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"cannot read identity file {file}: {exc}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"identity file {file} is too large to be a key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"identity file {file} is not a PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"identity file {file} holds a {type(key).__name__}, not an Ed25519 key")
    return Identity(key)


def save_identity(identity: Identity, path: str | os.PathLike[str]) -> None:
    """Write ``identity`` to ``path`` with mode 0600 (never readable by others, even briefly)."""
    file = Path(path)
    pem = identity.private_key().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    file.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"refusing to overwrite existing identity file {file}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def load_swarm_key(path: str | os.PathLike[str]) -> bytes:
    """Read a 32-byte swarm key from a libp2p-style PSK file (or a bare 64-hex-digit line)."""
    file = Path(path)
    try:
        text = file.read_bytes()[: MAX_KEY_FILE_BYTES + 1].decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read swarm key file {file}: {exc}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0] == SWARM_KEY_HEADER:
        if len(lines) != 3 or lines[1] != "/base16/":
            raise ConfigError(f"swarm key file {file}: expected {SWARM_KEY_HEADER}, /base16/, then the key")
        lines = lines[2:]
    if len(lines) != 1:
        raise ConfigError(f"swarm key file {file}: expected one line of 64 hex digits")
    try:
        key = bytes.fromhex(lines[0])
    except ValueError:
        raise ConfigError(f"swarm key file {file}: the key is not hex") from None
    if len(key) != 32:
        raise ConfigError(f"swarm key file {file}: the key must be 32 bytes (64 hex digits)")
    return key


def write_swarm_key(path: str | os.PathLike[str]) -> bytes:
    """Create a new random swarm key file (mode 0600) and return the key."""
    key = secrets.token_bytes(32)
    file = Path(path)
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"refusing to overwrite existing swarm key file {file}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{SWARM_KEY_HEADER}\n/base16/\n{key.hex()}\n")
    return key
