"""The relay's circuit table (pure): admission against the limits, byte budgets, deadlines."""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.relay import Circuit, CircuitTable, Refusal, RelayConfig, StatusCode
from chaosp2p.wire.identity import Identity

A, B, C, D = (Identity.from_seed(bytes([seed]) * 32).peer_id for seed in (1, 2, 3, 4))


def table(**changes: object) -> CircuitTable:
    return CircuitTable(dataclasses.replace(RelayConfig(), **changes), enabled=True)


def test_a_circuit_gets_a_deadline_and_a_byte_budget() -> None:
    circuits = table(max_circuit_duration_s=60.0, max_circuit_bytes=100)
    circuit = circuits.admit(A, B, now=10.0)
    assert isinstance(circuit, Circuit)
    assert (circuit.source, circuit.target, circuit.deadline) == (A, B, 70.0)
    assert circuits.charge(circuit, 60) and circuits.charge(circuit, 40)
    assert not circuits.charge(circuit, 1)  # the 101st byte
    stats = circuits.statistics()
    assert (stats.open, stats.opened, stats.bytes_relayed, stats.closed_at_byte_cap) == (1, 1, 101, 1)


def test_disabled_and_malformed() -> None:
    off = CircuitTable(RelayConfig(), enabled=False)
    refused = off.admit(A, B, now=0.0)
    assert isinstance(refused, Refusal) and refused.code is StatusCode.DISABLED
    self_circuit = table().admit(A, A, now=0.0)
    assert isinstance(self_circuit, Refusal) and self_circuit.code is StatusCode.MALFORMED


def test_per_peer_limit_counts_both_ends_and_frees_on_close() -> None:
    circuits = table(max_circuits_per_peer=2)
    first = circuits.admit(A, B, now=0.0)
    second = circuits.admit(C, A, now=0.0)  # A is the target here: it counts too
    assert isinstance(first, Circuit) and isinstance(second, Circuit)
    third = circuits.admit(A, D, now=0.0)
    assert (
        isinstance(third, Refusal)
        and third.code is StatusCode.RESOURCE_LIMIT
        and "max_circuits_per_peer" in third.reason
    )
    assert isinstance(circuits.admit(C, D, now=0.0), Circuit)  # others are not affected
    circuits.close(first)
    circuits.close(first)  # idempotent
    assert isinstance(circuits.admit(A, D, now=0.0), Circuit)
    assert circuits.statistics().refused == 1


def test_a_target_counts_only_the_source_per_peer() -> None:
    # A relayed target's own table: the target is always itself, so only the source is limited.
    accepted = CircuitTable(
        dataclasses.replace(RelayConfig(), max_circuits_per_peer=1), enabled=True, count_target=False
    )
    assert all(isinstance(accepted.admit(source, D, now=0.0), Circuit) for source in (A, B, C))
    refused = accepted.admit(A, D, now=0.0)
    assert isinstance(refused, Refusal) and refused.code is StatusCode.RESOURCE_LIMIT


def test_total_limit() -> None:
    circuits = table(max_circuits=2, max_circuits_per_peer=4)
    assert isinstance(circuits.admit(A, B, now=0.0), Circuit)
    assert isinstance(circuits.admit(C, D, now=0.0), Circuit)
    refused = circuits.admit(A, C, now=0.0)
    assert isinstance(refused, Refusal) and "max_circuits" in refused.reason
    assert len(circuits.circuits()) == 2


@pytest.mark.parametrize("field", ["max_circuits", "max_circuit_bytes", "max_circuit_duration_s", "window_bytes"])
def test_config_refuses_non_positive_limits(field: str) -> None:
    with pytest.raises(ConfigError):
        dataclasses.replace(RelayConfig(), **{field: 0})


def test_profiles_and_the_off_switch_load_from_a_profile_file() -> None:
    from chaosp2p.runtime.config import PeerConfig

    assert RelayConfig.wan().max_circuit_bytes < RelayConfig.lan().max_circuit_bytes
    config = PeerConfig.from_mapping({"profile": "lan", "relay": {"enabled": False, "max_circuits": 3}})
    assert config.relay.enabled is False and config.relay.max_circuits == 3
    assert PeerConfig.local().relay.enabled and PeerConfig.wan().relay == RelayConfig.wan()
