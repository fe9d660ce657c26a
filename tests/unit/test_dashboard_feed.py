"""The dashboard feed: JSON shape of views and events, SSE framing of hostile strings, bounded clients."""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from chaosp2p.clock import VirtualClock
from chaosp2p.dashboard.config import DashboardConfig, is_loopback, parse_bind
from chaosp2p.dashboard.feed import (
    MAX_LIST_ITEMS,
    MAX_STRING_CHARS,
    DashboardFeed,
    FeedClient,
    PeerConnectionView,
    SwarmView,
    TooManyClients,
    encode_frame,
    event_message,
    gather_view,
    json_value,
    snapshot_message,
)
from chaosp2p.dashboard.remote import MAX_REMOTE_RUNS, RemoteRuns, RemoteRunsConfig
from chaosp2p.errors import ConfigError
from chaosp2p.protocols.membership import LinkView, Member, MemberState, PeerFailed, Resources, Topology
from chaosp2p.protocols.negotiation.operations import OpKind
from chaosp2p.protocols.transfer import SourceProgress, TransferProgress
from chaosp2p.runtime.events import EventHub
from chaosp2p.runtime.status import RunStatusInfo, StatusReport
from chaosp2p.wire.identity import Identity, PeerID

from ..events import committed_operation

HOSTILE = '</td><script>window.pwned=1</script><img src=x onerror="pwned=2">\n\ndata: {"x":1}\r\n\u2028'


def peer_ids(count: int) -> list[PeerID]:
    return [Identity.generate().peer_id for _ in range(count)]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """Shaped like the training layer's run status (run, epoch, step, digest, members, pending)."""

    run: str
    epoch: int
    step: int
    config_digest: bytes
    members: tuple[PeerID, ...]
    pending: int
    started_at: float


def make_view(now: float = 100.0, wall: float = 1_700_000_000.0) -> tuple[SwarmView, list[PeerID]]:
    local, alive, failed = peer_ids(3)
    members = (
        Member(
            peer_id=local,
            state=MemberState.ALIVE,
            incarnation=0,
            addrs=("/ip4/127.0.0.1/tcp/1",),
            resources=Resources(cpu_cores=4, memory_bytes=8 << 30),
            info_version=1,
            last_change_s=90.0,
            is_local=True,
        ),
        Member(
            peer_id=alive,
            state=MemberState.ALIVE,
            incarnation=3,
            addrs=("/ip4/127.0.0.1/tcp/2",),
            resources=Resources(cpu_cores=2, train_samples_per_s=123.5),
            info_version=4,
            last_change_s=95.5,
        ),
        Member(
            peer_id=failed,
            state=MemberState.FAILED,
            incarnation=1,
            addrs=(),
            resources=None,
            info_version=-1,
            last_change_s=99.0,
        ),
    )
    links = (
        LinkView(source=local, target=alive, up=True, rtt_s=0.0021, bandwidth_bytes_per_s=5e8),
        LinkView(source=alive, target=failed, up=False, rtt_s=None, bandwidth_bytes_per_s=None),
    )
    transfer = TransferProgress(
        run=HOSTILE,
        step=7,
        bytes_done=250,
        bytes_total=1000,
        chunks_done=1,
        chunks_total=4,
        resumed_bytes=0,
        elapsed_s=1.0,
        rate_bytes_per_s=250.0,
        eta_s=3.0,
        sources=(
            SourceProgress(
                peer=alive, active=True, bytes_done=250, rate_bytes_per_s=250.0, inflight_chunks=1, queued_chunks=2
            ),
        ),
    )
    run = RunRecord(
        run=HOSTILE, epoch=2, step=40, config_digest=b"\x01\x02", members=(local, alive), pending=1, started_at=60.0
    )
    view = SwarmView(
        peer_id=str(local),
        agent="chaosp2p/0.1.0",
        addrs=("/ip4/127.0.0.1/tcp/1",),
        role="observer",
        members=members,
        links=links,
        connections={str(alive): PeerConnectionView(agent=HOSTILE, rtt_s=0.5, outbound=True)},
        runs=(run,),
        transfers=(transfer,),
        now=now,
        wall=wall,
    )
    return view, [local, alive, failed]


# ------------------------------------------------------------------------------------- JSON values
class Color(enum.Enum):
    RED = "red"


def test_json_value_converts_ids_enums_bytes_and_bounds_everything() -> None:
    peer = peer_ids(1)[0]
    assert json_value(peer) == str(peer)
    assert json_value(Color.RED) == "red"
    assert json_value(b"\xff\x00") == "ff00"
    assert json_value(float("nan")) is None and json_value(float("inf")) is None
    assert json_value("x" * 10_000) == "x" * MAX_STRING_CHARS
    assert json_value(list(range(10_000))) == list(range(MAX_LIST_ITEMS))
    assert json_value({1: (2, 3)}) == {"1": [2, 3]}
    deep: Any = "bottom"
    for _ in range(50):
        deep = [deep]
    flattened = json.dumps(json_value(deep))
    assert flattened == '[[[["<list>"]]]]'  # nesting is cut, never walked 50 levels deep
    assert json_value(True) is True and json_value(None) is None


# ------------------------------------------------------------------------------------- snapshot
def test_snapshot_shape_times_links_runs_and_transfers() -> None:
    view, (local, alive, failed) = make_view()
    message = snapshot_message(view, stats={"clients": 2})
    assert set(message) == {"self", "members", "links", "runs", "transfers", "omitted", "time", "feed"}
    assert message["self"] == {
        "peer_id": str(local),
        "agent": "chaosp2p/0.1.0",
        "addrs": ["/ip4/127.0.0.1/tcp/1"],
        "role": "observer",
    }
    by_id = {m["peer_id"]: m for m in message["members"]}
    assert [m["peer_id"] for m in message["members"]] == [str(local), str(alive), str(failed)]
    assert by_id[str(local)]["role"] == "observer" and by_id[str(local)]["is_local"]
    assert by_id[str(local)]["agent"] == "chaosp2p/0.1.0"
    assert by_id[str(alive)]["agent"] == HOSTILE  # data stays data: the page escapes it
    assert by_id[str(alive)]["rtt_ms"] == 2.1  # our overlay link's RTT wins over the connection's
    assert by_id[str(alive)]["resources"]["train_samples_per_s"] == 123.5
    assert by_id[str(failed)]["state"] == "failed" and by_id[str(failed)]["connected"] is False
    assert by_id[str(failed)]["agent"] is None and by_id[str(failed)]["resources"] is None
    # Node-clock times become wall-clock times: changed 1 s before "now".
    assert by_id[str(failed)]["since"] == pytest.approx(view.wall - 1.0)
    assert message["links"][0] == {
        "source": str(local),
        "target": str(alive),
        "up": True,
        "rtt_ms": 2.1,
        "bandwidth_bytes_per_s": 5e8,
    }
    assert message["links"][1]["up"] is False and message["links"][1]["rtt_ms"] is None
    (run,) = message["runs"]
    assert run["run"] == HOSTILE and run["epoch"] == 2 and run["step"] == 40 and run["pending"] == 1
    assert run["config_digest"] == "0102" and run["members"] == [str(local), str(alive)]
    assert run["times"] == {"started_at": pytest.approx(view.wall - 40.0)}
    (transfer,) = message["transfers"]
    assert transfer["fraction"] == 0.25 and transfer["run"] == HOSTILE
    assert transfer["sources"][0]["peer"] == str(alive) and transfer["sources"][0]["rate_bytes_per_s"] == 250.0
    assert message["feed"] == {"clients": 2} and message["omitted"] == {"members": 0, "links": 0}
    json.dumps(message, allow_nan=False)  # strictly JSON


def test_hostile_strings_cannot_break_the_event_stream_framing() -> None:
    view, _ = make_view()
    frame = encode_frame("snapshot", snapshot_message(view))
    frame.encode("ascii")  # ASCII only: no U+2028 or other line separator survives raw
    lines = frame.split("\n")
    assert lines[0] == "event: snapshot" and lines[1].startswith("data: ") and lines[2:] == ["", ""]
    assert "\r" not in frame
    decoded = json.loads(lines[1][len("data: ") :])
    assert decoded["runs"][0]["run"] == HOSTILE  # exactly what the peer sent, once parsed
    assert "<script>" not in lines[0]


def test_events_become_generic_json_with_wall_times_for_every_at_field() -> None:
    peer = peer_ids(1)[0]
    failed = event_message(
        PeerFailed(at=98.0, peer=peer, incarnation=2, suspected_at=97.5), seq=5, now=100.0, wall=1000.0
    )
    assert failed["kind"] == "PeerFailed" and failed["seq"] == 5 and failed["peer"] == str(peer)
    assert failed["time"] == 998.0
    assert failed["times"] == {"at": 998.0, "suspected_at": 997.5}
    assert failed["fields"]["incarnation"] == 2
    subject, origin = peer_ids(2)
    committed = committed_operation(
        run="run-a",
        kind=OpKind.FAIL,
        subject=subject,
        origin=origin,
        detected_at=96.0,
        proposed_at=97.0,
        committed_at=98.5,
        activation_step=1200,
    )
    message = event_message(committed, seq=6, now=100.0, wall=1000.0)
    assert message["kind"] == "OperationCommitted" and message["peer"] == str(subject)
    assert message["times"] == {"detected_at": 996.0, "proposed_at": 997.0, "committed_at": 998.5}
    assert message["time"] == 998.5  # no "at": the latest of its times
    assert message["fields"]["activation_step"] == 1200 and message["fields"]["kind"] == "FAIL"
    assert message["fields"]["other"] is None and message["fields"]["origin"] == str(origin)
    odd = event_message("not a dataclass", seq=7, now=0.0, wall=5.0)
    assert odd["fields"] == {"value": "not a dataclass"} and odd["time"] == 5.0 and odd["peer"] is None


# ------------------------------------------------------------------------------------- clients
def test_client_queue_is_bounded_drops_oldest_and_reports_the_loss() -> None:
    client = FeedClient(queue_events=8)
    kept = [client.offer_event(f"event: event\ndata: {i}\n\n") for i in range(20)]
    assert kept == [True] * 8 + [False] * 12
    assert client.pending() == 8 and client.dropped == 12
    client.offer_snapshot("event: snapshot\ndata: 1\n\n")
    client.offer_snapshot("event: snapshot\ndata: 2\n\n")  # replaces the unsent one
    frames = client.take()
    assert frames[0] == encode_frame("lag", {"dropped": 12})
    assert frames[1:9] == [f"event: event\ndata: {i}\n\n" for i in range(12, 20)]
    assert frames[9:] == ["event: snapshot\ndata: 2\n\n"]
    assert client.take() == []  # the loss is reported once
    client.offer_event("x")
    assert client.take() == ["x"]


class HubNode:
    """The two things the feed reads from a node besides its views: a clock and the real event hub."""

    def __init__(self) -> None:
        self.clock = VirtualClock(100.0)
        self.hub = EventHub(buffer_size=4096)
        self.subscribed = anyio.Event()

    def events(self) -> Any:
        subscription = self.hub.subscribe()
        self.subscribed.set()
        return subscription


@pytest.mark.anyio
async def test_a_stalled_browser_never_blocks_the_feed_and_loses_only_its_own_events() -> None:
    node = HubNode()
    view, (_, alive, _) = make_view()
    config = DashboardConfig(client_queue_events=32, snapshot_interval_s=60.0)
    feed = DashboardFeed(node, config, view=lambda: view)  # type: ignore[arg-type]
    reader, opening = feed.connect()
    stalled, _ = feed.connect()
    assert [f.split("\n", 1)[0] for f in opening] == ["event: history", "event: snapshot"]
    received: list[int] = []
    all_read = anyio.Event()

    async def read() -> None:
        while (frames := await reader.next_frames(timeout_s=5.0)) is not None:
            for frame in frames:
                if frame.startswith("event: event"):
                    received.append(json.loads(frame.split("data: ", 1)[1])["fields"]["incarnation"])
            if len(received) == 500:
                all_read.set()
                return

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed.run)
            tg.start_soon(read)
            await node.subscribed.wait()
            for i in range(500):
                node.hub.publish(PeerFailed(at=100.0, peer=alive, incarnation=i, suspected_at=None))
                if i % 4 == 0:
                    await anyio.lowlevel.checkpoint()  # let the reader keep up, as a live browser does
            await all_read.wait()
            tg.cancel_scope.cancel()
    assert received == list(range(500))  # the reading browser got everything, in order
    assert stalled.pending() == 32 and stalled.dropped == 500 - 32  # its queue stayed at its bound
    assert feed.events_dropped == 500 - 32 and feed.stats()["events_dropped"] == 468
    frames = stalled.take()
    assert json.loads(frames[0].split("data: ", 1)[1]) == {"dropped": 468}
    # A new page gets the recent history (bounded) at once.
    _, opening = feed.connect()
    history = json.loads(opening[0].split("data: ", 1)[1])["events"]
    assert len(history) == config.history_events and history[-1]["fields"]["incarnation"] == 499


@pytest.mark.anyio
async def test_views_are_sent_only_when_they_change_and_clients_are_capped() -> None:
    node = HubNode()
    view, _ = make_view()
    current = [view]
    feed = DashboardFeed(node, DashboardConfig(max_clients=2), view=lambda: current[0])  # type: ignore[arg-type]
    first, _ = feed.connect()
    second, _ = feed.connect()
    with pytest.raises(TooManyClients):
        feed.connect()
    assert feed.stats()["clients_refused"] == 1
    first.take()
    assert feed.refresh() is False and first.take() == []  # nothing changed: nothing sent
    suspect = dataclasses.replace(view.members[1], state=MemberState.SUSPECT)
    current[0] = dataclasses.replace(view, members=(view.members[0], suspect, view.members[2]))
    assert feed.refresh() is True
    (frame,) = first.take()
    states = [m["state"] for m in json.loads(frame.split("data: ", 1)[1])["members"]]
    assert states == ["alive", "suspect", "failed"]
    feed.disconnect(second)
    third, _ = feed.connect()  # the slot is free again
    current[0] = view
    assert feed.refresh() is True
    feed.close()
    assert await third.next_frames(timeout_s=1.0) is not None  # the snapshot it was owed
    assert await third.next_frames(timeout_s=1.0) is None  # then the stream ends


# ------------------------------------------------------------------------------------- settings
def test_dashboard_config_requires_a_token_off_loopback() -> None:
    assert parse_bind("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_bind("[::1]:0") == ("::1", 0)
    assert parse_bind("localhost:80") == ("localhost", 80)
    for bad in ("8765", "127.0.0.1", "example.com:80", "127.0.0.1:http", ":80"):
        with pytest.raises(ConfigError):
            parse_bind(bad)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and not is_loopback("0.0.0.0")
    assert DashboardConfig.from_bind("127.0.0.1:0").token is None
    with pytest.raises(ConfigError, match="needs a token"):
        DashboardConfig.from_bind("0.0.0.0:8765")
    with pytest.raises(ConfigError, match="at least 16"):
        DashboardConfig.from_bind("0.0.0.0:8765", token="short")
    with pytest.raises(ConfigError):
        DashboardConfig(token="a token with spaces in it")
    assert DashboardConfig.from_bind("0.0.0.0:8765", token="t" * 32).host == "0.0.0.0"
    with pytest.raises(ConfigError):
        DashboardConfig(port=70000)
    with pytest.raises(ConfigError):
        DashboardConfig(client_queue_events=0)


# ------------------------------------------------------------------------------------- remote runs
def status_with_runs(peer: PeerID, *runs: tuple[str, int, int]) -> StatusReport:
    return StatusReport(
        peer_id=str(peer),
        addrs=(),
        agent="x",
        uptime_s=1.0,
        connections=(),
        runs=tuple(
            RunStatusInfo(run=run, epoch=epoch, step=step, config_digest="d", members=(str(peer),))
            for run, epoch, step in runs
        ),
    )


def test_remote_runs_keep_the_newest_record_per_run_and_forget_stale_ones() -> None:
    node = HubNode()
    remote = RemoteRuns(node, RemoteRunsConfig(stale_after_s=10.0))
    a, b = peer_ids(2)
    remote.note(status_with_runs(a, ("r1", 2, 50), ("r2", 1, 5)), str(a))
    remote.note(status_with_runs(b, ("r1", 2, 40)), str(b))  # behind: ignored
    assert [(r["run"], r["step"], r["reported_by"]) for r in remote.runs()] == [("r1", 50, str(a)), ("r2", 5, str(a))]
    node.clock.advance(6.0)
    remote.note(status_with_runs(b, ("r1", 3, 0)), str(b))  # a new epoch wins
    node.clock.advance(6.0)  # r2 not reported for 12 s: gone
    assert [(r["run"], r["epoch"], r["reported_by"]) for r in remote.runs()] == [("r1", 3, str(b))]
    remote.note(status_with_runs(a, *((f"x{i}", 0, 0) for i in range(500))), str(a))
    assert len(remote.runs()) == MAX_REMOTE_RUNS  # a peer cannot grow the page without bound


def test_the_nodes_own_runs_win_over_what_others_report() -> None:
    view, (local, _, _) = make_view()

    class Node:
        clock = VirtualClock(100.0)

        def status_report(self) -> StatusReport:
            return status_with_runs(local, ("mine", 1, 10))

        def members(self) -> tuple[Member, ...]:
            return view.members

        def topology(self) -> Any:
            return Topology(nodes=view.members, links=view.links)

    gathered = gather_view(Node(), role="peer", remote_runs=[{"run": "mine", "step": 99}, {"run": "theirs", "step": 3}])
    assert [(getattr(r, "run", None) or r["run"]) for r in gathered.runs] == ["mine", "theirs"]
    assert gathered.runs[0].step == 10


def test_one_client_key_holds_at_most_its_share_of_the_streams() -> None:
    """Issue 20, finding 12: the per-client cap, and its slots freed when a stream ends."""
    node = HubNode()
    view, _ = make_view()
    feed = DashboardFeed(node, DashboardConfig(max_clients=4, max_streams_per_client=2), view=lambda: view)  # type: ignore[arg-type]
    first, _ = feed.connect("address:127.0.0.1")
    feed.connect("address:127.0.0.1")
    with pytest.raises(TooManyClients, match="this client"):
        feed.connect("address:127.0.0.1")
    feed.connect("browser:" + "a" * 32)  # another client still gets in
    feed.disconnect(first)
    feed.disconnect(first)  # twice: counted once
    feed.connect("address:127.0.0.1")
    assert feed.client_count == 3 and feed.stats()["clients_refused"] == 1
