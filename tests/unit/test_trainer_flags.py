"""The example trainers' shared flags: ``--listen`` replaces the profile's listen addresses (issue 21:
a host in its own network namespace could choose its address only with a profile file)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from chaosp2p.errors import ConfigError
from chaosp2p.trainers.digits import parser, peer_config

pytestmark = pytest.mark.unit


def test_listen_replaces_the_profiles_addresses_and_is_repeatable() -> None:
    args = parser().parse_args(
        ["--profile", "lan", "--listen", "/ip4/198.19.1.10/tcp/4001", "--listen", "/ip4/127.0.0.1/tcp/0"]
    )
    assert peer_config(args).listen == ("/ip4/198.19.1.10/tcp/4001", "/ip4/127.0.0.1/tcp/0")


def test_without_listen_the_profile_decides() -> None:
    args = parser().parse_args(["--profile", "lan"])
    assert peer_config(args).listen == ("/ip4/0.0.0.0/tcp/4001",)


def test_a_bad_listen_address_is_a_config_error_naming_it() -> None:
    args = parser().parse_args(["--listen", "/ip4/not-an-ip/tcp/1"])
    with pytest.raises(ConfigError, match="not-an-ip"):
        peer_config(args)
