"""Scenario files for the cluster harness: which peers run what, over which links, with which churn.

A scenario is a TOML file (``peers/churn-demo.toml`` is a commented example)::

    [cluster]
    duration_s = 60          # the run ends (every peer asked to leave) this long after all initial peers are up
    profile = "local"        # peer profile: local, lan, wan or a profile file
    seed = 1                 # loss draws in the link shaper
    startup_timeout_s = 60   # a peer not listening by then is an error (everything is stopped)
    stop_timeout_s = 30      # grace for SIGTERM at the end before kill -9

    [links]                  # every pair of peers, unless a [[link]] says otherwise
    bandwidth_mbit_s = 1000  # omit for unlimited
    delay_ms = 1.0           # one-way, each direction
    loss = 0.0               # fraction of records that pay a TCP retransmission timeout

    [[peer]]
    name = "a"
    run = "digits"           # "peer" (a bare peer), "digits", or a module taking the example flags
    args = ["--steps", "400"]
    count = 1                # >1 makes a1, a2, ... with the same settings

    [[link]]
    between = ["a", "b"]
    delay_ms = 20

    [[site]]                 # optional: each peer in its own network namespace (root; docs/cluster.md)
    name = "home"
    kind = "nat"             # public | nat | symmetric-nat | firewall
    bandwidth_mbit_s = 100   # tc tbf on each host's veth, both directions

    [[event]]
    at_s = 10                # seconds after the initial peers are up
    action = "kill"          # join | leave | kill | stall | cut | restore
    peer = "b"               # join, leave, kill, stall
    duration_s = 5           # stall (then SIGCONT) and cut (then restore); optional for cut

With ``[[site]]`` tables every peer names its site (``site = "home"`` in its ``[[peer]]``).

A peer named by a ``join`` event starts then; every other peer starts at time 0. Every error --
an unknown key, an impossible time, bandwidth or sequence of events -- is a :class:`ConfigError`
naming the file, the line and the key.
"""

from __future__ import annotations

import enum
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosp2p.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MAX_DURATION_S = 24 * 3600.0
MAX_DELAY_MS = 60_000.0
MAX_PEERS = 256
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
RUN_ALIASES = {"digits": "chaosp2p.trainers.digits"}
"""Short names for the training examples a scenario may run."""
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Action(enum.Enum):
    """What a scheduled event does."""

    JOIN = "join"
    """Start the peer (it joins through a running one)."""
    LEAVE = "leave"
    """SIGTERM: a graceful leave."""
    KILL = "kill"
    """SIGKILL: a crash."""
    STALL = "stall"
    """SIGSTOP for ``duration_s``, then SIGCONT."""
    CUT = "cut"
    """Blackhole the link between two peers (in both directions), restored after ``duration_s`` if given."""
    RESTORE = "restore"
    """Restore a cut link."""
    CONTINUE = "continue"
    """SIGCONT ending a stall (generated from ``stall``; not written in scenario files)."""


PEER_ACTIONS = frozenset((Action.JOIN, Action.LEAVE, Action.KILL, Action.STALL, Action.CONTINUE))
LINK_ACTIONS = frozenset((Action.CUT, Action.RESTORE))


class SiteKind(enum.Enum):
    """Where a host sits on the simulated network (see :mod:`chaosp2p.cluster.sites`)."""

    PUBLIC = "public"
    """A public address; anyone can dial it."""
    NAT = "nat"
    """Behind a masquerading NAT that keeps source ports (endpoint-independent mapping)."""
    SYMMETRIC_NAT = "symmetric-nat"
    """Behind a masquerading NAT that picks a random port per connection (endpoint-dependent)."""
    FIREWALL = "firewall"
    """A public address, but inbound packets not part of a connection it opened are dropped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SiteSpec:
    """A ``[[site]]``: a place on the simulated network for one or more hosts."""

    name: str
    kind: SiteKind
    bandwidth_bytes_per_s: float | None = None
    """Per host on this site, each direction (``tc tbf`` on its veth)."""
    line: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """One direction of a link: what the transport's link shaper applies."""

    bandwidth_bytes_per_s: float | None = None
    delay_s: float = 0.0
    loss: float = 0.0

    @property
    def neutral(self) -> bool:
        """True if the link is not shaped at all."""
        return self.bandwidth_bytes_per_s is None and self.delay_s == 0 and self.loss == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSpec:
    """One peer process."""

    name: str
    run: str
    """``"peer"`` or the Python module started with ``python -m``."""
    args: tuple[str, ...] = ()
    site: str | None = None
    """The ``[[site]]`` it runs on (scenarios with sites only)."""
    line: int = 0

    @property
    def is_bare(self) -> bool:
        """True for a bare peer (no training)."""
        return self.run == "peer"


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkOverride:
    """A ``[[link]]``: the link between two peers differs from the default."""

    between: tuple[str, str]
    link: LinkSpec
    line: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduledEvent:
    """One churn event at ``at_s`` seconds after the initial peers are up."""

    at_s: float
    action: Action
    peer: str | None = None
    link: tuple[str, str] | None = None
    duration_s: float | None = None
    line: int = 0

    @property
    def subject(self) -> str:
        """The peer name, or ``a~b`` for a link."""
        return self.peer if self.peer is not None else "~".join(self.link or ())


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A parsed, validated scenario file."""

    path: str
    duration_s: float
    profile: str = "local"
    seed: int = 0
    startup_timeout_s: float = 60.0
    stop_timeout_s: float = 30.0
    default_link: LinkSpec = field(default_factory=LinkSpec)
    peers: tuple[PeerSpec, ...] = ()
    links: tuple[LinkOverride, ...] = ()
    events: tuple[ScheduledEvent, ...] = ()
    sites: tuple[SiteSpec, ...] = ()

    def peer(self, name: str) -> PeerSpec:
        """The peer called ``name``."""
        for spec in self.peers:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def initial_peers(self) -> tuple[PeerSpec, ...]:
        """Peers started at time 0 (every peer no join event names), in file order."""
        joining = {e.peer for e in self.events if e.action is Action.JOIN}
        return tuple(p for p in self.peers if p.name not in joining)

    def link_between(self, a: str, b: str) -> LinkSpec:
        """The link between peers ``a`` and ``b`` (the same in both directions)."""
        for override in self.links:
            if set(override.between) == {a, b}:
                return override.link
        return self.default_link

    @property
    def shaped(self) -> bool:
        """True if any link is shaped or cut: only then is the transport's link shaper switched on."""
        return (
            not self.default_link.neutral
            or any(not o.link.neutral for o in self.links)
            or any(e.action in LINK_ACTIONS for e in self.events)
        )

    def schedule(self) -> list[ScheduledEvent]:
        """Every action in time order, with a stall's SIGCONT and a timed cut's restore made explicit."""
        actions: list[ScheduledEvent] = []
        for event in self.events:
            actions.append(event)
            if event.action is Action.STALL and event.duration_s is not None:
                actions.append(
                    ScheduledEvent(
                        at_s=event.at_s + event.duration_s, action=Action.CONTINUE, peer=event.peer, line=event.line
                    )
                )
            elif event.action is Action.CUT and event.duration_s is not None:
                actions.append(
                    ScheduledEvent(
                        at_s=event.at_s + event.duration_s, action=Action.RESTORE, link=event.link, line=event.line
                    )
                )
        return sorted(actions, key=lambda e: e.at_s)


# ------------------------------------------------------------------------------------------ loading
class _Lines:
    """Where each table and key of a TOML file starts (tomllib reports values, not positions).

    Tracks ``[table]`` and ``[[array]]`` headers and ``key =`` lines; enough for the flat scenario
    format (an inline table or a multi-line array is located by its first line).
    """

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?")
    _KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")

    def __init__(self, text: str) -> None:
        self.tables: dict[tuple[str, int], int] = {}
        self.keys: dict[tuple[str, int, str], int] = {}
        counts: dict[str, int] = {}
        current = ("", 0)
        for number, line in enumerate(text.splitlines(), start=1):
            header = self._HEADER.match(line)
            if header:
                name = header.group(2)
                if header.group(1) == "[[":
                    counts[name] = counts.get(name, 0) + 1
                    current = (name, counts[name] - 1)
                else:
                    current = (name, 0)
                self.tables.setdefault(current, number)
                continue
            key = self._KEY.match(line)
            if key:
                self.keys.setdefault((current[0], current[1], key.group(1)), number)

    def of(self, table: str, index: int = 0, key: str | None = None) -> int:
        """Line of ``key`` in the ``index``-th ``table`` (the table's own line without the key; 0 unknown)."""
        if key is not None and (table, index, key) in self.keys:
            return self.keys[(table, index, key)]
        return self.tables.get((table, index), 0)


class _Reader:
    """Reads one table of the file, reporting errors with the file, line and key."""

    def __init__(self, path: str, lines: _Lines, table: str, index: int, data: Any, label: str) -> None:
        self.path = path
        self.lines = lines
        self.table = table
        self.index = index
        self.label = label
        if not isinstance(data, dict):
            self.fail(None, f"{label} must be a table")
        self.data: dict[str, Any] = data

    @property
    def line(self) -> int:
        """The table's own line."""
        return self.lines.of(self.table, self.index)

    def fail(self, key: str | None, message: str) -> None:
        """Raise a :class:`ConfigError` naming where."""
        line = self.lines.of(self.table, self.index, key)
        where = f"{self.path}:{line}" if line else self.path
        what = f"{self.label}, key {key!r}" if key else self.label
        raise ConfigError(f"{where}: {what}: {message}")

    def check_keys(self, allowed: set[str]) -> None:
        """Refuse any key not in ``allowed``."""
        for key in self.data:
            if key not in allowed:
                self.fail(key, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def number(
        self, key: str, default: float | None, *, low: float, high: float, low_open: bool = False
    ) -> float | None:
        """A finite number within [low, high] (or (low, high] with ``low_open``)."""
        if key not in self.data:
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(key, f"must be a number, got {value!r}")
        ok = (value > low if low_open else value >= low) and value <= high
        if not ok:
            bound = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
            self.fail(key, f"{value!r} is impossible: must be within {bound}")
        return float(value)

    def required_number(self, key: str, *, low: float, high: float, low_open: bool = False) -> float:
        """Like :meth:`number`, but the key must be present."""
        if key not in self.data:
            self.fail(None, f"missing key {key!r}")
        value = self.number(key, None, low=low, high=high, low_open=low_open)
        assert value is not None
        return value

    def string(self, key: str, default: str | None) -> str | None:
        """A string value."""
        if key not in self.data:
            return default
        value = self.data[key]
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {value!r}")
        return str(value)

    def link(self) -> LinkSpec:
        """The link keys of this table."""
        mbit = self.number("bandwidth_mbit_s", None, low=0, high=1e6, low_open=True)
        delay_ms = self.number("delay_ms", 0.0, low=0, high=MAX_DELAY_MS)
        loss = self.number("loss", 0.0, low=0, high=0.5)
        assert delay_ms is not None and loss is not None
        return LinkSpec(
            bandwidth_bytes_per_s=None if mbit is None else mbit * 1e6 / 8, delay_s=delay_ms / 1e3, loss=loss
        )


LINK_KEYS = {"bandwidth_mbit_s", "delay_ms", "loss"}


def load_scenario(path: str | Path) -> Scenario:
    """Parse and validate a scenario file (:class:`ConfigError` naming the line on any problem)."""
    name = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read scenario {name}: {exc}") from None
    return parse_scenario(text, name)


def parse_scenario(text: str, path: str = "<scenario>") -> Scenario:
    """Parse and validate scenario text; ``path`` only names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    lines = _Lines(text)
    top = _Reader(path, lines, "", 0, data, "scenario")
    top.check_keys({"cluster", "links", "peer", "link", "event", "site"})

    cluster = _Reader(path, lines, "cluster", 0, data.get("cluster", {}), "[cluster]")
    cluster.check_keys({"duration_s", "profile", "seed", "startup_timeout_s", "stop_timeout_s"})
    if "cluster" not in data:
        top.fail(None, "missing the [cluster] table (with at least duration_s)")
    duration_s = cluster.required_number("duration_s", low=0, high=MAX_DURATION_S, low_open=True)
    profile = cluster.string("profile", "local") or "local"
    seed = cluster.number("seed", 0, low=0, high=2**63)
    startup = cluster.number("startup_timeout_s", 60.0, low=0, high=3600, low_open=True)
    stop = cluster.number("stop_timeout_s", 30.0, low=0, high=3600, low_open=True)
    assert seed is not None and startup is not None and stop is not None
    if seed != int(seed):
        cluster.fail("seed", "must be an integer")

    defaults = _Reader(path, lines, "links", 0, data.get("links", {}), "[links]")
    defaults.check_keys(LINK_KEYS)
    default_link = defaults.link()

    sites = _sites(path, lines, data.get("site", []))
    peers = _peers(path, lines, data.get("peer", []), {s.name for s in sites})
    names = {p.name for p in peers}
    overrides = _links(path, lines, data.get("link", []), names)
    events = _events(path, lines, data.get("event", []), names, duration_s)
    scenario = Scenario(
        path=path,
        duration_s=duration_s,
        profile=profile,
        seed=int(seed),
        startup_timeout_s=startup,
        stop_timeout_s=stop,
        default_link=default_link,
        peers=peers,
        links=overrides,
        events=events,
        sites=sites,
    )
    _check_sequence(scenario)
    return scenario


def _array(path: str, lines: _Lines, table: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        line = lines.of(table)
        raise ConfigError(f"{path}:{line}: {table} must be written [[{table}]] (an array of tables)")
    return value


def _sites(path: str, lines: _Lines, value: Any) -> tuple[SiteSpec, ...]:
    specs: list[SiteSpec] = []
    kinds = sorted(k.value for k in SiteKind)
    for index, item in enumerate(_array(path, lines, "site", value)):
        reader = _Reader(path, lines, "site", index, item, f"[[site]] #{index + 1}")
        reader.check_keys({"name", "kind", "bandwidth_mbit_s"})
        name = reader.string("name", None)
        if name is None:
            reader.fail(None, "missing key 'name'")
        assert name is not None
        if not NAME.match(name) or len(name) > 16:
            reader.fail("name", f"{name!r} is not a site name (letters, digits, _ and -, at most 16)")
        for earlier in specs:
            if earlier.name == name:
                reader.fail("name", f"site {name!r} is already defined on line {earlier.line}")
        kind = reader.string("kind", "public")
        if kind not in kinds:
            reader.fail("kind", f"unknown site kind {kind!r} (expected one of: {', '.join(kinds)})")
        mbit = reader.number("bandwidth_mbit_s", None, low=0, high=1e5, low_open=True)
        bandwidth = None if mbit is None else mbit * 1e6 / 8
        specs.append(SiteSpec(name=name, kind=SiteKind(kind), bandwidth_bytes_per_s=bandwidth, line=reader.line))
    return tuple(specs)


def _peers(path: str, lines: _Lines, value: Any, sites: set[str]) -> tuple[PeerSpec, ...]:
    specs: list[PeerSpec] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(_array(path, lines, "peer", value)):
        reader = _Reader(path, lines, "peer", index, item, f"[[peer]] #{index + 1}")
        reader.check_keys({"name", "run", "args", "count", "site"})
        base = reader.string("name", None)
        if base is None:
            reader.fail(None, "missing key 'name'")
        assert base is not None
        if not NAME.match(base):
            reader.fail("name", f"{base!r} is not a name (letters, digits, _ and -, starting with a letter)")
        run = reader.string("run", "peer") or "peer"
        run = RUN_ALIASES.get(run, run)
        if run != "peer" and not MODULE.match(run):
            reader.fail("run", f"{run!r} is neither 'peer', 'digits' nor a Python module name")
        args = item.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            reader.fail("args", "must be a list of strings")
        count = reader.number("count", 1, low=1, high=MAX_PEERS)
        assert count is not None
        if count != int(count):
            reader.fail("count", "must be an integer")
        site = reader.string("site", None)
        if site is not None and site not in sites:
            reader.fail("site", f"no [[site]] named {site!r}")
        if site is None and sites:
            reader.fail(None, "missing key 'site' (the scenario has [[site]] tables: every peer names its site)")
        names = [base] if count == 1 else [f"{base}{i}" for i in range(1, int(count) + 1)]
        for name in names:
            if name in seen:
                reader.fail("name", f"peer {name!r} is already defined on line {seen[name]}")
            seen[name] = reader.line
            specs.append(PeerSpec(name=name, run=run, args=tuple(args), site=site, line=reader.line))
    if not specs:
        raise ConfigError(f"{path}: a scenario needs at least one [[peer]]")
    if len(specs) > MAX_PEERS:
        raise ConfigError(f"{path}: {len(specs)} peers, at most {MAX_PEERS}")
    return tuple(specs)


def _pair(reader: _Reader, key: str, names: set[str]) -> tuple[str, str]:
    value = reader.data.get(key)
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        reader.fail(key, f'must name two peers, e.g. {key} = ["a", "b"]')
    assert isinstance(value, list)
    a, b = value
    for peer in (a, b):
        if peer not in names:
            reader.fail(key, f"no peer named {peer!r}")
    if a == b:
        reader.fail(key, "a link joins two different peers")
    return (a, b)


def _links(path: str, lines: _Lines, value: Any, names: set[str]) -> tuple[LinkOverride, ...]:
    overrides: list[LinkOverride] = []
    for index, item in enumerate(_array(path, lines, "link", value)):
        reader = _Reader(path, lines, "link", index, item, f"[[link]] #{index + 1}")
        reader.check_keys(LINK_KEYS | {"between"})
        if "between" not in reader.data:
            reader.fail(None, "missing key 'between'")
        between = _pair(reader, "between", names)
        for earlier in overrides:
            if set(earlier.between) == set(between):
                reader.fail("between", f"the link {between[0]}~{between[1]} is already given on line {earlier.line}")
        overrides.append(LinkOverride(between=between, link=reader.link(), line=reader.line))
    return tuple(overrides)


def _events(path: str, lines: _Lines, value: Any, names: set[str], duration_s: float) -> tuple[ScheduledEvent, ...]:
    events: list[ScheduledEvent] = []
    writable = sorted(a.value for a in Action if a is not Action.CONTINUE)
    for index, item in enumerate(_array(path, lines, "event", value)):
        reader = _Reader(path, lines, "event", index, item, f"[[event]] #{index + 1}")
        reader.check_keys({"at_s", "action", "peer", "link", "duration_s"})
        at_s = reader.required_number("at_s", low=0, high=math.inf)
        if at_s >= duration_s:
            reader.fail("at_s", f"{at_s:g} s is impossible: the run ends at duration_s = {duration_s:g} s")
        text = reader.string("action", None)
        if text is None:
            reader.fail(None, "missing key 'action'")
        if text not in writable:
            reader.fail("action", f"unknown action {text!r} (expected one of: {', '.join(writable)})")
        action = Action(text)
        peer = link = None
        if action in PEER_ACTIONS:
            if "link" in reader.data:
                reader.fail("link", f"a {action.value} event names a peer, not a link")
            peer = reader.string("peer", None)
            if peer is None:
                reader.fail(None, f"a {action.value} event needs key 'peer'")
            if peer not in names:
                reader.fail("peer", f"no peer named {peer!r}")
        else:
            if "peer" in reader.data:
                reader.fail("peer", f'a {action.value} event names a link (link = ["a", "b"]), not a peer')
            if "link" not in reader.data:
                reader.fail(None, f"a {action.value} event needs key 'link'")
            link = _pair(reader, "link", names)
        duration = reader.number("duration_s", None, low=0, high=MAX_DURATION_S, low_open=True)
        if action is Action.STALL and duration is None:
            reader.fail(None, "a stall event needs key 'duration_s' (how long the peer stays stopped)")
        if duration is not None and action not in (Action.STALL, Action.CUT):
            reader.fail("duration_s", f"only stall and cut events last; a {action.value} is instantaneous")
        if duration is not None and at_s + duration >= duration_s:
            reader.fail(
                "duration_s",
                f"{at_s:g} + {duration:g} s is impossible: the run ends at duration_s = {duration_s:g} s",
            )
        events.append(
            ScheduledEvent(at_s=at_s, action=action, peer=peer, link=link, duration_s=duration, line=reader.line)
        )
    return tuple(events)


def _check_sequence(scenario: Scenario) -> None:
    """Replay the schedule: every event must find its peers in a state where it can happen."""
    joined = [e for e in scenario.events if e.action is Action.JOIN]
    seen: dict[str, int] = {}
    for event in joined:
        assert event.peer is not None
        if event.peer in seen:
            raise ConfigError(
                f"{scenario.path}:{event.line}: peer {event.peer!r} already joins on line {seen[event.peer]}"
            )
        seen[event.peer] = event.line
    if not scenario.initial_peers:
        raise ConfigError(f"{scenario.path}: every peer joins later: at least one must start at time 0")
    state = {p.name: "up" for p in scenario.initial_peers} | {name: "not started" for name in seen}
    cut: set[frozenset[str]] = set()
    for event in scenario.schedule():
        where = f"{scenario.path}:{event.line}: [[event]] at {event.at_s:g} s"
        if event.peer is not None:
            now = state[event.peer]
            expected = {
                Action.JOIN: ("not started",),
                Action.LEAVE: ("up",),
                Action.KILL: ("up", "stalled"),
                Action.STALL: ("up",),
                Action.CONTINUE: ("stalled", "gone"),
            }[event.action]
            if now not in expected:
                raise ConfigError(f"{where}: cannot {event.action.value} peer {event.peer!r}: it is {now} then")
            state[event.peer] = {
                Action.JOIN: "up",
                Action.LEAVE: "gone",
                Action.KILL: "gone",
                Action.STALL: "stalled",
                Action.CONTINUE: "up" if now == "stalled" else "gone",
            }[event.action]
        else:
            assert event.link is not None
            pair = frozenset(event.link)
            if event.action is Action.CUT:
                if pair in cut:
                    raise ConfigError(f"{where}: the link {event.subject} is already cut then")
                cut.add(pair)
            elif pair not in cut:
                raise ConfigError(f"{where}: cannot restore the link {event.subject}: it is not cut then")
            else:
                cut.discard(pair)
