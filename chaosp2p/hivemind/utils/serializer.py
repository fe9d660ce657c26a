"""``hivemind.utils.serializer.MSGPackSerializer``: msgpack that keeps tuples as tuples.

The drop-in's DHT values travel in this format, so a value comes back from ``dht.get`` with the
types it was stored with, as in hivemind (lists stay lists, tuples stay tuples, bytes stay bytes).
"""

from __future__ import annotations

from typing import Any

import msgpack

_TUPLE = 0x40  # hivemind's ext type code for tuples


class MSGPackSerializer:
    """hivemind's serializer: strict msgpack, ``bytes`` as bin, tuples as an ext type."""

    @classmethod
    def _encode(cls, obj: Any) -> Any:
        if isinstance(obj, tuple):
            return msgpack.ExtType(_TUPLE, cls.dumps(list(obj)))
        raise TypeError(f"cannot serialize {type(obj).__name__} for the DHT")

    @classmethod
    def _decode(cls, code: int, data: bytes) -> Any:
        if code == _TUPLE:
            return tuple(cls.loads(data))
        return msgpack.ExtType(code, data)

    @classmethod
    def dumps(cls, obj: object) -> bytes:
        """Serialize ``obj`` (msgpack types, plus tuples)."""
        packed: bytes = msgpack.packb(obj, use_bin_type=True, strict_types=True, default=cls._encode)
        return packed

    @classmethod
    def loads(cls, buf: bytes) -> Any:
        """The object ``dumps`` serialized."""
        return msgpack.unpackb(buf, raw=False, ext_hook=cls._decode)


__all__ = ["MSGPackSerializer"]
