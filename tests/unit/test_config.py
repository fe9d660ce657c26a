"""Config dataclasses, profiles and TOML profile files."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.relay.holding import ReservationConfig
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.transport.config import TransportConfig

PEERS = Path(__file__).resolve().parents[2] / "peers"


@pytest.mark.parametrize("name", ["local", "lan", "wan"])
def test_profiles_are_valid_and_shipped_files_load(name: str) -> None:
    built_in = PeerConfig.profile_named(name)
    from_file = PeerConfig.from_toml(PEERS / f"{name}.toml")
    assert from_file.profile == built_in.profile == name
    assert from_file.transport.handshake_timeout_s == built_in.transport.handshake_timeout_s
    # The shipped files document the built-in profiles; they must not drift from them.
    assert from_file == built_in


@pytest.mark.parametrize("name", ["local", "lan", "wan"])
def test_every_component_follows_the_profile(name: str) -> None:
    """A profile sets every component's timing, not just the transport's."""
    config = PeerConfig.profile_named(name)
    for component in (config.transport, config.dht, config.membership, config.transfer):
        assert component == getattr(type(component), name)(), f"{type(component).__name__} is not the {name} profile"


def test_profiles_differ_where_networks_differ() -> None:
    local, wan = TransportConfig.local(), TransportConfig.wan()
    assert local.dead_connection_timeout_s < wan.dead_connection_timeout_s
    assert local.max_window_bytes < wan.max_window_bytes


def test_command_line_changes_win_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'profile = "lan"\n[peer]\nlisten = ["/ip4/127.0.0.1/tcp/5000"]\n[transport]\nrequest_timeout_s = 3\n'
    )
    config = PeerConfig.from_toml(path, listen=["/ip4/127.0.0.1/tcp/6000"])
    assert config.listen == ("/ip4/127.0.0.1/tcp/6000",)
    assert config.transport.request_timeout_s == 3.0
    assert config.profile == "lan"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[transport]\nrequest_timeout = 3\n", "no setting 'request_timeout'"),
        ("[transport]\nrequest_timeout_s = 'soon'\n", "must be a number"),
        ("[transport]\nrequest_timeout_s = -1\n", "must be > 0"),
        ("[gossip]\nx = 1\n", "unknown section"),
        ('profile = "mars"\n', "unknown profile"),
        ("[peer]\nlisten = ['localhost:80']\n", "invalid multiaddr"),
        ("[peer]\nport = 1\n", "no setting 'port'"),
        ("[transport\n", "not valid TOML"),
        ("[transport]\ninitial_window_bytes = 99999999999\n", "initial_window_bytes"),
    ],
)
def test_bad_profile_files_name_the_problem(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        PeerConfig.from_toml(path)


def test_missing_profile_file() -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        PeerConfig.from_toml("/nonexistent/profile.toml")


def test_transport_config_validation() -> None:
    with pytest.raises(ConfigError, match="keepalive"):
        TransportConfig(keepalive_interval_s=10, dead_connection_timeout_s=5)
    with pytest.raises(ConfigError):
        TransportConfig(max_record_bytes=0)


def test_the_reservations_section_follows_the_profile_and_loads_from_a_file(tmp_path: Path) -> None:
    for name in ("local", "lan", "wan"):
        assert PeerConfig.profile_named(name).reservations == getattr(ReservationConfig, name)()
    path = tmp_path / "p.toml"
    path.write_text('profile = "wan"\n[reservations]\nassume_private = true\nmax_relays = 1\n')
    config = PeerConfig.from_toml(path)
    assert config.reservations.assume_private and config.reservations.max_relays == 1
    assert config.reservations.check_interval_s == ReservationConfig.wan().check_interval_s
    path.write_text("[reservations]\nrenew_fraction = 1.5\n")
    with pytest.raises(ConfigError, match="renew_fraction"):
        PeerConfig.from_toml(path)
