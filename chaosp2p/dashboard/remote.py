"""Training runs as other members report them, for a dashboard on a peer that is not in them.

Theory of operation
-------------------
A node's own status lists only the runs it takes part in, and an observer takes part in none. While
a browser watches, :class:`RemoteRuns` asks a few members at a time (round robin over the alive
ones, over connections that are already open) for their ``/chaos/status/1`` report and keeps the
runs they list: per run id, the record with the highest (epoch, step), with the peer that reported
it. A run nobody has reported for ``stale_after_s`` is dropped. Everything a peer answers is
untrusted: the status codec bounds the report, a peer that errs or is slow is skipped, and at most
:data:`MAX_REMOTE_RUNS` runs are kept.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from chaosp2p.errors import ChaosError
from chaosp2p.protocols.membership import MemberState
from chaosp2p.runtime.status import STATUS_CODEC, StatusReport, StatusRequest

log = logging.getLogger("chaosp2p.dashboard")

MAX_REMOTE_RUNS = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteRunsConfig:
    """How often and how widely to ask."""

    interval_s: float = 2.0
    """One round of questions this often (only while a browser watches)."""
    fanout: int = 2
    """Members asked per round."""
    timeout_s: float = 2.0
    """A member that has not answered by then is skipped this round."""
    stale_after_s: float = 10.0
    """A run no member reported for this long disappears from the page."""


@dataclass(frozen=True, slots=True)
class _Seen:
    record: Any
    reporter: str
    at: float


class RemoteRuns:
    """Collects the runs other members report; :meth:`runs` gives them as JSON-ready dicts."""

    def __init__(self, node: Any, config: RemoteRunsConfig | None = None) -> None:
        self._node = node
        self.config = config or RemoteRunsConfig()
        self._seen: dict[str, _Seen] = {}
        self._cursor = 0
        self.answers = 0
        self.failures = 0

    def runs(self) -> tuple[dict[str, Any], ...]:
        """The freshest record of each run reported lately, with ``reported_by``."""
        now = self._node.clock.now()
        fresh = [s for s in self._seen.values() if now - s.at <= self.config.stale_after_s]
        out = []
        for seen in sorted(fresh, key=lambda s: str(s.record.run)):
            fields = {f.name: getattr(seen.record, f.name) for f in dataclasses.fields(seen.record)}
            out.append({**fields, "reported_by": seen.reporter})
        return tuple(out)

    def note(self, report: StatusReport, reporter: str) -> None:
        """Keep the runs of one member's report (the highest (epoch, step) per run id wins)."""
        now = self._node.clock.now()
        stale = [run for run, seen in self._seen.items() if now - seen.at > self.config.stale_after_s]
        for run in stale:
            del self._seen[run]
        for record in getattr(report, "runs", ())[:MAX_REMOTE_RUNS]:
            current = self._seen.get(record.run)
            newer_known = current is not None and (current.record.epoch, current.record.step) > (
                record.epoch,
                record.step,
            )
            if newer_known or (current is None and len(self._seen) >= MAX_REMOTE_RUNS):
                continue
            self._seen[record.run] = _Seen(record, reporter, now)

    async def run(self, watching: Callable[[], bool]) -> None:
        """Ask ``fanout`` members per ``interval_s`` while ``watching()``; until cancelled."""
        while True:
            await anyio.sleep(self.config.interval_s)
            if not watching():
                continue
            async with anyio.create_task_group() as tg:
                for peer in self._next_peers():
                    tg.start_soon(self._ask, peer)

    def _next_peers(self) -> list[Any]:
        others = [m.peer_id for m in self._node.members() if not m.is_local and m.state is MemberState.ALIVE]
        if not others:
            return []
        chosen = []
        for _ in range(min(self.config.fanout, len(others))):
            chosen.append(others[self._cursor % len(others)])
            self._cursor += 1
        return chosen

    async def _ask(self, peer: Any) -> None:
        connection = self._node.host.connection(peer)
        if connection is None:  # only open connections: the dashboard makes no new ones for this
            return
        try:
            reply = await connection.request(
                "status", STATUS_CODEC.to_obj(StatusRequest()), timeout_s=self.config.timeout_s
            )
            report = STATUS_CODEC.from_obj(reply)
        except (ChaosError, TimeoutError) as exc:
            self.failures += 1
            log.debug("status from %s for the dashboard: %s", peer, exc)
            return
        if isinstance(report, StatusReport) and report.peer_id == str(peer):
            self.answers += 1
            self.note(report, str(peer))
        else:
            self.failures += 1
