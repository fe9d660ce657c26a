"""PullMachine + SourceSession end to end over a tiny in-test fake network with a virtual clock.

The fake network models what the real driver does: one serial link per source (bytes flow at the
link's rate, replies in request order), a header that arrives before its payload, payloads written
straight into the staging buffer and handed back to the machine, streams closed (and any payload in
progress aborted) when the machine drops a source. Faults are injected per source.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import ChecksumMismatch, ConfigError, LocalProtocolError, RemoteProtocolError, TransferError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.transfer import (
    Completed,
    DropReason,
    Failed,
    ManifestReady,
    OutgoingPayload,
    PayloadKind,
    PayloadSlot,
    PenaltyReason,
    Planned,
    PlanReason,
    PullMachine,
    PullState,
    RequestQueue,
    ResumeDiscarded,
    SkippedRequest,
    SourceDropped,
    SourceEstimate,
    SourcePenalised,
    SourceSession,
    TransferProgress,
)
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.protocols.transfer.messages import (
    DataHeader,
    ErrorReply,
    GetChunks,
    GetManifest,
    GetVersions,
    ManifestReply,
    TransferErrorCode,
)
from chaosp2p.state.buffers import StagingBuffer
from chaosp2p.state.resume import checkpoint, load_resume
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

RUN = "run-1"
CHUNK = 4096
CONFIG = TransferConfig(
    chunk_bytes=CHUNK,
    max_inflight_chunks_per_source=3,
    request_timeout_s=1.0,
    stall_timeout_s=2.0,
    check_interval_s=0.25,
    progress_interval_s=0.05,
    lease_ttl_s=30.0,
)


def peer(i: int) -> PeerID:
    return Identity.from_seed(bytes([i + 1]) * 32).peer_id


NEWCOMER = peer(99)


def make_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "layer0.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "layer0.bias": rng.standard_normal(96).astype(np.float32),
        "layer1.weight": rng.standard_normal((96, 200)).astype(np.float64),
        "optimizer.step": np.array(7, dtype=np.int64),
        "mask": rng.integers(0, 2, size=1000).astype(bool),
        "empty": np.zeros((0, 3), dtype=np.float16),
    }


@dataclass
class FakeSource:
    """One source peer: a store, a session, a link, and faults."""

    peer: PeerID
    store: SnapshotStore
    session: SourceSession
    rate: float
    latency: float = 0.01
    link_free_at: float = 0.0
    served: int = 0
    crash_after_bytes: int | None = None
    stall_after_bytes: int | None = None
    corrupt_chunks: set[int] = field(default_factory=set)
    extra_bytes: int = 0
    short_bytes: int = 0
    trailing_garbage_after_bytes: int | None = None
    corrupt_manifest: bool = False
    error_on_chunks: TransferErrorCode | None = None
    retire_before_open: bool = False
    slow_start_s: float = 0.0
    """Its first data payload ends this much later (the newcomer was slow to read it: its staging
    pages still faulting in, its CPU taken), its later ones stream at ``rate``."""
    dead: bool = False
    stalled: bool = False
    queue: RequestQueue = field(default_factory=lambda: RequestQueue(32))
    serving: bool = False
    data_requests: list[GetChunks] = field(default_factory=list)


class FakeNet:
    """Discrete-event driver for one PullMachine and its sources."""

    def __init__(self, sources: list[FakeSource], machine: PullMachine, *, staging_path: Path | None = None) -> None:
        self.sources = {s.peer: s for s in sources}
        self.machine = machine
        self.now = 0.0
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.events: list[Any] = []
        self.sent: list[Message] = []
        self.closed: set[PeerID] = set()
        self.open_slots: dict[PeerID, list[PayloadSlot]] = {}
        self.staging: StagingBuffer | None = None
        self.staging_path = staging_path
        self.completed: Completed | None = None
        self.failed: Failed | None = None
        self.stop_when: Callable[[FakeNet], bool] | None = None
        self.start_delay = 0.0
        self.discarded = 0
        self.delivered: list[tuple[PeerID, Message]] = []

    # --------------------------------------------------------------------------- scheduling
    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (when, next(self.seq), action))

    def run(self, *, until: float = 120.0) -> None:
        self.machine.start(self.now)
        self.pump()
        while self.machine.state not in (PullState.COMPLETED, PullState.FAILED, PullState.ABORTED):
            if self.stop_when is not None and self.stop_when(self):
                return
            deadline = self.machine.next_deadline()
            next_event = self.queue[0][0] if self.queue else None
            if deadline is not None and (next_event is None or deadline <= next_event):
                self.now = max(self.now, deadline)
                self.machine.handle_timeout(self.now)
            elif next_event is not None:
                when, _, action = heapq.heappop(self.queue)
                self.now = max(self.now, when)
                action()
            else:
                raise AssertionError("deadlock: nothing scheduled and no deadline")
            self.pump()
            assert self.now < until, "transfer did not finish in virtual time"

    # ---------------------------------------------------------------------- newcomer driver
    def pump(self) -> None:
        while True:
            events = self.machine.take_events()
            outgoing = self.machine.take_outgoing()
            if not events and not outgoing:
                return
            # Messages first (a ReleaseLease is the last thing on a dropped source's stream), then
            # events (SourceDropped closes that stream).
            for out in outgoing:
                self.sent.append(out.message)
                self.deliver_request(out.to, out.message)
            for event in events:
                self.events.append(event)
                self.on_event(event)

    def on_event(self, event: Any) -> None:
        if isinstance(event, ManifestReady):
            self.staging = StagingBuffer(event.manifest, path=self.staging_path)
            if self.start_delay:
                self.at(self.now + self.start_delay, lambda: self.machine.start_pull(self.now))
            else:
                self.machine.start_pull(self.now)
        elif isinstance(event, SourceDropped):
            self.close(event.source)
        elif isinstance(event, Completed):
            self.completed = event
        elif isinstance(event, Failed):
            self.failed = event

    def close(self, source: PeerID) -> None:
        """Close the stream: payloads in progress are aborted, later bytes never read."""
        self.closed.add(source)
        for slot in self.open_slots.pop(source, []):
            self.machine.payload_aborted(self.now, source, slot)

    def deliver_request(self, to: PeerID, message: Message) -> None:
        self.delivered.append((to, message))
        src = self.sources[to]
        # The machine must never ask a source it dropped for data.
        assert not (to in self.closed and isinstance(message, (GetChunks, GetVersions, GetManifest))), message
        self.at(self.now + src.latency, lambda: self.source_handles(src, message))

    # ---------------------------------------------------------------------------- sources
    def source_handles(self, src: FakeSource, message: Message) -> None:
        """A request reaches the source: queued (cancellable) until its link is free to answer it."""
        if src.dead or src.stalled:
            return
        src.queue.push(message)
        if not src.serving:
            self.serve_next(src)

    def serve_next(self, src: FakeSource) -> None:
        src.serving = False
        if src.dead or src.stalled:
            return
        item = src.queue.pop()
        if item is None:
            return
        src.serving = True
        self.source_answers(src, item)
        # The writer takes the next request once this answer has left (as the real source does).
        self.at(max(src.link_free_at, self.now), lambda: self.serve_next(src))

    def source_answers(self, src: FakeSource, message: Message | SkippedRequest) -> None:
        if src.retire_before_open and isinstance(message, GetManifest):
            src.store.retire(RUN)  # the version went away between the query and the lease
        if isinstance(message, GetChunks):
            src.data_requests.append(message)
        if src.error_on_chunks is not None and isinstance(message, GetChunks):
            error = ErrorReply(request_id=message.request_id, code=src.error_on_chunks, detail="no")
            replies: list[Any] = [Outgoing(to=NEWCOMER, protocol="transfer", message=error)]
        else:
            replies = src.session.respond(self.now, NEWCOMER, message)
        for reply in replies:
            payload = reply.payload if isinstance(reply, OutgoingPayload) else None
            header = reply.message
            size = 0 if payload is None else len(payload)
            if src.stall_after_bytes is not None and src.served + size > src.stall_after_bytes:
                src.stalled = True
                return
            if src.crash_after_bytes is not None and src.served + size > src.crash_after_bytes:
                src.dead = True
                # The kernel answers a dead peer's port with RST: the driver learns one latency later.
                self.at(self.now + src.latency, lambda: self.machine.peer_unreachable(self.now, src.peer))
                return
            data = bytes(payload) if payload is not None else b""
            if isinstance(header, DataHeader):
                damaged = bytearray(data)
                for i in range(0, len(damaged), CHUNK):  # one flipped byte in each corrupt chunk
                    if (header.offset + i) // CHUNK in src.corrupt_chunks:
                        damaged[i] ^= 0xFF
                data = bytes(damaged)
                if src.short_bytes:
                    length = header.length - src.short_bytes
                    header = DataHeader(request_id=header.request_id, offset=header.offset, length=length)
                    data = data[:length]
                if src.extra_bytes:
                    header = DataHeader(
                        request_id=header.request_id, offset=header.offset, length=header.length + src.extra_bytes
                    )
                    data += b"\0" * src.extra_bytes
            if isinstance(header, ManifestReply) and src.corrupt_manifest and data:
                data = data[:-1] + bytes([data[-1] ^ 1])
            src.served += size
            start = max(src.link_free_at, self.now)
            src.link_free_at = start + size / src.rate
            if isinstance(header, DataHeader) and src.slow_start_s:
                src.link_free_at += src.slow_start_s
                src.slow_start_s = 0.0
            header_at = start + src.latency
            done_at = src.link_free_at + src.latency
            self.at(header_at, lambda h=header, d=data, e=done_at: self.newcomer_gets(src, h, d, e))
            if (
                src.trailing_garbage_after_bytes is not None
                and isinstance(header, DataHeader)
                and src.served > src.trailing_garbage_after_bytes
            ):
                self.at(done_at, lambda: self.garbage(src))

    def newcomer_gets(self, src: FakeSource, header: Message, data: bytes, done_at: float) -> None:
        if src.peer in self.closed:
            return
        slot = self.machine.receive(self.now, src.peer, "transfer", header)
        if slot is None:
            return
        assert slot.length == len(data)
        self.open_slots.setdefault(src.peer, []).append(slot)
        self.at(done_at, lambda: self.payload_done(src, slot, data))

    def payload_done(self, src: FakeSource, slot: PayloadSlot, data: bytes) -> None:
        if src.peer in self.closed or slot not in self.open_slots.get(src.peer, []):
            return
        self.open_slots[src.peer].remove(slot)
        if slot.kind is PayloadKind.DISCARD:
            self.discarded += 1
            self.machine.payload_received(self.now, src.peer, slot, b"")
        elif slot.kind is PayloadKind.DATA:
            assert self.staging is not None
            view = self.staging.slot_view(slot)
            view[:] = data
            self.machine.payload_received(self.now, src.peer, slot, view)
        else:
            self.machine.payload_received(self.now, src.peer, slot, data)

    def garbage(self, src: FakeSource) -> None:
        if src.peer not in self.closed:
            # What the driver's frame decoder raises on bytes that are no frame.
            self.machine.source_misbehaved(self.now, src.peer, RemoteProtocolError("undecodable frame"))

    # ---------------------------------------------------------------------------- checks
    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def result(self) -> dict[str, np.ndarray]:
        assert self.completed is not None and self.staging is not None, self.failed
        return dict(self.staging.commit(self.completed).arrays)


def make_sources(
    count: int,
    *,
    rates: list[float] | None = None,
    states: list[dict[str, np.ndarray]] | None = None,
    step: int = 5,
    config: TransferConfig = CONFIG,
) -> list[FakeSource]:
    out = []
    for i in range(count):
        store = SnapshotStore(config, keep_latest=2)
        store.publish(RUN, step, (states[i] if states else make_state()))
        rate = rates[i] if rates else 1e6
        out.append(FakeSource(peer(i), store, SourceSession(store, config), rate=rate))
    return out


def make_machine(sources: list[FakeSource], *, estimates: list[float] | None = None, **kwargs: Any) -> PullMachine:
    est = [
        SourceEstimate(peer=s.peer, bytes_per_s=(estimates[i] if estimates else s.rate), latency_s=s.latency)
        for i, s in enumerate(sources)
    ]
    kwargs.setdefault("config", CONFIG)
    return PullMachine(run=RUN, sources=est, **kwargs)


def assert_bit_exact(result: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(result) == set(expected)
    for name, array in expected.items():
        got = result[name]
        assert got.dtype == array.dtype and got.shape == array.shape, name
        assert got.tobytes() == array.tobytes(), name


def leases_held(sources: list[FakeSource]) -> int:
    return sum(s.session.statistics().leases_active for s in sources)


def settle(net: FakeNet) -> None:
    """Let the last fire-and-forget messages (lease releases) arrive."""
    while net.queue:
        when, _, action = heapq.heappop(net.queue)
        net.now = max(net.now, when)
        action()


# ===================================================================================== scenarios
def test_four_sources_bit_exact() -> None:
    sources = make_sources(4, rates=[1e6, 2e6, 3e6, 4e6])
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    completed = net.completed
    assert completed is not None
    shares = dict(completed.bytes_by_source)
    assert all(shares[s.peer] > 0 for s in sources), shares
    assert sum(shares.values()) == completed.manifest.total_bytes
    assert shares[sources[3].peer] > shares[sources[0].peer]  # bandwidth-weighted plan
    assert not net.of(SourceDropped) and not net.of(SourcePenalised)
    planned = net.of(Planned)
    assert [p.reason for p in planned] == [PlanReason.INITIAL]
    # one request per batch of consecutive chunks, never more than the per-source cap
    counts = [m.chunk_count for m in net.sent if isinstance(m, GetChunks)]
    assert max(counts) == CONFIG.max_inflight_chunks_per_source and min(counts) >= 1
    settle(net)
    assert leases_held(sources) == 0


def test_blake3_snapshots_pull_bit_exact() -> None:
    pytest.importorskip("blake3")
    config = dataclasses.replace(CONFIG, hash_algorithm="blake3")
    sources = make_sources(2, config=config)
    sources[1].corrupt_chunks = set(range(1000))
    net = FakeNet(sources, make_machine(sources, config=config))
    net.run()
    assert net.completed is not None and net.completed.manifest.hash_algorithm == "blake3"
    assert len(net.completed.digest) == 32
    assert_bit_exact(net.result(), make_state())
    assert [p.reason for p in net.of(SourcePenalised)] == [PenaltyReason.CORRUPT_DATA]


def test_progress_events_are_monotone_and_end_complete() -> None:
    sources = make_sources(2)
    net = FakeNet(sources, make_machine(sources))
    net.run()
    progress = net.of(TransferProgress)
    assert len(progress) >= 3
    done = [p.bytes_done for p in progress]
    assert done == sorted(done)
    last = progress[-1]
    assert last.bytes_done == last.bytes_total and last.fraction == 1.0 and last.eta_s == 0.0
    assert last.chunks_done == last.chunks_total
    assert last.rate_bytes_per_s > 0
    assert sum(s.bytes_done for s in last.sources) == last.bytes_total
    assert any(p.eta_s is not None and p.eta_s > 0 for p in progress[1:-1])


def test_source_failing_at_half_is_replanned_and_completes() -> None:
    sources = make_sources(4, rates=[2e6] * 4)
    total = sources[0].store.latest(RUN).total_bytes  # type: ignore[union-attr]
    sources[1].crash_after_bytes = total // 8  # half of its quarter
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    dropped = net.of(SourceDropped)
    assert [(d.source, d.reason) for d in dropped] == [(sources[1].peer, DropReason.FAILED)]
    assert [p.reason for p in net.of(Planned)] == [PlanReason.INITIAL, PlanReason.SOURCE_DROPPED]
    assert not net.of(SourcePenalised)
    shares = dict(net.completed.bytes_by_source)  # type: ignore[union-attr]
    assert 0 < shares[sources[1].peer] < total // 4


def test_silently_stalled_source_is_dropped_after_the_stall_timeout() -> None:
    sources = make_sources(3, rates=[2e6] * 3)
    sources[0].stall_after_bytes = 3 * CHUNK
    net = FakeNet(sources, make_machine(sources, work_stealing=False))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[0].peer, DropReason.STALLED)]


def test_corrupt_chunk_is_detected_penalised_and_fetched_elsewhere() -> None:
    sources = make_sources(3)
    bad = sources[2]
    bad.corrupt_chunks = set(range(1000))  # every chunk it serves
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    penalties = net.of(SourcePenalised)
    assert [(p.source, p.reason) for p in penalties] == [(bad.peer, PenaltyReason.CORRUPT_DATA)]
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(bad.peer, DropReason.CORRUPT)]
    assert dict(net.completed.bytes_by_source)[bad.peer] == 0  # type: ignore[union-attr]


def test_source_announcing_more_than_asked_is_dropped() -> None:
    sources = make_sources(3)
    sources[0].extra_bytes = 17
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[0].peer, DropReason.PROTOCOL)]
    assert "more than asked" in net.of(SourceDropped)[0].detail
    assert [p.reason for p in net.of(SourcePenalised)] == [PenaltyReason.PROTOCOL_VIOLATION]


def test_chunk_of_the_wrong_length_is_refused() -> None:
    sources = make_sources(3)
    sources[2].short_bytes = 100
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[2].peer, DropReason.PROTOCOL)]


def test_source_sending_bytes_after_a_payload_is_dropped() -> None:
    sources = make_sources(3)
    sources[1].trailing_garbage_after_bytes = 2 * CHUNK
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[1].peer, DropReason.PROTOCOL)]


def test_error_replies_drop_the_source() -> None:
    sources = make_sources(3)
    sources[0].error_on_chunks = TransferErrorCode.BUSY
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[0].peer, DropReason.REFUSED)]


def test_version_gone_before_the_lease_drops_the_source_without_penalty() -> None:
    sources = make_sources(3)
    sources[1].retire_before_open = True
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    dropped = net.of(SourceDropped)
    assert [(d.source, d.reason) for d in dropped] == [(sources[1].peer, DropReason.REFUSED)]
    assert "UNKNOWN_RUN" in dropped[0].detail and not net.of(SourcePenalised)


def test_corrupt_manifest_is_penalised_and_fetched_from_another_source() -> None:
    sources = make_sources(3, rates=[3e6, 2e6, 1e6])
    sources[0].corrupt_manifest = True  # the fastest is asked for the manifest first
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(p.source, p.reason) for p in net.of(SourcePenalised)] == [(sources[0].peer, PenaltyReason.BAD_MANIFEST)]
    ready = net.of(ManifestReady)
    assert len(ready) == 1 and sources[0].peer not in ready[0].sources


def test_slow_source_behind_plan_triggers_a_replan() -> None:
    sources = make_sources(3, rates=[2e5, 2e5, 1e4])
    # The monitor believes the third link is as fast as the others: it falls behind its plan.
    net = FakeNet(sources, make_machine(sources, estimates=[2e5, 2e5, 2e5], work_stealing=False))
    net.run()
    assert_bit_exact(net.result(), make_state())
    reasons = [p.reason for p in net.of(Planned)]
    assert PlanReason.BEHIND_PLAN in reasons
    assert not net.of(SourceDropped)


def test_work_stealing_takes_the_tail_of_a_slow_source() -> None:
    sources = make_sources(3, rates=[2e5, 2e5, 1e4])
    stealing = FakeNet(sources, make_machine(sources, estimates=[2e5, 2e5, 2e5]))
    stealing.run()
    assert_bit_exact(stealing.result(), make_state())
    sources2 = make_sources(3, rates=[2e5, 2e5, 1e4])
    no_healing = dataclasses.replace(CONFIG, max_replans=0)
    plain = FakeNet(sources2, make_machine(sources2, estimates=[2e5, 2e5, 2e5], work_stealing=False, config=no_healing))
    plain.run()
    assert not plain.of(Planned)[1:]
    assert stealing.now < plain.now


def test_resume_from_persisted_progress(tmp_path: Path) -> None:
    staging_file = tmp_path / "staging.bin"
    progress_file = tmp_path / "progress.resume"
    sources = make_sources(2)
    first = FakeNet(sources, make_machine(sources), staging_path=staging_file)

    def half_done(net: FakeNet) -> bool:
        progress = net.of(TransferProgress)
        return bool(progress) and progress[-1].fraction >= 0.5

    first.stop_when = half_done
    first.run()
    assert first.staging is not None
    record = checkpoint(first.machine, first.staging, progress_file)
    verified = len(record.verified_chunks())
    assert 0 < verified < record.chunk_count
    first.machine.abort(first.now)  # the newcomer process dies here
    first.staging.close()

    resumed = load_resume(progress_file)
    assert resumed == record
    sources = make_sources(2)
    second = FakeNet(sources, make_machine(sources, resume=resumed), staging_path=staging_file)
    second.run()
    assert second.staging is not None and second.staging.reused_file
    assert_bit_exact(second.result(), make_state())
    ready = second.of(ManifestReady)[0]
    assert ready.resumed_chunks == verified
    requested = {
        c for m in second.sent if isinstance(m, GetChunks) for c in range(m.first_chunk, m.first_chunk + m.chunk_count)
    }
    assert requested.isdisjoint(record.verified_chunks())
    assert len(requested) == record.chunk_count - verified
    assert second.of(TransferProgress)[-1].resumed_bytes > 0


def test_resume_record_for_another_version_is_discarded(tmp_path: Path) -> None:
    sources = make_sources(2)
    first = FakeNet(sources, make_machine(sources))
    first.run()
    record = first.machine.resume_record()
    newer = make_sources(2, step=6, states=[make_state(1), make_state(1)])
    second = FakeNet(newer, make_machine(newer, resume=record))
    second.run()
    assert second.of(ResumeDiscarded)
    assert second.of(ManifestReady)[0].resumed_chunks == 0
    assert_bit_exact(second.result(), make_state(1))


def test_mixed_versions_are_never_committed() -> None:
    # Three sources hold step 5 of the same state, one holds a different state under the same step.
    states = [make_state(), make_state(), make_state(), make_state(seed=3)]
    sources = make_sources(4, states=states, rates=[1e6, 1e6, 1e6, 9e6])
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    dropped = net.of(SourceDropped)
    assert [(d.source, d.reason) for d in dropped] == [(sources[3].peer, DropReason.CONFLICT)]
    assert dict(net.completed.bytes_by_source)[sources[3].peer] == 0  # type: ignore[union-attr]


def test_a_source_serving_another_versions_bytes_under_the_digest_is_caught() -> None:
    sources = make_sources(3)
    liar = sources[1]
    other = SnapshotStore(CONFIG)
    other.publish(RUN, 5, make_state(seed=9))
    # The liar advertises the right digest but its lease serves bytes of another snapshot.
    lease = other.lease(RUN, 5)
    assert lease is not None
    real_pin = liar.store.pin

    def lying_pin(run: str, step: int) -> Any:
        honest = real_pin(run, step)

        class Liar:
            manifest = honest.manifest  # type: ignore[union-attr]
            manifest_body = honest.manifest_body  # type: ignore[union-attr]
            digest = honest.digest  # type: ignore[union-attr]
            data = lease.data  # type: ignore[union-attr]

            def release(self) -> None:
                honest.release()  # type: ignore[union-attr]

        return Liar()

    liar.store.pin = lying_pin  # type: ignore[method-assign]
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(p.source, p.reason) for p in net.of(SourcePenalised)] == [(liar.peer, PenaltyReason.CORRUPT_DATA)]


def test_newest_step_is_chosen_unless_one_is_pinned() -> None:
    sources = make_sources(2, step=5)
    for s in sources:
        s.store.publish(RUN, 6, make_state(seed=6))
    latest = FakeNet(sources, make_machine(sources))
    latest.run()
    assert latest.completed is not None and latest.completed.step == 6
    assert_bit_exact(latest.result(), make_state(seed=6))
    sources = make_sources(2, step=5)
    for s in sources:
        s.store.publish(RUN, 6, make_state(seed=6))
    pinned = FakeNet(sources, make_machine(sources, step=5))
    pinned.run()
    assert pinned.completed is not None and pinned.completed.step == 5
    assert_bit_exact(pinned.result(), make_state())


def test_sources_without_the_run_are_skipped_and_no_source_at_all_fails() -> None:
    sources = make_sources(3)
    sources[2].store.retire(RUN)
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[2].peer, DropReason.NO_VERSION)]
    none = make_sources(2)
    for s in none:
        s.store.retire(RUN)
    failing = FakeNet(none, make_machine(none))
    failing.run()
    assert failing.failed is not None and "no reachable source" in str(failing.failed.error)
    wrong_step = make_sources(2)
    missing = FakeNet(wrong_step, make_machine(wrong_step, step=77))
    missing.run()
    assert missing.failed is not None and "step 77" in str(missing.failed.error)


def test_every_source_corrupt_fails_and_staging_cannot_be_committed() -> None:
    sources = make_sources(3)
    for s in sources:
        s.corrupt_chunks = set(range(1000))
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert net.failed is not None and net.completed is None
    assert isinstance(net.failed.error, TransferError)
    assert net.staging is not None
    with pytest.raises(LocalProtocolError):
        net.staging.commit(net.failed)  # type: ignore[arg-type]
    settle(net)
    assert leases_held(sources) == 0


def test_repeatedly_corrupt_chunk_fails_with_checksum_mismatch() -> None:
    config = dataclasses.replace(CONFIG, max_chunk_retries=2)
    sources = make_sources(4, config=config)
    for s in sources:
        s.corrupt_chunks = {0}
    net = FakeNet(sources, make_machine(sources, config=config))
    net.run()
    assert net.failed is not None and isinstance(net.failed.error, ChecksumMismatch)


def test_unreachable_sources_during_query_time_out() -> None:
    sources = make_sources(3)
    sources[0].dead = True
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert_bit_exact(net.result(), make_state())
    assert [(d.source, d.reason) for d in net.of(SourceDropped)] == [(sources[0].peer, DropReason.TIMEOUT)]


def test_all_sources_failing_mid_pull_fails() -> None:
    sources = make_sources(2)
    for s in sources:
        s.crash_after_bytes = 5 * CHUNK
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert net.failed is not None and "all sources failed" in str(net.failed.error)


def test_planner_gaps_are_covered() -> None:
    class GappyPlanner:
        def plan(
            self, ranges: Any, sources: Any, *, total_bytes: int, align_bytes: int
        ) -> list[tuple[PeerID, int, int]]:
            return [(sources[0].peer, 0, align_bytes)]  # only the first chunk

    sources = make_sources(2)
    net = FakeNet(sources, make_machine(sources, planner=GappyPlanner()))
    net.run()
    assert_bit_exact(net.result(), make_state())


def test_empty_snapshot_completes_at_once() -> None:
    sources = make_sources(2, states=[{}, {}])
    net = FakeNet(sources, make_machine(sources))
    net.run()
    assert net.completed is not None and net.completed.manifest.total_bytes == 0
    assert net.result() == {}


# ========================================================================== machine-level rules
def test_illegal_calls_are_local_protocol_errors() -> None:
    sources = make_sources(1)
    machine = make_machine(sources)
    with pytest.raises(LocalProtocolError):
        machine.start_pull(0.0)
    with pytest.raises(LocalProtocolError):
        machine.resume_record()
    machine.start(0.0)
    with pytest.raises(LocalProtocolError):
        machine.start(0.0)
    machine.abort(0.0)
    assert machine.state is PullState.ABORTED and machine.next_deadline() is None


def test_constructor_checks_its_arguments() -> None:
    est = SourceEstimate(peer=peer(0), bytes_per_s=1.0)
    with pytest.raises(ConfigError):
        PullMachine(run="", sources=[est], config=CONFIG)
    with pytest.raises(ConfigError):
        PullMachine(run=RUN, sources=[], config=CONFIG)
    with pytest.raises(ConfigError):
        PullMachine(run=RUN, sources=[est, est], config=CONFIG)
    with pytest.raises(ConfigError):
        SourceEstimate(peer=peer(0), bytes_per_s=0.0)
    with pytest.raises(ConfigError):
        SourceEstimate(peer=peer(0), bytes_per_s=1.0, latency_s=float("nan"))


def test_unsolicited_data_header_drops_the_source() -> None:
    sources = make_sources(2)
    net = FakeNet(sources, make_machine(sources))
    net.stop_when = lambda n: n.machine.state is PullState.PULLING
    net.run()
    slot = net.machine.receive(
        net.now, sources[0].peer, "transfer", DataHeader(request_id=10**9, offset=0, length=CHUNK)
    )
    assert slot is None
    events = net.machine.take_events()
    assert any(isinstance(e, SourceDropped) and e.source == sources[0].peer for e in events)
    assert not net.machine.is_active(sources[0].peer)
    # messages from strangers are ignored
    assert net.machine.receive(net.now, peer(50), "transfer", DataHeader(request_id=1, offset=0, length=1)) is None


def test_wrong_size_payload_is_a_local_error() -> None:
    sources = make_sources(1)
    net = FakeNet(sources, make_machine(sources))
    net.stop_when = lambda n: n.machine.state is PullState.PULLING
    net.run()
    message = next(m for m in net.sent if isinstance(m, GetChunks))
    length = message.chunk_count * CHUNK
    header = DataHeader(request_id=message.request_id, offset=message.first_chunk * CHUNK, length=length)
    slot = net.machine.receive(net.now, sources[0].peer, "transfer", header)
    assert slot is not None and slot.offset == message.first_chunk * CHUNK
    with pytest.raises(LocalProtocolError):
        net.machine.payload_received(net.now, sources[0].peer, slot, b"short")


def test_leases_are_renewed_while_the_driver_prepares_staging() -> None:
    sources = make_sources(2)
    net = FakeNet(sources, make_machine(sources))
    net.start_delay = 25.0  # allocating a huge staging file takes a while
    net.run()
    assert_bit_exact(net.result(), make_state())
    renewals = [m for m in net.sent if isinstance(m, GetManifest) and m.lease_id is not None]
    assert len(renewals) >= 2
    assert not net.of(SourceDropped)


def inject(src: FakeSource, kind: str, rng: np.random.Generator, total: int) -> None:
    """Give ``src`` the fault named ``kind`` (at a random point of the transfer)."""
    at = int(rng.integers(0, total))
    if kind == "crash":
        src.crash_after_bytes = at
    elif kind == "stall":
        src.stall_after_bytes = at
    elif kind == "corrupt":
        src.corrupt_chunks = {int(c) for c in rng.integers(0, total // CHUNK + 1, 5)}
    elif kind == "extra":
        src.extra_bytes = 1
    elif kind == "short":
        src.short_bytes = 1
    elif kind == "garbage":
        src.trailing_garbage_after_bytes = at
    elif kind == "busy":
        src.error_on_chunks = TransferErrorCode.BUSY
    elif kind == "manifest":
        src.corrupt_manifest = True
    elif kind == "dead":
        src.dead = True


faults = st.sampled_from(
    ["honest", "crash", "stall", "corrupt", "extra", "short", "garbage", "busy", "manifest", "dead"]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(faults, min_size=1, max_size=5), st.integers(0, 2**16))
def test_random_faults_never_commit_wrong_bytes(kinds: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)
    sources = make_sources(len(kinds), rates=[float(r) for r in rng.uniform(2e5, 4e6, len(kinds))])
    total = sources[0].store.latest(RUN).total_bytes  # type: ignore[union-attr]
    for src, kind in zip(sources, kinds, strict=True):
        inject(src, kind, rng, total)
    net = FakeNet(sources, make_machine(sources, work_stealing=bool(seed % 2)))
    net.run(until=600.0)
    if net.completed is not None:
        assert_bit_exact(net.result(), make_state())
        for src, kind in zip(sources, kinds, strict=True):
            if kind in ("extra", "short", "busy", "dead"):
                assert dict(net.completed.bytes_by_source)[src.peer] == 0
    else:
        assert net.failed is not None and isinstance(net.failed.error, TransferError)
        assert "honest" not in kinds or len(kinds) > 1
        with pytest.raises(LocalProtocolError):
            if net.staging is not None:
                net.staging.commit(net.failed)  # type: ignore[arg-type]
            else:
                raise LocalProtocolError("nothing staged")
    if "honest" in kinds:
        # One honest source is enough: every fault is survivable.
        assert net.completed is not None, (kinds, net.failed)
    settle(net)
    alive = [s for s in sources if not (s.dead or s.stalled)]
    assert leases_held(alive) == 0  # released explicitly, not left to expire
