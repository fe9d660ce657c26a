"""``/chaos/status/1``: ask a running peer who it is and what it sees.

The response is a typed message whose :meth:`StatusReport.to_json` gives the stable, documented
JSON shape of ``chaosp2p status --json`` (see README "Status JSON"): scripts may rely on every key
listed there; new keys may be added, none removed or renamed within major version 1.

Who sees which runs (:class:`StatusConfig`): a training run's details (its members, epoch, step,
pending operations) are the run's business, so by default a peer lists a run only to a peer that
is a member of it (the asker is known by its authenticated PeerID) and to the ``observers`` the
operator named; everyone else gets the same report with an empty ``runs`` list. Setting
``runs_visible_to = "anyone"`` shows every run to every asker, as before. The swarm-wide parts
(addresses, connections, membership, links) are what any peer of the swarm learns from gossip
anyway, and stay visible to every asker.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from chaosp2p.configbase import require
from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec

MAX_STATUS_ENTRIES = 4096


class StatusMessageType(enum.IntEnum):
    """Message types of ``/chaos/status/1``. ONLY APPEND TO THIS LIST."""

    REQUEST = 1
    REPORT = 2


STATUS_CODEC = MessageCodec("status", StatusMessageType)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionInfo:
    """One open connection as the reporting peer sees it."""

    peer_id: str
    address: str
    direction: str
    rtt_ms: float | None
    open_streams: int
    relayed: bool = False
    """A connection through a relay's circuit (``protocols/relay.md``); ``address`` is the relay's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberInfo:
    """One member of the swarm in the reporting peer's membership view."""

    peer_id: str
    state: str
    incarnation: int
    addrs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkInfo:
    """One overlay link from the reporting peer."""

    peer_id: str
    state: str
    rtt_ms: float | None
    bandwidth_bytes_per_s: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingInfo:
    """An operation a run has heard of but not yet committed."""

    kind: str
    subject: str
    origin: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitingInfo:
    """What the reporting peer's round of a run waits for right now (``waiting_for`` in JSON)."""

    step: int
    attempt: int
    waited_s: float
    """Since the round started on the reporting peer."""
    what: str
    """``contributions``, ``results`` or ``contributions+results``."""
    peers: tuple[str, ...]
    """Everyone the round waits for."""
    contributions_from: tuple[str, ...] = ()
    """Members whose contribution to the reporting peer's shard is not in."""
    results_from: tuple[str, ...] = ()
    """Owners whose averaged shard the reporting peer has not received."""
    links: tuple[str, ...] = ()
    """The links those bytes come over, ``sender~receiver`` (short ids)."""

    def to_json(self) -> dict[str, Any]:
        """The ``waiting_for`` object of a run in ``chaosp2p status --json``."""
        return {
            "step": self.step,
            "attempt": self.attempt,
            "waited_s": round(self.waited_s, 3),
            "what": self.what,
            "peers": list(self.peers),
            "contributions_from": list(self.contributions_from),
            "results_from": list(self.results_from),
            "links": list(self.links),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStatusInfo:
    """One training run the reporting peer takes part in, as it sees it."""

    run: str
    epoch: int
    step: int
    config_digest: str
    members: tuple[str, ...]
    pending: tuple[PendingInfo, ...] = ()
    activation_step: int = 0
    waiting_for: WaitingInfo | None = None
    """What this peer's round of the run waits for (None: no round waits). Appended last: an
    older peer ignores it, and a report from one decodes with None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReachabilityInfo:
    """What the reporting peer concluded about inbound connections to it (``protocols/reachability.md``)."""

    status: str
    """``public``, ``private`` or ``unknown``."""
    addrs: tuple[str, ...] = ()
    """Addresses peers dialed it back at, newest first."""
    reached: int = 0
    """Peers whose newest answer says they reached it."""
    not_reached: int = 0
    """Peers whose newest answer says they could not."""
    checked_s_ago: float | None = None
    """Seconds since its last check started (None: none yet)."""
    relay_addrs: tuple[str, ...] = ()
    """Appended: the relay addresses it announces (its reservations while private, ``protocols/relay.md`` §6)."""

    def to_json(self) -> dict[str, Any]:
        """The ``reachability`` object of ``chaosp2p status --json``."""
        return {
            "status": self.status,
            "addrs": list(self.addrs),
            "reached": self.reached,
            "not_reached": self.not_reached,
            "checked_s_ago": None if self.checked_s_ago is None else round(self.checked_s_ago, 3),
            "relay_addrs": list(self.relay_addrs),
        }


@STATUS_CODEC.register(StatusMessageType.REQUEST)
@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRequest(Message):
    """Ask for a :class:`StatusReport`."""


@STATUS_CODEC.register(StatusMessageType.REPORT)
@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReport(Message):
    """What a peer reports about itself."""

    peer_id: str
    addrs: tuple[str, ...]
    agent: str
    uptime_s: float
    connections: tuple[ConnectionInfo, ...]
    members: tuple[MemberInfo, ...] = ()
    links: tuple[LinkInfo, ...] = ()
    runs: tuple[RunStatusInfo, ...] = ()
    reachability: ReachabilityInfo | None = None
    """Appended last: an older peer's report decodes with None (``"reachability": null`` in JSON)."""

    def validate(self) -> None:
        """Bound the lists so a hostile peer cannot make the CLI render millions of rows."""
        for name in ("addrs", "connections", "members", "links", "runs"):
            if len(getattr(self, name)) > MAX_STATUS_ENTRIES:
                raise RemoteProtocolError(f"status report has more than {MAX_STATUS_ENTRIES} {name}")
        reachability = self.reachability
        if (
            reachability is not None
            and max(len(reachability.addrs), len(reachability.relay_addrs)) > MAX_STATUS_ENTRIES
        ):
            raise RemoteProtocolError(f"status report has more than {MAX_STATUS_ENTRIES} reachability addrs")
        for run in self.runs:
            waiting = run.waiting_for
            too_many = waiting is not None and any(
                len(names) > MAX_STATUS_ENTRIES
                for names in (waiting.peers, waiting.contributions_from, waiting.results_from, waiting.links)
            )
            if len(run.members) > MAX_STATUS_ENTRIES or len(run.pending) > MAX_STATUS_ENTRIES or too_many:
                raise RemoteProtocolError(f"status report run {run.run[:64]!r} is too large")

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape of ``chaosp2p status --json``."""
        return {
            "peer_id": self.peer_id,
            "addrs": list(self.addrs),
            "agent": self.agent,
            "uptime_s": round(self.uptime_s, 3),
            "connections": [
                {
                    "peer_id": c.peer_id,
                    "address": c.address,
                    "direction": c.direction,
                    "rtt_ms": c.rtt_ms,
                    "open_streams": c.open_streams,
                    "relayed": c.relayed,
                }
                for c in self.connections
            ],
            "members": [
                {"peer_id": m.peer_id, "state": m.state, "incarnation": m.incarnation, "addrs": list(m.addrs)}
                for m in self.members
            ],
            "links": [
                {
                    "peer_id": link.peer_id,
                    "state": link.state,
                    "rtt_ms": link.rtt_ms,
                    "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
                }
                for link in self.links
            ],
            "runs": [
                {
                    "run": r.run,
                    "epoch": r.epoch,
                    "step": r.step,
                    "activation_step": r.activation_step,
                    "config_digest": r.config_digest,
                    "members": list(r.members),
                    "pending": [{"kind": p.kind, "subject": p.subject, "origin": p.origin} for p in r.pending],
                    "waiting_for": None if r.waiting_for is None else r.waiting_for.to_json(),
                }
                for r in self.runs
            ],
            "reachability": None if self.reachability is None else self.reachability.to_json(),
        }


RUN_VISIBILITY = ("members", "anyone")
"""Values of :attr:`StatusConfig.runs_visible_to`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusConfig:
    """Who may read what in this peer's ``/chaos/status/1`` report (``[status]`` in a profile)."""

    runs_visible_to: str = "members"
    """``"members"``: a run is listed only to its members and to ``observers``; ``"anyone"``:
    every run to every asker (for an open swarm whose runs are public)."""
    observers: tuple[str, ...] = ()
    """PeerIDs that see every run (the operator's ``chaosp2p status --identity`` or dashboard key)."""

    def __post_init__(self) -> None:
        require(
            self.runs_visible_to in RUN_VISIBILITY,
            f"status.runs_visible_to must be one of {RUN_VISIBILITY} (got {self.runs_visible_to!r})",
        )
        for text in self.observers:
            PeerID.parse(text)  # ConfigError naming the bad one

    @classmethod
    def local(cls, **changes: Any) -> StatusConfig:
        """Runs visible to their members only (the default in every profile)."""
        return cls(**changes)

    @classmethod
    def lan(cls, **changes: Any) -> StatusConfig:
        """As :meth:`local`."""
        return cls(**changes)

    @classmethod
    def wan(cls, **changes: Any) -> StatusConfig:
        """As :meth:`local`."""
        return cls(**changes)

    def shows_every_run_to(self, asker: PeerID) -> bool:
        """Whether ``asker`` sees every run, member or not."""
        return self.runs_visible_to == "anyone" or str(asker) in self.observers


def report_for(report: StatusReport, asker: PeerID, config: StatusConfig) -> StatusReport:
    """``report`` as ``asker`` may see it: only the runs it is a member of, unless ``config``
    shows it every run (see the module docstring)."""
    if config.shows_every_run_to(asker):
        return report
    me = str(asker)
    return dataclasses.replace(report, runs=tuple(run for run in report.runs if me in run.members))
