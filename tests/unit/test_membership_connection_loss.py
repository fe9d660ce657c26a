"""A member's host closing our last connection to it: a first-hand hint, checked at once (issue 19).

The check goes out in the same instant (a direct PING, which makes the driver dial again, and
PING_REQs to the relays), and it fails the member without a suspicion only when it is conclusive:
the driver could not reach it *and* every relay answered NACK. Anything short of that -- an ACK,
direct or relayed, a relay that stays silent, a dial that works -- leaves the member alive or on the
ordinary path (suspicion first). Harnesses from ``test_membership_machine``.
"""

from __future__ import annotations

from chaosp2p.protocols.membership import MemberState, PeerFailed, PeerSuspected
from chaosp2p.protocols.membership.messages import Ack, Nack, Ping, PingReq
from tests.unit.membership_claims import peer
from tests.unit.test_membership_machine import LAN, Router, Scripted


def lost(s: Scripted, target: int) -> tuple[int, list[PingReq]]:
    """Report the loss of the connection to puppet ``target`` (silent); the direct PING's seq and the
    PING_REQs that went out with it."""
    x = s.puppets[target]
    s.silent.add(x)
    before = len(s.sent)
    s.machine.connection_lost(s.now, x)
    s.pump()
    pings = [m for _, to, m in s.sent[before:] if to == x and isinstance(m, Ping)]
    requests = [m for _, to, m in s.sent[before:] if isinstance(m, PingReq) and m.target == x]
    assert len(pings) == 1
    return pings[0].seq, requests


def relays_of(s: Scripted, target: int, since: int = 0) -> list[tuple[object, PingReq]]:
    x = s.puppets[target]
    return [(to, m) for _, to, m in s.sent[since:] if isinstance(m, PingReq) and m.target == x]


def test_a_lost_connection_starts_direct_and_indirect_probes_at_once() -> None:
    s = Scripted(LAN, puppets=4)
    s.advance(3.0)
    seq, requests = lost(s, 3)
    # No probe timeout waited for: the relays are asked in the same instant as the member itself.
    assert len(requests) == LAN.indirect_probes
    assert all(r.seq == seq for r in requests)
    assert s.machine.statistics().connection_losses == 1


def test_a_dead_member_fails_at_once_when_the_dial_fails_and_every_relay_nacks() -> None:
    s = Scripted(LAN, puppets=4)
    s.advance(3.0)
    x = s.puppets[3]
    s.silent.update(s.puppets)  # the relays' NACKs are sent by hand below
    seq, requests = lost(s, 3)
    relays = [to for to, _ in relays_of(s, 3)]
    s.machine.peer_unreachable(s.now, x)  # the driver's dial was refused
    s.pump()
    assert s.machine.state_of(x) is MemberState.ALIVE  # still waiting for the relays
    for relay in relays[:-1]:
        s.inject(relay, Nack(seq=seq))
    assert s.machine.state_of(x) is MemberState.ALIVE
    s.inject(relays[-1], Nack(seq=seq))
    assert s.machine.state_of(x) is MemberState.FAILED
    failed = [e for e in s.events if isinstance(e, PeerFailed)]
    assert [(e.peer, e.at) for e in failed] == [(x, s.now)]
    assert s.machine.statistics().failures_on_loss == 1
    assert len(requests) == len(relays)


def test_nacks_before_the_refused_dial_also_conclude() -> None:
    s = Scripted(LAN, puppets=3)
    s.advance(3.0)
    x = s.puppets[2]
    lost(s, 2)  # the other puppets NACK at once (pump)
    assert s.machine.state_of(x) is MemberState.ALIVE
    s.machine.peer_unreachable(s.now, x)
    s.pump()
    assert s.machine.state_of(x) is MemberState.FAILED


def test_a_live_member_that_answers_the_new_dial_stays_alive() -> None:
    s = Scripted(LAN, puppets=3)
    s.advance(3.0)
    x = s.puppets[2]
    seq, _ = lost(s, 2)  # relays NACK (they cannot reach it either, say)...
    s.inject(x, Ack(seq=seq))  # ... but our new connection to it works
    s.silent.discard(x)
    s.advance(10.0)
    assert s.machine.state_of(x) is MemberState.ALIVE
    assert not [e for e in s.events if isinstance(e, (PeerSuspected, PeerFailed))]


def test_a_relayed_ack_keeps_it_alive_even_when_our_dial_fails() -> None:
    s = Scripted(LAN, puppets=3)
    s.advance(3.0)
    x = s.puppets[2]
    s.silent.update(s.puppets)
    seq, _ = lost(s, 2)
    relays = [to for to, _ in relays_of(s, 2)]
    s.machine.peer_unreachable(s.now, x)
    s.inject(relays[0], Ack(seq=seq))  # a relay reached it: the trouble is on our path
    for relay in relays[1:]:
        s.inject(relay, Nack(seq=seq))
    s.silent.clear()
    s.advance(10.0)
    assert s.machine.state_of(x) is MemberState.ALIVE
    assert not [e for e in s.events if isinstance(e, (PeerSuspected, PeerFailed))]


def test_without_a_refused_dial_the_check_takes_the_ordinary_path() -> None:
    # The relays NACK, but our own PING just goes unanswered (a stalled process, a lost packet):
    # not conclusive, so suspicion first, as without the hint.
    s = Scripted(LAN, puppets=3)
    s.advance(3.0)
    x = s.puppets[2]
    lost(s, 2)
    s.advance(2 * LAN.probe_timeout_s + 0.01)
    assert s.machine.state_of(x) is MemberState.SUSPECT
    assert s.machine.statistics().failures_on_loss == 0


def test_no_relays_no_early_verdict() -> None:
    s = Scripted(LAN, puppets=1)
    s.advance(3.0)
    x = s.puppets[0]
    lost(s, 0)
    s.machine.peer_unreachable(s.now, x)
    s.pump()
    assert s.machine.state_of(x) is MemberState.ALIVE  # nobody else could confirm it
    s.advance(2 * LAN.probe_timeout_s + 0.01)
    assert s.machine.state_of(x) is MemberState.SUSPECT


def test_one_loss_check_per_member_per_probe_interval() -> None:
    s = Scripted(LAN, puppets=3)
    s.advance(3.0)
    x = s.puppets[2]
    seq, _ = lost(s, 2)
    s.inject(x, Ack(seq=seq))
    s.silent.discard(x)
    before = len(s.sent)
    s.machine.connection_lost(s.now, x)  # it closes again at once: no second check
    s.pump()
    assert not relays_of(s, 2, before)
    s.advance(LAN.probe_interval_s)
    before = len(s.sent)
    s.machine.connection_lost(s.now, x)
    s.pump()
    assert relays_of(s, 2, before)


def test_kill_9_every_survivor_fails_it_with_no_time_passing() -> None:
    # Four real machines, lan timers, zero latency: the survivors' connections to the killed one
    # close, and each fails it itself, before any timer could fire (today: seconds of suspicion).
    r = Router(4, LAN)
    r.run_until(lambda: all(r.state(o, p) is MemberState.ALIVE for o in range(4) for p in range(4)), timeout_s=30)
    r.advance(3.0)
    r.crash(3)
    for observer in range(3):
        r.call(observer, lambda m, now: m.connection_lost(now, peer(3)))
    assert all(r.state(o, 3) is MemberState.FAILED for o in range(3))
    r.advance(30.0)
    assert all(r.state(o, p) is MemberState.ALIVE for o in range(3) for p in range(3))
    assert not [e for _, o, e in r.events if isinstance(e, (PeerSuspected, PeerFailed)) and e.peer != peer(3)]


def test_losses_between_live_members_fail_no_one() -> None:
    r = Router(4, LAN)
    r.run_until(lambda: all(r.state(o, p) is MemberState.ALIVE for o in range(4) for p in range(4)), timeout_s=30)
    start = r.now
    for round_ in range(40):
        for observer in range(4):
            target = (observer + 1 + round_ % 3) % 4
            r.call(observer, lambda m, now, t=target: m.connection_lost(now, peer(t)))
        r.advance(0.37)
    assert all(r.state(o, p) is MemberState.ALIVE for o in range(4) for p in range(4))
    assert not [e for at, _, e in r.events if at >= start and isinstance(e, (PeerSuspected, PeerFailed))]


def test_two_killed_at_once_are_both_failed_at_once() -> None:
    # Each dead member may be picked as a relay for the other's check: a relay we cannot reach
    # never NACKs, so it is replaced by a live one instead of holding the check to its deadline.
    r = Router(6, LAN)
    r.run_until(lambda: all(r.state(o, p) is MemberState.ALIVE for o in range(6) for p in range(6)), timeout_s=30)
    r.advance(3.0)
    r.crash(4)
    r.crash(5)
    for observer in range(4):
        for victim in (4, 5):
            r.call(observer, lambda m, now, v=victim: m.connection_lost(now, peer(v)))
    assert all(r.state(o, v) is MemberState.FAILED for o in range(4) for v in (4, 5))
    dead = (peer(4), peer(5))
    assert not [e for _, o, e in r.events if isinstance(e, (PeerSuspected, PeerFailed)) and e.peer not in dead]


def test_a_relay_that_is_dead_too_stops_counting() -> None:
    s = Scripted(LAN, puppets=4)  # indirect_probes = 3: the relays are puppets 1-3
    s.advance(3.0)
    x, dead_relay = s.puppets[3], s.puppets[2]
    s.silent.update(s.puppets)
    seq, _ = lost(s, 3)
    relays = [to for to, _ in relays_of(s, 3)]
    assert dead_relay in relays
    s.machine.peer_unreachable(s.now, x)
    for relay in relays:
        if relay != dead_relay:
            s.inject(relay, Nack(seq=seq))
    assert s.machine.state_of(x) is MemberState.ALIVE  # the dead relay owes its NACK
    s.machine.peer_unreachable(s.now, dead_relay)  # our PING_REQ to it could not be delivered
    s.pump()
    assert s.machine.state_of(x) is MemberState.FAILED
