"""Relay addresses in the DHT (issue 21, ``protocols/dht.md`` §3.1): requests, contacts and
provider records carry where a private peer is relayed, apart from its plain addresses; bad ones
are capped, dropped with a reason and counted; a provider record's relay part is signed apart."""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.dht import AddProviderResult, DHTMachine, DHTOperationDone, FindPeerResult, GetProvidersResult
from chaosp2p.dht.contacts import AddressValidator, announced_relay_addrs
from chaosp2p.dht.messages import (
    DHT_CODEC,
    AddProvider,
    Contact,
    FindNode,
    GetProviders,
    Nodes,
    Ping,
    Pong,
    ProviderRecord,
    Providers,
)
from chaosp2p.dht.records import make_provider_record, provider_relay_problem
from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

from .test_dht_machine import addr_of, answer_to, ident, new_machine, swarm

KEY = b"/prov/state/run-r/1"


def via(relay: int, target: int) -> str:
    """``target``'s relay address through ``relay``."""
    return f"{addr_of(relay)}/p2p/{ident(relay).peer_id}/p2p-circuit/p2p/{ident(target).peer_id}"


def decode(message: object) -> object:
    return DHT_CODEC.decode(DHT_CODEC.encode(message), max_bytes=1 << 20)  # type: ignore[arg-type]


def with_one_contact() -> tuple[DHTMachine, Identity]:
    """A machine whose routing table holds one peer, which answered its ping."""
    machine, helper = new_machine(0), ident(1)
    machine.add_contact(0.0, helper.peer_id, (addr_of(1),))
    (ping,) = machine.take_outgoing()
    assert isinstance(ping.message, Ping)
    machine.receive(0.0, helper.peer_id, "dht", Pong(request_id=ping.message.request_id))
    return machine, helper


# ------------------------------------------------------------------ wire
def test_relay_fields_round_trip_and_default_to_none() -> None:
    contact = Contact(peer_id=ident(1).peer_id, addrs=(addr_of(1),), relay_addrs=(via(2, 1),))
    assert decode(Nodes(request_id=1, closer=(contact,))) == Nodes(request_id=1, closer=(contact,))
    ping = Ping(request_id=2, sender_addrs=(addr_of(1),), sender_relay_addrs=(via(2, 1), via(3, 1)))
    assert decode(ping) == ping
    record = make_provider_record(ident(1), KEY, (addr_of(1),), seq=3, ttl_ms=60_000, relay_addrs=(via(2, 1),))
    assert decode(Providers(request_id=3, providers=(record,), closer=())) == Providers(
        request_id=3, providers=(record,), closer=()
    )
    assert Contact(peer_id=ident(1).peer_id, addrs=()).relay_addrs == ()
    assert make_provider_record(ident(1), KEY, (addr_of(1),), seq=0, ttl_ms=1).relay_signature == b""


@pytest.mark.parametrize(
    "change",
    [
        lambda obj: obj[1][0].append([via(2, 1)] * 9),  # more relay addresses than the wire allows
        lambda obj: obj[1][0].append(["/" + "x" * 1024]),  # one longer than a relay address can be
    ],
)
def test_the_decoder_refuses_relay_addresses_past_the_hard_caps(change: object) -> None:
    obj = [int(Nodes.TYPE), 1, [[ident(1).peer_id.raw, [addr_of(1)]]]]
    change(obj[1:])  # type: ignore[operator]
    with pytest.raises(RemoteProtocolError, match="relay address"):
        DHT_CODEC.decode(pack(obj), max_bytes=1 << 20)


def test_a_provider_record_needs_a_relay_signature_with_relay_addresses_and_only_then() -> None:
    record = make_provider_record(ident(1), KEY, (addr_of(1),), seq=0, ttl_ms=60_000, relay_addrs=(via(2, 1),))
    for bad in (dataclasses.replace(record, relay_signature=b""), dataclasses.replace(record, relay_addrs=())):
        with pytest.raises(RemoteProtocolError, match="relay signature"):
            bad.validate()


# ------------------------------------------------------------------ form
def test_bad_relay_addresses_are_named_with_their_reason() -> None:
    validator = AddressValidator(max_addrs=8)
    me = ident(1).peer_id
    assert validator.relay_problem(me, (via(2, 1),)) is None
    assert validator.relay_problem(me, (addr_of(2),)) == (
        f"not a relay address: invalid relay address {addr_of(2)!r}: expected <relay>/p2p/<id>/p2p-circuit/p2p/<id>"
    )
    assert validator.relay_problem(me, (via(2, 3),)) == "relay address reaches another peer"
    assert validator.relay_problem(me, (via(1, 1),)) == "not a relay address: a relay address through the target itself"
    assert validator.relay_problem(me, ("/" + "x" * 1100,)) == "relay address too long"
    assert validator.relay_problem(me, (via(2, 1),) * 9) == "9 relay addresses (max 8)"
    assert AddressValidator(max_addrs=2).relay_problem(me, (via(2, 1),) * 3) == "3 relay addresses (max 2)"
    assert validator.usable_relay_addrs(me, (via(2, 1), via(2, 3), "junk")) == ((via(2, 1),), 2)
    assert validator.usable_relay_addrs(me, (via(2, 1),) * 9) == ((), 9)


def test_announced_relay_addresses_keep_every_relay_within_the_cap() -> None:
    def at(relay: int, port: int) -> CircuitAddr:
        return CircuitAddr.parse(
            f"/ip4/10.9.0.{relay}/tcp/{port}/p2p/{ident(relay).peer_id}/p2p-circuit/p2p/{ident(1).peer_id}"
        )

    first = [at(5, p) for p in range(1, 7)]
    second = [at(6, p) for p in range(1, 7)]
    announced = announced_relay_addrs([*first, *second], 8)
    assert len(announced) == 8 and announced[:4] == (str(first[0]), str(second[0]), str(first[1]), str(second[1]))
    assert announced_relay_addrs(first[:2], 8) == (str(first[0]), str(first[1])) and announced_relay_addrs([], 8) == ()


# ------------------------------------------------------------------ requests and contacts
def test_a_requesters_relay_addresses_enter_its_entry_and_go_out_in_contacts() -> None:
    machine = new_machine(0)
    private, asker = ident(1).peer_id, ident(2).peer_id
    good = (via(5, 1),)
    answer_to(
        machine, private, Ping(request_id=1, sender_addrs=(addr_of(1),), sender_relay_addrs=(*good, via(5, 9), "junk"))
    )
    entry = machine.routing_table.get(private)
    assert entry is not None and entry.contact.relay_addrs == good
    assert machine.statistics().rejected_relay_addrs == 2  # the bad ones, the rest of the request served
    assert machine.dial_addrs(private) == (Multiaddr.parse(addr_of(1)), CircuitAddr.parse(good[0]))
    (reply,) = answer_to(machine, asker, FindNode(request_id=2, sender_addrs=(), target=bytes(32)))
    assert isinstance(reply.message, Nodes)
    [named] = [c for c in reply.message.closer if c.peer_id == private]
    assert named.addrs == (addr_of(1),) and named.relay_addrs == good  # never among the plain addresses


def test_an_answer_leaves_the_relay_addresses_a_peer_announced() -> None:
    machine = new_machine(0)
    private = ident(1).peer_id
    machine.add_contact(0.0, private, (addr_of(1),))  # e.g. a connection opened: no relay addresses
    (ping,) = machine.take_outgoing()
    answer_to(machine, private, Ping(request_id=1, sender_addrs=(addr_of(1),), sender_relay_addrs=(via(5, 1),)))
    machine.receive(0.1, private, "dht", Pong(request_id=ping.message.request_id))  # type: ignore[attr-defined]
    assert machine.known_relay_addrs(private) == (via(5, 1),)
    # Its own later request without them (it became reachable) is what clears them.
    answer_to(machine, private, Ping(request_id=2, sender_addrs=(addr_of(1),)))
    assert machine.known_relay_addrs(private) == ()


def test_contacts_keep_their_good_relay_addresses_and_lose_the_bad_ones() -> None:
    machine, helper = with_one_contact()
    machine.start_find_peer(0.1, ident(50).peer_id)
    (query,) = machine.take_outgoing()
    named = (
        Contact(peer_id=ident(7).peer_id, addrs=(addr_of(7),), relay_addrs=(via(5, 7), via(5, 8))),
        Contact(peer_id=ident(8).peer_id, addrs=(addr_of(8),), relay_addrs=(addr_of(5),)),  # a plain one
    )
    machine.receive(0.2, helper.peer_id, "dht", Nodes(request_id=query.message.request_id, closer=named))  # type: ignore[attr-defined]
    stats = machine.statistics()
    assert stats.rejected_relay_addrs == 2 and stats.rejected_garbage_peers == 0
    assert machine.known_relay_addrs(ident(7).peer_id) == (via(5, 7),)  # what the driver dials
    assert CircuitAddr.parse(via(5, 7)) in machine.dial_addrs(ident(7).peer_id)
    assert machine.known_addrs(ident(8).peer_id) == (addr_of(8),) and machine.known_relay_addrs(ident(8).peer_id) == ()


def test_our_relay_addresses_go_out_with_every_request_and_are_checked() -> None:
    machine = new_machine(0)
    with pytest.raises(ConfigError, match="reaches another peer"):
        machine.set_relay_addrs(0.0, [via(5, 3)])
    machine.set_relay_addrs(0.0, [via(5, 0)])
    assert machine.relay_addrs == (via(5, 0),)
    machine.add_contact(0.0, ident(1).peer_id, (addr_of(1),))
    (ping,) = machine.take_outgoing()
    assert isinstance(ping.message, Ping) and ping.message.sender_relay_addrs == (via(5, 0),)
    assert ping.message.sender_addrs == machine.listen_addrs


def test_a_peer_found_by_a_lookup_is_found_with_its_relay_addresses() -> None:
    net, machines = swarm(20, roundtrip=True)
    private, seeker = machines[13], machines[4]
    relay = (via(17, 13),)
    private.set_relay_addrs(net.now, relay)  # a self-lookup tells its neighbours at once
    net.flush()
    op = seeker.start_find_peer(net.now, private.peer_id)
    net.flush()
    found = net.done(seeker.peer_id, op)
    assert isinstance(found, FindPeerResult) and found.contact is not None
    assert found.contact.relay_addrs == relay and found.contact.addrs == private.listen_addrs
    assert CircuitAddr.parse(relay[0]) in seeker.dial_addrs(private.peer_id)


# ------------------------------------------------------------------ provider records
def test_provider_records_carry_signed_relay_addresses_to_whoever_looks_them_up() -> None:
    net, machines = swarm(20, roundtrip=True)
    private, seeker = machines[11], machines[3]
    private.set_relay_addrs(net.now, [via(17, 11)])
    op = private.start_add_provider(net.now, KEY, ttl_s=300.0)
    net.flush()
    added = net.done(private.peer_id, op)
    assert isinstance(added, AddProviderResult) and added.ok
    op = seeker.start_get_providers(net.now, KEY)
    net.flush()
    got = net.done(seeker.peer_id, op)
    assert isinstance(got, GetProvidersResult)
    [record] = got.providers
    assert record.relay_addrs == (via(17, 11),) and record.addrs == private.listen_addrs
    assert provider_relay_problem(record, AddressValidator(max_addrs=8)) is None


def test_a_change_of_relay_addresses_reissues_our_provider_records_at_once() -> None:
    net, machines = swarm(12, roundtrip=True)
    private = machines[5]
    op = private.start_add_provider(net.now, KEY, ttl_s=300.0)
    net.flush()
    added = net.done(private.peer_id, op)
    assert isinstance(added, AddProviderResult) and added.ok
    holders = [m for m in machines if m is not private and m.held_providers(net.now, KEY)]
    assert holders and all(m.held_providers(net.now, KEY)[0].relay_addrs == () for m in holders)
    net.now += 1.0  # a later issue time than the first record
    private.set_relay_addrs(net.now, [via(9, 5)])
    net.flush()
    assert all(m.held_providers(net.now, KEY)[0].relay_addrs == (via(9, 5),) for m in holders)
    assert private.held_providers(net.now, KEY)[0].seq == 0  # the same seq, re-issued


def _stored(machine: DHTMachine, sender: int, record: ProviderRecord, request_id: int) -> None:
    (ack,) = answer_to(
        machine, ident(sender).peer_id, AddProvider(request_id=request_id, sender_addrs=(), provider=record)
    )
    assert ack.message.accepted  # type: ignore[attr-defined]


def test_a_forged_relay_part_is_stripped_and_the_record_kept() -> None:
    machine = new_machine(0)
    record = make_provider_record(ident(1), KEY, (addr_of(1),), seq=0, ttl_ms=60_000, relay_addrs=(via(5, 1),))
    mallory = via(6, 1)  # a relay of the attacker's choice, under the provider's own relay signature
    _stored(machine, 2, dataclasses.replace(record, relay_addrs=(mallory,)), 1)
    [held] = machine.held_providers(0.0, KEY)
    assert held.relay_addrs == () and held.signature == record.signature
    assert machine.statistics().rejected_relay_addrs == 1
    assert (
        provider_relay_problem(dataclasses.replace(record, relay_addrs=(mallory,)), AddressValidator(max_addrs=8))
        == "bad relay signature"
    )
    # The genuine record at the same issue brings its relay part back.
    _stored(machine, 3, record, 2)
    assert machine.held_providers(0.0, KEY)[0].relay_addrs == (via(5, 1),)


def test_a_relay_part_arriving_in_an_answer_is_checked_too() -> None:
    machine, helper = with_one_contact()
    machine.start_get_providers(0.1, KEY)
    (query,) = machine.take_outgoing()
    assert isinstance(query.message, GetProviders)
    good = make_provider_record(ident(2), KEY, (addr_of(2),), seq=0, ttl_ms=60_000, relay_addrs=(via(5, 2),))
    other = make_provider_record(ident(3), KEY, (addr_of(3),), seq=0, ttl_ms=60_000, relay_addrs=(via(5, 3),))
    swapped = dataclasses.replace(other, relay_addrs=(via(6, 3),))
    answer = Providers(request_id=query.message.request_id, providers=(good, swapped), closer=())
    machine.receive(0.2, helper.peer_id, "dht", answer)
    machine.peer_unreachable(0.3, helper.peer_id)
    [event] = machine.take_events()
    assert isinstance(event, DHTOperationDone)
    result = event.result
    assert isinstance(result, GetProvidersResult)
    by_provider = {r.provider: r for r in result.providers}
    assert by_provider[ident(2).peer_id].relay_addrs == (via(5, 2),)
    assert by_provider[ident(3).peer_id].relay_addrs == () and machine.statistics().rejected_relay_addrs == 1
