"""Gossip cannot decide: regression tests for issue 20 (findings 2, 7 and 8), on the sans-I/O machine.

One real machine (peer 0) is fed messages as a dishonest member or an outsider would send them;
``Router`` (from ``test_membership_machine``) joins a few real machines when the test needs the
victim to answer for itself.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from chaosp2p.protocols.membership import PROTOCOL, MembershipConfig, MembershipMachine, MemberState
from chaosp2p.protocols.membership.config import MAX_INCARNATION
from chaosp2p.protocols.membership.messages import (
    Gossip,
    InfoUpdate,
    MemberUpdate,
    Ping,
    PushPull,
    Resources,
    UpdateKind,
    codec,
)
from chaosp2p.protocols.membership.signing import alive_payload
from chaosp2p.wire.identity import Identity
from tests.unit.membership_claims import addr, alive, forged_alive, identity, info, left, peer
from tests.unit.test_membership_machine import Router, Scripted

LAN = MembershipConfig.lan()
B = 2  # the honest member under attack (puppet 2 of ``Scripted``, peer 2 of ``Router``)


def member_events(s: Scripted, subject: int) -> list[str]:
    """Names of the member events (not link events) about ``subject``."""
    return [
        type(e).__name__
        for e in s.events
        if getattr(e, "peer", None) == peer(subject) and not type(e).__name__.startswith("Link")
    ]


# ------------------------------------------------------------------------------------- finding 2
def test_a_forged_left_removes_no_one() -> None:
    """Issue 20, finding 2: one unsigned LEFT(B), from a non-member or a member, removed B."""
    s = Scripted(LAN, puppets=3)
    unsigned = MemberUpdate(kind=UpdateKind.LEFT, peer=peer(B), incarnation=0)
    wrong_key = dataclasses.replace(left(3, 0), peer=peer(B))  # signed, but by peer 3
    s.inject(peer(30), Gossip(updates=(unsigned,)))  # an outsider
    s.inject(peer(1), Gossip(updates=(unsigned, wrong_key)))  # a member
    s.inject(peer(1), PushPull(seq=1, join=False, members=(alive(1), unsigned)))
    s.advance(10.0)
    assert s.machine.state_of(peer(B)) is MemberState.ALIVE
    assert "PeerLeft" not in member_events(s, B)
    assert s.machine.statistics().bad_signatures >= 2
    # B's own goodbye, relayed by anyone, is believed: only a member may say it left.
    s.inject(peer(1), Gossip(updates=(left(B, 0),)))
    assert s.machine.state_of(peer(B)) is MemberState.LEFT and member_events(s, B)[-1] == "PeerLeft"


@pytest.mark.parametrize("origin", [None, 1, 2, 40])
def test_a_dead_claim_fails_no_one_whatever_origin_it_names(origin: int | None) -> None:
    """Issue 20, finding 2: DEAD(B) was believed unless its sender-chosen ``origin`` looked cut off."""
    s = Scripted(LAN, puppets=3)
    s.advance(2.0)
    claim = MemberUpdate(
        kind=UpdateKind.DEAD, peer=peer(B), incarnation=0, origin=None if origin is None else peer(origin)
    )
    s.inject(peer(1), Gossip(updates=(claim,)))
    s.inject(peer(1), PushPull(seq=1, join=False, members=(alive(1), claim)))
    s.advance(30.0)
    assert s.machine.state_of(peer(B)) is MemberState.ALIVE
    assert member_events(s, B) == ["PeerJoined"]  # not even suspected: B answered our own look
    assert s.machine.statistics().hints_checked == 1


def test_a_verdict_near_the_largest_incarnation_cannot_pin_a_member() -> None:
    """Issue 20, finding 2: SUSPECT(B, huge) then DEAD(B, huge - 1) pinned B failed for good."""
    r = Router(3, LAN)
    r.advance(5.0)
    b, observer = r.machines[peer(B)], r.machines[peer(0)]
    huge = MAX_INCARNATION - 2
    suspect = MemberUpdate(kind=UpdateKind.SUSPECT, peer=peer(B), incarnation=huge)
    b.receive(r.now, peer(1), PROTOCOL, Gossip(updates=(suspect,)))
    r.flush()
    assert b.incarnation <= LAN.max_incarnation_jump  # B refused to jump to the top
    for inc in (huge - 1, huge + 1, b.incarnation):
        dead = MemberUpdate(kind=UpdateKind.DEAD, peer=peer(B), incarnation=inc, origin=peer(1))
        observer.receive(r.now, peer(1), PROTOCOL, Gossip(updates=(dead,)))
        b.receive(r.now, peer(1), PROTOCOL, Gossip(updates=(dead,)))
        r.flush()
    r.advance(60.0)
    assert r.state(0, B) is MemberState.ALIVE and r.state(1, B) is MemberState.ALIVE
    assert [type(e).__name__ for e in r.events_of(0, subject=B) if "Link" not in type(e).__name__] == ["PeerJoined"]
    assert b.incarnation <= 2 * LAN.max_incarnation_jump + 2


def test_repeated_verdicts_about_us_raise_our_incarnation_once_per_probe_interval() -> None:
    """Issue 20, finding 2 (capped jumps): each claim at our incarnation made us refute, at any rate."""
    s = Scripted(LAN, puppets=2)
    for _ in range(50):
        mine = s.machine.incarnation
        s.inject(peer(1), Gossip(updates=(MemberUpdate(kind=UpdateKind.DEAD, peer=s.me, incarnation=mine),)))
    assert s.machine.incarnation == 1
    s.advance(LAN.probe_interval_s * 3.5)
    assert s.machine.incarnation <= 4  # the put-off refutation, once per probe tick
    assert s.machine.statistics().refutations == s.machine.incarnation


# ------------------------------------------------------------------------------------- finding 8
def test_unsigned_alive_gossip_cannot_move_a_member_to_another_address() -> None:
    """Issue 20, finding 8: forged ALIVE records sent peers to probe a third party's address."""
    s = Scripted(LAN, puppets=3)
    third_party = ("/ip4/203.0.113.7/tcp/80",)
    s.inject(peer(1), Gossip(updates=(forged_alive(B, 1, third_party),)))
    s.inject(peer(30), Gossip(updates=(forged_alive(B, 1, third_party),)))
    s.inject(peer(1), Gossip(updates=(dataclasses.replace(alive(3, 1), peer=peer(B)),)))  # peer 3's signature
    member = s.machine.member(peer(B))
    assert member is not None and member.addrs == (addr(B),) and member.incarnation == 0
    assert s.machine.addresses(peer(B)) == (addr(B),)
    s.advance(10.0)
    stats = s.machine.statistics()
    assert stats.bad_signatures == 2 and stats.ignored_from_strangers == 1  # the outsider's: not even checked
    assert s.machine.addresses(peer(B)) == (addr(B),)
    # B's own move (signed by B) is believed from anyone.
    s.inject(peer(1), Gossip(updates=(alive(B, 1, third_party),)))
    assert s.machine.addresses(peer(B)) == third_party


def test_made_up_members_cannot_shut_real_newcomers_out() -> None:
    """Issue 20, finding 8: ALIVE gossip about made-up members filled the table; newcomers were refused."""
    config = dataclasses.replace(LAN, max_members=20)
    s = Scripted(config, puppets=3)
    rng = random.Random(5)
    fakes = []
    for i in range(60):  # a dishonest member vouches for 60 made-up (validly signed) identities
        fake = Identity.from_seed(rng.randbytes(32))
        record = dataclasses.replace(alive(100 + i), peer=fake.peer_id)
        record = dataclasses.replace(record, signature=fake.sign(alive_payload(fake.peer_id, 0, record.addrs)))
        fakes.append(record)
    for batch in range(0, 60, 10):
        s.inject(peer(1), Gossip(updates=tuple(fakes[batch : batch + 10])))
    assert len(s.machine.members()) <= config.max_members + 1
    # A newcomer that contacts us itself gets in; so does one an honest member vouches for.
    s.inject(peer(50), PushPull(seq=7, join=True, members=(alive(50),)))
    s.inject(peer(3), Gossip(updates=(alive(51),)))
    assert s.machine.state_of(peer(50)) is MemberState.ALIVE
    assert s.machine.state_of(peer(51)) is MemberState.ALIVE
    assert len(s.machine.members()) <= config.max_members + 1
    assert all(s.machine.state_of(peer(i)) is MemberState.ALIVE for i in (1, 2, 3))  # members kept
    assert s.machine.statistics().evicted_unvouched >= 2


def test_strangers_may_speak_only_for_themselves() -> None:
    """Issue 20, finding 8: a non-member's gossip introduced (and addressed) anyone it liked."""
    s = Scripted(LAN, puppets=2)
    s.inject(peer(30), Gossip(updates=(alive(30), alive(31), alive(32))))
    assert s.machine.state_of(peer(30)) is MemberState.ALIVE  # itself: a join
    assert s.machine.state_of(peer(31)) is None and s.machine.state_of(peer(32)) is None
    hint = MemberUpdate(kind=UpdateKind.SUSPECT, peer=peer(1), incarnation=0)
    s.inject(peer(33), Gossip(updates=(hint,)))
    assert s.machine.statistics().ignored_from_strangers == 3  # two introductions, one hint
    assert s.machine.statistics().hints_checked == 0


def test_forged_info_records_are_refused_and_cannot_pin_our_version() -> None:
    """Issue 20, finding 8 (claims about a member's resources): info records are the owner's to sign."""
    s = Scripted(LAN, puppets=2)
    forged = InfoUpdate(peer=peer(1), version=5, resources=Resources(gpus=64))
    s.inject(peer(2), Gossip(infos=(forged,)))
    s.inject(peer(2), Gossip(infos=(dataclasses.replace(info(2, 5, Resources(gpus=64)), peer=peer(1)),)))
    assert s.machine.member(peer(1)).resources is None  # type: ignore[union-attr]
    ours = s.machine.member(s.me).info_version  # type: ignore[union-attr]
    s.inject(peer(2), Gossip(infos=(InfoUpdate(peer=s.me, version=MAX_INCARNATION - 2, resources=Resources()),)))
    assert s.machine.member(s.me).info_version == ours  # type: ignore[union-attr]
    s.inject(peer(2), Gossip(infos=(info(1, 5, Resources(gpus=2)),)))
    assert s.machine.member(peer(1)).resources == Resources(gpus=2)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------- checking costs
def test_each_claim_is_checked_once_and_a_forger_pays_from_its_own_budget() -> None:
    """Issue 20, finding 7: limits before work -- one check per claim, a cache of bad ones, a budget."""
    config = dataclasses.replace(LAN, verify_burst=20.0, verify_rate_per_s=1.0)
    s = Scripted(config, puppets=2)
    checked = s.machine.statistics().signatures_verified
    for _ in range(20):
        s.inject(peer(1), Gossip(updates=(alive(1), alive(7, 3))))
    assert s.machine.statistics().signatures_verified == checked + 1  # alive(7, 3): once; alive(1): held
    forged = dataclasses.replace(alive(8, 0), signature=bytes(64))
    for _ in range(20):
        s.inject(peer(1), Gossip(updates=(forged,)))
    stats = s.machine.statistics()
    assert stats.signatures_verified == checked + 2 and stats.bad_signatures == 20  # the bad outcome is cached
    for i in range(40):  # distinct forgeries: each costs a check, from the sender's budget only
        s.inject(peer(1), Gossip(updates=(dataclasses.replace(alive(9, i), signature=bytes([i + 1]) * 64),)))
    stats = s.machine.statistics()
    assert stats.verify_limited > 0 and stats.signatures_verified <= checked + 2 + 20
    s.inject(peer(2), Gossip(updates=(alive(10),)))  # another sender still has its budget
    assert s.machine.state_of(peer(10)) is MemberState.ALIVE


def test_messages_are_refused_before_decoding_when_too_big_or_over_budget() -> None:
    """Issue 20, finding 7: membership messages were decoded (0.1 s per MiB) before the rate limit."""
    config = dataclasses.replace(LAN, rate_limit_bytes_per_s=1000.0, rate_limit_burst_bytes=float(1 << 20))
    machine = MembershipMachine(identity=identity(0), addrs=(addr(0),), config=config, rng=random.Random(1), now=0.0)
    big_gossip = codec.encode(Gossip(updates=tuple(alive(i) for i in range(1, 900))))
    assert len(big_gossip) > config.max_datagram_bytes
    assert not machine.admit(0.0, peer(1), big_gossip)  # over the size cap of its type
    state = codec.encode(PushPull(seq=1, join=False, members=tuple(alive(i) for i in range(1, 900))))
    assert config.max_datagram_bytes < len(state) <= config.max_push_pull_bytes
    admitted = sum(machine.admit(0.0, peer(2), state) for _ in range(20))
    assert admitted == (1 << 20) // len(state)  # the byte budget: a burst, then nothing
    ping = codec.encode(Ping(seq=1))
    assert sum(machine.admit(0.0, peer(3), ping) for _ in range(500)) == LAN.rate_limit_burst
    stats = machine.statistics()
    assert stats.rejected_messages == 1 and stats.rate_limited == (20 - admitted) + (500 - 100)
    assert machine.admit(0.0, peer(4), ping)  # other senders are unaffected
    assert not machine.admit(0.0, peer(0), ping)  # ourselves: refused
