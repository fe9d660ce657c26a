"""Overlay links: a bounded set of neighbours, watched by heartbeats (part of the membership machine).

Theory of operation
-------------------
Each peer keeps up to ``max_link_degree`` overlay links, chosen from alive members by measured RTT
and bandwidth (``links.py`` plans them). Every ``link_refresh_interval_s`` the current links and a
bounded random sample of alive members compete, so the work per refresh does not grow with the
cluster and good peers are found over rounds; links to members no longer live, and links down for
``link_drop_down_after_s``, are dropped first. Free slots are also filled right after an input
that added or revived members or dropped a link -- once per input, so that a PUSH_PULL introducing
hundreds of members picks among all of them.

Every link gets a heartbeat PING each ``heartbeat_interval_s`` (``probing.py`` sends it and reads
the answer). ``link_down_after_missed`` unanswered heartbeats take a link down (LinkDown) -- this
catches a stalled peer whose TCP connection stays open -- and an ACK brings it up again (LinkUp).
Every ``info_report_interval_s`` our link summaries are compared with the ones we last published,
and republished in our info record only when a link came or went, changed state, or a figure moved
by a quarter (RTTs by a millisecond at least): measurement noise does not flood the gossip.
"""

from __future__ import annotations

from chaosp2p.protocols.membership.bookkeeping import LinkRecord, PingPurpose
from chaosp2p.protocols.membership.core import MembershipCore, TimerKind
from chaosp2p.protocols.membership.events import LinkDown, MemberState
from chaosp2p.protocols.membership.links import LinkMetrics, plan_links
from chaosp2p.protocols.membership.messages import LinkSummary
from chaosp2p.wire.identity import PeerID

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)

_INFO_CHANGE = 0.25  # republish link summaries when a figure moved by a quarter...
_INFO_RTT_FLOOR_S = 0.001  # ...and an RTT by a millisecond at least (LAN RTTs jitter by more than 25 %)
_LINK_SAMPLE_MULT = 8  # link candidates sampled per refresh, per link slot


class Overlay(MembershipCore):
    """The overlay links: planning, heartbeats, and the summaries we publish about them."""

    def _link_down(self, now: float, link: LinkRecord, reason: str) -> None:
        link.up = False
        link.since = now
        self._events.append(LinkDown(at=now, peer=link.peer, reason=reason))

    def _drop_link(self, now: float, peer: PeerID, reason: str) -> None:
        link = self._links.pop(peer, None)
        if link is None:
            return
        if link.up:
            self._events.append(LinkDown(at=now, peer=peer, reason=reason))
        self._links_dirty = True

    def _fill_links(self, now: float) -> None:
        # Called once after each input, not per membership change: a PUSH_PULL that introduces
        # hundreds of members must not pick links among whichever few were merged first.
        self._links_dirty = False
        if len(self._links) < self.config.max_link_degree and len(self._alive_list()) > len(self._links):
            self._refresh_links(now)

    def _refresh_links(self, now: float) -> None:
        cfg = self.config
        for peer, link in list(self._links.items()):
            member = self._members.get(peer)
            stale_down = not link.up and now - link.since >= cfg.link_drop_down_after_s
            if member is None or member.state not in _LIVE or stale_down:
                del self._links[peer]
                if link.up:
                    self._events.append(LinkDown(at=now, peer=peer, reason="failed"))
        # A bounded random sample of alive members competes with the current links each round, so
        # the work per refresh does not grow with the cluster; good peers are found over rounds.
        candidates: dict[PeerID, LinkMetrics] = {}
        for peer in (*self._links, *self._sample_alive(_LINK_SAMPLE_MULT * cfg.max_link_degree)):
            member = self._members[peer]
            candidates[peer] = LinkMetrics(rtt_s=member.rtt_s, bandwidth_bytes_per_s=member.bandwidth)
        plan = plan_links(
            list(self._links),
            candidates,
            degree=cfg.max_link_degree,
            improvement=cfg.link_replace_improvement,
            reference_bytes=cfg.link_cost_reference_bytes,
            rng=self._rng,
        )
        for peer in plan.drop:
            link = self._links.pop(peer)
            if link.up:
                self._events.append(LinkDown(at=now, peer=peer, reason="replaced"))
        for peer in plan.add:
            self._links[peer] = LinkRecord(peer=peer, since=now)
            self._ping(now, peer, PingPurpose.HEARTBEAT)

    def _link_summaries(self) -> tuple[LinkSummary, ...]:
        out = []
        for peer in sorted(self._links):
            member = self._members.get(peer)
            out.append(
                LinkSummary(
                    peer=peer,
                    rtt_s=(member.rtt_s or 0.0) if member is not None else 0.0,
                    bandwidth_bytes_per_s=(member.bandwidth or 0.0) if member is not None else 0.0,
                    up=self._links[peer].up,
                )
            )
        return tuple(out)

    def _links_changed(self, new: tuple[LinkSummary, ...]) -> bool:
        old = self._published_links
        if len(old) != len(new):
            return True
        for a, b in zip(old, new, strict=True):
            if a.peer != b.peer or a.up != b.up:
                return True
            if abs(a.rtt_s - b.rtt_s) > max(_INFO_CHANGE * max(a.rtt_s, b.rtt_s), _INFO_RTT_FLOOR_S):
                return True
            x, y = a.bandwidth_bytes_per_s, b.bandwidth_bytes_per_s
            if abs(x - y) > _INFO_CHANGE * max(x, y):
                return True
        return False

    def _tick_heartbeat(self, now: float, deadline: float, key: None) -> None:
        # The probe's tick ran just before, at the same instant (core.py aligns them): a link
        # whose peer it probed already has its PING of this interval, which stands for the
        # heartbeat (an ACK keeps the link up either way; a timeout now counts against it too).
        probed = None
        for probe in self._probes.values():
            if probe.sent_at == now and probe.purpose is PingPurpose.PROBE:
                probed = probe
        for peer in list(self._links):
            if probed is not None and probed.target == peer:
                probed.heartbeat = True
                continue
            self._ping(now, peer, PingPurpose.HEARTBEAT)
        self._schedule(now + self.config.heartbeat_interval_s, TimerKind.HEARTBEAT, None)

    def _tick_links(self, now: float, deadline: float, key: None) -> None:
        self._refresh_links(now)
        self._schedule(now + self.config.link_refresh_interval_s, TimerKind.LINKS, None)

    def _tick_info(self, now: float, deadline: float, key: None) -> None:
        summaries = self._link_summaries()
        if self._links_changed(summaries):
            self._published_links = summaries
            self._publish_info()
        self._schedule(now + self.config.info_report_interval_s, TimerKind.INFO, None)
