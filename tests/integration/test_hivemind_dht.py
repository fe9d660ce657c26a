"""The drop-in's DHT with real peers in one process: hivemind's store/get, fast failure on a dead
initial peer, and a DHT-only peer that never blocks a run (issue 22, items 1 and 3).

Each ``hivemind.DHT`` here is a real chaosp2p peer on 127.0.0.1 (its own background event loop).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from chaosp2p.errors import PeerUnreachable
from chaosp2p.hivemind import DHT, get_dht_time
from chaosp2p.hivemind.dht.crypto import RSASignatureValidator
from chaosp2p.wire.identity import Identity


def addrs(dht: DHT) -> list[str]:
    return [str(addr) for addr in dht.get_visible_maddrs()]


@pytest.fixture
def swarm() -> Iterator[list[DHT]]:
    """Three DHT peers: the first, and two bootstrapped from it."""
    first = DHT(start=True)
    peers = [first, DHT(initial_peers=addrs(first), start=True), DHT(initial_peers=addrs(first), start=True)]
    try:
        yield peers
    finally:
        for peer in reversed(peers):
            peer.shutdown()


def test_subkeys_from_several_writers_merge_and_expire_on_the_dht_clock(swarm: list[DHT]) -> None:
    """issue 22, finding 1: albert's callback stores metrics per peer, its monitor reads them all."""
    reader, writer_a, writer_b = swarm
    now = get_dht_time()
    assert writer_a.store("run_metrics", {"step": 1}, now + 2.0, subkey=b"a")
    future = writer_b.store("run_metrics", subkey=b"b", value={"step": 2}, expiration_time=now + 60, return_future=True)
    assert future.result(timeout=30) is True
    found = reader.get("run_metrics", latest=True)
    assert found is not None
    assert {key: item.value for key, item in found.value.items()} == {b"a": {"step": 1}, b"b": {"step": 2}}
    assert found.expiration_time == pytest.approx(now + 60)
    assert found.value[b"a"].expiration_time == pytest.approx(now + 2.0)
    time.sleep(max(0.0, now + 2.2 - get_dht_time()))
    later = reader.get("run_metrics", latest=True, return_future=True).result(timeout=30)
    assert later is not None and set(later.value) == {b"b"}  # a's entry expired


def test_regular_values_keep_the_latest_expiration_and_missing_keys_are_none(swarm: list[DHT]) -> None:
    """issue 22, finding 1."""
    reader, writer_a, writer_b = swarm
    now = get_dht_time()
    assert writer_a.store("config", (1, "old"), now + 30)
    assert writer_b.store("config", (2, "new"), now + 40)
    assert not writer_b.store("config", (3, "older"), now + 35)  # this writer holds a later one
    assert not writer_a.store("expired", 1, now - 1)
    found = reader.get("config")
    assert found is not None and found.value == (2, "new") and found.expiration_time == pytest.approx(now + 40)
    assert reader.get("never stored") is None


def test_an_entry_under_someone_else_s_owner_marker_is_dropped_on_read(swarm: list[DHT]) -> None:
    """issue 22, finding 1: record_validators are honoured; owner signatures use chaosp2p's Ed25519 keys."""
    reader, forger, owner = swarm
    victim = RSASignatureValidator(Identity.generate())
    own = RSASignatureValidator(Identity.generate())
    reader.add_validators([RSASignatureValidator()])
    owner.add_validators([own])
    now = get_dht_time()
    assert forger.store("metrics", {"loss": 0.0}, now + 30, subkey=victim.local_public_key)  # no validators there
    assert owner.store("metrics", {"loss": 1.0}, now + 30, subkey=own.local_public_key)  # signed
    found = reader.get("metrics")
    assert found is not None and set(found.value) == {own.local_public_key}
    assert found.value[own.local_public_key].value == {"loss": 1.0}  # the signature is stripped


def test_a_dead_initial_peer_is_an_error_within_seconds() -> None:
    """issue 22, finding 2: hivemind fails in 0.3 s; the drop-in used to accept it silently."""
    nobody = f"/ip4/127.0.0.1/tcp/9/p2p/{Identity.generate().peer_id}"
    with pytest.raises(PeerUnreachable, match="initial_peers"):
        DHT(initial_peers=[nobody], start=True)
    lenient = DHT(initial_peers=[nobody], start=True, ensure_bootstrap_success=False)
    assert lenient.is_alive()
    lenient.shutdown()
