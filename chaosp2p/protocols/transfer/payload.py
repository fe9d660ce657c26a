"""What a transfer header announces: the raw payload that follows it on the same stream.

Bulk bytes never go through msgpack. A source's reply is a header message plus an
:class:`OutgoingPayload` (a read-only slice of the snapshot, written right after the header with no
copy); on the newcomer a :class:`PayloadSlot` tells the driver where those bytes go: straight into
the staging buffer (``DATA``), into a scratch buffer (``MANIFEST``), or nowhere (``DISCARD``: bytes
of a request the newcomer no longer wants, read and thrown away so the stream stays in step).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.protocols.base import Outgoing
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class OutgoingPayload(Outgoing):
    """A header message followed, on the same stream, by ``payload`` as raw bytes (zero-copy)."""

    payload: memoryview


class PayloadKind(enum.Enum):
    """What the raw bytes announced by a header are."""

    MANIFEST = "manifest"
    DATA = "data"
    DISCARD = "discard"
    """Bytes of a request that lost an end-game race: read them and drop them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadSlot:
    """Where the next ``length`` raw bytes from ``source`` go.

    ``DATA``: bytes ``offset .. offset+length`` of the staging buffer. ``MANIFEST``: a scratch
    buffer of ``length`` bytes (``offset`` is 0). ``DISCARD``: read ``length`` bytes and drop them
    (``offset`` is where they would have gone); report them with ``payload_received`` as usual.
    """

    source: PeerID
    request_id: int
    kind: PayloadKind
    offset: int
    length: int
