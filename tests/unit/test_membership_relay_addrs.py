"""Relay addresses in membership info records (``protocols/membership.md`` §2.3), on the sans-I/O machine.

A private member announces the relay addresses its reservations gave it, signed; a receiver keeps
them only when they are few, name the member, and carry the member's signature.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.membership.bookkeeping import check_relay_addrs
from chaosp2p.protocols.membership.messages import Gossip, InfoUpdate, Resources
from chaosp2p.wire.circuit_addr import CircuitAddr
from tests.unit.membership_claims import info, peer
from tests.unit.test_membership_machine import LAN, Scripted


def relay_addr(relay: int, target: int, port: int = 4001) -> str:
    return f"/ip4/198.18.0.{relay + 1}/tcp/{port}/p2p/{peer(relay)}/p2p-circuit/p2p/{peer(target)}"


def info_of(s: Scripted, index: int) -> InfoUpdate | None:
    return s.machine._members[peer(index)].info


def test_a_members_signed_relay_addresses_are_kept_and_dialable() -> None:
    s = Scripted(LAN, puppets=2)
    s.inject(peer(2), Gossip(infos=(info(1, 5, Resources(gpus=1), (), (relay_addr(2, 1),)),)))
    assert s.machine.relay_addrs(peer(1)) == (CircuitAddr.parse(relay_addr(2, 1)),)
    assert s.machine.relay_addrs(peer(2)) == ()


@pytest.mark.parametrize(
    "tamper",
    [
        "unsigned",
        "signed-by-another",
        "signature-of-another-version",
        "names-another-target",
        "not-a-relay-address",
        "too-many",
    ],
)
def test_bad_relay_addresses_drop_the_record(tamper: str) -> None:
    s = Scripted(LAN, puppets=3)
    good = info(1, 5, Resources(gpus=1), (), (relay_addr(2, 1),))
    record = {
        "unsigned": dataclasses.replace(good, relay_signature=b""),
        "signed-by-another": dataclasses.replace(
            good, relay_signature=info(3, 5, None, (), (relay_addr(2, 1),)).relay_signature
        ),
        "signature-of-another-version": dataclasses.replace(
            good, relay_signature=info(1, 4, None, (), (relay_addr(2, 1),)).relay_signature
        ),
        "names-another-target": info(1, 5, Resources(gpus=1), (), (relay_addr(2, 3),)),
        "not-a-relay-address": info(1, 5, Resources(gpus=1), (), ("/ip4/198.18.0.3/tcp/4001",)),
        "too-many": info(1, 5, Resources(gpus=1), (), tuple(relay_addr(2, 1, 4001 + i) for i in range(9))),
    }[tamper]
    before = s.machine.statistics()
    s.inject(peer(2), Gossip(infos=(record,)))
    after = s.machine.statistics()
    assert info_of(s, 1) is None and s.machine.relay_addrs(peer(1)) == ()
    assert (after.rejected_updates, after.bad_signatures) != (before.rejected_updates, before.bad_signatures)


def test_too_many_is_counted_against_the_configured_cap_not_only_the_wire_cap() -> None:
    config = dataclasses.replace(LAN, max_addrs_per_member=2)
    s = Scripted(config, puppets=2)
    s.inject(peer(2), Gossip(infos=(info(1, 5, None, (), tuple(relay_addr(2, 1, 4001 + i) for i in range(3))),)))
    assert info_of(s, 1) is None
    s.inject(peer(2), Gossip(infos=(info(1, 6, None, (), tuple(relay_addr(2, 1, 4001 + i) for i in range(2))),)))
    assert len(s.machine.relay_addrs(peer(1))) == 2


def test_announcing_relay_addresses_publishes_a_new_signed_info_version() -> None:
    s = Scripted(LAN, puppets=1)
    me = s.machine.member(s.me)
    assert me is not None
    version = me.info_version
    s.machine.set_local_relay_addrs(0.0, [relay_addr(1, 0)])
    ours = s.machine._self_info()
    assert ours.version == version + 1 and ours.relay_addrs == (relay_addr(1, 0),)
    assert s.machine.relay_addrs(s.me) == (CircuitAddr.parse(relay_addr(1, 0)),)
    s.machine.set_local_relay_addrs(0.0, [relay_addr(1, 0)])  # unchanged: no new version
    assert s.machine._self_info().version == version + 1
    s.machine.set_local_relay_addrs(0.0, [])  # the relay went away
    assert s.machine._self_info().relay_addrs == () and s.machine._self_info().relay_signature == b""
    with pytest.raises(ConfigError):
        s.machine.set_local_relay_addrs(0.0, [relay_addr(1, 2)])  # not ours


@functools.cache
def _valid_prefix() -> str:
    """A well-formed relay address, built once (deriving its identities is the slow part)."""
    return relay_addr(2, 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=200) | st.builds(lambda s: _valid_prefix() + s, st.text(max_size=20)), max_size=9))
def test_any_text_is_judged_without_raising(addrs: list[str]) -> None:
    problem = check_relay_addrs(addrs, peer(1), LAN)
    assert problem is None or isinstance(problem, str)
