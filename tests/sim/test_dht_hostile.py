"""Hostile peers on a simulated network: liars, forgers, flooders, and unreachable bootstrap peers."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence

from chaosp2p.dht import (
    BootstrapResult,
    BootstrapRetrying,
    DHTConfig,
    DHTMachine,
    DHTOperationDone,
    GetResult,
    StoreResult,
    signed_key,
)
from chaosp2p.dht.keys import id_to_bytes
from chaosp2p.dht.messages import (
    Contact,
    FindNode,
    FindValue,
    GetProviders,
    Nodes,
    Ping,
    Providers,
    Store,
    Stored,
    StoreStatus,
    Value,
)
from chaosp2p.dht.records import make_record
from chaosp2p.protocols.base import Outgoing
from chaosp2p.sim.dht import DHTSimCluster
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

CONFIG = dataclasses.replace(DHTConfig.local(), request_timeout_s=0.5, republish_interval_s=30.0,
                             refresh_interval_s=600.0)


def fake_id(n: int) -> PeerID:
    return PeerID.from_public_bytes(hashlib.sha256(b"phantom/%d" % n).digest())


class Liar:
    """Answers every lookup with made-up contacts and swallows stores (claiming success)."""

    protocols: Sequence[str] = ("dht",)

    def __init__(self, identity: Identity, addr: str, *, garbage: bool, seed: int) -> None:
        self.peer_id = identity.peer_id
        self.addr = addr
        self.garbage = garbage
        self.rng = random.Random(seed)
        self.out: list[Outgoing] = []
        self.phantoms: set[PeerID] = set()

    def _contacts(self) -> tuple[Contact, ...]:
        contacts = []
        for _ in range(20):
            peer = fake_id(self.rng.getrandbits(48))
            self.phantoms.add(peer)
            addrs = ("complete garbage",) if self.garbage else (f"/ip4/192.0.2.{self.rng.randrange(1, 250)}/tcp/1",)
            contacts.append(Contact(peer_id=peer, addrs=addrs))
        return tuple(contacts)

    def announce(self, peers: Sequence[PeerID]) -> None:
        for peer in peers:
            self.out.append(Outgoing(to=peer, protocol="dht", message=Ping(request_id=self.rng.getrandbits(32),
                                                                            sender_addrs=(self.addr,))))

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        reply: Message | None = None
        if isinstance(message, FindNode):
            reply = Nodes(request_id=message.request_id, closer=self._contacts())
        elif isinstance(message, FindValue):
            reply = Value(request_id=message.request_id, record=None, closer=self._contacts())
        elif isinstance(message, GetProviders):
            reply = Providers(request_id=message.request_id, providers=(), closer=self._contacts())
        elif isinstance(message, Store):
            reply = Stored(request_id=message.request_id, accepted=True, reason=StoreStatus.OK)
        if reply is not None:
            self.out.append(Outgoing(to=sender, protocol="dht", message=reply))

    def handle_timeout(self, now: float) -> None:
        pass

    def next_deadline(self) -> float | None:
        return None

    def take_outgoing(self) -> list[Outgoing]:
        out, self.out = self.out, []
        return out

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        pass


def get(cluster: DHTSimCluster, reader: PeerID, key: bytes) -> GetResult:
    machine = cluster.machines[reader]
    op = cluster.call(reader, lambda now: machine.start_get(now, key))
    result = cluster.wait(reader, op, timeout_s=30.0)
    assert isinstance(result, GetResult)
    return result


def test_lying_peers_cannot_break_gets_or_poison_routing_tables() -> None:
    rng = random.Random(3)
    cluster = DHTSimCluster(seed=3, config=CONFIG)
    cluster.build(200, refresh=False)
    honest = cluster.alive()
    liars = []
    for i in range(20):
        identity = Identity.from_seed(hashlib.sha256(b"liar/%d" % i).digest())
        liar = Liar(identity, f"/ip4/198.51.100.{i + 1}/tcp/4001", garbage=i % 2 == 0, seed=i)
        cluster.sim.add(liar.peer_id, liar)
        liar.announce(rng.sample(honest, 100))
        cluster.sim._after_call(liar.peer_id)  # hand the announcements to the network
        liars.append(liar)
    cluster.sim.run_for(1.0)
    assert sum(1 for p in honest for liar in liars if liar.peer_id in cluster.machines[p].routing_table) > 100

    keys = {}
    for i in range(20):
        writer = rng.choice(honest)
        key = b"key/%d" % i
        machine = cluster.machines[writer]
        op = cluster.call(writer, lambda now, m=machine, k=key, v=b"v%d" % i: m.start_store(now, k, v))
        result = cluster.wait(writer, op)
        assert isinstance(result, StoreResult) and result.accepted >= 10
        keys[key] = b"v%d" % i
    successes = sum(get(cluster, rng.choice(honest), key).value == value for key, value in keys.items())
    assert successes == len(keys)

    phantoms = set().union(*(liar.phantoms for liar in liars))
    assert phantoms
    for peer in honest:
        entries = {e.peer_id for e in cluster.machines[peer].routing_table}
        assert not entries & phantoms, "contacts only named by others must never enter a routing table"
    garbage = sum(cluster.machines[p].statistics().rejected_garbage_peers for p in honest)
    assert garbage > 0


def test_forged_records_are_rejected_everywhere() -> None:
    rng = random.Random(8)
    cluster = DHTSimCluster(seed=8, config=CONFIG)
    cluster.build(128, refresh=False)
    owner = cluster.alive()[7]
    key = signed_key(owner, "model-config")
    machine = cluster.machines[owner]
    op = cluster.call(owner, lambda now: machine.start_store(now, key, b"genuine"))
    assert isinstance(cluster.wait(owner, op), StoreResult)

    mallory = Identity.from_seed(b"\x66" * 32)
    genuine = next(cluster.machines[p].held_record(cluster.sim.now, key) for p in cluster.alive()
                   if cluster.machines[p].held_record(cluster.sim.now, key) is not None)
    assert genuine is not None
    forgeries: list[Message] = [
        Store(request_id=1, sender_addrs=(), record=dataclasses.replace(genuine, value=b"evil", version=99)),
        Store(request_id=2, sender_addrs=(), record=make_record(key, b"evil", version=99, ttl_ms=60_000,
                                                                 identity=mallory)),
        Store(request_id=3, sender_addrs=(), record=dataclasses.replace(genuine, version=0)),  # rollback
    ]
    for peer in cluster.alive():
        for forged in forgeries:
            cluster.sim.inject(mallory.peer_id, peer, "dht", forged)
    cluster.sim.run_for(1.0)
    rejected = sum(cluster.machines[p].statistics().rejected_bad_signature for p in cluster.alive())
    assert rejected >= 2 * 128
    for _ in range(10):
        result = get(cluster, rng.choice(cluster.alive()), key)
        assert result.value == b"genuine" and result.record is not None and result.record.version == 0


def test_flooding_peer_is_rate_limited_and_others_are_served() -> None:
    config = dataclasses.replace(CONFIG, rate_limit_requests_per_s=50.0, rate_limit_burst=100)
    cluster = DHTSimCluster(seed=4, config=config)
    cluster.build(64, refresh=False)
    victim = cluster.alive()[5]
    flooder = fake_id(1)
    for i in range(3000):
        target = id_to_bytes(random.Random(i).getrandbits(256))
        cluster.sim.inject(flooder, victim, "dht", FindNode(request_id=i, sender_addrs=(), target=target))
    cluster.sim.run_for(2.0)
    stats = cluster.machines[victim].statistics()
    # All 3000 arrive at the same instant: the burst is served, nothing refills in between.
    assert stats.rate_limited == 3000 - 100
    # The victim still answers everyone else: it can read and write through the swarm.
    machine = cluster.machines[victim]
    op = cluster.call(victim, lambda now: machine.start_store(now, b"after-flood", b"ok"))
    assert isinstance(cluster.wait(victim, op), StoreResult)
    assert get(cluster, cluster.alive()[40], b"after-flood").value == b"ok"


def test_bootstrap_keeps_retrying_until_a_bootstrap_peer_comes_back() -> None:
    cluster = DHTSimCluster(seed=9, config=CONFIG)
    cluster.build(16, refresh=False)
    seed_peer = cluster.alive()[0]
    seed_machine = cluster.machines[seed_peer]
    cluster.crash(seed_peer)
    newcomer = cluster.new_peer()
    op = cluster.call(newcomer.peer_id, lambda now: newcomer.start_bootstrap(
        now, [(seed_peer, seed_machine.listen_addrs[0])]))
    cluster.sim.run_for(30.0)
    retries = [e for _, p, e in cluster.sim.events if p == newcomer.peer_id and isinstance(e, BootstrapRetrying)]
    assert len(retries) >= 4
    assert all(r.delay_s <= CONFIG.bootstrap_backoff_max_s for r in retries)
    assert cluster.result(newcomer.peer_id, op) is None
    # The seed restarts (same identity, empty state) and the next attempt gets through.
    restarted = DHTMachine(seed_machine.identity, rng=random.Random(1), config=CONFIG,
                           listen_addrs=seed_machine.listen_addrs, now=cluster.sim.now)
    cluster.sim.add(seed_peer, restarted)
    result = cluster.wait(newcomer.peer_id, op, timeout_s=CONFIG.bootstrap_backoff_max_s + 1.0)
    assert isinstance(result, BootstrapResult) and result.attempts == len(retries) + 1
    done = [e for _, p, e in cluster.sim.events if p == newcomer.peer_id and isinstance(e, DHTOperationDone)]
    assert len(done) == 1
