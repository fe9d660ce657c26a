"""First-hand link events with hysteresis: when this member declares its own links down and up (pure).

Theory of operation
-------------------
A round that fails because this member could not exchange with one peer -- while membership still
holds that peer alive, and the other members reached it -- is first-hand evidence that the *link*
is broken (``protocols/averaging.md`` section 4.5). :meth:`LinkWatch.failed` says whether to raise
a LINK_DOWN about it at once (no settling delay: the run is stuck until the plan routes around the
link, ``protocols/negotiation.md`` section 3d). From then on the link is **probed** (a
connection-level ping every ``probe_interval_s``); it is declared up again only after it answered
every probe for ``required_up_s``, which doubles with each flap of that link (a LINK_DOWN less than
``forget_flaps_after_s`` after its last LINK_UP), from ``base_up_s`` up to ``max_up_s``:

    required_up_s = min(base_up_s x 2^flaps, max_up_s)

so a link that keeps breaking costs the run one failed round and two configuration changes per
cycle, at most one cycle per ``max_up_s`` once it has flapped a few times. A failed probe restarts
the count. Everything is driven by the caller with ``now``; nothing here reads a clock.

A member can only declare links it is an endpoint of (the negotiation refuses any other,
``forged_origin``), and this watch is the honest member's own discipline: a member that ignores it
and flaps on purpose is bounded by the negotiation instead (spec section 3d).
"""

from __future__ import annotations

from dataclasses import dataclass

from chaosp2p.configbase import require, require_positive
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkWatchConfig:
    """Hysteresis of first-hand link events (``protocols/negotiation.md`` section 3d)."""

    base_up_s: float = 2.0
    """A link declared down first-hand is declared up once it answered probes for this long..."""
    max_up_s: float = 120.0
    """...doubled with each flap of the link, up to this."""
    forget_flaps_after_s: float = 600.0
    """A link that stayed up this long after its LINK_UP starts again from ``base_up_s``."""
    probe_interval_s: float = 0.5
    """How often a link declared down is probed."""
    probe_timeout_s: float = 1.0
    """A probe (dial + connection-level ping) that takes longer failed."""
    max_links: int = 4096
    """Links tracked at once (one per peer: this member is an endpoint of each)."""

    def __post_init__(self) -> None:
        require_positive(
            self, "base_up_s", "max_up_s", "forget_flaps_after_s", "probe_interval_s", "probe_timeout_s", "max_links"
        )
        require(self.max_up_s >= self.base_up_s, "max_up_s must be >= base_up_s")


@dataclass(slots=True)
class _Link:
    down: bool = True
    flaps: int = 0
    ok_since: float | None = None
    up_at: float | None = None


class LinkWatch:
    """The links this member declared down first-hand, and when to declare them up again."""

    def __init__(self, config: LinkWatchConfig | None = None) -> None:
        self.config = config or LinkWatchConfig()
        self._links: dict[PeerID, _Link] = {}

    def failed(self, peer: PeerID, now: float) -> bool:
        """A round could not exchange with ``peer``: True if a LINK_DOWN should be raised now."""
        link = self._links.get(peer)
        if link is None:
            if len(self._links) >= self.config.max_links:
                self._links.pop(next(iter(self._links)))
            self._links[peer] = _Link()
            return True
        link.ok_since = None
        if link.down:
            return False  # declared already: the probes start over
        recent = link.up_at is not None and now - link.up_at < self.config.forget_flaps_after_s
        link.flaps = link.flaps + 1 if recent else 0
        link.down = True
        return True

    def required_up_s(self, peer: PeerID) -> float:
        """How long ``peer``'s link must answer probes before it is declared up."""
        link = self._links.get(peer)
        flaps = 0 if link is None else min(link.flaps, 32)
        return min(self.config.base_up_s * 2.0**flaps, self.config.max_up_s)

    def is_down(self, peer: PeerID) -> bool:
        """Did this member declare its link to ``peer`` down (and not up since)?"""
        link = self._links.get(peer)
        return link is not None and link.down

    def to_probe(self, now: float) -> list[PeerID]:
        """The links declared down (to probe); forgets links up for ``forget_flaps_after_s``."""
        for peer, link in list(self._links.items()):
            if not link.down and link.up_at is not None and now - link.up_at >= self.config.forget_flaps_after_s:
                del self._links[peer]
        return [peer for peer, link in self._links.items() if link.down]

    def probed(self, peer: PeerID, now: float, *, ok: bool) -> bool:
        """A probe of ``peer``'s link answered (``ok``) or not: True if a LINK_UP should be raised now."""
        link = self._links.get(peer)
        if link is None or not link.down:
            return False
        if not ok:
            link.ok_since = None
            return False
        if link.ok_since is None:
            link.ok_since = now
        if now - link.ok_since < self.required_up_s(peer):
            return False
        link.down = False
        link.ok_since = None
        link.up_at = now
        return True

    def forget(self, peer: PeerID) -> None:
        """``peer`` failed or left: its link is no longer this member's business."""
        self._links.pop(peer, None)


__all__ = ["LinkWatch", "LinkWatchConfig"]
