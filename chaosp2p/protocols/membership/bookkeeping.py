"""The membership machine's private bookkeeping records and small helpers (not part of the public API).

Theory of operation
-------------------
The machine's parts (``core.py`` and its role modules) share one set of tables; this module holds
the row types of those tables. Mutable, slotted dataclasses: one per member, suspicion, probe in
flight, relayed probe, overlay link and pending contact, plus the statistics counters. A PING's
:class:`PingPurpose` decides what its answer or silence means besides "the member is alive": an
answered SWIM probe also says our own side is healthy, and a missed heartbeat also counts against
the link. The helpers size and hash what the tables hold (for the gossip byte budget and the view
digests) and validate the addresses a peer claims. Kept apart from the parts so that they read as
protocol logic.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.membership.config import MembershipConfig
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.membership.messages import WIRE_MAX_RELAY_ADDRS, InfoUpdate, MemberUpdate
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr


class PingPurpose(enum.IntEnum):
    """Why a PING was sent."""

    PROBE = 0
    """A SWIM probe (or a ping after a full state disagreed with ours): its ACK lowers awareness."""
    HEARTBEAT = 1
    """An overlay link's heartbeat: missing it counts against the link as well."""
    CHECK = 2
    """The direct PING sent beside a check started at once (the driver could not reach the member,
    or the member's host closed our last connection to it)."""
    LOOK = 3
    """Our own look at a member after another peer's hint: like a probe, but it leaves awareness
    alone (in a mass failure most looks fail, and that says nothing about our own health)."""


@dataclass(slots=True)
class MemberRecord:
    """One member as we hold it."""

    peer: PeerID
    state: MemberState
    incarnation: int
    addrs: tuple[str, ...]
    since: float
    record: MemberUpdate
    """What we gossip about it: its own signed ALIVE/LEFT, or our SUSPECT/DEAD verdict (a hint)."""
    introducer: PeerID | None = None
    """The third party whose gossip introduced it, until we hear from the member itself (None)."""
    suspected_at: float | None = None
    hinted_at: float | None = None
    """When another peer's SUSPECT/DEAD hint about it first arrived (cleared when it answers us)."""
    hint_checked_at: float = -1e300
    """When a hint last made us look at it ourselves (one look per probe interval)."""
    loss_checked_at: float = -1e300
    """When its host closing our connection last started a check (one per probe interval)."""
    hinters: set[PeerID] | None = None
    """Members whose own SUSPECT/DEAD verdict on it (at its current incarnation) reached us from
    them while we held it alive: confirmations, should our own check fail (cleared when it answers)."""
    hint_relayed: tuple[int, float] = (-1, -1e300)
    """(incarnation, time) of the last hint about it we passed on (once per incarnation and window)."""
    told_incarnation: int = -1
    """Our incarnation whose signed record it acknowledged (our probes carry it until then)."""
    info: InfoUpdate | None = None
    info_hash: int = 0  # member_hash(peer, info.version), 0 without info
    rtt_s: float | None = None
    bandwidth: float | None = None
    """Our upload to it (bytes/s): what our probes measure and what our link summaries publish."""
    bandwidth_at: float | None = None
    bandwidth_asked_at: float | None = None
    receive_bandwidth: float | None = None
    """Its upload to us (bytes/s), measured on what we pulled from it: a download is planned by
    this one, since a capped uplink makes the two directions differ."""
    receive_bandwidth_at: float | None = None


@dataclass(slots=True)
class SuspicionRecord:
    """A running suspicion and its confirmations."""

    incarnation: int
    start: float
    min_s: float
    max_s: float
    k: int
    confirmers: set[PeerID]
    deadline: float = 0.0
    tells: int = 0  # PINGs carrying our verdict sent to the suspect itself
    told_at: float = -1e300


@dataclass(slots=True)
class ProbeRecord:
    """A PING of ours awaiting its ACK (and the check it may have started)."""

    seq: int
    target: PeerID
    sent_at: float
    purpose: PingPurpose
    relays: tuple[PeerID, ...] = ()
    nacks: int = 0
    carried_self: int = -1  # the incarnation of our own record the PING carried (-1: none)
    lost: bool = False
    """The member's host closed our last connection to it (EOF or reset, no goodbye) before or
    during this check: the check may end early, on negatives alone (see probing.py)."""
    unreachable: bool = False
    """Since ``lost``, the driver failed to reach the member directly (a dial refused, a send failed)."""
    nacked_by: set[PeerID] | None = None
    """Relays that answered NACK (a ``lost`` check ends when every current relay is among them)."""
    heartbeat: bool = False
    """A SWIM probe of a link's peer that also stands for the link's heartbeat of the same tick
    (one PING instead of two): its timeout counts against the link as a heartbeat's would."""


@dataclass(slots=True)
class RelayRecord:
    """A PING we send on someone's behalf (PING_REQ)."""

    requester: PeerID
    request_seq: int
    target: PeerID


@dataclass(slots=True)
class LinkRecord:
    """One overlay link."""

    peer: PeerID
    since: float
    up: bool = False
    missed: int = 0


@dataclass(slots=True)
class ContactRecord:
    """A contact we are joining through."""

    addrs: tuple[str, ...]
    attempts: int = 0
    next_try: float = 0.0


@dataclass(slots=True)
class Counters:
    """Statistics counters."""

    messages_received: int = 0
    messages_sent: int = 0
    rate_limited: int = 0
    rejected_messages: int = 0
    rejected_updates: int = 0
    ignored_unknown: int = 0
    probes_sent: int = 0
    indirect_probes_sent: int = 0
    probes_failed: int = 0
    suspicions_raised: int = 0
    suspicions_refuted: int = 0
    refutations: int = 0
    failures_declared: int = 0
    late_acks: int = 0
    nacks_received: int = 0
    push_pulls_sent: int = 0
    push_pulls_received: int = 0
    local_pauses: int = 0
    bad_signatures: int = 0
    signatures_verified: int = 0
    verify_limited: int = 0
    hints_checked: int = 0
    connection_losses: int = 0
    failures_on_loss: int = 0
    ignored_from_strangers: int = 0
    evicted_unvouched: int = 0


def check_addrs(addrs: Sequence[str], peer: PeerID, config: MembershipConfig) -> str | None:
    """Why ``addrs`` are not acceptable as ``peer``'s listen addresses, or ``None`` if they are."""
    if len(addrs) > config.max_addrs_per_member:
        return f"{len(addrs)} addresses (max {config.max_addrs_per_member})"
    for addr in addrs:
        if type(addr) is not str or len(addr) > config.max_addr_chars:
            return "address too long"
        try:
            parsed = Multiaddr.parse(addr)
        except ConfigError as exc:
            return str(exc)
        if parsed.peer_id is not None and parsed.peer_id != peer:
            return "address names another peer"
    return None


def check_relay_addrs(addrs: Sequence[str], peer: PeerID, config: MembershipConfig) -> str | None:
    """Why ``addrs`` are not acceptable as relay addresses of ``peer``, or ``None`` if they are: at
    most ``max_addrs_per_member`` (and the wire's 8), each a relay address that names ``peer`` as its target."""
    most = min(config.max_addrs_per_member, WIRE_MAX_RELAY_ADDRS)
    if len(addrs) > most:
        return f"{len(addrs)} relay addresses (max {most})"
    for addr in addrs:
        if type(addr) is not str or len(addr) > 2 * config.max_addr_chars:
            return "relay address too long"
        try:
            parsed = CircuitAddr.parse(addr)
        except ConfigError as exc:
            return str(exc)
        if parsed.target != peer:
            return "relay address names another peer"
    return None


def member_hash(peer: PeerID, incarnation: int) -> int:
    """A 64-bit hash of (``peer``, ``incarnation``): the digests of two views are XORs of these."""
    data = peer.raw + incarnation.to_bytes(8, "big")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def update_size(update: MemberUpdate) -> int:
    """About how many bytes ``update`` takes on the wire (for the piggyback budget)."""
    return 50 + sum(len(a) + 2 for a in update.addrs) + (40 if update.origin is not None else 0) + len(update.signature)


def info_size(info: InfoUpdate) -> int:
    """About how many bytes ``info`` takes on the wire (for the piggyback budget)."""
    relayed = sum(len(a) + 3 for a in info.relay_addrs) + len(info.relay_signature)
    return 70 + 60 * len(info.links) + len(info.signature) + relayed
