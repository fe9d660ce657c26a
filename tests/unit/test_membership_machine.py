"""Unit tests of the SWIM membership machine, driven by hand on a virtual clock.

Two harnesses: ``Scripted`` runs one real machine against puppet peers whose answers the test
chooses message by message; ``Router`` connects a few real machines with zero-latency delivery and
lets the test crash (connections refused), stall (SIGSTOP: messages queue, no timers) and resume
them. Neither uses threads, sockets or sleeps.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable

import pytest

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.membership import (
    PROTOCOL,
    LinkDirection,
    LinkDown,
    LinkUp,
    MembershipConfig,
    MembershipMachine,
    MemberState,
    PeerFailed,
    PeerJoined,
    PeerLeft,
    PeerSuspected,
)
from chaosp2p.protocols.membership.messages import (
    Ack,
    Gossip,
    InfoUpdate,
    Leave,
    LinkSummary,
    MemberUpdate,
    Nack,
    Ping,
    PingReq,
    PushPull,
    PushPullReply,
    Resources,
    UpdateKind,
)
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message
from tests.unit.membership_claims import addr, alive, forged_alive, identity, peer

LAN = MembershipConfig.lan()
LOCAL = MembershipConfig.local()


def kinds(events: list[object]) -> list[str]:
    """Names of the member events (link events left out)."""
    return [type(e).__name__ for e in events if not isinstance(e, (LinkUp, LinkDown))]


# ------------------------------------------------------------------------------------- harnesses
class Scripted:
    """One real machine (peer 0) and puppet peers 1..n that answer as the test says."""

    def __init__(self, config: MembershipConfig = LAN, *, puppets: int = 3, seed: int = 1) -> None:
        self.now = 0.0
        self.me = peer(0)
        self.machine = MembershipMachine(
            identity=identity(0), addrs=(addr(0),), config=config, rng=random.Random(seed), now=0.0
        )
        self.puppets = [peer(i) for i in range(1, puppets + 1)]
        self.silent: set[PeerID] = set()  # puppets that never answer (crashed or stalled)
        self.sent: list[tuple[float, PeerID, Message]] = []
        self.events: list[object] = []
        for i in range(1, puppets + 1):  # each puppet introduces itself (first-hand)
            self.inject(peer(i), Gossip(updates=(alive(i),)))

    def inject(self, sender: PeerID, message: Message) -> None:
        self.machine.receive(self.now, sender, PROTOCOL, message)
        self.pump()

    def pump(self) -> None:
        """Puppets that are not silent ACK every PING and NACK every PING_REQ, at once."""
        while True:
            out = self.machine.take_outgoing()
            self.events += self.machine.take_events()
            if not out:
                return
            for o in out:
                self.sent.append((self.now, o.to, o.message))
                if o.to in self.silent:
                    continue
                if isinstance(o.message, Ping):
                    self.machine.receive(self.now, o.to, PROTOCOL, Ack(seq=o.message.seq))
                elif isinstance(o.message, PingReq):
                    self.machine.receive(self.now, o.to, PROTOCOL, Nack(seq=o.message.seq))

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            deadline = self.machine.next_deadline()
            if deadline is None or deadline > end:
                break
            self.now = max(self.now, deadline)
            self.machine.handle_timeout(self.now)
            self.pump()
        self.now = end

    def sent_to(self, target: PeerID, kind: type[Message]) -> list[tuple[float, Message]]:
        return [(at, m) for at, to, m in self.sent if to == target and isinstance(m, kind)]


class Router:
    """A few real machines with zero-latency delivery and hand-made faults."""

    def __init__(self, count: int, config: MembershipConfig = LOCAL, *, seed: int = 1) -> None:
        self.now = 0.0
        self.config = config
        self.seed = seed
        self.ids = [peer(i) for i in range(count)]
        self.machines: dict[PeerID, MembershipMachine] = {}
        self.crashed: set[PeerID] = set()
        self.stalled: dict[PeerID, list[tuple[PeerID, Message]]] = {}
        self.events: list[tuple[float, PeerID, object]] = []
        for index in range(count):
            self.start(index, contact=0 if index else None)

    def start(self, index: int, *, contact: int | None) -> MembershipMachine:
        p = peer(index)
        machine = MembershipMachine(
            identity=identity(index),
            addrs=(addr(index),),
            config=self.config,
            rng=random.Random(self.seed + index),
            now=self.now,
        )
        self.machines[p] = machine
        self.crashed.discard(p)
        if contact is not None:
            machine.add_contact(self.now, peer(contact), (addr(contact),))
        self.flush()
        return machine

    def flush(self) -> None:
        busy = True
        while busy:
            busy = False
            for p, machine in list(self.machines.items()):
                if p in self.crashed or p in self.stalled:
                    continue
                for event in machine.take_events():
                    self.events.append((self.now, p, event))
                for o in machine.take_outgoing():
                    busy = True
                    if o.to in self.crashed:
                        machine.peer_unreachable(self.now, o.to)
                    elif o.to in self.stalled:
                        self.stalled[o.to].append((p, o.message))
                    else:
                        self.machines[o.to].receive(self.now, p, PROTOCOL, o.message)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = [
                (d, p)
                for p, m in self.machines.items()
                if p not in self.crashed and p not in self.stalled and (d := m.next_deadline()) is not None
            ]
            if not due or min(due)[0] > end:
                break
            self.now = max(self.now, min(due)[0])
            for deadline, p in sorted(due):
                if deadline <= self.now:
                    self.machines[p].handle_timeout(self.now)
            self.flush()
        self.now = end

    def run_until(self, condition: Callable[[], bool], *, timeout_s: float, step_s: float = 0.01) -> float:
        start = self.now
        while not condition():
            assert self.now - start < timeout_s, "condition not reached in time"
            self.advance(step_s)
        return self.now - start

    def call(self, index: int, action: Callable[[MembershipMachine, float], object]) -> None:
        action(self.machines[peer(index)], self.now)
        self.flush()

    def crash(self, index: int) -> None:
        self.crashed.add(peer(index))

    def stall(self, index: int) -> None:
        self.stalled[peer(index)] = []

    def resume(self, index: int) -> None:
        p = peer(index)
        backlog = self.stalled.pop(p)
        for sender, message in backlog:
            self.machines[p].receive(self.now, sender, PROTOCOL, message)
        self.flush()

    def state(self, observer: int, subject: int) -> MemberState | None:
        return self.machines[peer(observer)].state_of(peer(subject))

    def events_of(self, observer: int, kind: type | None = None, subject: int | None = None) -> list[object]:
        return [
            e
            for _, o, e in self.events
            if o == peer(observer)
            and (kind is None or isinstance(e, kind))
            and (subject is None or getattr(e, "peer", None) == peer(subject))
        ]


# ------------------------------------------------------------------------------------- SWIM core
def test_failed_probe_leads_to_indirect_probe_then_suspicion_then_failure() -> None:
    s = Scripted(LAN, puppets=3)
    x = s.puppets[2]
    s.advance(3.0)
    assert s.machine.state_of(x) is MemberState.ALIVE
    s.silent.add(x)
    t0 = s.now
    s.advance(2 * LAN.probe_interval_s)  # the next heartbeat (x is a link) or probe of x goes unanswered
    pings = [at for at, _ in s.sent_to(x, Ping) if at >= t0]
    assert pings, "x was not pinged"
    first_ping = pings[0]
    requests = [(at, m) for at, to, m in s.sent if isinstance(m, PingReq) and m.target == x]
    assert requests, "no indirect probe after the failed direct probe"
    assert requests[0][0] == pytest.approx(first_ping + LAN.probe_timeout_s)
    relays = {to for at, to, m in s.sent if isinstance(m, PingReq) and m.target == x}
    assert relays == set(s.puppets[:2])  # every other member, never the target itself
    suspected = [e for e in s.events if isinstance(e, PeerSuspected)]
    assert [e.peer for e in suspected] == [x]
    assert suspected[0].at == pytest.approx(first_ping + 3 * LAN.probe_timeout_s)
    # No confirmations from anyone else: the suspicion runs its maximum time.
    n = 4
    k = min(LAN.suspicion_confirmations, n - 2)
    assert k >= 1
    maximum = LAN.suspicion_min_s(n) * LAN.suspicion_max_timeout_mult
    s.advance(maximum - 0.01 - (s.now - suspected[0].at))
    assert s.machine.state_of(x) is MemberState.SUSPECT
    s.advance(1.0)
    failed = [e for e in s.events if isinstance(e, PeerFailed)]
    assert [e.peer for e in failed] == [x]
    assert failed[0].at - suspected[0].at == pytest.approx(maximum)
    assert failed[0].suspected_at == suspected[0].at
    stats = s.machine.statistics()
    assert stats.failures_declared == 1 and stats.suspicions_raised == 1 and stats.indirect_probes_sent >= 2
    # The verdict is gossiped.
    s.advance(1.0)
    piggybacked = [u for _, _, m in s.sent if isinstance(m, (Ping, Gossip)) for u in m.updates]
    assert any(u.kind is UpdateKind.DEAD and u.peer == x for u in piggybacked)


def test_an_indirect_ack_keeps_the_target_alive() -> None:
    s = Scripted(LAN, puppets=3)
    x = s.puppets[2]
    s.advance(3.0)
    s.silent.add(x)
    while not (requests := [(to, m) for _, to, m in s.sent if isinstance(m, PingReq) and m.target == x]):
        s.advance(0.01)
    relay, request = requests[0]
    s.inject(relay, Ack(seq=request.seq))  # the relay reached x where we could not
    s.silent.discard(x)  # (it was a one-way glitch)
    s.advance(3 * LAN.probe_timeout_s)
    assert s.machine.state_of(x) is MemberState.ALIVE
    assert not [e for e in s.events if isinstance(e, PeerSuspected)]


def suspicion_after_hints(origins: list[int | None]) -> tuple[float, list[PeerFailed]]:
    """x (puppet 4 of 5 members) goes silent; puppets 1-3 each send a SUSPECT(x) naming ``origins[i]``
    (None: no origin, i.e. the sender's own verdict). When did the hints start, and who failed x?"""
    s = Scripted(LAN, puppets=4)
    x = s.puppets[3]
    s.advance(2.0)
    s.silent.add(x)
    t0 = s.now
    for p, origin in zip(s.puppets[:3], origins, strict=True):
        author = None if origin is None else peer(origin)
        claim = MemberUpdate(kind=UpdateKind.SUSPECT, peer=x, incarnation=0, origin=author)
        s.inject(p, Gossip(updates=(claim,)))
    s.advance(60.0)
    return t0, [e for e in s.events if isinstance(e, PeerFailed)]


def test_confirmations_shorten_the_suspicion() -> None:
    # Other members' own verdicts make us look (x is silent to us too), and once our own check
    # failed they count as confirmations: the suspicion, dated from the first hint, runs the minimum.
    t0, failed = suspicion_after_hints([None, 2, 3])  # puppets 1-3 are peers 1-3: their own verdicts
    assert len(failed) == 1
    assert failed[0].at - t0 == pytest.approx(LAN.suspicion_min_s(5))  # k = 3 confirmations
    assert failed[0].suspected_at == t0


def test_a_confirmation_counts_only_from_the_suspector_itself() -> None:
    # A hint naming some other origin is relayed hearsay: it may make us look, never shorten our
    # suspicion (issue 20, finding 2: the DEAD check trusted an origin the sender chose).
    t0, failed = suspicion_after_hints([40, 41, 42])
    assert len(failed) == 1
    maximum = LAN.suspicion_min_s(5) * LAN.suspicion_max_timeout_mult
    assert failed[0].at - t0 == pytest.approx(maximum)  # no confirmation counted


def test_a_suspected_member_refutes_with_a_higher_incarnation() -> None:
    r = Router(3, LAN)
    r.advance(5.0)
    x = r.machines[peer(2)]
    assert x.incarnation == 0
    # x stops answering long enough for peer 0's own check to fail, then wakes up.
    r.stall(2)
    r.run_until(lambda: r.state(0, 2) is MemberState.SUSPECT, timeout_s=5)
    r.resume(2)
    r.run_until(lambda: r.state(0, 2) is MemberState.ALIVE and r.state(1, 2) is MemberState.ALIVE, timeout_s=5)
    assert x.incarnation == 1
    assert kinds(r.events_of(0, subject=2)) == ["PeerJoined", "PeerSuspected", "PeerAlive"]
    assert r.machines[peer(0)].member(peer(2)).incarnation == 1  # type: ignore[union-attr]
    assert r.machines[peer(0)].statistics().suspicions_refuted == 1
    assert x.statistics().refutations == 1


def test_a_dead_claim_about_a_live_peer_makes_others_look_not_fail_it() -> None:
    """Issue 20, finding 2: one DEAD message (with any origin) no longer removes a member."""
    r = Router(3, LAN)
    r.advance(5.0)
    m0 = r.machines[peer(0)]
    for origin in (None, peer(1), peer(2)):
        claim = MemberUpdate(kind=UpdateKind.DEAD, peer=peer(2), incarnation=0, origin=origin)
        m0.receive(r.now, peer(1), PROTOCOL, Gossip(updates=(claim,)))
        r.flush()
    r.advance(30.0)
    assert r.state(0, 2) is MemberState.ALIVE
    assert not r.events_of(0, PeerFailed) and not r.events_of(0, PeerSuspected)
    assert m0.statistics().hints_checked == 1  # one look of its own, which x answered
    assert r.machines[peer(2)].incarnation == 0  # nobody believed it: nothing to refute


def test_graceful_leave_removes_the_peer_at_once_and_stale_gossip_cannot_resurrect_it() -> None:
    r = Router(3, LOCAL)
    r.advance(1.0)
    t = r.now
    r.call(2, lambda m, now: m.leave(now))
    for observer in (0, 1):
        left = r.events_of(observer, PeerLeft, 2)
        assert len(left) == 1 and left[0].at == t  # type: ignore[attr-defined]
        assert r.state(observer, 2) is MemberState.LEFT
    assert not r.events_of(0, PeerSuspected, 2)
    r.crash(2)
    r.machines[peer(0)].receive(r.now, peer(1), PROTOCOL, Gossip(updates=(alive(2, 0),)))
    r.advance(2.0)
    assert r.state(0, 2) is MemberState.LEFT
    with pytest.raises(LocalProtocolError):
        r.machines[peer(2)].add_contact(r.now, peer(0), (addr(0),))
    with pytest.raises(LocalProtocolError):
        r.machines[peer(2)].leave(r.now)
    assert r.machines[peer(2)].next_deadline() is None
    # The same PeerID starts again: it refutes "left" and rejoins with a higher incarnation.
    again = r.start(2, contact=0)
    r.run_until(lambda: r.state(0, 2) is MemberState.ALIVE and r.state(1, 2) is MemberState.ALIVE, timeout_s=3)
    assert again.incarnation == 1
    assert kinds(r.events_of(0, subject=2))[-1] == "PeerJoined"


def test_restarted_peer_rejoins_after_being_declared_failed() -> None:
    r = Router(4, LOCAL)
    r.advance(1.0)
    r.crash(3)
    r.run_until(lambda: all(r.state(o, 3) is MemberState.FAILED for o in range(3)), timeout_s=3)
    r.advance(0.5)
    again = r.start(3, contact=1)
    r.run_until(lambda: all(r.state(o, 3) is MemberState.ALIVE for o in range(3)), timeout_s=3)
    assert again.incarnation >= 1
    assert all(again.state_of(peer(o)) is MemberState.ALIVE for o in range(3))


# ------------------------------------------------------------------------------------- links
def test_stalled_peer_takes_its_link_down_and_resuming_brings_it_up() -> None:
    r = Router(3, LOCAL)
    r.advance(1.0)
    assert peer(2) in {link.target for link in r.machines[peer(0)].links() if link.up}
    r.stall(2)
    t0 = r.now
    r.run_until(lambda: bool(r.events_of(0, LinkDown, 2)), timeout_s=1)
    down = r.events_of(0, LinkDown, 2)[0]
    assert down.reason == "timeout"  # type: ignore[attr-defined]
    # Heartbeats every 0.1 s, two misses: down well before the member could be declared failed.
    assert down.at - t0 <= LOCAL.heartbeat_interval_s * (LOCAL.link_down_after_missed + 1)  # type: ignore[attr-defined]
    assert r.state(0, 2) is not MemberState.FAILED
    r.resume(2)
    r.run_until(lambda: bool(r.events_of(0, LinkUp, 2)) and r.events_of(0, LinkUp, 2)[-1].at > down.at, timeout_s=1)  # type: ignore[attr-defined]
    r.run_until(lambda: r.state(0, 2) is MemberState.ALIVE, timeout_s=2)


def test_stalled_peer_is_declared_failed_and_refutes_after_resuming() -> None:
    r = Router(5, LOCAL)
    r.advance(1.0)
    r.stall(4)
    t0 = r.now
    r.run_until(lambda: all(r.state(o, 4) is MemberState.FAILED for o in range(4)), timeout_s=3)
    assert r.now - t0 < 1.0  # local: well under a second
    r.resume(4)
    r.run_until(lambda: all(r.state(o, 4) is MemberState.ALIVE for o in range(4)), timeout_s=2)
    assert r.machines[peer(4)].incarnation >= 1
    # The resumed peer was the one paused: it must not blame the others for its own silence.
    assert not r.events_of(4, PeerSuspected)
    assert r.machines[peer(4)].statistics().local_pauses >= 1


def test_unreachable_peer_takes_the_link_down_at_once_and_starts_a_check() -> None:
    s = Scripted(LOCAL, puppets=3)
    x = s.puppets[2]
    s.advance(0.5)
    assert any(link.target == x and link.up for link in s.machine.links())
    before = len(s.sent)
    s.silent.add(x)
    s.machine.peer_unreachable(s.now, x)
    s.pump()
    downs = [e for e in s.events if isinstance(e, LinkDown)]
    assert [(e.peer, e.reason, e.at) for e in downs] == [(x, "unreachable", s.now)]
    requests = [to for _, to, m in s.sent[before:] if isinstance(m, PingReq) and m.target == x]
    assert sorted(requests) == sorted(s.puppets[:2])  # indirect_probes = 2 in the local profile
    s.advance(3 * LOCAL.probe_timeout_s)
    assert s.machine.state_of(x) is MemberState.SUSPECT


def test_links_are_bounded_and_prefer_low_latency() -> None:
    config = dataclasses.replace(LAN, max_link_degree=2)
    s = Scripted(config, puppets=6)
    s.advance(2.0)
    assert len(s.machine.links()) == 2
    # Puppets 1 and 2 answer after 200 ms, the others after 1 ms: probes measure every member.
    slow = set(s.puppets[:2])
    acks: list[tuple[float, int, PeerID, int]] = []
    order = 0
    while s.now < 60.0:
        deadline = s.machine.next_deadline()
        assert deadline is not None
        if acks and acks[0][0] <= deadline:
            s.now, _, sender, seq = acks.pop(0)
            s.machine.receive(s.now, sender, PROTOCOL, Ack(seq=seq))
        else:
            s.now = deadline
            s.machine.handle_timeout(s.now)
        for o in s.machine.take_outgoing():
            if isinstance(o.message, Ping):
                order += 1
                acks.append((s.now + (0.2 if o.to in slow else 0.001), order, o.to, o.message.seq))
        acks.sort()
        s.events += s.machine.take_events()
    links = s.machine.links()
    assert len(links) == 2 and {link.target for link in links}.isdisjoint(slow)
    assert all(link.rtt_s is not None and link.rtt_s < 0.01 for link in links)


# ------------------------------------------------------------------------------------- joining
def test_join_through_a_contact_and_retry_with_backoff() -> None:
    me = MembershipMachine(identity=identity(0), addrs=(addr(0),), config=LAN, rng=random.Random(1), now=0.0)
    me.add_contact(0.0, peer(1), (addr(1),))
    out = me.take_outgoing()
    assert [type(o.message) for o in out] == [PushPull] and out[0].to == peer(1)
    first = out[0].message
    assert isinstance(first, PushPull) and first.join and first.members[0].peer == peer(0)
    me.peer_unreachable(0.01, peer(1))
    times = []
    now = 0.0
    while now < 200:
        deadline = me.next_deadline()
        assert deadline is not None
        now = deadline
        me.handle_timeout(now)
        for o in me.take_outgoing():
            if isinstance(o.message, PushPull) and o.to == peer(1):
                times.append(now)
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(times)]
    assert len(times) == LAN.join_max_attempts - 1
    assert gaps == sorted(gaps) and gaps[0] == LAN.join_retry_interval_s * 2  # doubling backoff
    assert me.addresses(peer(1)) == ()  # the contact was given up


def test_a_push_pull_reply_makes_the_contacts_members_known() -> None:
    me = MembershipMachine(identity=identity(0), addrs=(addr(0),), config=LAN, rng=random.Random(1), now=0.0)
    me.add_contact(0.0, peer(1), (addr(1),))
    request = me.take_outgoing()[0].message
    assert isinstance(request, PushPull)
    reply = PushPullReply(seq=request.seq, members=(alive(1), alive(2), alive(3, 4)))
    me.receive(0.01, peer(1), PROTOCOL, reply)
    assert [m.peer_id for m in me.members()] == [peer(0), *sorted([peer(1), peer(2), peer(3)])]
    joined = [e for e in me.take_events() if isinstance(e, PeerJoined)]
    assert {e.peer for e in joined} == {peer(1), peer(2), peer(3)}
    assert me.addresses(peer(3)) == (addr(3),)
    assert [str(a) for a in me.dial_addrs(peer(3))] == [addr(3)]
    # A reply nobody asked for is refused.
    me.receive(0.02, peer(2), PROTOCOL, PushPullReply(seq=request.seq, members=(alive(5),)))
    assert me.state_of(peer(5)) is None and me.statistics().rejected_messages == 1


def test_full_state_claims_are_verified_not_believed() -> None:
    r = Router(3, LAN)
    r.advance(5.0)
    m0 = r.machines[peer(0)]
    dead = MemberUpdate(kind=UpdateKind.DEAD, peer=peer(2), incarnation=0)
    m0.receive(r.now, peer(1), PROTOCOL, PushPull(seq=99, join=False, members=(alive(1), dead)))
    r.flush()
    assert not r.events_of(0, PeerSuspected) and not r.events_of(0, PeerFailed)
    # We looked ourselves; the subject answered, and had nothing to refute.
    assert m0.statistics().hints_checked == 1
    assert r.machines[peer(2)].incarnation == 0
    assert m0.state_of(peer(2)) is MemberState.ALIVE


def test_our_own_old_record_elsewhere_is_refuted_and_a_forged_one_ignored() -> None:
    s = Scripted(LAN, puppets=2)
    # Forged (unsigned, or signed by someone else): nobody believes it, so there is nothing to refute.
    s.inject(s.puppets[0], Gossip(updates=(forged_alive(0, 0, ("/ip4/10.9.9.9/tcp/1",)),)))
    assert s.machine.incarnation == 0 and s.machine.statistics().bad_signatures == 1
    # Our own record from before a restart (signed with our key): out-bid it.
    s.inject(s.puppets[0], Gossip(updates=(alive(0, 0, ("/ip4/10.9.9.9/tcp/1",)),)))
    assert s.machine.incarnation == 1
    s.advance(1.0)
    mine = [u for _, _, m in s.sent if isinstance(m, (Ping, Gossip)) for u in m.updates if u.peer == s.me]
    assert mine and mine[-1].incarnation == 1 and mine[-1].addrs == (addr(0),)


# ------------------------------------------------------------------------------------- hostile input
def test_a_flooding_sender_is_rate_limited() -> None:
    s = Scripted(LAN, puppets=2)
    flooder = s.puppets[1]
    s.machine.take_outgoing()
    received_before = s.machine.statistics().rate_limited
    for seq in range(1000):
        s.machine.receive(s.now, flooder, PROTOCOL, Ping(seq=seq))
    acks = [o for o in s.machine.take_outgoing() if isinstance(o.message, Ack) and o.to == flooder]
    stats = s.machine.statistics()
    # The flooder already spent two tokens: introducing itself, and answering our first heartbeat.
    assert len(acks) == LAN.rate_limit_burst - 2
    assert stats.rate_limited - received_before == 1000 - len(acks)
    # Tokens come back at the configured rate; other senders are unaffected.
    s.now += 1.0
    for seq in range(1000, 1100):
        s.machine.receive(s.now, flooder, PROTOCOL, Ping(seq=seq))
    assert len(s.machine.take_outgoing()) == pytest.approx(LAN.rate_limit_msgs_per_s, abs=1)
    s.machine.receive(s.now, s.puppets[0], PROTOCOL, Ping(seq=5))
    assert [o.to for o in s.machine.take_outgoing()] == [s.puppets[0]]


@pytest.mark.parametrize(
    ("update", "counter"),
    [
        (MemberUpdate(kind=UpdateKind.ALIVE, peer=peer(9), incarnation=0, addrs=("garbage",)), "rejected_updates"),
        (MemberUpdate(kind=UpdateKind.ALIVE, peer=peer(9), incarnation=0, addrs=()), "rejected_updates"),
        (
            MemberUpdate(
                kind=UpdateKind.ALIVE, peer=peer(9), incarnation=0, addrs=(f"/ip4/10.0.0.9/tcp/1/p2p/{peer(8)}",)
            ),
            "rejected_updates",
        ),
        (
            MemberUpdate(kind=UpdateKind.ALIVE, peer=peer(9), incarnation=0, addrs=tuple(addr(i) for i in range(20))),
            "rejected_updates",
        ),
        (MemberUpdate(kind=UpdateKind.ALIVE, peer=peer(9), incarnation=1 << 60, addrs=(addr(9),)), "rejected_updates"),
        (MemberUpdate(kind=UpdateKind.ALIVE, peer=peer(9), incarnation=-1, addrs=(addr(9),)), "rejected_updates"),
        (MemberUpdate(kind=UpdateKind.SUSPECT, peer=peer(9), incarnation=0), "ignored_unknown"),
        (MemberUpdate(kind=UpdateKind.DEAD, peer=peer(9), incarnation=0), "ignored_unknown"),
    ],
)
def test_garbage_gossip_is_rejected_and_counted(update: MemberUpdate, counter: str) -> None:
    s = Scripted(LAN, puppets=2)
    before = getattr(s.machine.statistics(), counter)
    s.inject(s.puppets[0], Gossip(updates=(update,)))
    assert getattr(s.machine.statistics(), counter) == before + 1
    assert s.machine.state_of(peer(9)) is None


def test_incarnation_jumps_are_accepted_only_in_the_member_s_own_name() -> None:
    s = Scripted(LAN, puppets=3)
    x = s.puppets[2]
    jump = LAN.max_incarnation_jump + 5
    s.inject(s.puppets[0], Gossip(updates=(forged_alive(3, jump),)))
    assert s.machine.member(x).incarnation == 0  # type: ignore[union-attr]
    assert s.machine.statistics().bad_signatures == 1
    # Signed by x itself: x's own decision, whoever relays it.
    s.inject(s.puppets[0], Gossip(updates=(alive(3, jump),)))
    assert s.machine.member(x).incarnation == jump  # type: ignore[union-attr]


def test_oversized_payloads_are_cut_and_counted_and_foreign_messages_rejected() -> None:
    s = Scripted(LAN, puppets=2)
    cap = LAN.max_gossip_items_per_message
    many = tuple(alive(i) for i in range(10, 10 + cap + 5))
    s.inject(s.puppets[0], Ping(seq=1, updates=many))
    stats = s.machine.statistics()
    assert stats.rejected_updates == 5
    assert [s.machine.state_of(u.peer) for u in many] == [MemberState.ALIVE] * cap + [None] * 5
    assert s.sent_to(s.puppets[0], Ack)  # the PING itself is still answered
    big_state = tuple(alive(i % 200 + 10, i) for i in range(LAN.max_push_pull_members + 7))
    s.inject(s.puppets[0], PushPull(seq=1, join=True, members=big_state))
    assert s.machine.statistics().rejected_updates == 5 + 7
    s.machine.receive(s.now, s.puppets[0], "dht", Ping(seq=1))
    s.machine.receive(s.now, s.me, PROTOCOL, Ping(seq=1))
    s.inject(s.puppets[0], PingReq(seq=1, target=s.me))
    assert s.machine.statistics().rejected_messages == 3


def test_bad_info_records_are_rejected() -> None:
    s = Scripted(LAN, puppets=2)
    x = s.puppets[1]
    bad_values = [
        InfoUpdate(peer=x, version=1, resources=Resources(cpu_cores=-1)),
        InfoUpdate(peer=x, version=1, resources=Resources(train_samples_per_s=math.nan)),
        InfoUpdate(
            peer=x,
            version=1,
            resources=Resources(),
            links=(LinkSummary(peer=peer(0), rtt_s=math.inf, bandwidth_bytes_per_s=0.0, up=True),),
        ),
        InfoUpdate(
            peer=x,
            version=1,
            resources=Resources(),
            links=tuple(
                LinkSummary(peer=peer(0), rtt_s=0.0, bandwidth_bytes_per_s=0.0, up=True)
                for _ in range(LAN.max_links_per_info + 1)
            ),
        ),
        InfoUpdate(peer=x, version=-3, resources=Resources()),
    ]
    for info in bad_values:
        s.inject(s.puppets[0], Gossip(infos=(info,)))
    assert s.machine.statistics().rejected_updates == len(bad_values)
    assert s.machine.member(x).resources is None  # type: ignore[union-attr]
    s.inject(s.puppets[0], Gossip(infos=(InfoUpdate(peer=peer(42), version=1, resources=Resources()),)))
    assert s.machine.statistics().ignored_unknown == 1


def test_a_local_pause_is_not_blamed_on_others() -> None:
    s = Scripted(LAN, puppets=3)
    s.advance(3.0)
    s.now += 30.0  # we were SIGSTOPped: every timer is overdue, every probe "timed out"
    s.machine.handle_timeout(s.now)
    s.pump()
    s.advance(5.0)
    assert not [e for e in s.events if isinstance(e, (PeerSuspected, PeerFailed))]
    assert s.machine.statistics().local_pauses == 1


# ------------------------------------------------------------------------------------- monitor
def test_resources_and_links_spread_to_every_peer() -> None:
    r = Router(4, LOCAL)
    r.advance(1.0)
    r.call(1, lambda m, now: m.set_local_resources(now, cpu_cores=16, memory_bytes=64 << 30, gpus=2))
    r.call(1, lambda m, now: m.set_local_resources(now, train_samples_per_s=250.0))
    r.advance(2 * LOCAL.info_report_interval_s)
    for observer in (0, 2, 3):
        view = r.machines[peer(observer)].member(peer(1))
        assert view is not None and view.resources == Resources(
            cpu_cores=16, memory_bytes=64 << 30, gpus=2, train_samples_per_s=250.0
        )
    topology = r.machines[peer(3)].topology()
    assert {n.peer_id for n in topology.nodes} == set(r.ids)
    sources = {link.source for link in topology.links}
    assert sources == set(r.ids)  # every peer's links, as it reported them
    assert all(link.up and link.rtt_s is not None for link in topology.links if link.source == peer(3))
    with pytest.raises(ConfigError):
        r.machines[peer(1)].set_local_resources(r.now, gpus=-1)


def test_bandwidth_estimates_and_probe_requests() -> None:
    s = Scripted(LAN, puppets=2)
    s.advance(2.0)
    probes = s.machine.take_bandwidth_probes(s.now)
    assert {p.peer for p in probes} == set(s.puppets)
    assert all(p.nbytes == LAN.bandwidth_probe_bytes for p in probes)
    assert s.machine.take_bandwidth_probes(s.now) == []  # asked once per retry interval
    s.machine.record_transfer(s.now, s.puppets[0], 100 << 20, 0.1)  # 1 GiB/s
    s.machine.record_transfer(s.now, s.puppets[0], 1000, 10.0)  # too small to measure bandwidth
    link = {link.target: link for link in s.machine.links()}[s.puppets[0]]
    assert link.bandwidth_bytes_per_s == pytest.approx((100 << 20) / 0.1)
    s.advance(LAN.bandwidth_probe_retry_s)
    assert [p.peer for p in s.machine.take_bandwidth_probes(s.now)] == [s.puppets[1]]
    with pytest.raises(ConfigError):
        s.machine.record_transfer(s.now, s.puppets[0], -1, 1.0)


def test_no_bandwidth_probe_is_asked_for_while_a_bulk_transfer_runs() -> None:
    # Issue 24: every member uploading an 8 MiB probe to a newcomer on the uplink its pull uses
    # slowed the pull; the probes wait until the transfer ends, and nobody counts as asked.
    s = Scripted(LAN, puppets=2)
    s.advance(2.0)
    s.machine.bulk_transfer_started(s.now)
    s.machine.bulk_transfer_started(s.now)  # a pull and a served pull at once
    assert s.machine.probes_paused
    assert s.machine.take_bandwidth_probes(s.now) == []
    s.machine.bulk_transfer_finished(s.now)
    assert s.machine.take_bandwidth_probes(s.now) == []
    s.machine.bulk_transfer_finished(s.now)
    assert not s.machine.probes_paused
    assert {p.peer for p in s.machine.take_bandwidth_probes(s.now)} == set(s.puppets)
    with pytest.raises(LocalProtocolError):
        s.machine.bulk_transfer_finished(s.now)


def test_bandwidth_is_estimated_per_direction() -> None:
    # Issue 24: a newcomer's probe measures its own uplink; a download from a source capped at
    # 20 MB/s must be planned with what was received from it, not with that.
    s = Scripted(LAN, puppets=2)
    s.advance(2.0)
    target = s.puppets[0]
    s.machine.record_transfer(s.now, target, 100 << 20, 0.1)  # our probe: ~1 GB/s up
    assert s.machine.receive_estimate(s.now, target) is None
    s.machine.record_transfer(s.now, target, 200 << 20, 10.0, LinkDirection.RECEIVE)  # a pull: ~21 MB/s
    s.machine.record_transfer(s.now, target, 1000, 1.0, LinkDirection.RECEIVE)  # too small to count
    link = {link.target: link for link in s.machine.links()}[target]
    assert link.bandwidth_bytes_per_s == pytest.approx((100 << 20) / 0.1)  # the probe's, unchanged
    assert link.receive_bytes_per_s == pytest.approx((200 << 20) / 10.0)
    assert s.machine.receive_estimate(s.now, target) == pytest.approx((200 << 20) / 10.0)
    assert s.machine.receive_estimate(s.now, s.puppets[1]) is None
    s.advance(LAN.bandwidth_estimate_max_age_s)
    assert s.machine.receive_estimate(s.now, target) is None  # stale


def test_members_view_is_frozen_and_complete() -> None:
    r = Router(3, LOCAL)
    r.advance(1.0)
    members = r.machines[peer(0)].members()
    assert members[0].peer_id == peer(0) and members[0].is_local
    assert {m.peer_id for m in members} == set(r.ids)
    assert all(m.state is MemberState.ALIVE and m.addrs for m in members)
    with pytest.raises(dataclasses.FrozenInstanceError):
        members[0].incarnation = 5  # type: ignore[misc]


def test_invalid_local_setup_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        MembershipMachine(identity=identity(0), addrs=(), config=LAN, rng=random.Random(1), now=0.0)
    with pytest.raises(ConfigError):
        MembershipMachine(identity=identity(0), addrs=("garbage",), config=LAN, rng=random.Random(1), now=0.0)
    m = MembershipMachine(identity=identity(0), addrs=(addr(0),), config=LAN, rng=random.Random(1), now=0.0)
    with pytest.raises(ConfigError):
        m.add_contact(0.0, peer(1), ("/ip4/999.0.0.1/tcp/1",))
    m.set_local_addrs(0.0, ("/ip4/10.1.1.1/tcp/5",))
    assert m.incarnation == 1 and m.addresses(peer(0)) == ("/ip4/10.1.1.1/tcp/5",)


def test_link_candidates_from_the_dht_are_contacted_and_garbage_is_skipped() -> None:
    s = Scripted(LAN, puppets=2)
    s.machine.offer_link_candidates(
        s.now, [(peer(7), (addr(7),)), (peer(8), ("garbage",)), (peer(9), ()), (s.puppets[0], (addr(1),))]
    )
    s.pump()
    joins = [(to, m) for _, to, m in s.sent if isinstance(m, PushPull)]
    assert [to for to, _ in joins] == [peer(7)]  # known members are not contacted again
    assert s.machine.addresses(peer(7)) == (addr(7),)
    assert s.machine.statistics().rejected_updates == 2


def test_leave_message_from_an_unknown_sender_is_ignored() -> None:
    s = Scripted(LAN, puppets=1)
    s.inject(peer(30), Leave(incarnation=0))
    assert s.machine.state_of(peer(30)) is None
    assert s.machine.statistics().ignored_unknown == 1
