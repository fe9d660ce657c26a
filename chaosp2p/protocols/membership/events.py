"""What the membership machine tells its driver and users: events, views and statistics.

Events come out of ``take_events()`` in the order they happened, each stamped with the ``now`` of
the call that produced it. Views (``members()``, ``topology()``, ``links()``) are snapshots made of
frozen dataclasses, safe to hand to another task.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.protocols.membership.messages import Resources
from chaosp2p.wire.identity import PeerID


class MemberState(enum.Enum):
    """A member's state in the local view (``status --json`` prints the value)."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    FAILED = "failed"
    LEFT = "left"


# ---------------------------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True, kw_only=True)
class PeerJoined:
    """A member became alive in our view: first sighting, or back after failing or leaving.

    The record behind it (incarnation and addresses) is signed by the member itself."""

    at: float
    peer: PeerID
    incarnation: int
    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerSuspected:
    """A member did not answer this peer's own probes (direct and indirect); it may still refute."""

    at: float
    peer: PeerID
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerAlive:
    """A suspected member refuted the suspicion with a higher incarnation."""

    at: float
    peer: PeerID
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerFailed:
    """A member failed in this peer's own view: first-hand, never on another peer's word.

    This peer's own probe of it went unanswered, directly and through other members, and the
    suspicion that followed ran out without the member refuting it. (Other peers' suspicions only
    make this peer look sooner and shorten the suspicion; they cannot raise this event.)
    """

    at: float
    peer: PeerID
    incarnation: int
    suspected_at: float | None
    """When this peer's suspicion started (backdated to another peer's hint that made it look)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerLeft:
    """A member left gracefully: it said so itself, under its own signature."""

    at: float
    peer: PeerID
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkUp:
    """An overlay link answered a heartbeat: new link, or a down link that resumed."""

    at: float
    peer: PeerID
    rtt_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkDown:
    """An overlay link stopped answering, or was dropped.

    ``reason`` is ``"timeout"`` (heartbeats unanswered: a stalled or unreachable peer),
    ``"unreachable"`` (the driver reported the connection refused or lost), ``"failed"`` or
    ``"left"`` (its member did), or ``"replaced"`` (a better candidate took its slot).
    """

    at: float
    peer: PeerID
    reason: str


MembershipEvent = PeerJoined | PeerSuspected | PeerAlive | PeerFailed | PeerLeft | LinkUp | LinkDown
"""Every event ``take_events()`` can return."""


# ---------------------------------------------------------------------------------------- views
@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One member as the local peer sees it (the local peer itself included)."""

    peer_id: PeerID
    state: MemberState
    incarnation: int
    addrs: tuple[str, ...]
    resources: Resources | None
    """Last resources the member published (None until its first info arrives)."""
    info_version: int
    """Version of the member's resource/link record we hold (-1: none yet)."""
    last_change_s: float
    """When the state last changed in our view (machine time)."""
    is_local: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkView:
    """One directed overlay link ``source -> target`` as ``source`` measures it."""

    source: PeerID
    target: PeerID
    up: bool
    rtt_s: float | None
    bandwidth_bytes_per_s: float | None
    """``source`` uploading to ``target`` (what bandwidth probes measure, and what members publish)."""
    receive_bytes_per_s: float | None = None
    """``target`` uploading to ``source``, as ``source`` measured it receiving (its pulls from
    ``target``); only for this peer's own links (members publish one direction)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """The cluster monitor's view: live nodes with resources, and every peer's reported links."""

    nodes: tuple[Member, ...]
    links: tuple[LinkView, ...]


class LinkDirection(enum.Enum):
    """Which way bytes moved on a link, seen from this peer: a capped uplink makes them differ."""

    SEND = "send"
    """This peer uploaded to the other one (a bandwidth probe, serving state)."""
    RECEIVE = "receive"
    """The other peer uploaded to this one (pulling state from it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BandwidthProbe:
    """A request to the driver: move ``nbytes`` to/from ``peer`` and ``record_transfer`` the result."""

    peer: PeerID
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipStatistics:
    """Counters since the machine started."""

    messages_received: int
    messages_sent: int
    rate_limited: int
    """Messages dropped because their sender exceeded its token bucket."""
    rejected_messages: int
    """Whole messages refused (wrong protocol, oversized, malformed)."""
    rejected_updates: int
    """Single updates/infos refused (garbage address, absurd incarnation, bad values)."""
    ignored_unknown: int
    """Updates about members we do not know that cannot introduce them (suspect/dead/left)."""
    probes_sent: int
    indirect_probes_sent: int
    probes_failed: int
    suspicions_raised: int
    """Members this peer itself started suspecting."""
    suspicions_refuted: int
    """Suspicions (ours or learned) that ended with the member alive: false suspicions seen here."""
    refutations: int
    """Times this peer refuted a suspicion or death claim about itself."""
    failures_declared: int
    late_acks: int
    nacks_received: int
    push_pulls_sent: int
    push_pulls_received: int
    local_pauses: int
    """Times a gap between calls made the machine discard in-flight probes (it was paused)."""
    awareness: int
    """Current Lifeguard local-health score (0 = healthy)."""
    bad_signatures: int = 0
    """Self-claims (ALIVE, LEFT, info) whose signature was missing or wrong: forged, dropped."""
    signatures_verified: int = 0
    """Ed25519 checks made (claims already held or cached cost none)."""
    verify_limited: int = 0
    """Claims dropped unchecked because their sender spent its signature-check budget."""
    hints_checked: int = 0
    """Times another peer's SUSPECT/DEAD hint made this peer probe the member itself."""
    connection_losses: int = 0
    """Times a member's host closed this peer's last connection to it (EOF or reset, no goodbye)."""
    failures_on_loss: int = 0
    """Members failed at once after a connection loss: neither this peer nor any relay could reach them."""
    ignored_from_strangers: int = 0
    """Claims about third parties (or hints) from senders that are not members: ignored."""
    evicted_unvouched: int = 0
    """Members evicted from a full table that only a third party had vouched for."""
