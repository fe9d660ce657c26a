"""Identifiers, distances and key namespaces of the DHT.

Every peer and every key maps to a 256-bit point of one XOR metric space: a peer's node id is
``sha256(peer_id.raw)``, a key's target is ``sha256(key)``. Ids travel as 32 big-endian bytes and
are handled here as Python ints so that ``a ^ b`` is the Kademlia distance.

Key namespaces (normative text in ``protocols/dht.md``):

* ``/pk/<peer-id>/<name>`` -- a *signed* key owned by ``<peer-id>`` (its canonical base58 text).
  Only records signed by that peer are accepted, and a stored one is only replaced by a newer
  version signed by it.
* ``/prov/<anything>`` is only a convention for provider keys (see :func:`state_provider_key`);
  provider records live in their own table, so any key works for them.
* any other key is *unsigned*: anyone may write it, the highest (version, value) wins.
"""

from __future__ import annotations

import functools
import hashlib

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID

ID_BITS = 256
ID_BYTES = ID_BITS // 8
SIGNED_PREFIX = b"/pk/"


def node_id(peer: PeerID) -> int:
    """The 256-bit DHT position of ``peer``."""
    return _node_id_of_raw(peer.raw)


@functools.lru_cache(maxsize=1 << 16)
def _node_id_of_raw(raw: bytes) -> int:
    # Cached on the raw bytes (whose hash CPython caches) rather than the PeerID dataclass, whose
    # hash is recomputed in Python on every call: this runs for every contact a lookup sees.
    return int.from_bytes(hashlib.sha256(raw).digest(), "big")


def key_id(key: bytes) -> int:
    """The 256-bit DHT position a key's records are stored around."""
    return int.from_bytes(hashlib.sha256(key).digest(), "big")


def id_to_bytes(value: int) -> bytes:
    """32-byte big-endian wire form of an id."""
    return value.to_bytes(ID_BYTES, "big")


def id_from_bytes(data: bytes) -> int:
    """Parse a 32-byte id (the caller checked the length)."""
    return int.from_bytes(data, "big")


def signed_key(owner: PeerID, name: bytes | str) -> bytes:
    """The key ``/pk/<owner>/<name>`` in ``owner``'s signed namespace."""
    raw_name = name.encode() if isinstance(name, str) else name
    return SIGNED_PREFIX + str(owner).encode("ascii") + b"/" + raw_name


class MalformedKey(ValueError):
    """A key that claims the signed namespace but does not name a valid owner."""


@functools.lru_cache(maxsize=1 << 12)
def key_owner(key: bytes) -> PeerID | None:
    """The owner of a signed key, or ``None`` for an unsigned key.

    Raises :class:`MalformedKey` for a key under ``/pk/`` whose owner part is not the canonical
    base58 text of a PeerID followed by ``/`` -- such keys can hold nothing. Cached: every stored,
    served and republished record asks, and the answer depends on the key alone.
    """
    if not key.startswith(SIGNED_PREFIX):
        return None
    end = key.find(b"/", len(SIGNED_PREFIX))
    if end < 0:
        raise MalformedKey("a /pk/ key needs /pk/<peer-id>/<name>")
    owner_text = key[len(SIGNED_PREFIX) : end]
    try:
        text = owner_text.decode("ascii")
        owner = PeerID.parse(text)
    except (UnicodeDecodeError, ConfigError):
        raise MalformedKey("the owner part of a /pk/ key is not a PeerID") from None
    if str(owner) != text:
        raise MalformedKey("the owner part of a /pk/ key is not in canonical form")
    return owner


def state_provider_key(run: str, version: int) -> bytes:
    """Provider key for "who holds state version ``version`` of training run ``run``"."""
    if "/" in run or not run:
        raise ConfigError("a run id is a non-empty string without '/'")
    if version < 0:
        raise ConfigError("a state version is >= 0")
    return f"/prov/state/{run}/{version}".encode()


def bucket_index(own: int, other: int) -> int:
    """Index of the k-bucket ``other`` belongs to: the position of the highest differing bit.

    Bucket ``i`` holds peers at XOR distance in ``[2**i, 2**(i+1))``; ``-1`` means ``other == own``.
    """
    return (own ^ other).bit_length() - 1
