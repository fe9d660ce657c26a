"""The dashboard's live feed: views of the swarm and its events, fanned out to browsers.

Theory of operation
-------------------
A :class:`DashboardFeed` turns what a node knows into JSON messages:

* a *snapshot* -- members, links, connections, training runs, transfers in progress -- built from
  the node's read-only views (:func:`gather_view`, then the pure :func:`snapshot_message`), at most
  once per ``min_snapshot_spacing_s`` after an event and at least every ``snapshot_interval_s``,
  and broadcast only when it changed;
* an *event* per item of ``node.events()`` -- joins, failures, link changes, negotiated operations,
  whatever a driver publishes -- converted generically (:func:`event_message`): a dataclass's fields
  become JSON keys, so new event types show up on the page without changes here.

Each browser is a :class:`FeedClient` with a bounded queue of events and a single slot for the
newest snapshot (a newer view replaces an unsent one: views supersede each other). Publishing never
waits: when a client's queue is full its oldest event is dropped and counted, and the page is told
how many it missed. A stalled or vanished browser therefore costs at most one queue of memory and
never slows the peer.

Peer-provided strings pass through as data; the page escapes them (it only ever sets
``textContent``). Here they are bounded -- strings cut to :data:`MAX_STRING_CHARS`, lists to
:data:`MAX_LIST_ITEMS`, nesting to :data:`MAX_DEPTH` -- and every message is one line of ASCII JSON,
so no string can break the Server-Sent-Events framing.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from chaosp2p.clock import Clock
from chaosp2p.dashboard.config import DashboardConfig
from chaosp2p.errors import ChaosError
from chaosp2p.protocols.membership import LinkView, Member, Topology
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.dashboard")

MAX_STRING_CHARS = 256
MAX_LIST_ITEMS = 64
MAX_DEPTH = 4
MAX_MEMBERS = 1024
"""Members beyond this are left out of a view (and counted): the page stays responsive."""
MAX_LINKS = 4096
MAX_FEED_CPU_SHARE_INVERSE = 9.0
"""After a view that took t seconds to build, wait at least 9 t: the feed takes at most ~10% of the loop."""


class TooManyClients(ChaosError):
    """The dashboard already streams to ``max_clients`` browsers."""


# ------------------------------------------------------------------------------------- JSON values
@functools.lru_cache(maxsize=16384)
def peer_text(peer: PeerID) -> str:
    """``str(peer)``, remembered: base58 dominates the cost of a view otherwise (~90% at 1000 members)."""
    return str(peer)


def json_value(value: Any, depth: int = 0) -> Any:
    """``value`` as bounded JSON data: dataclasses become objects, enums their values, ids strings."""
    if isinstance(value, enum.Enum):  # text values as they are (MemberState), numbered ones by name (OpKind)
        return value.value[:MAX_STRING_CHARS] if isinstance(value.value, str) else value.name
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:MAX_STRING_CHARS]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value[: MAX_STRING_CHARS // 2]).hex()
    if isinstance(value, PeerID):
        return peer_text(value)
    text_form: object = type(value).__str__
    if text_form is not object.__str__:  # ids and addresses (PeerID, Multiaddr) have a text form
        return str(value)[:MAX_STRING_CHARS]
    if depth >= MAX_DEPTH:  # deeper structure is summarised, never walked
        return f"<{type(value).__name__}>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        items = list(value.items())[:MAX_LIST_ITEMS]
        return {str(k)[:MAX_STRING_CHARS]: json_value(v, depth + 1) for k, v in items}
    if isinstance(value, list | tuple | set | frozenset):
        out = []
        for index, item in enumerate(value):
            if index >= MAX_LIST_ITEMS:
                break
            out.append(json_value(item, depth + 1))
        return out
    return str(value)[:MAX_STRING_CHARS]  # PeerID, Multiaddr, anything else with a text form


def encode_frame(name: str, payload: Mapping[str, Any]) -> str:
    """One Server-Sent-Events frame: ``event: NAME`` and a single ``data:`` line of ASCII JSON."""
    data = json.dumps(payload, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return f"event: {name}\ndata: {data}\n\n"


# ------------------------------------------------------------------------------------- views
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerConnectionView:
    """What an open connection tells about a peer: its self-declared agent and the RTT."""

    agent: str | None
    rtt_s: float | None
    outbound: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SwarmView:
    """Everything one snapshot shows, read from a node at one instant."""

    peer_id: str
    agent: str
    addrs: tuple[str, ...]
    role: str
    members: tuple[Member, ...]
    links: tuple[LinkView, ...]
    connections: Mapping[str, PeerConnectionView]
    runs: tuple[Any, ...] = ()
    transfers: tuple[Any, ...] = ()
    now: float
    """The node's clock (``Member.last_change_s`` and event ``at`` fields use it)."""
    wall: float
    """Wall-clock seconds at ``now``: the page shows times of day."""


class FeedSource(Protocol):
    """What the feed reads from a node (a :class:`~chaosp2p.runtime.node.Node` is one)."""

    clock: Clock

    def members(self) -> tuple[Member, ...]:
        """The membership view."""
        ...

    def topology(self) -> Topology:
        """Members and reported links."""
        ...

    def status_report(self) -> Any:
        """The status report (``runs`` is read from it when the node has training runs)."""
        ...

    def events(self) -> Any:
        """An async iterator over the node's events."""
        ...


def gather_view(
    node: Any, *, role: str, wall: Callable[[], float] = time.time, remote_runs: Iterable[Mapping[str, Any]] = ()
) -> SwarmView:
    """Read a :class:`SwarmView` from a running node (read-only; never awaits).

    ``remote_runs`` (other members' reports, see :mod:`.remote`) fill in the runs the node itself
    is not in; a run the node takes part in is shown as the node sees it.
    """
    report = node.status_report()
    connections: dict[str, PeerConnectionView] = {}
    host = getattr(node, "host", None)
    for connection in host.connections() if host is not None else ():
        key = peer_text(connection.remote_peer)
        if key in connections:
            continue
        hello = connection.remote_hello
        connections[key] = PeerConnectionView(
            agent=None if hello is None else hello.agent,
            rtt_s=connection.rtt_s,
            outbound=connection.is_dialer,
        )
    runs: list[Any] = list(getattr(report, "runs", ()))
    local_runs = {getattr(r, "run", None) for r in runs}
    runs.extend(r for r in remote_runs if r.get("run") not in local_runs)
    state = getattr(node, "state", None)
    transfers_of = getattr(state, "transfers_in_progress", None)
    return SwarmView(
        peer_id=str(report.peer_id),
        agent=str(report.agent),
        addrs=tuple(str(a) for a in report.addrs),
        role=role,
        members=node.members(),
        links=node.topology().links,
        connections=connections,
        runs=tuple(runs),
        transfers=tuple(transfers_of()) if callable(transfers_of) else (),
        now=node.clock.now(),
        wall=wall(),
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or not math.isfinite(seconds) else round(seconds * 1e3, 3)


def _member_json(member: Member, view: SwarmView, link_rtt_s: Mapping[str, float | None]) -> dict[str, Any]:
    peer = peer_text(member.peer_id)
    connection = view.connections.get(peer)
    agent = view.agent if member.is_local else (connection.agent if connection else None)
    rtt_s = link_rtt_s.get(peer)  # our overlay link's smoothed RTT, else the connection's
    if rtt_s is None and connection is not None:
        rtt_s = connection.rtt_s
    return {
        "peer_id": peer,
        "state": member.state.value,
        "incarnation": member.incarnation,
        "addrs": json_value(member.addrs),
        "is_local": member.is_local,
        "role": view.role if member.is_local else None,
        "agent": None if agent is None else agent[:MAX_STRING_CHARS],
        "connected": connection is not None,
        "rtt_ms": _ms(rtt_s),
        "since": round(view.wall - (view.now - member.last_change_s), 3),
        "resources": json_value(member.resources),
    }


def snapshot_body(view: SwarmView) -> dict[str, Any]:
    """The snapshot's content without its timestamp (compared to decide whether to send)."""
    members = view.members[:MAX_MEMBERS]
    links = view.links[:MAX_LINKS]
    own_rtt_s = {peer_text(link.target): link.rtt_s for link in links if peer_text(link.source) == view.peer_id}
    return {
        "self": {
            "peer_id": view.peer_id,
            "agent": view.agent[:MAX_STRING_CHARS],
            "addrs": json_value(view.addrs),
            "role": view.role,
        },
        "members": [_member_json(m, view, own_rtt_s) for m in members],
        "links": [
            {
                "source": peer_text(link.source),
                "target": peer_text(link.target),
                "up": link.up,
                "rtt_ms": _ms(link.rtt_s),
                "bandwidth_bytes_per_s": json_value(link.bandwidth_bytes_per_s),
            }
            for link in links
        ],
        "runs": [_record_json(run, view) for run in view.runs[:MAX_LIST_ITEMS]],
        "transfers": [_transfer_json(t) for t in view.transfers[:MAX_LIST_ITEMS]],
        "omitted": {"members": len(view.members) - len(members), "links": len(view.links) - len(links)},
    }


def snapshot_message(
    view: SwarmView, *, stats: Mapping[str, int] | None = None, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON ``snapshot`` message for ``view``: its body plus the time and the feed's counters."""
    return {
        **(body if body is not None else snapshot_body(view)),
        "time": round(view.wall, 3),
        "feed": dict(stats or {}),
    }


def _record_json(record: Any, view: SwarmView) -> dict[str, Any]:
    """A run (or any other record): its fields, plus wall times for its ``*_at`` fields."""
    fields = json_value(record)
    if not isinstance(fields, dict):
        return {"value": fields}
    return {**fields, "times": _wall_times(fields, view.now, view.wall)}


def _transfer_json(progress: Any) -> dict[str, Any]:
    fields = json_value(progress)
    if not isinstance(fields, dict):
        return {"value": fields}
    total, done = getattr(progress, "bytes_total", 0), getattr(progress, "bytes_done", 0)
    if isinstance(total, int) and isinstance(done, int):
        fields["fraction"] = 1.0 if total <= 0 else round(min(done / total, 1.0), 4)
    return dict(fields)


def _wall_times(fields: Mapping[str, Any], now: float, wall: float) -> dict[str, float]:
    """Wall-clock times of the node-clock fields ``at`` and ``*_at`` (for the page to print)."""
    out: dict[str, float] = {}
    for key, value in fields.items():
        if (key == "at" or key.endswith("_at")) and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = round(wall - (now - value), 3)
    return out


def event_message(event: Any, *, seq: int, now: float, wall: float) -> dict[str, Any]:
    """The JSON ``event`` message for one item of ``node.events()`` (any dataclass works)."""
    fields = json_value(event)
    if not isinstance(fields, dict):
        fields = {"value": fields}
    times = _wall_times(fields, now, wall)
    peer = next((fields[k] for k in ("peer", "peer_id", "subject") if isinstance(fields.get(k), str)), None)
    # When it happened: ``at``, else the latest of its times (an operation's ``committed_at``), else now.
    when = times.get("at", max(times.values(), default=round(wall, 3)))
    return {
        "seq": seq,
        "kind": type(event).__name__[:MAX_STRING_CHARS],
        "time": when,
        "peer": peer,
        "fields": fields,
        "times": times,
    }


# ------------------------------------------------------------------------------------- clients
class FeedClient:
    """One browser's stream: a bounded event queue and a slot for the newest snapshot."""

    def __init__(self, *, queue_events: int, key: str | None = None) -> None:
        self.key = key
        """Who opened it (see :meth:`DashboardFeed.connect`); None: not counted per client."""
        self._events: deque[str] = deque()
        self._limit = queue_events
        self._snapshot: str | None = None
        self._wake: anyio.Event | None = None  # made when a reader waits (so no event loop is needed before)
        self._closed = False
        self.dropped = 0
        """Events this client lost because it read too slowly."""
        self._dropped_reported = 0

    @property
    def closed(self) -> bool:
        """Whether the feed stopped serving this client."""
        return self._closed

    def pending(self) -> int:
        """Frames waiting to be sent (events plus the snapshot slot)."""
        return len(self._events) + (self._snapshot is not None)

    def offer_event(self, frame: str) -> bool:
        """Queue an event frame; if the queue is full drop the oldest. False if one was dropped."""
        dropped = len(self._events) >= self._limit
        if dropped:
            self._events.popleft()
            self.dropped += 1
        self._events.append(frame)
        self._notify()
        return not dropped

    def offer_snapshot(self, frame: str) -> None:
        """Replace any unsent snapshot with ``frame`` (a view supersedes the one before)."""
        self._snapshot = frame
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def take(self) -> list[str]:
        """Everything pending, in order: a ``lag`` notice if events were lost, events, the snapshot."""
        frames: list[str] = []
        if self.dropped != self._dropped_reported:
            frames.append(encode_frame("lag", {"dropped": self.dropped}))
            self._dropped_reported = self.dropped
        frames.extend(self._events)
        self._events.clear()
        if self._snapshot is not None:
            frames.append(self._snapshot)
            self._snapshot = None
        return frames

    async def next_frames(self, *, timeout_s: float) -> list[str] | None:
        """Wait up to ``timeout_s`` for frames: the frames, ``[]`` on timeout, None once closed."""
        if not self.pending() and not self._closed:
            self._wake = wake = anyio.Event()
            with anyio.move_on_after(timeout_s):
                await wake.wait()
            self._wake = None
        frames = self.take()
        if not frames and self._closed:
            return None
        return frames

    def close(self) -> None:
        """End the stream (the browser reconnects to a running dashboard by itself)."""
        self._closed = True
        self._notify()


# ------------------------------------------------------------------------------------- the feed
class DashboardFeed:
    """Builds snapshots and event messages from a node and fans them out to :class:`FeedClient` s."""

    def __init__(
        self,
        node: FeedSource,
        config: DashboardConfig,
        *,
        wall: Callable[[], float] = time.time,
        view: Callable[[], SwarmView] | None = None,
    ) -> None:
        self._node = node
        self.config = config
        self._wall = wall
        self._view = view or (lambda: gather_view(node, role=config.role, wall=wall))
        self._clients: set[FeedClient] = set()
        self._per_key: dict[str, int] = {}  # open streams per client key
        self._history: deque[str] = deque(maxlen=config.history_events)
        self._seq = 0
        self._snapshot_frame: str | None = None
        self._snapshot_key: str | None = None
        self._changed = False  # an event arrived since the last view was built
        self._dirty: anyio.Event | None = None  # made by run() (so the feed can be built outside a loop)
        self._closed = False
        self.events_seen = 0
        self.snapshots_sent = 0
        self.events_dropped = 0
        """Events lost over all clients (each slow client counts its own)."""
        self.clients_refused = 0

    # --------------------------------------------------------------- clients
    @property
    def client_count(self) -> int:
        """Browsers currently streaming."""
        return len(self._clients)

    def connect(self, key: str | None = None) -> tuple[FeedClient, list[str]]:
        """A new client and its opening frames (recent history, then the current snapshot).

        ``key`` names who asks (the server passes the browser's dashboard cookie, else its
        address): one key holds at most ``max_streams_per_client`` streams, so a page or script
        that opens many cannot take every slot (``max_clients`` in all).
        """
        if len(self._clients) >= self.config.max_clients:
            self.clients_refused += 1
            raise TooManyClients(f"the dashboard already streams to {self.config.max_clients} browsers")
        if key is not None and self._per_key.get(key, 0) >= self.config.max_streams_per_client:
            self.clients_refused += 1
            raise TooManyClients(f"this client already holds {self.config.max_streams_per_client} event streams")
        client = FeedClient(queue_events=self.config.client_queue_events, key=key)
        if self._closed:
            client.close()
        self._clients.add(client)
        if key is not None:
            self._per_key[key] = self._per_key.get(key, 0) + 1
        opening = [encode_frame("history", {"events": [json.loads(e) for e in self._history]})]
        opening.append(self.current_snapshot())
        return client, opening

    def disconnect(self, client: FeedClient) -> None:
        """Forget ``client`` (its stream ended)."""
        client.close()
        if client in self._clients and client.key is not None:
            left = self._per_key[client.key] - 1
            if left:
                self._per_key[client.key] = left
            else:
                del self._per_key[client.key]
        self._clients.discard(client)

    def stats(self) -> dict[str, int]:
        """Counters shown on the page: clients, events seen and dropped, snapshots sent."""
        return {
            "clients": len(self._clients),
            "events": self.events_seen,
            "events_dropped": self.events_dropped,
            "snapshots": self.snapshots_sent,
            "clients_refused": self.clients_refused,
        }

    # --------------------------------------------------------------- producing
    def current_snapshot(self) -> str:
        """The newest snapshot frame (built now if none was yet)."""
        if self._snapshot_frame is None:
            self.refresh()
        assert self._snapshot_frame is not None
        return self._snapshot_frame

    def snapshot_now(self) -> dict[str, Any]:
        """A snapshot message built from the node's views right now (for ``/api/snapshot``)."""
        return snapshot_message(self._view(), stats=self.stats())

    def refresh(self) -> bool:
        """Build a snapshot; broadcast it if it differs from the last one. True if it was sent."""
        view = self._view()
        body = snapshot_body(view)
        key = json.dumps(body, ensure_ascii=True, separators=(",", ":"), allow_nan=False)  # built in a fixed order
        if key == self._snapshot_key and self._snapshot_frame is not None:
            return False
        self._snapshot_key = key
        self._snapshot_frame = encode_frame("snapshot", snapshot_message(view, stats=self.stats(), body=body))
        self.snapshots_sent += 1
        for client in self._clients:
            client.offer_snapshot(self._snapshot_frame)
        return True

    def on_event(self, event: Any) -> None:
        """Turn one node event into a message for every client (never blocks)."""
        self._seq += 1
        self.events_seen += 1
        message = event_message(event, seq=self._seq, now=self._node.clock.now(), wall=self._wall())
        data = json.dumps(message, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
        self._history.append(data)
        frame = f"event: event\ndata: {data}\n\n"
        for client in self._clients:
            if not client.offer_event(frame):
                self.events_dropped += 1
        self._changed = True
        if self._dirty is not None:
            self._dirty.set()

    # --------------------------------------------------------------- running
    async def run(self) -> None:
        """Follow the node's events and keep snapshots fresh until cancelled or closed."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow_events)
            await self._snapshot_loop()
            tg.cancel_scope.cancel()

    async def _follow_events(self) -> None:
        subscription = self._node.events()
        try:
            async for event in subscription:
                self.on_event(event)
        finally:
            close = getattr(subscription, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()

    async def _snapshot_loop(self) -> None:
        while not self._closed:
            if not self._changed:
                self._dirty = dirty = anyio.Event()
                with anyio.move_on_after(self.config.snapshot_interval_s):
                    await dirty.wait()
            self._changed = False
            if self._closed:
                return
            if not self._clients:
                self._snapshot_frame = None  # nobody watches: build nothing; a new page gets a fresh view
                continue
            started = time.perf_counter()
            self.refresh()
            cost_s = time.perf_counter() - started
            # Bursts of events (a partition, a mass join) coalesce into one view per spacing, and a
            # view that is costly to build (thousands of members) is built at most ~1/10 of the time.
            await anyio.sleep(max(self.config.min_snapshot_spacing_s, MAX_FEED_CPU_SHARE_INVERSE * cost_s))

    def close(self) -> None:
        """Stop producing and end every client's stream."""
        self._closed = True
        if self._dirty is not None:
            self._dirty.set()
        for client in list(self._clients):
            client.close()


def frames_bytes(frames: Iterable[str]) -> bytes:
    """Frames joined for one write (ASCII by construction)."""
    return "".join(frames).encode("ascii")
