"""SourceSession: every request validated against the snapshot; zero-copy payloads; leases."""

from __future__ import annotations

import gc
import hashlib
import weakref

import numpy as np
import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer import OutgoingPayload, RequestQueue, SkippedRequest, SourceSession
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import (
    CancelRequest,
    DataHeader,
    ErrorReply,
    GetChunks,
    GetManifest,
    GetRange,
    GetVersions,
    ManifestReply,
    ReleaseLease,
    TransferErrorCode,
    VersionsReply,
    decode_manifest,
    manifest_digest,
)
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.wire.identity import Identity, PeerID

CONFIG = TransferConfig(chunk_bytes=1024, lease_ttl_s=10.0, max_leases=3, max_leases_per_peer=2, request_timeout_s=1.0)
A = Identity.from_seed(b"a" * 32).peer_id
B = Identity.from_seed(b"b" * 32).peer_id


def store_with(step: int = 1) -> SnapshotStore:
    store = SnapshotStore(CONFIG, keep_latest=1)
    store.publish("r", step, {"w": np.arange(1000, dtype=np.float32), "b": np.ones(7, dtype=np.int64)})
    return store


def only(replies: list[Outgoing]) -> Outgoing:
    assert len(replies) == 1
    return replies[0]


def open_lease(session: SourceSession, who: PeerID = A, now: float = 0.0, step: int = 1) -> int:
    reply = only(session.respond(now, who, GetManifest(request_id=1, run="r", step=step, include_manifest=False)))
    assert isinstance(reply.message, ManifestReply), reply.message
    return reply.message.lease_id


def error_code(reply: Outgoing) -> TransferErrorCode:
    assert isinstance(reply.message, ErrorReply), reply.message
    return reply.message.code


def test_versions_and_unknown_run() -> None:
    session = SourceSession(store_with(), CONFIG)
    reply = only(session.respond(0.0, A, GetVersions(request_id=9, run="r")))
    assert isinstance(reply.message, VersionsReply) and reply.to == A
    assert [v.step for v in reply.message.versions] == [1]
    assert (
        error_code(only(session.respond(0.0, A, GetVersions(request_id=9, run="nope"))))
        is TransferErrorCode.UNKNOWN_RUN
    )


def test_manifest_reply_is_a_header_plus_the_body_as_raw_payload() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    reply = only(session.respond(0.0, A, GetManifest(request_id=1, run="r", step=1)))
    assert isinstance(reply, OutgoingPayload) and isinstance(reply.message, ManifestReply)
    body = bytes(reply.payload)
    assert reply.message.manifest_bytes == len(body)
    assert manifest_digest(body) == reply.message.digest == hashlib.sha256(body).digest()
    manifest = decode_manifest(body, max_bytes=1 << 20)
    assert manifest == store.latest("r").manifest  # type: ignore[union-attr]
    assert session.statistics().leases_active == 1


def test_unknown_version_and_unknown_run_on_open() -> None:
    session = SourceSession(store_with(), CONFIG)
    reply = only(session.respond(0.0, A, GetManifest(request_id=1, run="r", step=2)))
    assert error_code(reply) is TransferErrorCode.UNKNOWN_VERSION
    reply = only(session.respond(0.0, A, GetManifest(request_id=1, run="x", step=1)))
    assert error_code(reply) is TransferErrorCode.UNKNOWN_RUN


def test_chunk_payload_is_a_zero_copy_slice_of_the_snapshot() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    lease = open_lease(session)
    reply = only(
        session.respond(0.0, A, GetChunks(request_id=2, run="r", step=1, lease_id=lease, first_chunk=1, chunk_count=2))
    )
    assert isinstance(reply, OutgoingPayload)
    assert reply.message == DataHeader(request_id=2, offset=1024, length=2048)
    assert reply.payload.readonly and len(reply.payload) == 2048
    pinned = store.lease("r", 1)
    assert pinned is not None
    # same memory, not a copy
    assert np.shares_memory(np.frombuffer(reply.payload, dtype=np.uint8), np.frombuffer(pinned.data, dtype=np.uint8))
    assert bytes(reply.payload) == bytes(pinned.data[1024:3072])
    last = only(
        session.respond(0.0, A, GetChunks(request_id=3, run="r", step=1, lease_id=lease, first_chunk=3, chunk_count=1))
    )
    assert isinstance(last.message, DataHeader) and last.message.length == pinned.manifest.total_bytes - 3072
    ranged = only(session.respond(0.0, A, GetRange(request_id=4, run="r", step=1, lease_id=lease, offset=5, length=10)))
    assert isinstance(ranged, OutgoingPayload) and bytes(ranged.payload) == bytes(pinned.data[5:15])
    assert session.statistics().bytes_served == 2048 + len(last.payload) + 10  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (
            GetChunks(request_id=2, run="r", step=1, lease_id=999, first_chunk=0, chunk_count=1),
            TransferErrorCode.NO_LEASE,
        ),
        (
            GetChunks(request_id=2, run="r", step=2, lease_id=1, first_chunk=0, chunk_count=1),
            TransferErrorCode.BAD_REQUEST,
        ),
        (
            GetChunks(request_id=2, run="q", step=1, lease_id=1, first_chunk=0, chunk_count=1),
            TransferErrorCode.BAD_REQUEST,
        ),
        (
            GetChunks(request_id=2, run="r", step=1, lease_id=1, first_chunk=4, chunk_count=1),
            TransferErrorCode.OUT_OF_RANGE,
        ),
        (
            GetChunks(request_id=2, run="r", step=1, lease_id=1, first_chunk=2, chunk_count=3),
            TransferErrorCode.OUT_OF_RANGE,
        ),
        (
            GetChunks(request_id=2, run="r", step=1, lease_id=1, first_chunk=0, chunk_count=2**64 - 1),
            TransferErrorCode.OUT_OF_RANGE,
        ),
        (GetRange(request_id=2, run="r", step=1, lease_id=1, offset=4000, length=1000), TransferErrorCode.OUT_OF_RANGE),
        (
            GetRange(request_id=2, run="r", step=1, lease_id=1, offset=2**64 - 1, length=1),
            TransferErrorCode.OUT_OF_RANGE,
        ),
    ],
)
def test_bad_requests_get_error_codes(request_: GetChunks | GetRange, code: TransferErrorCode) -> None:
    session = SourceSession(store_with(), CONFIG)
    assert open_lease(session) == 1
    reply = only(session.respond(0.0, A, request_))
    assert error_code(reply) is code
    assert reply.message.request_id == 2  # type: ignore[attr-defined]


def test_leases_belong_to_their_requester() -> None:
    session = SourceSession(store_with(), CONFIG)
    lease = open_lease(session, A)
    stolen = only(
        session.respond(0.0, B, GetChunks(request_id=2, run="r", step=1, lease_id=lease, first_chunk=0, chunk_count=1))
    )
    assert error_code(stolen) is TransferErrorCode.NO_LEASE
    renew = only(
        session.respond(0.0, B, GetManifest(request_id=3, run="r", step=1, include_manifest=False, lease_id=lease))
    )
    assert error_code(renew) is TransferErrorCode.NO_LEASE


def test_requests_larger_than_max_request_bytes_are_refused() -> None:
    config = TransferConfig(chunk_bytes=1024, max_chunk_bytes=1024, max_request_bytes=2048)
    store = SnapshotStore(config)
    store.publish("r", 1, {"w": np.zeros(4096, dtype=np.uint8)})
    session = SourceSession(store, config)
    lease = open_lease(session)
    reply = only(
        session.respond(0.0, A, GetChunks(request_id=2, run="r", step=1, lease_id=lease, first_chunk=0, chunk_count=3))
    )
    assert error_code(reply) is TransferErrorCode.BAD_REQUEST


def test_busy_beyond_lease_limits() -> None:
    session = SourceSession(store_with(), CONFIG)
    open_lease(session, A)
    open_lease(session, A)
    assert (
        error_code(only(session.respond(0.0, A, GetManifest(request_id=1, run="r", step=1)))) is TransferErrorCode.BUSY
    )
    open_lease(session, B)
    assert (
        error_code(only(session.respond(0.0, B, GetManifest(request_id=1, run="r", step=1)))) is TransferErrorCode.BUSY
    )


def test_leases_expire_unless_renewed_and_release_frees_retired_memory() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    lease = open_lease(session, A, now=0.0)
    assert session.next_deadline() == 10.0
    only(
        session.respond(8.0, A, GetChunks(request_id=2, run="r", step=1, lease_id=lease, first_chunk=0, chunk_count=1))
    )
    assert session.next_deadline() == 18.0
    session.handle_timeout(17.9)
    assert session.statistics().leases_active == 1
    store.publish("r", 2, {"w": np.zeros(3, dtype=np.float32)})  # retires step 1, still pinned
    assert [s.step for s in store.statistics()] == [1, 2]
    session.handle_timeout(18.0)
    assert session.statistics().leases_active == 0 and session.next_deadline() is None
    assert [s.step for s in store.statistics()] == [2]
    reply = only(
        session.respond(19.0, A, GetChunks(request_id=3, run="r", step=1, lease_id=lease, first_chunk=0, chunk_count=1))
    )
    assert error_code(reply) is TransferErrorCode.NO_LEASE


def test_release_and_unreachable_drop_leases() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    lease = open_lease(session, A)
    open_lease(session, B)
    assert session.respond(0.0, A, ReleaseLease(lease_id=lease)) == []
    assert session.respond(0.0, A, ReleaseLease(lease_id=12345)) == []  # unknown: ignored
    session.peer_unreachable(0.0, B)
    assert session.statistics().leases_active == 0
    assert store.statistics()[0].pins == 0


def test_payload_keeps_memory_alive_after_the_lease_is_gone() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    lease = open_lease(session)
    reply = only(
        session.respond(0.0, A, GetChunks(request_id=2, run="r", step=1, lease_id=lease, first_chunk=0, chunk_count=1))
    )
    assert isinstance(reply, OutgoingPayload)
    expected = bytes(reply.payload)
    store.retire("r")
    session.close()
    gc.collect()
    assert store.bytes_held == 0
    assert bytes(reply.payload) == expected  # the driver may still be sending it


def test_replies_are_refused_as_requests() -> None:
    session = SourceSession(store_with(), CONFIG)
    with pytest.raises(RemoteProtocolError):
        session.respond(0.0, A, DataHeader(request_id=1, offset=0, length=1))


def test_message_machine_interface_queues_replies() -> None:
    session = SourceSession(store_with(), CONFIG)
    session.receive(0.0, A, "transfer", GetVersions(request_id=1, run="r"))
    session.receive(0.0, A, "other", GetVersions(request_id=2, run="r"))
    out = session.take_outgoing()
    assert [o.message.request_id for o in out] == [1]  # type: ignore[attr-defined]
    assert session.take_outgoing() == []


def test_released_snapshot_buffer_is_freed() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    lease = open_lease(session)
    pinned = store.lease("r", 1)
    assert pinned is not None
    ref = weakref.ref(pinned.data.obj.base)  # the snapshot buffer behind this lease's exporter
    pinned.release()
    del pinned
    store.retire("r")
    gc.collect()
    assert ref() is not None  # the session's lease still holds it
    session.respond(0.0, A, ReleaseLease(lease_id=lease))
    gc.collect()
    assert ref() is None and store.bytes_held == 0


def test_queued_requests_can_be_cancelled_until_they_are_taken() -> None:
    store = store_with()
    session = SourceSession(store, CONFIG)
    lease = open_lease(session)
    queue = RequestQueue(limit=3)
    for request_id in (10, 11, 12):
        queue.push(GetChunks(request_id=request_id, run="r", step=1, lease_id=lease, first_chunk=0, chunk_count=1))
    assert queue.full
    with pytest.raises(RemoteProtocolError):
        queue.push(GetVersions(request_id=13, run="r"))
    first = queue.pop()
    queue.push(CancelRequest(request_id=10))  # already taken: too late, nothing changes
    queue.push(CancelRequest(request_id=11))
    queue.push(CancelRequest(request_id=99))  # unknown ids are ignored, not queued
    assert len(queue) == 2
    answers = [session.respond(0.0, A, item) for item in (first, queue.pop(), queue.pop())]
    assert isinstance(answers[0][0].message, DataHeader) and answers[0][0].message.request_id == 10
    skipped = answers[1][0].message
    assert isinstance(skipped, ErrorReply) and skipped.request_id == 11 and skipped.code is TransferErrorCode.CANCELLED
    assert isinstance(answers[2][0].message, DataHeader) and answers[2][0].message.request_id == 12
    assert queue.pop() is None
    # a cancel that reaches the session in order has nothing left to cancel
    assert session.respond(0.0, A, CancelRequest(request_id=12)) == []
    assert session.respond(0.0, A, SkippedRequest(request_id=5))[0].message.code is TransferErrorCode.CANCELLED  # type: ignore[attr-defined]
