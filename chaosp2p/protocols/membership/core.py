"""Shared state and helpers of the membership machine (see :mod:`.machine` for the theory).

Theory of operation
-------------------
:class:`MembershipCore` holds what every part of the machine uses: the member table and the
tables of probes, checks, relays, suspicions, links and contacts (rows from ``bookkeeping.py``),
the two view digests, the broadcast queues, the timer heap, and the outgoing queue, events and
counters. The parts build on it, each owning one idea: ``members.py`` applies what others say
about members and changes their states, ``suspicion.py`` runs suspicions out, ``probing.py``
probes (SWIM, indirect checks, relays), ``dissemination.py`` spreads news (piggyback, gossip,
push-pull, joins) and ``overlay.py`` keeps the overlay links; ``machine.py`` puts them together
and dispatches messages and timers through tables. Constructing the core validates the local
addresses, signs this peer's own ALIVE and info records, arms every periodic timer at a random
phase and queues both records for gossip.

Trust
-----
The core holds the pieces that keep one sender from making this peer work for it: the message and
byte budgets per sender (charged before a message is decoded, see :meth:`admit` in ``machine.py``),
the per-sender budget of signature checks and the caches of their outcomes (``signing.py``), and
the bookkeeping of which third party vouched for which member we have not yet heard from, so that
a full table evicts the largest voucher's members first. This peer's own records are signed here,
once per incarnation and info version.

A part calls another part only through a method declared here ("provided by the other parts"),
so each module reads on its own. Timers are heap entries ``(deadline, sequence, kind, key)``: the
sequence keeps equal deadlines in the order they were armed, the :class:`TimerKind` names the
handler, and the key (a probe's sequence number, a peer, or ``None`` for the periodic ones)
picks the record the handler looks at. A timer whose record changed meanwhile finds nothing to
do: entries are never removed from the heap, only ignored.
"""

from __future__ import annotations

import enum
import heapq
import math
import random
from collections.abc import Sequence
from typing import Any

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership.bookkeeping import (
    ContactRecord,
    Counters,
    LinkRecord,
    MemberRecord,
    PingPurpose,
    ProbeRecord,
    RelayRecord,
    SuspicionRecord,
    check_addrs,
    info_size,
    member_hash,
)
from chaosp2p.protocols.membership.config import MAX_INCARNATION, MembershipConfig
from chaosp2p.protocols.membership.events import MembershipEvent, MemberState
from chaosp2p.protocols.membership.gossip import BroadcastQueue
from chaosp2p.protocols.membership.messages import (
    PROTOCOL,
    InfoUpdate,
    LinkSummary,
    MemberUpdate,
    Resources,
    UpdateKind,
)
from chaosp2p.protocols.membership.signing import (
    SIGNATURE_BYTES,
    SignatureCache,
    Verifier,
    alive_payload,
    info_payload,
    left_payload,
    relay_payload,
    verify_signature,
)
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

_ALIVE = MemberState.ALIVE


class TimerKind(enum.IntEnum):
    """What a timer on the heap is for; ``machine.py`` maps each kind to its handler."""

    PROBE = 0
    """Periodic: probe the next member of the round-robin (``probing.py``)."""
    HEARTBEAT = 1
    """Periodic: a heartbeat PING on every overlay link (``overlay.py``)."""
    GOSSIP = 2
    """Periodic: send queued membership news to a few random members (``dissemination.py``)."""
    PUSH_PULL = 3
    """Periodic: a full-state exchange with a random member (``dissemination.py``)."""
    RECONNECT = 4
    """Periodic: maybe a full-state exchange with a failed member (``dissemination.py``)."""
    LINKS = 5
    """Periodic: re-plan the overlay links (``overlay.py``)."""
    INFO = 6
    """Periodic: republish our link summaries if they moved (``overlay.py``)."""
    SWEEP = 7
    """Periodic: forget expired members and stale bookkeeping (``members.py``)."""
    DIRECT = 8
    """A PING's wait for its ACK ran out (key: the probe's sequence number; ``probing.py``)."""
    CHECK_END = 9
    """A check's indirect probes ran out (key: the probe's sequence number; ``probing.py``)."""
    RELAY = 10
    """A PING sent for a PING_REQ went unanswered (key: our sequence number; ``probing.py``)."""
    SUSPICION = 11
    """A suspicion may have run out (key: the suspected peer; ``suspicion.py``)."""
    JOIN = 12
    """Retry joining through a contact (key: the contact's peer; ``dissemination.py``)."""


class MembershipCore:
    """State and helpers shared by the parts of :class:`~.machine.MembershipMachine`."""

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(
        self,
        *,
        identity: Identity,
        addrs: Sequence[str],
        config: MembershipConfig,
        rng: random.Random,
        now: float,
        incarnation: int = 0,
        resources: Resources | None = None,
        verify: Verifier | None = None,
    ) -> None:
        local_peer = identity.peer_id
        addrs = tuple(addrs)
        problem = check_addrs(addrs, local_peer, config) if addrs else "no address"
        if problem is not None:
            raise ConfigError(f"local addresses rejected: {problem}")
        if not 0 <= incarnation < MAX_INCARNATION:
            raise ConfigError(f"incarnation out of range: {incarnation}")
        self.local_peer = local_peer
        self._local_raw = local_peer.raw
        self.config = config
        self._identity = identity
        self._verifier: Verifier = verify or verify_signature
        self._rng = rng
        self._addrs = addrs
        self._incarnation = incarnation
        self._resources = resources or Resources()
        if resources is not None:
            self._resources.validate()
        self._info_version = 0
        self._relay_addrs: tuple[str, ...] = ()
        """Relay addresses this peer announces in its info record (while it is private)."""
        self._left = False
        self._bulk_transfers = 0  # bulk transfers (pulls, served pulls) this peer runs now
        self._started = now
        self._last_now = now

        self._members: dict[PeerID, MemberRecord] = {}
        self._live_count = 0  # ALIVE + SUSPECT, not counting ourselves
        self._alive_cache: list[PeerID] | None = None
        self._probe_order: list[PeerID] = []
        self._probe_index = 0
        self._suspicions: dict[PeerID, SuspicionRecord] = {}
        self._probes: dict[int, ProbeRecord] = {}
        self._checks: dict[PeerID, int] = {}
        self._relays: dict[int, RelayRecord] = {}
        self._links: dict[PeerID, LinkRecord] = {}
        self._published_links: tuple[LinkSummary, ...] = ()
        self._links_dirty = False
        self._contacts: dict[PeerID, ContactRecord] = {}
        self._verified: dict[PeerID, int] = {}
        # introducer -> the members it vouched for that we have not heard from ourselves (oldest first)
        self._unvouched: dict[PeerID, dict[PeerID, None]] = {}
        self._hint_pending: set[PeerID] = set()
        self._next_refutation_at = -math.inf
        self._unsigned_news = False  # set while merging an unsigned view: it held news to ask for signed
        self._last_signed_sync = -math.inf
        self._pending_refutation = 0  # an incarnation to refute up to once the refutation budget allows
        self._strangers: dict[PeerID, float] = {}
        self._told_stale: dict[PeerID, float] = {}
        self._push_pulls: dict[int, tuple[PeerID, float]] = {}
        self._seq = rng.randrange(1 << 32)
        self._awareness = 0
        self._digest = 0
        self._digest_changed_at = now
        self._last_digest_sync = -math.inf
        self._digest_toggle(now, local_peer, incarnation)
        # The same over (peer, info version) of live members with info: the monitor's view.
        self._info_digest = member_hash(local_peer, 0)
        self._info_digest_changed_at = now

        self._updates: BroadcastQueue[MemberUpdate] = BroadcastQueue()
        self._gossip_parked_at: float | None = None
        """When the GOSSIP tick found no news and stopped (no wake-up per tick while nothing
        changes); queued news restarts it on the same grid (``dissemination.py``)."""
        self._infos: BroadcastQueue[InfoUpdate] = BroadcastQueue()
        self._limiter = RateLimiter(
            rate_per_s=config.rate_limit_msgs_per_s,
            burst=config.rate_limit_burst,
            max_senders=config.max_tracked_senders,
        )
        self._byte_limiter = RateLimiter(
            rate_per_s=config.rate_limit_bytes_per_s,
            burst=config.rate_limit_burst_bytes,
            max_senders=config.max_tracked_senders,
        )
        self._verify_limiter = RateLimiter(
            rate_per_s=config.verify_rate_per_s, burst=config.verify_burst, max_senders=config.max_tracked_senders
        )
        self._signatures = SignatureCache(config.signature_cache_entries)
        self._self_alive = self._sign_alive()
        self._self_info_record = self._sign_info()
        self._outgoing: list[Outgoing] = []
        self._events: list[MembershipEvent] = []
        self._counters = Counters()

        self._timers: list[tuple[float, int, TimerKind, Any]] = []
        self._timer_seq = 0
        c = config
        for kind, interval in (
            (TimerKind.PROBE, c.probe_interval_s),
            (TimerKind.HEARTBEAT, c.heartbeat_interval_s),
            (TimerKind.GOSSIP, c.gossip_interval_s),
            (TimerKind.PUSH_PULL, c.push_pull_interval_s),
            (TimerKind.RECONNECT, c.reconnect_interval_s),
            (TimerKind.LINKS, c.link_refresh_interval_s),
            (TimerKind.INFO, c.info_report_interval_s),
            (TimerKind.SWEEP, self._sweep_interval()),
        ):
            # Random phases keep a swarm started at one instant from probing in lockstep.
            at = now + rng.uniform(0.0, interval)
            if kind is TimerKind.HEARTBEAT and interval == c.probe_interval_s:
                # ...but our own heartbeats share the probe's tick (and their ACK deadlines its
                # deadline): one wake-up per interval for both instead of two, or four with the
                # two timeouts. The draw above still happens, so seeded runs draw as before.
                at = self._timers[0][0] if self._timers[0][2] is TimerKind.PROBE else at
            self._schedule(at, kind, None)
        self._queue_update(self._self_record())
        self._infos.put(local_peer.raw, self._self_info(), info_size(self._self_info()))

    # ------------------------------------------------------------------ provided by the other parts
    def _apply_piggyback(
        self, now: float, sender: PeerID, updates: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]
    ) -> None:
        """Apply the updates and info records a message carried (``members.py``)."""
        raise NotImplementedError

    def _merge_state(
        self, now: float, sender: PeerID, members: tuple[MemberUpdate, ...], infos: tuple[InfoUpdate, ...]
    ) -> bool:
        """Apply another peer's full state; True if it held news we could not take unsigned (``members.py``)."""
        raise NotImplementedError

    def _set_state(self, now: float, member: MemberRecord, state: MemberState, incarnation: int) -> None:
        """Move ``member`` to ``state``, keeping the counts and digests (``members.py``)."""
        raise NotImplementedError

    def _suspect(self, now: float, member: MemberRecord, incarnation: int, origin: PeerID) -> None:
        """Start a suspicion of ``member`` after our own check failed (``suspicion.py``)."""
        raise NotImplementedError

    def _confirm(self, now: float, member: MemberRecord, origin: PeerID) -> None:
        """Count ``origin``'s independent suspicion of a suspect member (``suspicion.py``)."""
        raise NotImplementedError

    def _fail(self, now: float, member: MemberRecord, incarnation: int, origin: PeerID) -> None:
        """Declare ``member`` failed (``suspicion.py``)."""
        raise NotImplementedError

    def _ping(self, now: float, target: PeerID, purpose: PingPurpose, *, probe: bool = False) -> None:
        """PING ``target`` and wait for its ACK; a SWIM ``probe`` carries our digests (``probing.py``)."""
        raise NotImplementedError

    def _look(self, now: float, member: MemberRecord) -> None:
        """Probe ``member`` ourselves because another peer hinted it is suspect or dead (``probing.py``)."""
        raise NotImplementedError

    def _tell_suspects(self, now: float) -> None:
        """Tell members we suspect about it again, if they have not refuted yet (``suspicion.py``)."""
        raise NotImplementedError

    def _refute_pending(self, now: float) -> None:
        """Make a refutation that the once-per-interval budget put off, if it is due (``members.py``)."""
        raise NotImplementedError

    def _queue_update(self, update: MemberUpdate) -> None:
        """Queue membership news for piggybacking and gossip (``dissemination.py``)."""
        raise NotImplementedError

    def _publish_info(self, *, past: int = 0) -> None:
        """Publish a new version of our info record (``dissemination.py``)."""
        raise NotImplementedError

    def _piggyback(
        self, dest: PeerID | None, extra: MemberUpdate | None = None
    ) -> tuple[tuple[MemberUpdate, ...], tuple[InfoUpdate, ...]]:
        """The news to piggyback on a message to ``dest`` (``dissemination.py``)."""
        raise NotImplementedError

    def _check_digest(self, now: float, sender: PeerID, digest: int, info_digest: int) -> None:
        """Exchange full state if a prober's view differs from ours (``dissemination.py``)."""
        raise NotImplementedError

    def _sync_stranger(self, now: float) -> None:
        """Exchange full state with one peer that talks to us unannounced (``dissemination.py``)."""
        raise NotImplementedError

    def _link_down(self, now: float, link: LinkRecord, reason: str) -> None:
        """Mark an overlay link down (``overlay.py``)."""
        raise NotImplementedError

    def _drop_link(self, now: float, peer: PeerID, reason: str) -> None:
        """Remove the overlay link to ``peer``, if any (``overlay.py``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ timers and time
    def _schedule(self, at: float, kind: TimerKind, key: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (at, self._timer_seq, kind, key))

    def _note_time(self, now: float) -> None:
        gap = now - self._last_now
        if gap > self.config.local_pause_threshold_s:
            self._local_pause(now)
        if now > self._last_now:
            self._last_now = now

    def _local_pause(self, now: float) -> None:
        # We were not running (SIGSTOP, swap, GC, starved loop). Probes in flight timed out because
        # of us, not their targets: forget them. Suspicions get a grace period so refutations that
        # queued up while we were paused are read before anyone is declared failed.
        self._counters.local_pauses += 1
        self._probes.clear()
        self._checks.clear()
        self._relays.clear()
        for link in self._links.values():
            link.missed = 0
        grace = now + self.config.probe_interval_s + self._probe_timeout()
        for peer, suspicion in self._suspicions.items():
            if suspicion.deadline < grace:
                suspicion.start += grace - suspicion.deadline
                suspicion.deadline = grace
                self._schedule(grace, TimerKind.SUSPICION, peer)

    def _sweep_interval(self) -> float:
        return max(1.0, 10 * self.config.probe_interval_s)

    def _probe_timeout(self) -> float:
        return self.config.probe_timeout_s * (1 + self._awareness)

    # ------------------------------------------------------------------ helpers
    def _send(self, to: PeerID, message: Message) -> None:
        self._outgoing.append(Outgoing(to=to, protocol=PROTOCOL, message=message))
        self._counters.messages_sent += 1

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFFFFFFFFFF
        return self._seq

    def _require_running(self, what: str) -> None:
        if self._left:
            raise LocalProtocolError(f"{what}: this peer has left the membership")

    def _self_record(self) -> MemberUpdate:
        """Our own ALIVE record, signed (once per incarnation and address set)."""
        return self._self_alive

    def _self_info(self) -> InfoUpdate:
        """Our own info record, signed (once per version)."""
        return self._self_info_record

    def _sign_alive(self) -> MemberUpdate:
        peer, incarnation, addrs = self.local_peer, self._incarnation, self._addrs
        signature = self._identity.sign(alive_payload(peer, incarnation, addrs))
        return MemberUpdate(kind=UpdateKind.ALIVE, peer=peer, incarnation=incarnation, addrs=addrs, signature=signature)

    def _sign_left(self) -> MemberUpdate:
        peer, incarnation = self.local_peer, self._incarnation
        signature = self._identity.sign(left_payload(peer, incarnation))
        return MemberUpdate(kind=UpdateKind.LEFT, peer=peer, incarnation=incarnation, signature=signature)

    def _sign_info(self) -> InfoUpdate:
        info = InfoUpdate(
            peer=self.local_peer, version=self._info_version, resources=self._resources, links=self._published_links
        )
        relay_addrs = self._relay_addrs
        return InfoUpdate(
            peer=info.peer,
            version=info.version,
            resources=info.resources,
            links=info.links,
            signature=self._identity.sign(info_payload(info)),
            relay_addrs=relay_addrs,
            relay_signature=(
                self._identity.sign(relay_payload(info.peer, info.version, relay_addrs)) if relay_addrs else b""
            ),
        )

    def _set_incarnation(self, now: float, incarnation: int) -> None:
        """Move to ``incarnation`` (refuting, or new addresses): sign the new record and spread it."""
        self._digest_toggle(now, self.local_peer, self._incarnation)
        self._incarnation = incarnation
        self._digest_toggle(now, self.local_peer, incarnation)
        self._self_alive = self._sign_alive()
        self._queue_update(self._self_alive)

    def _signed(self, sender: PeerID, signer: PeerID, signature: bytes, payload: bytes) -> bool:
        """Is ``signature`` ``signer``'s over ``payload``? Caches first, then ``sender``'s check budget.

        A check that no cache answers is paid from the sender's budget; a claim whose sender has
        spent it is dropped unchecked -- it will come again (gossip repeats, push-pull repairs),
        from a sender with budget left. (The payload names the signer, so it keys the cache.)
        """
        counters = self._counters
        if len(signature) != SIGNATURE_BYTES:
            counters.bad_signatures += 1
            return False
        key = (payload, signature)
        known = self._signatures.lookup(key)
        if known is not None:
            if not known:
                counters.bad_signatures += 1
            return known
        if not self._verify_limiter.allow(sender, self._last_now):
            counters.verify_limited += 1
            return False
        counters.signatures_verified += 1
        ok = self._verifier(signer, signature, payload)
        self._signatures.remember(key, ok)
        if not ok:
            counters.bad_signatures += 1
        return ok

    def _digest_toggle(self, now: float, peer: PeerID, incarnation: int) -> None:
        # The digest is the XOR of a hash of (peer, incarnation) over live members, ourselves
        # included: identical views have identical digests, and updating it costs one hash.
        self._digest ^= member_hash(peer, incarnation)
        self._digest_changed_at = now

    def _alive_list(self) -> list[PeerID]:
        cache = self._alive_cache
        if cache is None:
            cache = self._alive_cache = [p for p, m in self._members.items() if m.state is _ALIVE]
        return cache

    def _sample_alive(self, k: int) -> list[PeerID]:
        alive = self._alive_list()
        if len(alive) <= k:
            return list(alive)
        return self._rng.sample(alive, k)
