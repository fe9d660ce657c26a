"""The DHT machine, driven directly: requests it answers, operations it runs, hostile input."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections import deque

import pytest

from chaosp2p.dht import (
    BootstrapDialRequested,
    BootstrapResult,
    BootstrapRetrying,
    BootstrapState,
    DHTConfig,
    DHTMachine,
    DHTOperationDone,
    FindPeerResult,
    GetProvidersResult,
    GetResult,
    StoreResult,
    StoreStatus,
    signed_key,
)
from chaosp2p.dht.keys import bucket_index, id_to_bytes, key_id, node_id
from chaosp2p.dht.machine import ON_ANSWER, ON_FAILURE, ON_TIMER, RECEIVE
from chaosp2p.dht.messages import (
    DHT_CODEC,
    MAX_VERSION,
    AddProvider,
    Contact,
    FindNode,
    FindValue,
    Nodes,
    Ping,
    Pong,
    Store,
    Stored,
    Value,
)
from chaosp2p.dht.operation import LookupKind
from chaosp2p.dht.querying import AFTER_LOOKUP, TAKE
from chaosp2p.dht.records import make_provider_record, make_record
from chaosp2p.dht.serving import SERVE
from chaosp2p.dht.storing import PREPARE_PUT
from chaosp2p.dht.timers import DHTTimer
from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.base import Outgoing
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message


def ident(n: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"machine-test/%d" % n).digest())


def addr_of(n: int) -> str:
    return f"/ip4/10.2.{n // 250}.{n % 250 + 1}/tcp/4001"


def new_machine(n: int, config: DHTConfig | None = None, now: float = 0.0) -> DHTMachine:
    return DHTMachine(ident(n), rng=random.Random(n), config=config or DHTConfig.local(),
                      listen_addrs=(addr_of(n),), now=now)


class Net:
    """Delivers messages between machines instantly; peers in ``down`` are unreachable."""

    def __init__(self, *, roundtrip: bool = False) -> None:
        self.roundtrip = roundtrip  # pass every message through the msgpack codec, as the runtime does
        self.machines: dict[PeerID, DHTMachine] = {}
        self.now = 0.0
        self.down: set[PeerID] = set()
        self.silent: set[PeerID] = set()  # receive nothing, no error: requests to them time out
        self.events: list[tuple[PeerID, object]] = []

    def add(self, machine: DHTMachine) -> DHTMachine:
        self.machines[machine.peer_id] = machine
        return machine

    def flush(self) -> None:
        queue: deque[tuple[PeerID, Outgoing]] = deque()
        while True:
            for peer, machine in list(self.machines.items()):
                for out in machine.take_outgoing():
                    queue.append((peer, out))
                self.events.extend((peer, e) for e in machine.take_events())
            if not queue:
                return
            while queue:
                sender, out = queue.popleft()
                target = self.machines.get(out.to)
                if out.to in self.silent:
                    continue
                if target is None or out.to in self.down:
                    self.machines[sender].peer_unreachable(self.now, out.to)
                    continue
                message = out.message
                if self.roundtrip:
                    message = DHT_CODEC.decode(DHT_CODEC.encode(message), max_bytes=1 << 20)
                    assert message == out.message
                target.receive(self.now, sender, out.protocol, message)

    def run(self, seconds: float, step: float = 0.05) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            for machine in list(self.machines.values()):
                deadline = machine.next_deadline()
                if deadline is not None and deadline <= self.now:
                    machine.handle_timeout(self.now)
            self.flush()

    def done(self, peer: PeerID, op_id: int) -> object | None:
        for who, event in self.events:
            if who == peer and isinstance(event, DHTOperationDone) and event.op_id == op_id:
                return event.result
        return None


def swarm(size: int, config: DHTConfig | None = None, *, roundtrip: bool = False) -> tuple[Net, list[DHTMachine]]:
    net = Net(roundtrip=roundtrip)
    machines = [net.add(new_machine(n, config)) for n in range(size)]
    first = machines[0]
    for machine in machines[1:]:
        machine.start_bootstrap(net.now, [(first.peer_id, first.listen_addrs[0])])
        net.flush()
    for machine in machines:
        machine.refresh(net.now)
        net.flush()
    return net, machines


def answer_to(machine: DHTMachine, sender: PeerID, message: Message, now: float = 0.0) -> list[Outgoing]:
    machine.receive(now, sender, "dht", message)
    return machine.take_outgoing()


# ------------------------------------------------------------------ config
def test_profiles_are_valid_and_distinct() -> None:
    assert DHTConfig.local().request_timeout_s < DHTConfig.lan().request_timeout_s < DHTConfig.wan().request_timeout_s
    assert DHTConfig().k == 20 and DHTConfig().alpha == 3


@pytest.mark.parametrize(
    "changes",
    [
        {"alpha": 21},
        {"k": 0},
        {"request_timeout_s": 0.0},
        {"max_value_bytes": 10**9},
        {"bootstrap_backoff_min_s": 10.0, "bootstrap_backoff_max_s": 1.0},
        {"default_record_ttl_s": 10.0, "max_record_ttl_s": 5.0},
        {"max_peers_per_response": 10},
        {"max_records_per_sender": 10, "max_records_total": 5},
        {"max_providers_per_key": 4, "max_providers_per_sender_per_key": 5},
    ],
)
def test_bad_config_is_refused(changes: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        DHTConfig(**changes)  # type: ignore[arg-type]


def test_bad_listen_addresses_are_refused() -> None:
    with pytest.raises(ConfigError):
        DHTMachine(ident(1), rng=random.Random(1), listen_addrs=("garbage",))
    with pytest.raises(ConfigError):
        DHTMachine(ident(1), rng=random.Random(1), listen_addrs=(f"/ip4/1.2.3.4/tcp/1/p2p/{ident(2).peer_id}",))


# ------------------------------------------------------------------ answering requests
def test_ping_is_answered_and_the_sender_enters_the_table() -> None:
    machine = new_machine(0)
    other = ident(1).peer_id
    out = answer_to(machine, other, Ping(request_id=7, sender_addrs=(addr_of(1),)))
    assert [(o.to, o.message) for o in out] == [(other, Pong(request_id=7))]
    assert other in machine.routing_table
    assert machine.known_addrs(other) == (addr_of(1),)
    assert [str(a) for a in machine.known_multiaddrs(other)] == [addr_of(1)]
    assert machine.known_addrs(ident(5).peer_id) == ()


def test_sender_with_garbage_addresses_is_answered_but_not_added() -> None:
    machine = new_machine(0)
    other = ident(1).peer_id
    out = answer_to(machine, other, Ping(request_id=1, sender_addrs=("/ip4/999.1.1.1/tcp/1",)))
    assert len(out) == 1 and other not in machine.routing_table
    assert machine.statistics().rejected_garbage_peers == 1


def test_find_node_answers_k_closest_without_the_requester() -> None:
    machine = new_machine(0, DHTConfig.local())
    peers = [ident(n).peer_id for n in range(1, 60)]
    for n, peer in enumerate(peers, start=1):
        answer_to(machine, peer, Ping(request_id=n, sender_addrs=(addr_of(n),)))
    target = random.Random(3).getrandbits(256)
    (out,) = answer_to(machine, peers[0], FindNode(request_id=99, sender_addrs=(), target=id_to_bytes(target)))
    assert isinstance(out.message, Nodes) and out.message.request_id == 99
    got = [c.peer_id for c in out.message.closer]
    expected = sorted((e.peer_id for e in machine.routing_table if e.peer_id != peers[0]),
                      key=lambda p: node_id(p) ^ target)[:20]
    assert got == expected


def test_store_then_find_value_locally() -> None:
    machine = new_machine(0)
    sender = ident(1)
    record = make_record(b"k", b"v", version=3, ttl_ms=10_000)
    (ack,) = answer_to(machine, sender.peer_id, Store(request_id=1, sender_addrs=(), record=record))
    assert ack.message == Stored(request_id=1, accepted=True, reason=StoreStatus.OK)
    (reply,) = answer_to(machine, sender.peer_id, FindValue(request_id=2, sender_addrs=(), key=b"k"), now=4.0)
    assert isinstance(reply.message, Value) and reply.message.record is not None
    assert reply.message.record.value == b"v" and reply.message.record.remaining_ms == 6_000


def test_bad_records_are_rejected_counted_and_do_not_replace_good_ones() -> None:
    machine = new_machine(0)
    alice, mallory = ident(1), ident(2)
    key = signed_key(alice.peer_id, "cfg")
    good = make_record(key, b"good", version=1, ttl_ms=60_000, identity=alice)
    answer_to(machine, alice.peer_id, Store(request_id=1, sender_addrs=(), record=good))
    forged = dataclasses.replace(good, value=b"evil", version=5)
    (ack,) = answer_to(machine, mallory.peer_id, Store(request_id=2, sender_addrs=(), record=forged))
    assert ack.message == Stored(request_id=2, accepted=False, reason=StoreStatus.BAD_SIGNATURE)
    resigned = make_record(key, b"evil", version=5, ttl_ms=60_000, identity=mallory)
    (ack,) = answer_to(machine, mallory.peer_id, Store(request_id=3, sender_addrs=(), record=resigned))
    assert ack.message.reason is StoreStatus.BAD_SIGNATURE  # type: ignore[attr-defined]
    huge = make_record(b"big", b"x" * (DHTConfig.local().max_value_bytes + 1), version=0, ttl_ms=1000)
    (ack,) = answer_to(machine, mallory.peer_id, Store(request_id=4, sender_addrs=(), record=huge))
    assert ack.message.reason is StoreStatus.OVERSIZED  # type: ignore[attr-defined]
    stats = machine.statistics()
    assert (stats.rejected_bad_signature, stats.rejected_oversized, stats.records_accepted) == (2, 1, 1)
    held = machine.held_record(0.0, key)
    assert held is not None and held.value == b"good"


def test_sender_quota_via_the_wire() -> None:
    config = dataclasses.replace(DHTConfig.local(), max_records_per_sender=5)
    machine = new_machine(0, config)
    flooder = ident(9).peer_id
    reasons = []
    for i in range(8):
        record = make_record(b"key-%d" % i, b"v", version=0, ttl_ms=10_000)
        (ack,) = answer_to(machine, flooder, Store(request_id=i, sender_addrs=(), record=record))
        reasons.append(ack.message.reason)  # type: ignore[attr-defined]
    assert reasons == [StoreStatus.OK] * 5 + [StoreStatus.QUOTA] * 3
    assert machine.statistics().rejected_quota == 3


def test_a_sender_is_charged_for_records_it_signed_with_throwaway_identities() -> None:
    """Issue 20, finding 6: the DHT quota is charged to the peer that sends the STORE or
    ADD_PROVIDER, not to the identity that signed the record (identities cost nothing to make)."""
    config = dataclasses.replace(DHTConfig.local(), max_records_per_sender=5)
    machine = new_machine(0, config)
    flooder = ident(9).peer_id
    reasons = []
    for i in range(4):
        throwaway = Identity.generate()
        record = make_record(signed_key(throwaway.peer_id, "x"), b"v", version=0, ttl_ms=10_000, identity=throwaway)
        (ack,) = answer_to(machine, flooder, Store(request_id=i, sender_addrs=(), record=record))
        reasons.append(ack.message.reason)  # type: ignore[attr-defined]
    for i in range(4):
        throwaway = Identity.generate()
        provider = make_provider_record(throwaway, b"/prov/key-%d" % i, (addr_of(1),), seq=0, ttl_ms=10_000)
        (ack,) = answer_to(machine, flooder, AddProvider(request_id=10 + i, sender_addrs=(), provider=provider))
        reasons.append(ack.message.reason)  # type: ignore[attr-defined]
    assert reasons == [StoreStatus.OK] * 5 + [StoreStatus.QUOTA] * 3
    # Another sender is unaffected.
    record = make_record(b"plain", b"v", version=0, ttl_ms=10_000)
    (ack,) = answer_to(machine, ident(8).peer_id, Store(request_id=99, sender_addrs=(), record=record))
    assert ack.message.reason is StoreStatus.OK  # type: ignore[attr-defined]


def test_one_sender_cannot_fill_a_keys_provider_list() -> None:
    """Issue 20, finding 9: provider records under one key are bounded per sender, so one identity
    announcing throwaway providers cannot crowd out the real ones (nor outvote them in a pull)."""
    config = dataclasses.replace(DHTConfig.local(), max_providers_per_key=8, max_providers_per_sender_per_key=2)
    machine = new_machine(0, config)
    key = b"/prov/state/run/7"
    flooder = ident(9).peer_id
    reasons = []
    for i in range(8):
        provider = make_provider_record(Identity.generate(), key, (addr_of(1),), seq=0, ttl_ms=10_000)
        (ack,) = answer_to(machine, flooder, AddProvider(request_id=i, sender_addrs=(), provider=provider))
        reasons.append(ack.message.reason)  # type: ignore[attr-defined]
    assert reasons == [StoreStatus.OK] * 2 + [StoreStatus.QUOTA] * 6
    honest = [ident(20 + n) for n in range(6)]
    for n, who in enumerate(honest):  # each real provider announces itself
        provider = make_provider_record(who, key, (addr_of(20 + n),), seq=0, ttl_ms=10_000)
        (ack,) = answer_to(machine, who.peer_id, AddProvider(request_id=100 + n, sender_addrs=(), provider=provider))
        assert ack.message.reason is StoreStatus.OK  # type: ignore[attr-defined]
    assert {p.provider for p in machine.held_providers(0.0, key)} >= {who.peer_id for who in honest}


def test_flooding_sender_is_rate_limited() -> None:
    config = dataclasses.replace(DHTConfig.local(), rate_limit_burst=50, rate_limit_requests_per_s=10.0)
    machine = new_machine(0, config)
    flooder, polite = ident(1).peer_id, ident(2).peer_id
    for i in range(500):
        machine.receive(1.0, flooder, "dht", Ping(request_id=i, sender_addrs=()))
    assert len(machine.take_outgoing()) == 50
    assert machine.statistics().rate_limited == 450
    # Other senders are unaffected, and the flooder's bucket refills with time.
    assert len(answer_to(machine, polite, Ping(request_id=1, sender_addrs=()), now=1.0)) == 1
    for i in range(30):
        machine.receive(2.0, flooder, "dht", Ping(request_id=1000 + i, sender_addrs=()))
    assert len(machine.take_outgoing()) == 10


def test_unexpected_and_spoofed_responses_are_counted_and_ignored() -> None:
    machine = new_machine(0)
    alice, mallory = ident(1), ident(2)
    machine.add_contact(0.0, alice.peer_id, (addr_of(1),))
    (ping,) = machine.take_outgoing()
    assert isinstance(ping.message, Ping)
    machine.receive(0.1, mallory.peer_id, "dht", Pong(request_id=ping.message.request_id))  # wrong sender
    machine.receive(0.1, alice.peer_id, "dht", Pong(request_id=ping.message.request_id + 1000))  # unknown id
    assert machine.statistics().unexpected_responses == 2
    assert alice.peer_id not in machine.routing_table
    machine.receive(0.2, alice.peer_id, "dht", Pong(request_id=ping.message.request_id))
    assert alice.peer_id in machine.routing_table


def test_malformed_messages_are_counted() -> None:
    machine = new_machine(0)
    machine.receive(0.0, ident(1).peer_id, "dht", FindNode(request_id=1, sender_addrs=(), target=b"short"))
    machine.receive(0.0, ident(1).peer_id, "dht", Ping(request_id=-1, sender_addrs=()))
    assert machine.take_outgoing() == []
    assert machine.statistics().rejected_malformed == 2


def test_other_protocols_and_self_messages_are_ignored() -> None:
    machine = new_machine(0)
    machine.receive(0.0, ident(1).peer_id, "membership", Ping(request_id=1, sender_addrs=()))
    machine.receive(0.0, machine.peer_id, "dht", Ping(request_id=1, sender_addrs=()))
    assert machine.take_outgoing() == [] and machine.statistics().requests_received == 0


# ------------------------------------------------------------------ operations across machines
def test_store_and_get_across_a_small_swarm() -> None:
    net, machines = swarm(40)
    writer = machines[5]
    op = writer.start_store(net.now, b"hello", b"world", ttl_s=120.0)
    net.flush()
    result = net.done(writer.peer_id, op)
    assert isinstance(result, StoreResult) and result.accepted == 20 and result.version == 0
    reader = next(m for m in machines if m.held_record(net.now, b"hello") is None)
    op = reader.start_get(net.now, b"hello")
    net.flush()
    got = net.done(reader.peer_id, op)
    assert isinstance(got, GetResult) and got.value == b"world" and got.stats.hops >= 1
    holders = sorted((m for m in machines if m.held_record(net.now, b"hello")), key=lambda m: node_id(m.peer_id))
    closest = sorted(machines, key=lambda m: node_id(m.peer_id) ^ key_id(b"hello"))[:20]
    assert {m.peer_id for m in closest} <= {m.peer_id for m in holders}


def test_every_operation_works_through_the_wire_codec() -> None:
    net, machines = swarm(30, roundtrip=True)
    owner = machines[4]
    key = signed_key(owner.peer_id, "x")
    results = []
    for machine, start in (
        (owner, lambda now: owner.start_store(now, key, b"signed value")),
        (machines[5], lambda now: machines[5].start_store(now, b"plain", b"plain value", version=3)),
        (machines[6], lambda now: machines[6].start_add_provider(now, b"/prov/state/r/1")),
        (machines[7], lambda now: machines[7].start_get(now, key)),
        (machines[8], lambda now: machines[8].start_get(now, b"plain")),
        (machines[9], lambda now: machines[9].start_get_providers(now, b"/prov/state/r/1")),
        (machines[10], lambda now: machines[10].start_find_peer(now, machines[20].peer_id)),
    ):
        op = start(net.now)
        net.flush()
        results.append(net.done(machine.peer_id, op))
    assert all(r is not None and r.ok for r in results), results  # type: ignore[attr-defined]
    assert results[3].value == b"signed value" and results[4].value == b"plain value"  # type: ignore[union-attr]
    assert sum(m.statistics().rejected_malformed for m in machines) == 0


def test_store_without_version_supersedes_what_the_network_holds() -> None:
    net, machines = swarm(30)
    owner = machines[3]
    key = signed_key(owner.peer_id, "state")
    versions = []
    for value in (b"a", b"b", b"c"):
        op = owner.start_store(net.now, key, value)
        net.flush()
        result = net.done(owner.peer_id, op)
        assert isinstance(result, StoreResult) and result.ok
        versions.append(result.version)
    assert versions == [0, 1, 2]
    op = machines[20].start_get(net.now, key)
    net.flush()
    got = net.done(machines[20].peer_id, op)
    assert isinstance(got, GetResult) and got.record is not None
    assert (got.value, got.record.version, got.record.publisher) == (b"c", 2, owner.peer_id)


def test_storing_under_someone_elses_namespace_is_refused() -> None:
    machine = new_machine(0)
    with pytest.raises(ConfigError):
        machine.start_store(0.0, signed_key(ident(5).peer_id, "x"), b"v")
    with pytest.raises(ConfigError):
        machine.start_store(0.0, b"/pk/garbage/x", b"v")
    with pytest.raises(ConfigError):
        machine.start_store(0.0, b"k", b"x" * (DHTConfig.local().max_value_bytes + 1))
    with pytest.raises(ConfigError):
        machine.start_store(0.0, b"k", b"v", ttl_s=10**9)


def test_get_of_a_local_record_needs_no_network() -> None:
    machine = new_machine(0)
    answer_to(machine, ident(1).peer_id, Store(request_id=1, sender_addrs=(),
                                               record=make_record(b"k", b"v", version=0, ttl_ms=5000)))
    op = machine.start_get(0.0, b"k")
    assert machine.take_outgoing() == []
    (event,) = machine.take_events()
    assert isinstance(event, DHTOperationDone) and event.op_id == op
    assert isinstance(event.result, GetResult) and event.result.value == b"v" and event.result.stats.hops == 0


def test_get_of_a_missing_key_completes_empty() -> None:
    net, machines = swarm(25)
    op = machines[4].start_get(net.now, b"nothing here")
    net.flush()
    result = net.done(machines[4].peer_id, op)
    assert isinstance(result, GetResult) and not result.ok and result.stats.messages >= 20


def test_find_peer_and_providers() -> None:
    net, machines = swarm(30)
    seeker, target = machines[1], machines[27]
    op = seeker.start_find_peer(net.now, target.peer_id)
    net.flush()
    found = net.done(seeker.peer_id, op)
    assert isinstance(found, FindPeerResult) and found.contact is not None
    assert found.contact.addrs == target.listen_addrs
    key = b"/prov/state/run-a/7"
    for provider in machines[10:13]:
        op = provider.start_add_provider(net.now, key, ttl_s=300.0)
        net.flush()
        assert net.done(provider.peer_id, op).ok  # type: ignore[union-attr]
    op = machines[2].start_get_providers(net.now, key)
    net.flush()
    got = net.done(machines[2].peer_id, op)
    assert isinstance(got, GetProvidersResult)
    assert {p.provider for p in got.providers} == {m.peer_id for m in machines[10:13]}
    assert all(p.addrs == machines[10 + i].listen_addrs for i, p in
               enumerate(sorted(got.providers, key=lambda p: [m.peer_id for m in machines].index(p.provider))))


def test_unanswered_requests_time_out_and_the_operation_still_completes() -> None:
    net, machines = swarm(30)
    silent = sorted(machines[1:], key=lambda m: node_id(m.peer_id) ^ key_id(b"x"))[:5]
    net.silent = {m.peer_id for m in silent}
    op = machines[0].start_store(net.now, b"x", b"y", version=1)
    net.flush()
    assert net.done(machines[0].peer_id, op) is None
    net.run(DHTConfig.local().request_timeout_s * 3)
    result = net.done(machines[0].peer_id, op)
    assert isinstance(result, StoreResult) and result.accepted >= 15 and result.stats.failures >= 5
    assert machines[0].statistics().request_timeouts >= 5


def test_garbage_contacts_are_counted_and_never_enter_the_table() -> None:
    machine = new_machine(0)
    liar = ident(1)
    machine.add_contact(0.0, liar.peer_id, (addr_of(1),))
    (ping,) = machine.take_outgoing()
    machine.receive(0.0, liar.peer_id, "dht", Pong(request_id=ping.message.request_id))  # type: ignore[attr-defined]
    before = {e.peer_id for e in machine.routing_table}
    op = machine.start_find_peer(0.1, ident(50).peer_id)
    (query,) = machine.take_outgoing()
    fake = [ident(100 + i).peer_id for i in range(6)]
    junk = (
        Contact(peer_id=fake[0], addrs=("not-an-addr",)),
        Contact(peer_id=fake[1], addrs=(f"/ip4/1.2.3.4/tcp/1/p2p/{fake[2]}",)),  # names another peer
        Contact(peer_id=fake[3], addrs=()),
        Contact(peer_id=fake[4], addrs=(addr_of(4),)),
        Contact(peer_id=fake[4], addrs=(addr_of(4),)),  # duplicate
    )
    machine.receive(0.2, liar.peer_id, "dht", Nodes(request_id=query.message.request_id, closer=junk))  # type: ignore[attr-defined]
    assert machine.statistics().rejected_garbage_peers == 4
    assert {e.peer_id for e in machine.routing_table} == before
    # Only the one well-formed contact is queried next; it never answers, so the op ends after it.
    queried = [o.to for o in machine.take_outgoing()]
    assert queried == [fake[4]]
    machine.peer_unreachable(0.3, fake[4])
    (event,) = machine.take_events()
    assert isinstance(event, DHTOperationDone) and event.op_id == op
    assert isinstance(event.result, FindPeerResult) and event.result.contact is None


def test_too_many_contacts_fail_the_whole_response() -> None:
    machine = new_machine(0)
    liar = ident(1)
    machine.add_contact(0.0, liar.peer_id, (addr_of(1),))
    (ping,) = machine.take_outgoing()
    machine.receive(0.0, liar.peer_id, "dht", Pong(request_id=ping.message.request_id))  # type: ignore[attr-defined]
    machine.start_get(0.1, b"k")
    (query,) = machine.take_outgoing()
    many = tuple(Contact(peer_id=ident(200 + i).peer_id, addrs=(addr_of(i),)) for i in range(25))
    machine.receive(0.2, liar.peer_id, "dht", Value(request_id=query.message.request_id, record=None, closer=many))  # type: ignore[attr-defined]
    assert machine.take_outgoing() == []
    assert machine.statistics().rejected_garbage_peers == 25


def test_forged_value_in_a_lookup_is_rejected() -> None:
    machine = new_machine(0)
    owner, liar = ident(3), ident(1)
    machine.add_contact(0.0, liar.peer_id, (addr_of(1),))
    (ping,) = machine.take_outgoing()
    machine.receive(0.0, liar.peer_id, "dht", Pong(request_id=ping.message.request_id))  # type: ignore[attr-defined]
    key = signed_key(owner.peer_id, "x")
    op = machine.start_get(0.1, key)
    (query,) = machine.take_outgoing()
    forged = make_record(key, b"evil", version=9, ttl_ms=1000, identity=liar)
    machine.receive(0.2, liar.peer_id, "dht", Value(request_id=query.message.request_id, record=forged, closer=()))  # type: ignore[attr-defined]
    (event,) = machine.take_events()
    assert isinstance(event, DHTOperationDone) and event.op_id == op
    assert isinstance(event.result, GetResult) and event.result.record is None
    assert machine.statistics().rejected_bad_signature == 1


# ------------------------------------------------------------------ eviction through the machine
def test_full_bucket_pings_lrs_and_keeps_it_when_it_answers() -> None:
    config = dataclasses.replace(DHTConfig.local(), k=2, alpha=1, max_peers_per_response=2)
    machine = new_machine(0, config)
    own = node_id(machine.peer_id)
    far = [n for n in range(1, 400) if bucket_index(own, node_id(ident(n).peer_id)) == 255][:3]
    for i, n in enumerate(far):
        machine.receive(float(i), ident(n).peer_id, "dht", Ping(request_id=n, sender_addrs=(addr_of(n),)))
    out = machine.take_outgoing()
    checks = [o for o in out if isinstance(o.message, Ping)]
    assert [o.to for o in checks] == [ident(far[0]).peer_id]
    assert machine.statistics().eviction_checks == 1
    machine.receive(3.0, ident(far[0]).peer_id, "dht", Pong(request_id=checks[0].message.request_id))  # type: ignore[attr-defined]
    assert {e.peer_id for e in machine.routing_table} == {ident(far[0]).peer_id, ident(far[1]).peer_id}


def test_full_bucket_replaces_lrs_that_does_not_answer() -> None:
    config = dataclasses.replace(DHTConfig.local(), k=2, alpha=1, max_peers_per_response=2)
    machine = new_machine(0, config)
    own = node_id(machine.peer_id)
    far = [n for n in range(1, 400) if bucket_index(own, node_id(ident(n).peer_id)) == 255][:3]
    for i, n in enumerate(far):
        machine.receive(float(i), ident(n).peer_id, "dht", Ping(request_id=n, sender_addrs=(addr_of(n),)))
    machine.take_outgoing()
    machine.handle_timeout(2.0 + config.request_timeout_s + 0.01)
    assert {e.peer_id for e in machine.routing_table} == {ident(far[1]).peer_id, ident(far[2]).peer_id}
    assert machine.statistics().evictions == 1


# ------------------------------------------------------------------ bootstrap
def test_bootstrap_retries_with_backoff_while_everyone_is_unreachable() -> None:
    net = Net()
    machine = net.add(new_machine(0))
    dead = ident(1).peer_id
    op = machine.start_bootstrap(0.0, [(dead, addr_of(1))])
    net.flush()
    net.run(60.0, step=0.05)
    retries = [e for _, e in net.events if isinstance(e, BootstrapRetrying)]
    assert len(retries) >= 5
    config = DHTConfig.local()
    assert all(config.bootstrap_backoff_min_s * 0.5 <= r.delay_s <= config.bootstrap_backoff_max_s for r in retries)
    assert retries[4].delay_s > retries[0].delay_s
    assert [r.attempt for r in retries] == list(range(1, len(retries) + 1))
    assert machine.bootstrap_state is BootstrapState.BACKOFF
    assert net.done(machine.peer_id, op) is None
    # The peer comes up: the next attempt succeeds and completes the original op.
    net.add(new_machine(1))
    net.run(config.bootstrap_backoff_max_s + 1.0)
    result = net.done(machine.peer_id, op)
    assert isinstance(result, BootstrapResult) and result.attempts == len(retries) + 1
    assert machine.bootstrap_state is BootstrapState.DONE
    assert dead in machine.routing_table


def test_bootstrap_address_without_peer_id_asks_the_driver_to_dial() -> None:
    net = Net()
    machine = net.add(new_machine(0))
    helper = net.add(new_machine(1))
    op = machine.start_bootstrap(0.0, [(None, addr_of(1))])
    net.flush()
    (dial,) = [e for _, e in net.events if isinstance(e, BootstrapDialRequested)]
    assert dial.addr == addr_of(1)
    machine.add_contact(0.1, helper.peer_id, (dial.addr,))  # the driver dialled and learned the id
    net.flush()
    result = net.done(machine.peer_id, op)
    assert isinstance(result, BootstrapResult) and result.routing_table_size == 1


def test_unresolved_bootstrap_that_nobody_resolves_retries() -> None:
    net = Net()
    machine = net.add(new_machine(0))
    machine.start_bootstrap(0.0, [(None, addr_of(1))])
    net.flush()
    net.run(DHTConfig.local().request_timeout_s * 2 + 0.1)
    assert any(isinstance(e, BootstrapRetrying) for _, e in net.events)


def test_bootstrap_argument_checks() -> None:
    machine = new_machine(0)
    with pytest.raises(ConfigError):
        machine.start_bootstrap(0.0, [])
    with pytest.raises(ConfigError):
        machine.start_bootstrap(0.0, [(None, "bogus")])
    with pytest.raises(ConfigError):
        machine.start_bootstrap(0.0, [(ident(3).peer_id, f"/ip4/1.1.1.1/tcp/1/p2p/{ident(4).peer_id}")])
    machine.start_bootstrap(0.0, [(ident(3).peer_id, addr_of(3))])
    with pytest.raises(LocalProtocolError):
        machine.start_bootstrap(0.0, [(ident(3).peer_id, addr_of(3))])


# ------------------------------------------------------------------ timers
def test_records_expire_and_are_republished_by_holders() -> None:
    config = dataclasses.replace(DHTConfig.local(), republish_interval_s=10.0, expiry_sweep_interval_s=1.0)
    net, machines = swarm(30, config)
    op = machines[0].start_store(net.now, b"key", b"value", ttl_s=25.0, version=0)
    net.flush()
    assert net.done(machines[0].peer_id, op).ok  # type: ignore[union-attr]
    latecomer = net.add(new_machine(99, config, now=net.now))
    latecomer.start_bootstrap(net.now, [(machines[0].peer_id, machines[0].listen_addrs[0])])
    net.flush()
    net.run(20.0, step=0.5)
    assert sum(m.statistics().republished for m in machines) >= 1
    holders = sum(1 for m in net.machines.values() if m.held_record(net.now, b"key") is not None)
    assert holders >= 20
    net.run(6.0, step=0.5)  # past the 25 s TTL: gone everywhere, republishing did not extend it
    assert all(m.held_record(net.now, b"key") is None for m in net.machines.values())
    assert sum(m.statistics().records_expired for m in net.machines.values()) >= 20


def test_the_owner_reissues_its_signed_records_and_they_lapse_once_it_is_gone() -> None:
    """Holders cannot extend a signed record (its issue time is signed); its owner re-signs it."""
    config = dataclasses.replace(DHTConfig.local(), republish_interval_s=10.0, expiry_sweep_interval_s=1.0)
    net, machines = swarm(12, config)
    owner = machines[0]
    key = signed_key(owner.peer_id, "cfg")
    op = owner.start_store(net.now, key, b"v", ttl_s=30.0)
    net.flush()
    assert net.done(owner.peer_id, op).ok  # type: ignore[union-attr]
    net.run(45.0, step=0.5)  # past the first issue's 30 s: alive because the owner re-issued it
    held = [m.held_record(net.now, key) for m in machines[1:]]
    assert sum(r is not None for r in held) >= 5
    assert max(r.issued_at_ms for r in held if r is not None) > 0
    net.down.add(owner.peer_id)
    del net.machines[owner.peer_id]
    net.run(31.0, step=0.5)  # holders keep republishing among themselves, but nobody can re-sign
    assert all(m.held_record(net.now, key) is None for m in machines[1:])


def test_an_unsigned_key_squatted_at_the_clock_limit_is_taken_back_by_a_later_store() -> None:
    config = dataclasses.replace(DHTConfig.local(), max_clock_skew_s=5.0)
    net, machines = swarm(10, config)
    squatter, honest = machines[1], machines[2]
    op = squatter.start_store(net.now, b"open", b"squat", version=MAX_VERSION)
    net.flush()
    assert net.done(squatter.peer_id, op).accepted == 0  # type: ignore[union-attr]
    op = squatter.start_store(net.now, b"open", b"squat", version=5_000)  # the furthest anyone accepts
    net.flush()
    assert net.done(squatter.peer_id, op).ok  # type: ignore[union-attr]
    net.run(6.0, step=0.5)
    op = honest.start_store(net.now, b"open", b"ours")  # version: the current time
    net.flush()
    assert net.done(honest.peer_id, op).ok  # type: ignore[union-attr]
    op = machines[5].start_get(net.now, b"open")
    net.flush()
    found = net.done(machines[5].peer_id, op)
    assert found is not None and found.record is not None and found.record.value == b"ours"  # type: ignore[attr-defined]


def test_statistics_is_a_frozen_snapshot() -> None:
    machine = new_machine(0)
    stats = machine.statistics()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.lookups = 5  # type: ignore[misc]
    answer_to(machine, ident(1).peer_id, Ping(request_id=1, sender_addrs=()))
    assert stats.requests_received == 0 and machine.statistics().requests_received == 1


def test_every_dispatch_table_names_a_handler_of_the_machine() -> None:
    """The tables route by method name (no bound methods kept per machine): every name must exist,
    and the tables keyed by an enum cover all of it."""
    tables: dict[str, dict[object, str]] = {
        "RECEIVE": dict(RECEIVE),
        "ON_ANSWER": dict(ON_ANSWER),
        "ON_FAILURE": dict(ON_FAILURE),
        "ON_TIMER": dict(ON_TIMER),
        "SERVE": dict(SERVE),
        "TAKE": dict(TAKE),
        "AFTER_LOOKUP": dict(AFTER_LOOKUP),
        "PREPARE_PUT": dict(PREPARE_PUT),
    }
    for table, entries in tables.items():
        for key, name in entries.items():
            assert callable(getattr(DHTMachine, name, None)), f"{table}[{key}] names no method: {name}"
    assert set(ON_TIMER) == set(DHTTimer)
    assert set(AFTER_LOOKUP) == set(LookupKind)
