"""PeerIDs, multiaddrs and key files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from chaosp2p.errors import ConfigError
from chaosp2p.transport.keyfile import (
    load_identity,
    load_or_create_identity,
    load_swarm_key,
    save_identity,
    write_swarm_key,
)
from chaosp2p.wire.base58 import b58decode, b58encode
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr


def test_peer_id_has_libp2p_ed25519_form() -> None:
    peer = Identity.generate().peer_id
    text = str(peer)
    assert text.startswith("12D3KooW")
    assert len(peer.raw) == 38
    assert PeerID.parse(text) == peer


def test_known_peer_id_from_seed() -> None:
    # Cross-checked against the Noise test vector in protocols/wire.md.
    assert str(Identity.from_seed(b"\x01" * 32).peer_id) == "12D3KooWK99VoVxNE7XzyBwXEzW7xhK7Gpv85r9F3V3fyKSUKPH5"


def test_signatures_verify_only_for_the_signer_and_the_data() -> None:
    a, b = Identity.generate(), Identity.generate()
    signature = a.sign(b"record")
    assert a.peer_id.verify(signature, b"record")
    assert not a.peer_id.verify(signature, b"other")
    assert not b.peer_id.verify(signature, b"record")
    assert not a.peer_id.verify(b"short", b"record")


@pytest.mark.parametrize("text", ["", "0OIl", "12D3KooW", "Qm" + "1" * 44, "x" * 100])
def test_bad_peer_ids_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        PeerID.parse(text)


def test_base58_round_trip_keeps_leading_zeros() -> None:
    for data in (b"", b"\0", b"\0\0\x01", bytes(range(40))):
        assert b58decode(b58encode(data)) == data


@pytest.mark.parametrize(
    "text",
    [
        "/ip4/127.0.0.1/tcp/4001",
        "/ip6/::1/tcp/0",
        "/dns/peer-1.example.org/tcp/443",
        "/dns4/localhost/tcp/1",
        "/ip4/10.0.0.5/tcp/4001/p2p/12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq",
    ],
)
def test_multiaddrs_round_trip(text: str) -> None:
    assert str(Multiaddr.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("127.0.0.1:4001", "expected"),
        ("/ip4/127.0.0.1/udp/4001", "only /tcp"),
        ("/ip4/300.0.0.1/tcp/1", "IPv4"),
        ("/ip6/zz::/tcp/1", "IPv6"),
        ("/ip4/127.0.0.1/tcp/port", "not a number"),
        ("/ip4/127.0.0.1/tcp/70000", "out of range"),
        ("/ip4/127.0.0.1/tcp/1/p2p/notapeer", "invalid PeerID"),
        ("/ip4/127.0.0.1/tcp/1/ws", "only /p2p"),
        ("/quic/1.2.3.4/tcp/1", "unsupported address kind"),
        ("/dns/-bad-/tcp/1", "DNS"),
        ("/" * 600, "too long"),
    ],
)
def test_bad_multiaddrs_name_the_problem(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Multiaddr.parse(text)


def test_identity_file_is_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "peer.key"
    first = load_or_create_identity(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_identity(path).peer_id == first.peer_id


def test_world_readable_identity_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    save_identity(Identity.generate(), path)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_identity(path)


def test_identity_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    save_identity(Identity.generate(), path)
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        save_identity(Identity.generate(), path)


def test_garbage_identity_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    path.write_bytes(b"not a key")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_identity(path)


def test_swarm_key_files(tmp_path: Path) -> None:
    path = tmp_path / "swarm.key"
    key = write_swarm_key(path)
    assert load_swarm_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    bare = tmp_path / "bare.key"
    bare.write_text("ab" * 32 + "\n")
    assert load_swarm_key(bare) == b"\xab" * 32
    for bad in ("zz" * 32, "ab" * 31, "/key/swarm/psk/1.0.0/\n/base64/\nxx", ""):
        bad_path = tmp_path / "bad.key"
        bad_path.write_text(bad)
        with pytest.raises(ConfigError):
            load_swarm_key(bad_path)
