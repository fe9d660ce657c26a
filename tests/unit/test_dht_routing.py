"""Routing table: bucket placement, XOR ordering, and liveness-based eviction."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.dht.keys import bucket_index, node_id
from chaosp2p.dht.routing import RoutingTable
from chaosp2p.wire.identity import PeerID


def fake_peer(n: int) -> PeerID:
    # Routing needs ids only, not working keys, so any 32 bytes make a PeerID here.
    return PeerID.from_public_bytes(hashlib.sha256(b"routing-test/%d" % n).digest())


OWN = fake_peer(0)
OWN_ID = node_id(OWN)


def peers_in_bucket(index: int, count: int, start: int = 1) -> list[PeerID]:
    out: list[PeerID] = []
    n = start
    while len(out) < count:
        peer = fake_peer(n)
        if bucket_index(OWN_ID, node_id(peer)) == index:
            out.append(peer)
        n += 1
    return out


def addr(n: int) -> tuple[str, ...]:
    return (f"/ip4/10.0.0.{n % 250 + 1}/tcp/{4000 + n}",)


def test_bucket_index_is_highest_differing_bit() -> None:
    assert bucket_index(0b1000, 0b1001) == 0
    assert bucket_index(0b1000, 0b0000) == 3
    assert bucket_index(5, 5) == -1


def test_fills_bucket_up_to_k_then_starts_an_eviction_check() -> None:
    table = RoutingTable(OWN, k=4)
    first = peers_in_bucket(255, 6)
    for i, peer in enumerate(first[:4]):
        assert table.seen(float(i), peer, addr(i)) is None
    assert [e.peer_id for e in table.bucket(255)] == first[:4]
    # The fifth contender triggers a ping of the least-recently seen entry; it is not admitted yet.
    assert table.seen(10.0, first[4], addr(4)) == first[0]
    assert first[4] not in table
    assert table.pending_check(255) == (first[0], first[4])
    # While the check runs, further newcomers wait in the replacement cache.
    assert table.seen(11.0, first[5], addr(5)) is None
    assert [e.peer_id for e in table.replacements(255)] == [first[5]]


def test_lrs_that_answers_stays_and_newcomer_is_only_cached() -> None:
    table = RoutingTable(OWN, k=3)
    peers = peers_in_bucket(255, 4)
    for i, peer in enumerate(peers[:3]):
        table.seen(float(i), peer, addr(i))
    assert table.seen(5.0, peers[3], addr(3)) == peers[0]
    table.seen(6.0, peers[0], ())  # the ping answer: any message from it counts
    assert table.pending_check(255) is None
    assert [e.peer_id for e in table.bucket(255)] == [peers[1], peers[2], peers[0]]
    assert peers[3] not in table
    assert [e.peer_id for e in table.replacements(255)] == [peers[3]]
    assert table.evictions == 0


def test_lrs_that_fails_is_replaced_by_the_newcomer() -> None:
    table = RoutingTable(OWN, k=3)
    peers = peers_in_bucket(255, 4)
    for i, peer in enumerate(peers[:3]):
        table.seen(float(i), peer, addr(i))
    lrs = table.seen(5.0, peers[3], addr(3))
    assert lrs == peers[0]
    assert table.check_failed(lrs)
    assert peers[0] not in table
    assert [e.peer_id for e in table.bucket(255)] == [peers[1], peers[2], peers[3]]
    assert table.evictions == 1


def test_check_failed_for_a_peer_not_under_check_does_nothing() -> None:
    table = RoutingTable(OWN, k=3)
    peers = peers_in_bucket(255, 3)
    for i, peer in enumerate(peers):
        table.seen(float(i), peer, addr(i))
    assert not table.check_failed(peers[1])
    assert len(table) == 3


def test_removed_entry_is_refilled_from_the_replacement_cache() -> None:
    table = RoutingTable(OWN, k=2)
    peers = peers_in_bucket(255, 4)
    table.seen(0.0, peers[0], addr(0))
    table.seen(1.0, peers[1], addr(1))
    assert table.seen(2.0, peers[2], addr(2)) == peers[0]  # check starts, peers[2] waits
    table.seen(3.0, peers[3], addr(3))  # cached
    table.seen(4.0, peers[0], ())  # check passes: peers[2] is cached too
    assert {e.peer_id for e in table.replacements(255)} == {peers[2], peers[3]}
    assert table.remove(peers[1])
    # The most recently seen replacement takes the slot.
    assert peers[3] in table and peers[2] not in table


def test_peer_without_addresses_never_enters() -> None:
    table = RoutingTable(OWN, k=4)
    assert table.seen(0.0, fake_peer(1), ()) is None
    assert len(table) == 0


def test_own_id_never_enters() -> None:
    table = RoutingTable(OWN, k=4)
    table.seen(0.0, OWN, addr(0))
    assert OWN not in table


def test_record_failure_drops_after_the_limit_and_success_resets() -> None:
    table = RoutingTable(OWN, k=4)
    peer = fake_peer(7)
    table.seen(0.0, peer, addr(7))
    assert not table.record_failure(peer, limit=2)
    table.seen(1.0, peer, ())  # it answered something: the count resets
    assert not table.record_failure(peer, limit=2)
    assert table.record_failure(peer, limit=2)
    assert peer not in table


def test_seen_updates_addresses() -> None:
    table = RoutingTable(OWN, k=4)
    peer = fake_peer(3)
    table.seen(0.0, peer, addr(3))
    table.seen(1.0, peer, addr(4))
    entry = table.get(peer)
    assert entry is not None and entry.contact.addrs == addr(4) and entry.last_seen == 1.0


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=2**256 - 1), st.integers(min_value=1, max_value=40), st.integers(0, 10**6))
def test_closest_matches_brute_force(target: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    table = RoutingTable(OWN, k=8)
    for n in rng.sample(range(1, 5000), 300):
        table.seen(0.0, fake_peer(n), addr(n))
    everyone = sorted(table, key=lambda e: e.node_id ^ target)
    assert [e.peer_id for e in table.closest(target, count)] == [e.peer_id for e in everyone[:count]]
    excluded = everyone[0].peer_id
    got = [e.peer_id for e in table.closest(target, count, exclude=excluded)]
    assert got == [e.peer_id for e in everyone[1 : count + 1]]


def test_closest_to_own_id_walks_buckets_upward() -> None:
    table = RoutingTable(OWN, k=20)
    for n in range(1, 200):
        table.seen(0.0, fake_peer(n), addr(n))
    got = table.closest(OWN_ID, 5)
    assert [e.node_id ^ OWN_ID for e in got] == sorted(e.node_id ^ OWN_ID for e in table)[:5]


@pytest.mark.parametrize("index", [255, 254])
def test_buckets_never_exceed_k(index: int) -> None:
    table = RoutingTable(OWN, k=5)
    for i, peer in enumerate(peers_in_bucket(index, 30)):
        lrs = table.seen(float(i), peer, addr(i))
        if lrs is not None:
            table.check_failed(lrs)
    assert len(table.bucket(index)) == 5
