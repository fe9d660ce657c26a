"""Source side of ``/chaos/transfer/1``: answer newcomers' requests from a snapshot catalog.

Theory of operation
-------------------
A :class:`SourceSession` serves immutable snapshots of a :class:`SnapshotCatalog` to every
newcomer. Each request is checked against the snapshot it names -- run known, version known, lease
held by this requester, byte range inside the snapshot and within ``max_request_bytes`` -- and
answered with a header message, plus for data and manifests an :class:`OutgoingPayload` whose
``payload`` is a read-only ``memoryview`` slice of the snapshot itself: the driver writes the header
frame, then those bytes, with no copy. A lease pins the snapshot (the catalog keeps its memory
alive) until the newcomer releases it, stops renewing it for ``lease_ttl_s``, or becomes
unreachable.

Requests on one stream are answered in the order they arrive. A stream's driver reads them ahead
into a :class:`RequestQueue` (at most ``max_queued_requests``), so a ``CancelRequest`` can still
reach a request nobody has started to answer: that request is then answered with
``ErrorReply(CANCELLED)`` in its place instead of its bytes (the end game of a pull re-requests
slow chunks elsewhere and cancels the loser).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import (
    PROTOCOL,
    WIRE_MAX_VERSIONS,
    CancelRequest,
    DataHeader,
    ErrorReply,
    GetChunks,
    GetManifest,
    GetRange,
    GetVersions,
    Manifest,
    ManifestReply,
    ReleaseLease,
    TransferErrorCode,
    VersionInfo,
    VersionsReply,
)
from chaosp2p.protocols.transfer.payload import OutgoingPayload
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class PinnedSnapshot(Protocol):
    """A snapshot held in memory for as long as this pin is not released."""

    @property
    def manifest(self) -> Manifest:
        """The snapshot's manifest."""
        ...

    @property
    def manifest_body(self) -> bytes:
        """The encoded manifest (what the digest is computed over)."""
        ...

    @property
    def digest(self) -> bytes:
        """Hash of ``manifest_body`` with the manifest's hash algorithm."""
        ...

    @property
    def data(self) -> memoryview:
        """The snapshot's bytes, read-only, ``manifest.total_bytes`` long."""
        ...

    def release(self) -> None:
        """Drop this pin (idempotent)."""
        ...


class SnapshotCatalog(Protocol):
    """What a source serves (``chaosp2p.state.SnapshotStore`` implements it)."""

    def versions(self, run: str) -> Sequence[VersionInfo] | None:
        """Snapshots of ``run`` newest first, or ``None`` if the run is unknown."""
        ...

    def pin(self, run: str, step: int) -> PinnedSnapshot | None:
        """Pin snapshot (run, step), or ``None`` if it is not (or no longer) offered."""
        ...


@dataclass(slots=True)
class _Lease:
    peer: PeerID
    lease_id: int
    run: str
    step: int
    pin: PinnedSnapshot
    expires_at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceStatistics:
    """Counters of a :class:`SourceSession`."""

    leases_active: int
    leases_granted: int
    requests: int
    errors: int
    bytes_served: int


class SourceSession:
    """Serves snapshots of a :class:`SnapshotCatalog` to newcomers (see the module docstring)."""

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(self, catalog: SnapshotCatalog, config: TransferConfig) -> None:
        self.catalog = catalog
        self.config = config
        self._leases: dict[tuple[PeerID, int], _Lease] = {}
        self._next_lease = 1
        self._outgoing: list[Outgoing] = []
        self._granted = 0
        self._requests = 0
        self._errors = 0
        self._bytes_served = 0

    # ----------------------------------------------------------------------------- driver API
    def respond(self, now: float, sender: PeerID, message: Message | SkippedRequest) -> list[Outgoing]:
        """Answer one request; the returned items go back to ``sender`` in order, on the same stream.

        Raises :class:`RemoteProtocolError` if ``message`` is not a request (close the stream).
        """
        self._requests += 1
        handler = _RESPONDERS.get(type(message))
        if handler is None:
            raise RemoteProtocolError(f"{PROTOCOL}: a source does not accept {type(message).__name__}")
        return handler(self, now, sender, message)

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """:class:`MessageMachine` form of :meth:`respond` (replies are queued for ``take_outgoing``)."""
        if protocol == PROTOCOL:
            self._outgoing.extend(self.respond(now, sender, message))

    def take_outgoing(self) -> list[Outgoing]:
        """Remove and return queued replies."""
        out, self._outgoing = self._outgoing, []
        return out

    def next_deadline(self) -> float | None:
        """When the earliest lease expires."""
        return min((lease.expires_at for lease in self._leases.values()), default=None)

    def handle_timeout(self, now: float) -> None:
        """Expire leases nobody renewed."""
        for key, lease in list(self._leases.items()):
            if lease.expires_at <= now:
                del self._leases[key]
                lease.pin.release()

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """Release every lease ``peer`` held."""
        for key, lease in list(self._leases.items()):
            if key[0] == peer:
                del self._leases[key]
                lease.pin.release()

    def close(self) -> None:
        """Release every lease (the catalog may then free retired snapshots)."""
        for lease in self._leases.values():
            lease.pin.release()
        self._leases.clear()

    def statistics(self) -> SourceStatistics:
        """Counters since creation."""
        return SourceStatistics(
            leases_active=len(self._leases),
            leases_granted=self._granted,
            requests=self._requests,
            errors=self._errors,
            bytes_served=self._bytes_served,
        )

    # ------------------------------------------------------------------------------ requests
    def _error(self, sender: PeerID, request_id: int, code: TransferErrorCode, detail: str) -> Outgoing:
        self._errors += 1
        return Outgoing(
            to=sender, protocol=PROTOCOL, message=ErrorReply(request_id=request_id, code=code, detail=detail)
        )

    def _on_skipped(self, now: float, sender: PeerID, msg: SkippedRequest) -> list[Outgoing]:
        return [self._error(sender, msg.request_id, TransferErrorCode.CANCELLED, "cancelled")]

    def _on_cancel(self, now: float, sender: PeerID, msg: CancelRequest) -> list[Outgoing]:
        return []  # it reached us in order: what it names is answered already

    def _on_release(self, now: float, sender: PeerID, msg: ReleaseLease) -> list[Outgoing]:
        lease = self._leases.pop((sender, msg.lease_id), None)
        if lease is not None:
            lease.pin.release()
        return []

    def _on_versions(self, now: float, sender: PeerID, msg: GetVersions) -> list[Outgoing]:
        versions = self.catalog.versions(msg.run)
        if versions is None:
            return [self._error(sender, msg.request_id, TransferErrorCode.UNKNOWN_RUN, f"no run {msg.run!r}")]
        reply = VersionsReply(request_id=msg.request_id, run=msg.run, versions=tuple(versions)[:WIRE_MAX_VERSIONS])
        return [Outgoing(to=sender, protocol=PROTOCOL, message=reply)]

    def _on_manifest(self, now: float, sender: PeerID, msg: GetManifest) -> list[Outgoing]:
        return [self._manifest(now, sender, msg)]

    def _manifest(self, now: float, sender: PeerID, msg: GetManifest) -> Outgoing:
        if msg.lease_id is not None:
            lease = self._leases.get((sender, msg.lease_id))
            if lease is None:
                return self._error(sender, msg.request_id, TransferErrorCode.NO_LEASE, "no such lease")
            if (lease.run, lease.step) != (msg.run, msg.step):
                return self._error(
                    sender, msg.request_id, TransferErrorCode.BAD_REQUEST, "lease is for another snapshot"
                )
        else:
            held = sum(1 for key in self._leases if key[0] == sender)
            if len(self._leases) >= self.config.max_leases or held >= self.config.max_leases_per_peer:
                return self._error(sender, msg.request_id, TransferErrorCode.BUSY, "too many leases")
            pin = self.catalog.pin(msg.run, msg.step)
            if pin is None:
                if self.catalog.versions(msg.run) is None:
                    return self._error(sender, msg.request_id, TransferErrorCode.UNKNOWN_RUN, "unknown run")
                return self._error(
                    sender, msg.request_id, TransferErrorCode.UNKNOWN_VERSION, f"step {msg.step} not held"
                )
            lease = _Lease(sender, self._next_lease, msg.run, msg.step, pin, now)
            self._next_lease += 1
            self._granted += 1
            self._leases[(sender, lease.lease_id)] = lease
        lease.expires_at = now + self.config.lease_ttl_s
        pin = lease.pin
        body = pin.manifest_body if msg.include_manifest else b""
        reply = ManifestReply(
            request_id=msg.request_id,
            lease_id=lease.lease_id,
            lease_ttl_s=self.config.lease_ttl_s,
            hash_algorithm=pin.manifest.hash_algorithm,
            digest=pin.digest,
            manifest_bytes=len(body),
        )
        if body:
            return OutgoingPayload(to=sender, protocol=PROTOCOL, message=reply, payload=memoryview(body))
        return Outgoing(to=sender, protocol=PROTOCOL, message=reply)

    def _on_chunks(self, now: float, sender: PeerID, msg: GetChunks) -> list[Outgoing]:
        return [self._data(now, sender, msg, _chunk_span)]

    def _on_range(self, now: float, sender: PeerID, msg: GetRange) -> list[Outgoing]:
        return [self._data(now, sender, msg, _byte_span)]

    def _data(self, now: float, sender: PeerID, msg: GetChunks | GetRange, span: _Span) -> Outgoing:
        lease = self._leases.get((sender, msg.lease_id))
        if lease is None:
            return self._error(sender, msg.request_id, TransferErrorCode.NO_LEASE, "no such lease")
        if (lease.run, lease.step) != (msg.run, msg.step):
            return self._error(sender, msg.request_id, TransferErrorCode.BAD_REQUEST, "lease is for another snapshot")
        bounds = span(lease.pin.manifest, msg)
        if isinstance(bounds, str):
            return self._error(sender, msg.request_id, TransferErrorCode.OUT_OF_RANGE, bounds)
        offset, end = bounds
        length = end - offset
        if length > self.config.max_request_bytes:
            return self._error(
                sender,
                msg.request_id,
                TransferErrorCode.BAD_REQUEST,
                f"{length} bytes exceed max_request_bytes={self.config.max_request_bytes}",
            )
        lease.expires_at = now + self.config.lease_ttl_s
        self._bytes_served += length
        header = DataHeader(request_id=msg.request_id, offset=offset, length=length)
        return OutgoingPayload(to=sender, protocol=PROTOCOL, message=header, payload=lease.pin.data[offset:end])


_Span = Callable[[Manifest, Any], tuple[int, int] | str]
"""The bytes ``[offset, end)`` of the snapshot a data request names, or why it names bytes outside it."""


def _chunk_span(manifest: Manifest, msg: GetChunks) -> tuple[int, int] | str:
    count = manifest.chunk_count
    if msg.first_chunk >= count or msg.chunk_count > count - msg.first_chunk:
        return f"snapshot has {count} chunks"
    offset = msg.first_chunk * manifest.chunk_bytes
    return offset, min((msg.first_chunk + msg.chunk_count) * manifest.chunk_bytes, manifest.total_bytes)


def _byte_span(manifest: Manifest, msg: GetRange) -> tuple[int, int] | str:
    end = msg.offset + msg.length
    if end > manifest.total_bytes:
        return f"snapshot has {manifest.total_bytes} bytes"
    return msg.offset, end


@dataclass(frozen=True, slots=True, kw_only=True)
class SkippedRequest:
    """A queued request the newcomer cancelled: answer ``ErrorReply(CANCELLED)`` in its place."""

    request_id: int


class RequestQueue:
    """Requests read ahead on one stream, answered in order; cancellable until they are taken."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[Message | SkippedRequest] = deque()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        """Stop reading the stream until an item is taken (back-pressure on the newcomer)."""
        return len(self._items) >= self.limit

    def push(self, message: Message) -> None:
        """Queue a request; a ``CancelRequest`` instead replaces the queued request it names."""
        if isinstance(message, CancelRequest):
            for i, item in enumerate(self._items):
                if isinstance(item, (GetChunks, GetRange)) and item.request_id == message.request_id:
                    self._items[i] = SkippedRequest(request_id=item.request_id)
                    return
            return  # too late (already answered or being answered), or unknown: nothing to do
        if self.full:
            raise RemoteProtocolError(f"{PROTOCOL}: more than {self.limit} requests queued on one stream")
        self._items.append(message)

    def pop(self) -> Message | SkippedRequest | None:
        """The next request to answer, or ``None``."""
        return self._items.popleft() if self._items else None


_RESPONDERS: dict[type, Callable[[SourceSession, float, PeerID, Any], list[Outgoing]]] = {
    SkippedRequest: SourceSession._on_skipped,
    CancelRequest: SourceSession._on_cancel,
    GetVersions: SourceSession._on_versions,
    GetManifest: SourceSession._on_manifest,
    GetChunks: SourceSession._on_chunks,
    GetRange: SourceSession._on_range,
    ReleaseLease: SourceSession._on_release,
}
"""How a source answers each request (anything else is a protocol violation: close the stream)."""
