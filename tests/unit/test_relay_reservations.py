"""Relay reservations and relay addresses, the pure pieces: the relay's table of slots (one per
peer, renewals, the cap, expiry) and ``/p2p-circuit`` addresses (``protocols/relay.md`` §6)."""

from __future__ import annotations

import pytest

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.reachability import Reachability
from chaosp2p.protocols.relay import RelayConfig, ReservationTable, StatusCode
from chaosp2p.protocols.relay.circuits import Refusal
from chaosp2p.wire.circuit_addr import CircuitAddr, is_circuit
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

A, B, R = (Identity.from_seed(bytes([seed]) * 32).peer_id for seed in (1, 2, 3))
CONFIG = RelayConfig(max_reservations=2, reservation_duration_s=100.0)


def test_a_reservation_lasts_its_duration_and_asking_again_renews_it() -> None:
    table = ReservationTable(CONFIG, enabled=True)
    assert table.reserve(A, 0.0) == 100.0
    assert table.holds(A, 99.0) and not table.holds(A, 100.0)
    assert table.reserve(A, 50.0) == 150.0  # renewed, still one slot
    assert len(table) == 1 and table.holds(A, 120.0)


def test_a_full_table_refuses_until_a_slot_expires() -> None:
    table = ReservationTable(CONFIG, enabled=True)
    table.reserve(A, 0.0)
    table.reserve(B, 10.0)
    refused = table.reserve(R, 20.0)
    assert isinstance(refused, Refusal) and refused.code == StatusCode.RESOURCE_LIMIT
    assert table.reserve(A, 30.0) == 130.0  # a holder may still renew when full
    assert table.reserve(R, 110.0) == 210.0  # B's slot (until 110) expired: room again
    assert not table.holds(B, 110.0) and table.refused == 1


def test_a_relay_that_relays_for_nobody_grants_no_reservation() -> None:
    refused = ReservationTable(CONFIG, enabled=False).reserve(A, 0.0)
    assert isinstance(refused, Refusal) and refused.code == StatusCode.DISABLED


@pytest.mark.parametrize("own", [Reachability.PRIVATE, Reachability.UNKNOWN])
def test_a_relay_that_is_not_public_refuses_reservations_saying_why(own: Reachability) -> None:
    """Two private peers on one LAN dial each other: the one dialled is no relay for the other."""
    table = ReservationTable(CONFIG, enabled=True)
    refused = table.reserve(A, 0.0, own=own)
    assert isinstance(refused, Refusal) and refused.code == StatusCode.NOT_PUBLIC
    assert f"reachability is {own.value}, not public" in refused.reason
    assert len(table) == 0 and table.refused == 1
    assert table.reserve(A, 1.0, own=Reachability.PUBLIC) == 101.0  # once its dial-backs say public
    refused = table.reserve(A, 2.0, own=Reachability.PRIVATE)  # a renewal is refused too
    assert isinstance(refused, Refusal) and table.holds(A, 50.0)  # the slot runs out; the holder drops it


def test_a_relay_without_dial_back_checks_or_on_one_machine_grants_as_before() -> None:
    assert ReservationTable(CONFIG, enabled=True).reserve(A, 0.0, own=None) == 100.0  # no checks run
    local = ReservationTable(RelayConfig.local(), enabled=True)
    assert not RelayConfig.local().reserve_only_when_public and RelayConfig.lan().reserve_only_when_public
    assert isinstance(local.reserve(A, 0.0, own=Reachability.UNKNOWN), float)


def test_a_released_slot_is_gone() -> None:
    table = ReservationTable(CONFIG, enabled=True)
    table.reserve(A, 0.0)
    table.release(A)
    assert not table.holds(A, 1.0) and len(table) == 0


def test_relay_addresses_parse_and_print_back() -> None:
    text = f"/ip4/198.18.0.1/tcp/4001/p2p/{R}/p2p-circuit/p2p/{B}"
    addr = CircuitAddr.parse(text)
    assert is_circuit(text) and not is_circuit(f"/ip4/198.18.0.1/tcp/4001/p2p/{R}")
    assert addr.relay == Multiaddr.parse(f"/ip4/198.18.0.1/tcp/4001/p2p/{R}")
    assert (addr.relay_peer, addr.target, addr.peer_id) == (R, B, B)
    assert str(addr) == text
    assert addr.with_peer(A).target == A and addr.without_peer() is addr


@pytest.mark.parametrize(
    "text",
    [
        f"/ip4/198.18.0.1/tcp/4001/p2p-circuit/p2p/{B}",  # the relay is not named
        f"/ip4/198.18.0.1/tcp/4001/p2p/{R}/p2p-circuit",  # no target
        f"/ip4/198.18.0.1/tcp/4001/p2p/{R}/p2p-circuit/p2p/{B}/extra",
        f"/ip4/198.18.0.1/tcp/4001/p2p/{B}/p2p-circuit/p2p/{B}",  # through the target itself
        f"/ip4/198.18.0.1/tcp/4001/p2p/{R}/p2p-circuit/p2p/not-a-peer-id",
        "/p2p-circuit/" + "x" * 2000,
    ],
)
def test_malformed_relay_addresses_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        CircuitAddr.parse(text)


def test_a_plain_multiaddr_refuses_a_relay_address() -> None:
    # What a peer of an earlier version does with one: a clear error, never a dial.
    with pytest.raises(ConfigError):
        Multiaddr.parse(f"/ip4/198.18.0.1/tcp/4001/p2p/{R}/p2p-circuit/p2p/{B}")
