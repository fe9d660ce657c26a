"""``hivemind.dht.crypto.RSASignatureValidator``: owner-protected DHT entries, signed with Ed25519.

hivemind protects an entry whose key or subkey contains ``[owner:<public key>]``: only a value
signed by that key is accepted, so only the owner can write it. The drop-in keeps the scheme and
the markers and signs with chaosp2p's own primitive, an Ed25519 :class:`~chaosp2p.wire.identity.Identity`
(hivemind: RSA). The owner's public key in the marker is its libp2p-style id (``12D3KooW...``),
which embeds the Ed25519 public key, and the signature (base64) covers the key id, subkey, value
and expiration. As in hivemind, the key is process-wide unless one is passed, so every validator
of a process, and every entry it writes, has the same owner.

This is on top of chaosp2p's own record signing: a writer's entries travel in a record only that
writer can sign (``/pk/<peer id>/...``), so nobody can remove or replace another writer's entries;
this validator also stops a writer from entering a value under someone else's owner marker.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import threading

from chaosp2p.errors import ConfigError
from chaosp2p.hivemind.dht.validation import DHTRecord, RecordValidatorBase
from chaosp2p.hivemind.utils.serializer import MSGPackSerializer
from chaosp2p.wire.identity import Identity, PeerID

_process_lock = threading.Lock()
_process_identity: Identity | None = None


def process_wide_identity() -> Identity:
    """The signing key every validator of this process uses unless given one (created once)."""
    global _process_identity
    with _process_lock:
        if _process_identity is None:
            _process_identity = Identity.generate()
        return _process_identity


class RSASignatureValidator(RecordValidatorBase):
    """Protect ``[owner:...]`` entries: only their owner's signature is accepted (see the module docstring)."""

    PUBLIC_KEY_FORMAT = b"[owner:_key_]"
    SIGNATURE_FORMAT = b"[signature:_value_]"
    PUBLIC_KEY_REGEX = re.escape(PUBLIC_KEY_FORMAT).replace(b"_key_", rb"(.+?)")
    _PUBLIC_KEY_RE = re.compile(PUBLIC_KEY_REGEX)
    _SIGNATURE_RE = re.compile(re.escape(SIGNATURE_FORMAT).replace(b"_value_", rb"(.+?)"))

    def __init__(self, private_key: Identity | None = None) -> None:
        if private_key is not None and not isinstance(private_key, Identity):
            raise ConfigError("RSASignatureValidator(private_key=) takes a chaosp2p Identity (Ed25519) here")
        self._identity = private_key or process_wide_identity()
        owner = str(self._identity.peer_id).encode()
        self._local_public_key = self.PUBLIC_KEY_FORMAT.replace(b"_key_", owner)

    @property
    def local_public_key(self) -> bytes:
        """This process's owner marker, ``b"[owner:12D3KooW...]"``: put it in a key or subkey to protect it."""
        return self._local_public_key

    def validate(self, record: DHTRecord) -> bool:
        """An entry without an owner marker passes; one with a marker needs its owner's signature."""
        owners = self._PUBLIC_KEY_RE.findall(record.key) + self._PUBLIC_KEY_RE.findall(record.subkey)
        if not owners:
            return True
        if len(set(owners)) > 1:
            return False  # key and subkey name different owners
        try:
            owner = PeerID.parse(owners[0].decode())
        except (ConfigError, UnicodeDecodeError):
            return False
        signatures = self._SIGNATURE_RE.findall(record.value)
        if len(signatures) != 1:
            return False
        try:
            signature = base64.b64decode(signatures[0], validate=True)
        except (binascii.Error, ValueError):
            return False
        stripped = dataclasses.replace(record, value=self.strip_value(record))
        return owner.verify(signature, self._payload(stripped))

    def sign_value(self, record: DHTRecord) -> bytes:
        """Append this owner's signature when the key or subkey carries its marker."""
        if self._local_public_key not in record.key and self._local_public_key not in record.subkey:
            return record.value
        signature = base64.b64encode(self._identity.sign(self._payload(record)))
        return record.value + self.SIGNATURE_FORMAT.replace(b"_value_", signature)

    def strip_value(self, record: DHTRecord) -> bytes:
        """The value without its signature."""
        return self._SIGNATURE_RE.sub(b"", record.value)

    @staticmethod
    def _payload(record: DHTRecord) -> bytes:
        return MSGPackSerializer.dumps([record.key, record.subkey, record.value, record.expiration_time])

    @property
    def priority(self) -> int:
        """Checked before validators that parse the value (as in hivemind)."""
        return 10

    def merge_with(self, other: RecordValidatorBase) -> bool:
        """One signature validator is enough: another instance merges into this one."""
        return isinstance(other, RSASignatureValidator)


__all__ = ["RSASignatureValidator", "process_wide_identity"]
