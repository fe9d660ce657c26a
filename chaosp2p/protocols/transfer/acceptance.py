"""What a newcomer accepts from a source before it allocates anything for it.

Two things a source says decide what the newcomer will spend memory on: its version list (the
sizes of the snapshots it offers) and, for the chosen snapshot, the manifest body. A version is
usable only if its chunk hash is installed, its digest has the snapshot-digest size and its sizes
are within this newcomer's limits; versions that are not usable are ignored (not counted in the
vote). A manifest body is accepted only if it hashes to the chosen digest, decodes within the
configured limits (counts checked as it is decoded) and agrees with the version it was chosen as.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import (
    DIGEST_BYTES,
    MANIFEST_DIGEST_BYTES,
    Manifest,
    VersionInfo,
    check_manifest,
    decode_manifest,
    hash_function,
    manifest_digest,
)


def hash_available(algorithm: str) -> bool:
    """Known and installed (``blake3`` is optional): versions we cannot verify are ignored."""
    if algorithm not in DIGEST_BYTES:
        return False
    try:
        hash_function(algorithm)
    except ConfigError:
        return False
    return True


def usable_versions(versions: Sequence[VersionInfo], config: TransferConfig) -> list[VersionInfo]:
    """The versions a newcomer with ``config`` can pull at all."""
    return [
        info
        for info in versions
        if hash_available(info.hash_algorithm)
        and len(info.digest) == MANIFEST_DIGEST_BYTES
        and info.total_bytes <= config.max_state_bytes
        and 1 <= info.chunk_bytes <= config.max_chunk_bytes
    ]


class ManifestDigestMismatch(RemoteProtocolError):
    """The body does not hash to the digest the source advertised (corrupt, or a lie)."""


def accept_manifest(body: bytes | memoryview, *, run: str, chosen: VersionInfo, config: TransferConfig) -> Manifest:
    """The manifest in ``body`` if it is the chosen snapshot's; :class:`RemoteProtocolError` otherwise."""
    if manifest_digest(body) != chosen.digest:
        raise ManifestDigestMismatch("manifest does not match its digest")
    manifest = decode_manifest(body, max_bytes=config.max_manifest_bytes, limits=config)
    check_manifest(manifest, config)
    if (manifest.run, manifest.step) != (run, chosen.step):
        raise RemoteProtocolError("manifest is for another snapshot")
    if (
        manifest.hash_algorithm != chosen.hash_algorithm
        or manifest.total_bytes != chosen.total_bytes
        or manifest.chunk_bytes != chosen.chunk_bytes
    ):
        raise RemoteProtocolError("manifest disagrees with the advertised version")
    return manifest
