"""Hole punching, the pure pieces: the coordination machine between two sides (a byte-free pipe of
messages), the choice of handshake roles, and which of the other side's addresses we dial."""

from __future__ import annotations

import itertools

import pytest

from chaosp2p.errors import LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.holepunch import (
    Connect,
    HolePunchConfig,
    Outcome,
    PunchMachine,
    PunchState,
    Refusal,
    Result,
    Role,
    Sync,
    decide,
)
from chaosp2p.transport.holepunch import dialable
from chaosp2p.wire.identity import Identity

A, B = sorted((Identity.from_seed(bytes([seed]) * 32).peer_id for seed in (1, 2)), key=lambda p: p.raw)
CONFIG = HolePunchConfig(answer_timeout_s=5.0, connect_timeout_s=3.0)


def pair(now: float = 0.0) -> tuple[PunchMachine, PunchMachine]:
    initiator = PunchMachine(
        initiator=True, local_peer=A, remote_peer=B, local_addrs=["/ip4/198.18.0.11/tcp/4001"], config=CONFIG, now=now
    )
    responder = PunchMachine(
        initiator=False, local_peer=B, remote_peer=A, local_addrs=["/ip4/198.18.0.12/tcp/4001"], config=CONFIG, now=now
    )
    return initiator, responder


def test_the_exchange_synchronises_both_dials_and_agrees_on_roles() -> None:
    i, r = pair()
    connect = i.start(0.0)
    assert connect == Connect(addrs=("/ip4/198.18.0.11/tcp/4001",)) and i.state is PunchState.AWAIT_CONNECT
    [answer] = r.receive(connect, 0.05)
    assert r.remote_addrs == ("/ip4/198.18.0.11/tcp/4001",) and r.state is PunchState.AWAIT_SYNC
    [sync] = i.receive(answer, 0.1)  # round trip 0.1 s
    assert isinstance(sync, Sync) and i.rtt_s == pytest.approx(0.1)
    assert i.dial_at == pytest.approx(0.15)  # half a round trip later: when the SYNC reaches r
    assert not i.dial_due(0.14)
    assert r.receive(sync, 0.15) == [] and r.dial_due(0.15)
    assert i.dial_due(0.16) and i.state is PunchState.DIALING
    ri = i.dialed(Outcome.CONNECTED, 0.2)
    rr = r.dialed(Outcome.CONNECTED, 0.2)
    r.receive(ri, 0.25)
    i.receive(rr, 0.25)
    assert (i.state, r.state) == (PunchState.DONE, PunchState.DONE)
    assert (i.role, r.role) == (Role.INITIATE, Role.RESPOND)  # A has the smaller PeerID


def test_a_result_that_arrives_before_our_own_attempt_ends_is_kept() -> None:
    i, r = pair()
    r.receive(i.start(0.0), 0.0)
    i.receive(Connect(addrs=()), 0.1)
    r.receive(Sync(), 0.15)
    assert r.dial_due(0.15) and i.dial_due(0.16)
    i.receive(r.dialed(Outcome.TAKEN, 0.16), 0.17)  # theirs first
    assert i.state is PunchState.DIALING and i.role is None
    i.dialed(Outcome.CONNECTED, 0.2)
    assert i.state is PunchState.DONE and i.role is Role.INITIATE


def test_roles_are_complementary_for_every_pair_of_outcomes() -> None:
    attempts = (Outcome.CONNECTED, Outcome.TAKEN, Outcome.FAILED)
    for ours, theirs in itertools.product(attempts, attempts):
        mine, other = decide(ours, theirs, A, B), decide(theirs, ours, B, A)
        if Role.FAIL in (mine, other):
            assert mine is other is Role.FAIL, (ours, theirs)
        else:
            assert {mine, other} in ({Role.INITIATE, Role.RESPOND}, {Role.INITIATE, Role.AWAIT_INBOUND})
    assert decide(Outcome.CONNECTED, Outcome.TAKEN, B, A) is Role.INITIATE  # whoever's socket connected
    assert decide(Outcome.TAKEN, Outcome.CONNECTED, A, B) is Role.AWAIT_INBOUND


def test_a_refusal_ends_the_punch_at_once() -> None:
    i, _ = pair()
    i.start(0.0)
    assert i.receive(Result(outcome=Outcome.REFUSED), 0.1) == []
    assert i.state is PunchState.FAILED and i.role is Role.FAIL and "refused" in i.failure


def test_a_refusal_for_a_symmetric_nat_says_so_and_an_unknown_reason_is_unspecified() -> None:
    i, _ = pair()
    i.start(0.0)
    assert i.receive(Result(outcome=Outcome.REFUSED, reason=Refusal.PORTS_CHANGED), 0.1) == []
    assert i.role is Role.FAIL and i.refusal is Refusal.PORTS_CHANGED
    assert "changes source ports" in i.failure and "cannot work" in i.failure
    i, _ = pair()
    i.start(0.0)
    i.receive(Result(outcome=Outcome.REFUSED, reason=999), 0.1)  # a newer peer's reason
    assert i.refusal is Refusal.UNSPECIFIED and "refused" in i.failure


def test_a_silent_other_side_fails_the_punch_at_the_deadline() -> None:
    i, r = pair()
    i.start(0.0)
    assert i.next_deadline() == CONFIG.answer_timeout_s
    i.handle_timeout(4.9)
    assert i.state is PunchState.AWAIT_CONNECT
    i.handle_timeout(5.0)
    assert i.role is Role.FAIL and i.next_deadline() is None
    r.receive(Connect(addrs=()), 0.0)
    r.handle_timeout(5.0)
    assert r.role is Role.FAIL


def test_out_of_order_messages_are_errors() -> None:
    i, r = pair()
    with pytest.raises(LocalProtocolError):
        r.receive(Sync(), 0.0)  # SYNC before CONNECT
    with pytest.raises(LocalProtocolError):
        i.receive(Connect(addrs=()), 0.0)  # the initiator has not sent its CONNECT
    with pytest.raises(RemoteProtocolError):
        r.receive(Result(outcome=Outcome.REFUSED), 0.0)  # REFUSED is the responder's, not the initiator's
    r.receive(Connect(addrs=()), 0.0)
    with pytest.raises(LocalProtocolError):
        r.receive(Connect(addrs=()), 0.0)  # twice
    with pytest.raises(LocalProtocolError):
        r.dialed(Outcome.CONNECTED, 0.0)  # before the SYNC


@pytest.mark.parametrize(
    ("addr", "loopback", "kept"),
    [
        ("/ip4/198.18.0.12/tcp/4001", False, True),
        ("/ip4/198.18.0.12/tcp/4001/p2p/" + str(B), False, True),
        ("/ip4/198.18.0.12/tcp/0", False, False),
        ("/ip4/0.0.0.0/tcp/4001", False, False),
        ("/ip4/224.0.0.1/tcp/4001", False, False),
        ("/ip4/127.0.0.1/tcp/4001", False, False),  # our loopback is not the other peer's
        ("/ip4/127.0.0.1/tcp/4001", True, True),  # unless the relay itself is on our loopback
        ("/dns/example.org/tcp/4001", False, False),
        ("nonsense", False, False),
    ],
)
def test_which_addresses_of_the_other_side_are_dialed(addr: str, loopback: bool, kept: bool) -> None:
    assert bool(dialable([addr], loopback=loopback, limit=4)) is kept


def test_at_most_max_dial_addrs_distinct_addresses_are_dialed() -> None:
    addrs = [f"/ip4/198.18.0.12/tcp/{port}" for port in (1, 1, 2, 3, 4, 5, 6)]
    assert [a.port for a in dialable(addrs, loopback=False, limit=4)] == [1, 2, 3, 4]
