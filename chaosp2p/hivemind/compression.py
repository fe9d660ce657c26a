"""The two hivemind compression settings chaosp2p's averaging can honour.

``hivemind.compression.NoCompression()`` averages float32 and ``Float16Compression()`` sends float16
on the wire (accumulation stays float32), which are chaosp2p's ``wire_dtype`` values ``float32`` and
``float16``. hivemind's other codecs (scaled float16, 8-bit quantisation, per-tensor or size-adaptive
mixes) are refused by :class:`chaosp2p.hivemind.Optimizer` with an error naming them.
"""

from __future__ import annotations


class CompressionBase:
    """Base of the compression settings (a marker: chaosp2p compresses inside its averager)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoCompression(CompressionBase):
    """Average in float32 (hivemind's default)."""


class Float16Compression(CompressionBase):
    """Send averages as float16 (accumulation stays float32)."""


__all__ = ["CompressionBase", "Float16Compression", "NoCompression"]
