"""The example trainers' shared flags: ``--listen`` replaces the profile's listen addresses (issue 21:
a host in its own network namespace could choose its address only with a profile file)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from chaosp2p.errors import ConfigError
from chaosp2p.trainers.digits import collaboration_config, parser, peer_config
from chaosp2p.wire.identity import Identity

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


def test_identity_gives_a_key_file_and_admit_closes_a_founded_run(tmp_path: Path) -> None:
    listed = Identity.generate().peer_id
    args = parser().parse_args(["--identity", str(tmp_path / "key"), "--admit", str(listed), "--batch", "32"])
    assert peer_config(args).identity_path == str(tmp_path / "key")
    config = collaboration_config(args, "local")
    assert config.admitted_peers == (str(listed),) and config.global_batch == 32
    assert collaboration_config(parser().parse_args([]), "local").admitted_peers == ()  # open by default


def test_admit_is_for_founders_and_names_peer_ids() -> None:
    with pytest.raises(SystemExit, match="--admit closes a run its founder creates"):
        collaboration_config(parser().parse_args(["--admit", "x", "--join", "/ip4/127.0.0.1/tcp/1"]), "local")
    with pytest.raises(ConfigError, match="not-a-peer"):
        collaboration_config(parser().parse_args(["--admit", "not-a-peer"]), "local")
