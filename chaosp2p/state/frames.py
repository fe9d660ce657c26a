"""Transfer control frames on a stream, decoded with the transfer protocol's own tight limits.

A transport frame may be up to ``max_frame_bytes`` (1 MiB) and the generic decoder lets a frame's
containers be that large. No transfer control message comes close (a full version list is about
6 KiB), so transfer streams read their frames here instead: the length prefix is checked against
:data:`~chaosp2p.protocols.transfer.messages.WIRE_MAX_FRAME_BYTES` before the body is read, and the
body is decoded by :func:`~chaosp2p.protocols.transfer.messages.decode_message`, which refuses an
oversized count from its msgpack header before anything is built.
"""

from __future__ import annotations

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.transfer.messages import WIRE_MAX_FRAME_BYTES, decode_message
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.framing import LENGTH_PREFIX
from chaosp2p.wire.messages import Message


async def receive_transfer_message(stream: Stream) -> Message | None:
    """Read one transfer message; ``None`` at a clean end of stream before it."""
    first = await stream.receive_some(LENGTH_PREFIX.size)
    if not first:
        return None
    header = bytearray(LENGTH_PREFIX.size)
    header[: len(first)] = first
    if len(first) < LENGTH_PREFIX.size:
        await stream.receive_into(memoryview(header)[len(first) :])
    (length,) = LENGTH_PREFIX.unpack(header)
    if not 1 <= length <= WIRE_MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"transfer frame of {length} bytes outside 1..{WIRE_MAX_FRAME_BYTES}")
    body = await stream.receive_exactly(length)
    return decode_message(body)
