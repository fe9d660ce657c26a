"""Iterative lookup: the pure state machine, and the async driver with an injected rpc."""

from __future__ import annotations

import hashlib
import random

import anyio
import pytest

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.keys import id_to_bytes, key_id, node_id
from chaosp2p.dht.lookup import CandidateState, LookupState, lookup
from chaosp2p.dht.messages import Contact, FindNode, FindValue, Nodes, Value
from chaosp2p.dht.records import make_record
from chaosp2p.dht.routing import RoutingTable
from chaosp2p.errors import LocalProtocolError, RequestTimeout
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


def fake_peer(n: int) -> PeerID:
    return PeerID.from_public_bytes(hashlib.sha256(b"lookup-test/%d" % n).digest())


def contact(peer: PeerID) -> Contact:
    return Contact(peer_id=peer, addrs=(f"/ip4/10.1.0.{peer.raw[-1] % 250 + 1}/tcp/4001",))


class ToyNetwork:
    """Peers with Kademlia tables: each offered every other peer in random order (k per bucket)."""

    def __init__(self, size: int, *, seed: int = 1, k: int = 20) -> None:
        rng = random.Random(seed)
        self.peers = [fake_peer(n) for n in range(size)]
        self.tables: dict[PeerID, RoutingTable] = {}
        for peer in self.peers:
            table = RoutingTable(peer, k=k)
            for other in rng.sample(self.peers, size):
                lrs = table.seen(0.0, other, contact(other).addrs)
                if lrs is not None:
                    table.check_failed(lrs)
            self.tables[peer] = table
        self.k = k
        self.dead: set[PeerID] = set()
        self.values: dict[PeerID, object] = {}
        self.queries = 0

    def answer(self, peer: PeerID, target: int) -> tuple[Contact, ...]:
        self.queries += 1
        return tuple(e.contact for e in self.tables[peer].closest(target, self.k))

    def true_closest(self, target: int, count: int) -> list[PeerID]:
        live = [p for p in self.peers if p not in self.dead]
        return sorted(live, key=lambda p: node_id(p) ^ target)[:count]


def run_sync(net: ToyNetwork, state: LookupState) -> None:
    """Drive a LookupState to completion, answering queries in FIFO order."""
    queue: list[PeerID] = []
    while True:
        batch = state.next_queries()
        assert state.in_flight <= state.window <= state.k
        queue.extend(c.peer_id for c in batch)
        if state.done or not queue:
            break
        peer = queue.pop(0)
        if peer in net.dead:
            state.failed(peer)
        else:
            state.answered(peer, net.answer(peer, state.target))


def test_lookup_finds_the_true_k_closest() -> None:
    net = ToyNetwork(200)
    rng = random.Random(5)
    for _ in range(10):
        target = rng.getrandbits(256)
        start = rng.choice(net.peers)
        seeds = [e.contact for e in net.tables[start].closest(target, 20)]
        state = LookupState(target, seeds, k=20, alpha=3, own=start)
        run_sync(net, state)
        assert state.done
        expected = [p for p in net.true_closest(target, 21) if p != start][:20]
        assert [c.peer_id for c in state.closest()] == expected
        assert 1 <= state.hops() <= 8


def test_lookup_routes_around_dead_peers() -> None:
    net = ToyNetwork(200, seed=2)
    rng = random.Random(9)
    net.dead = set(rng.sample(net.peers, 40))
    target = rng.getrandbits(256)
    start = next(p for p in net.peers if p not in net.dead)
    seeds = [e.contact for e in net.tables[start].closest(target, 20)]
    state = LookupState(target, seeds, k=20, alpha=3, own=start)
    run_sync(net, state)
    assert state.done and state.failures > 0
    found = [c.peer_id for c in state.closest()]
    assert not set(found) & net.dead
    # Dead entries crowd some live peers out of the tables, so a few of the true closest may be
    # unknown to everyone asked; the lookup must still get (almost) all of them.
    truth = [p for p in net.true_closest(target, 21) if p != start][:20]
    assert found[:10] == truth[:10]
    assert len(set(found) & set(truth)) >= 17


def test_done_needs_every_one_of_the_k_closest_to_answer() -> None:
    peers = [fake_peer(n) for n in range(5)]
    target = 0
    state = LookupState(target, [contact(p) for p in peers], k=3, alpha=3)
    asked = state.next_queries()
    assert len(asked) == 3 and state.in_flight == 3
    assert state.next_queries() == []  # window full
    for c in asked[:2]:
        state.answered(c.peer_id, [])
    assert not state.done
    state.failed(asked[2].peer_id)
    nxt = state.next_queries()  # the failed one's slot goes to the 4th closest
    assert len(nxt) == 1
    state.answered(nxt[0].peer_id, [])
    assert state.done
    assert state.messages == 4 and state.failures == 1


def test_window_widens_to_k_after_a_fruitless_round() -> None:
    peers = sorted((fake_peer(n) for n in range(12)), key=node_id)
    state = LookupState(0, [contact(p) for p in peers], k=8, alpha=2)
    first = state.next_queries()
    assert len(first) == 2 and state.window == 2
    state.answered(first[0].peer_id, [])
    assert len(state.next_queries()) == 1  # one answer without progress: still alpha
    state.answered(first[1].peer_id, [])  # a whole round (alpha answers) found nothing closer
    assert state.window == 8
    assert len(state.next_queries()) == 8 - 1 - 2  # the rest of the 8 closest, at once


def test_progress_keeps_the_window_at_alpha() -> None:
    ordered = sorted((fake_peer(n) for n in range(100, 143)), key=node_id)  # distance to 0 = node id
    state = LookupState(0, [contact(p) for p in ordered[40:]], k=8, alpha=2)
    for batch in (ordered[20:30], ordered[10:20], ordered[0:10]):
        for i, asked in enumerate(state.next_queries()):
            # The first answer of each round brings closer peers; the second brings nothing.
            state.answered(asked.peer_id, [contact(p) for p in batch] if i == 0 else [])
        assert state.window == 2


def test_hops_follow_discovery_depth() -> None:
    a, b, c = fake_peer(1), fake_peer(2), fake_peer(3)
    target = node_id(c)
    state = LookupState(target, [contact(a)], k=1, alpha=1)
    (first,) = state.next_queries()
    state.answered(first.peer_id, [contact(b)])
    (second,) = state.next_queries()
    state.answered(second.peer_id, [contact(c)])
    (third,) = state.next_queries()
    assert third.peer_id == c and state.depth_of(c) == 2
    state.answered(c, [])
    assert state.done and state.hops() == 3


def test_answers_from_unknown_or_settled_peers_are_ignored() -> None:
    a = fake_peer(1)
    state = LookupState(0, [contact(a)], k=1, alpha=1)
    state.answered(fake_peer(99), [contact(fake_peer(5))])
    assert state.state_of(fake_peer(5)) is None
    state.next_queries()
    state.answered(a, [])
    state.failed(a)  # late failure after the answer: no effect
    assert state.state_of(a) is CandidateState.SUCCEEDED


def test_candidate_list_is_bounded() -> None:
    state = LookupState(0, [], k=2, alpha=1, max_candidates=10)
    for n in range(100):
        state.add(contact(fake_peer(n)), depth=1)
    assert len(state._sorted) == 10
    distances = [c.distance for c in state._sorted]
    assert distances == sorted(distances)
    everyone = sorted(node_id(fake_peer(n)) for n in range(100))
    assert distances == everyone[:10]


def test_own_id_is_never_a_candidate() -> None:
    me = fake_peer(0)
    state = LookupState(0, [contact(me)], k=2, alpha=1, own=me)
    assert state.next_queries() == [] and state.done


def test_illegal_candidate_transition_raises() -> None:
    state = LookupState(0, [contact(fake_peer(1))], k=1, alpha=1)
    candidate = state._sorted[0]
    with pytest.raises(LocalProtocolError):
        candidate.step("answer")


# ------------------------------------------------------------------ async driver
def make_rpc(net: ToyNetwork, *, garbage_from: PeerID | None = None, value_at: set[PeerID] | None = None,
             key: bytes | None = None):  # type: ignore[no-untyped-def]
    record = make_record(key, b"the value", version=4, ttl_ms=60_000) if key is not None else None

    async def rpc(peer: Contact, request: Message) -> Message:
        await anyio.lowlevel.checkpoint()
        pid = peer.peer_id
        if pid in net.dead:
            raise RequestTimeout("dead")
        if isinstance(request, FindNode):
            if pid == garbage_from:
                junk = tuple(Contact(peer_id=fake_peer(10_000 + i), addrs=("garbage",)) for i in range(20))
                return Nodes(request_id=request.request_id, closer=junk)
            return Nodes(request_id=request.request_id, closer=net.answer(pid, int.from_bytes(request.target, "big")))
        assert isinstance(request, FindValue)
        closer = net.answer(pid, key_id(request.key))
        held = record if value_at is not None and pid in value_at else None
        return Value(request_id=request.request_id, record=held, closer=closer)

    return rpc


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_lookup_matches_the_true_closest(backend: str) -> None:
    net = ToyNetwork(200, seed=4)
    target = random.Random(1).getrandbits(256)
    start = net.peers[0]
    seeds = [e.contact for e in net.tables[start].closest(target, 20)]

    async def main() -> None:
        result = await lookup(id_to_bytes(target), make_rpc(net), seeds=seeds, own=start)
        assert [c.peer_id for c in result.closest] == [p for p in net.true_closest(target, 21) if p != start][:20]
        assert result.hops >= 1 and result.messages >= 20 and result.records == ()

    anyio.run(main, backend=backend)


def test_async_lookup_survives_timeouts_and_garbage() -> None:
    net = ToyNetwork(200, seed=6)
    rng = random.Random(3)
    net.dead = set(rng.sample(net.peers[1:], 30))
    target = rng.getrandbits(256)
    start = net.peers[0]
    seeds = [e.contact for e in net.tables[start].closest(target, 20)]
    liar = next(c.peer_id for c in seeds if c.peer_id not in net.dead)

    async def main() -> None:
        result = await lookup(id_to_bytes(target), make_rpc(net, garbage_from=liar), seeds=seeds, own=start)
        assert result.garbage_contacts == 20
        assert result.failures >= 1
        closest = [c.peer_id for c in result.closest]
        assert not set(closest) & net.dead
        truth = [p for p in net.true_closest(target, 22) if p not in (start,)][:20]
        assert closest[:10] == truth[:10]
        assert len(set(closest) & set(truth)) >= 17

    anyio.run(main)


def test_async_value_lookup_stops_at_quorum() -> None:
    net = ToyNetwork(200, seed=8)
    key = b"some key"
    target = key_id(key)
    holders = set(net.true_closest(target, 20))
    start = next(p for p in net.peers if p not in holders)
    seeds = [e.contact for e in net.tables[start].closest(target, 20)]

    async def main() -> None:
        result = await lookup(
            id_to_bytes(target), make_rpc(net, value_at=holders, key=key), seeds=seeds, value_key=key,
            config=DHTConfig(get_quorum=2), own=start,
        )
        assert len(result.records) >= 2
        best = result.best
        assert best is not None and best.value == b"the value" and best.version == 4

    anyio.run(main)


def test_async_value_lookup_rejects_wrong_target() -> None:
    async def main() -> None:
        with pytest.raises(LocalProtocolError):
            await lookup(id_to_bytes(1), make_rpc(ToyNetwork(25)), seeds=[], value_key=b"k")

    anyio.run(main)
