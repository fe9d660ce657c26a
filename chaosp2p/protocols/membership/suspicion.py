"""Suspicion: how a silent member becomes FAILED (part of the membership machine).

Theory of operation
-------------------
A member that did not answer our own probe, nor the indirect probes of our check, is not declared
failed at once: it becomes SUSPECT, and the suspicion is gossiped so that the member itself hears it
and can refute by raising its incarnation (and so that other peers look at it themselves: to them
our verdict is a hint, see ``members.py``). The suspicion runs out after a timeout that scales with
log(n) (``suspicion_min_s``) and starts at ``suspicion_max_timeout_mult`` times that; each
*independent* confirmation -- another member's own verdict, heard from that member itself, up to
``k`` of them -- brings the deadline closer on a log scale, down to the minimum (Lifeguard).
Confirmations can only shorten a suspicion we hold; they cannot start one, and none is taken on
a third party's word (an ``origin`` the sender names is not evidence). When the deadline passes
with the suspicion still standing the member is FAILED -- first-hand, always -- announced as DEAD
(again a hint to others), and its overlay link is dropped.

When another peer's hint made us look, the suspicion counts from the hint's arrival: the member has
been told since then (by the suspector's own messages) and had as long to refute, which keeps the
detection time of a swarm where every peer looks for itself what it was when peers believed each
other.

Since others do not adopt our verdict (to them it is a hint to look), a suspicion of our own making --
our probe, not another peer's hint, made us look -- is told to the suspect by us: a PING carrying
our SUSPECT record when the suspicion starts, and again each probe tick until it refutes,
``_TELLS`` times at most (a live member answers the first that reaches it with its refutation; a
lossy link must not turn a false suspicion into a false failure). A suspicion that followed a hint
was told by the peers whose verdicts the hints were; in a mass failure, telling every dead member
from every peer would only double the probes.

A suspicion's timer may fire after the suspicion was refuted, replaced or re-armed with an earlier
deadline: it acts only if the suspicion it was armed for is still the current one.
"""

from __future__ import annotations

import math

from chaosp2p.protocols.membership.bookkeeping import MemberRecord, PingPurpose, SuspicionRecord
from chaosp2p.protocols.membership.core import MembershipCore, TimerKind
from chaosp2p.protocols.membership.events import MemberState, PeerFailed, PeerSuspected
from chaosp2p.protocols.membership.messages import MemberUpdate, UpdateKind
from chaosp2p.wire.identity import PeerID

_SUSPECT = MemberState.SUSPECT
_FAILED = MemberState.FAILED
_TELLS = 3


class Suspicion(MembershipCore):
    """Suspicions, their confirmations and their deadlines."""

    def _suspect(self, now: float, member: MemberRecord, incarnation: int, origin: PeerID) -> None:
        # A recent hint that made us look dates the suspicion; its authors are confirmations. (One
        # that outlived a local pause or an older check says nothing about this one.)
        hinted, confirmers = member.hinted_at, member.hinters
        window = 2 * self.config.probe_interval_s + 3 * self._probe_timeout()  # a look may wait a tick
        since = hinted if hinted is not None and now - hinted <= window else None
        was_suspect = member.state is _SUSPECT
        start = now if since is None else min(since, now)
        self._set_state(now, member, _SUSPECT, incarnation)
        if not was_suspect:
            member.suspected_at = start
            self._events.append(PeerSuspected(at=now, peer=member.peer, incarnation=incarnation))
        cfg = self.config
        n = self._live_count + 1
        min_s = cfg.suspicion_min_s(n)
        suspicion = SuspicionRecord(
            incarnation=incarnation,
            start=start,
            min_s=min_s,
            max_s=min_s * cfg.suspicion_max_timeout_mult,
            k=min(cfg.suspicion_confirmations, max(0, n - 2)),
            confirmers={origin},
        )
        if confirmers:
            suspicion.confirmers.update(sorted(confirmers)[: suspicion.k])
        self._suspicions[member.peer] = suspicion
        self._arm_suspicion(member.peer, suspicion)
        member.record = MemberUpdate(
            kind=UpdateKind.SUSPECT, peer=member.peer, incarnation=incarnation, addrs=(), origin=origin
        )
        self._queue_update(member.record)
        if since is None or since >= now:
            self._tell(now, member.peer, suspicion)
        else:
            suspicion.tells = _TELLS  # others' verdicts made us look: they told it

    def _tell(self, now: float, peer: PeerID, suspicion: SuspicionRecord) -> None:
        # A PING to the suspect leads with our verdict (see dissemination._piggyback): a live member
        # refutes in its ACK.
        suspicion.tells += 1
        suspicion.told_at = now
        self._ping(now, peer, PingPurpose.LOOK)

    def _tell_suspects(self, now: float) -> None:
        interval = self.config.probe_interval_s
        for peer, suspicion in list(self._suspicions.items()):
            if suspicion.tells < _TELLS and now - suspicion.told_at >= interval:
                self._tell(now, peer, suspicion)

    def _confirm(self, now: float, member: MemberRecord, origin: PeerID) -> None:
        suspicion = self._suspicions.get(member.peer)
        if suspicion is None or origin in suspicion.confirmers:
            return
        if len(suspicion.confirmers) - 1 >= suspicion.k:
            return
        suspicion.confirmers.add(origin)
        self._arm_suspicion(member.peer, suspicion)
        # Not re-gossiped: to others, a verdict we relay for someone else is no evidence.

    def _arm_suspicion(self, peer: PeerID, suspicion: SuspicionRecord) -> None:
        confirmations = len(suspicion.confirmers) - 1  # the first suspector is not a confirmation
        if suspicion.k < 1:
            timeout = suspicion.min_s
        else:
            fraction = math.log(confirmations + 1) / math.log(suspicion.k + 1)
            timeout = max(suspicion.min_s, suspicion.max_s - (suspicion.max_s - suspicion.min_s) * fraction)
        suspicion.deadline = suspicion.start + timeout
        self._schedule(suspicion.deadline, TimerKind.SUSPICION, peer)

    def _fail(self, now: float, member: MemberRecord, incarnation: int, origin: PeerID) -> None:
        suspected_at = member.suspected_at
        self._set_state(now, member, _FAILED, incarnation)
        member.suspected_at = None
        member.record = MemberUpdate(kind=UpdateKind.DEAD, peer=member.peer, incarnation=incarnation, origin=origin)
        self._queue_update(member.record)
        self._counters.failures_declared += 1
        self._events.append(PeerFailed(at=now, peer=member.peer, incarnation=incarnation, suspected_at=suspected_at))
        self._drop_link(now, member.peer, "failed")

    def _on_suspicion_timeout(self, now: float, deadline: float, peer: PeerID) -> None:
        suspicion = self._suspicions.get(peer)
        member = self._members.get(peer)
        if suspicion is not None and member is not None and suspicion.deadline == deadline:
            self._fail(now, member, suspicion.incarnation, self.local_peer)
