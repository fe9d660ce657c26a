"""The module paths and objects hivemind scripts use exist on the drop-in (issue 22, items 2 and 5).

albert's scripts import ``hivemind.utils.logging``, ``hivemind.utils.networking``,
``hivemind.optim.state_averager``, ``hivemind.dht.{crypto,schema,validation}`` and
``get_dht_time``; lightning-hivemind and others handle visible multiaddrs and peer ids the
multiaddr/libp2p way. Each import is checked under the drop-in's own name and, with the alias that
``python -m chaosp2p.hivemind`` installs, under hivemind's.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Iterator

import pytest

from chaosp2p.hivemind.p2p import PeerID
from chaosp2p.hivemind.utils.multiaddr import Multiaddr
from chaosp2p.wire.identity import Identity

IMPORTS = [
    ("utils.logging", "get_logger"),
    ("utils.logging", "use_hivemind_log_handler"),
    ("utils.networking", "log_visible_maddrs"),
    ("utils.networking", "choose_ip_address"),
    ("utils", "get_dht_time"),
    ("utils", "ValueWithExpiration"),
    ("utils.timed_storage", "get_dht_time"),
    ("dht.crypto", "RSASignatureValidator"),
    ("dht.schema", "SchemaValidator"),
    ("dht.schema", "BytesWithPublicKey"),
    ("dht.validation", "RecordValidatorBase"),
    ("dht", "DHT"),
    ("p2p", "PeerID"),
    ("compression", "Float16Compression"),
    ("", "get_dht_time"),
    ("", "Float16Compression"),
    ("", "DHT"),
]


@pytest.fixture
def hivemind_alias() -> Iterator[None]:
    from chaosp2p.hivemind import alias

    before = list(sys.meta_path)
    alias.install_alias()
    try:
        yield
    finally:
        sys.meta_path[:] = before
        for name in [name for name in sys.modules if name == "hivemind" or name.startswith("hivemind.")]:
            del sys.modules[name]


@pytest.mark.parametrize(("module", "name"), IMPORTS)
def test_hivemind_s_import_paths_exist_on_the_drop_in(module: str, name: str) -> None:
    path = "chaosp2p.hivemind" + (f".{module}" if module else "")
    assert getattr(importlib.import_module(path), name) is not None


@pytest.mark.parametrize(("module", "name"), [*IMPORTS, ("optim.state_averager", "LRSchedulerBase")])
def test_the_alias_resolves_hivemind_imports_to_the_very_same_objects(
    hivemind_alias: None, module: str, name: str
) -> None:
    if module.startswith("optim"):
        pytest.importorskip("torch")
    ours = importlib.import_module("chaosp2p.hivemind" + (f".{module}" if module else ""))
    theirs = importlib.import_module("hivemind" + (f".{module}" if module else ""))
    assert theirs is ours
    assert getattr(theirs, name) is getattr(ours, name)
    assert ours.__spec__ is not None and ours.__spec__.name.startswith("chaosp2p.hivemind")


def test_the_alias_names_what_the_drop_in_lacks(hivemind_alias: None) -> None:
    with pytest.raises(ModuleNotFoundError, match=r"does not provide hivemind\.moe"):
        importlib.import_module("hivemind.moe")


def test_the_dht_clock_is_the_wall_clock_under_both_spellings() -> None:
    import chaosp2p.hivemind as hivemind

    assert hivemind.get_dht_time is hivemind.utils.get_dht_time
    assert abs(hivemind.get_dht_time() - time.time()) < 1.0


def test_lr_scheduler_base_is_torch_s() -> None:
    torch = pytest.importorskip("torch")
    from chaosp2p.hivemind.optim.state_averager import LRSchedulerBase

    assert LRSchedulerBase is torch.optim.lr_scheduler.LRScheduler


def test_a_visible_multiaddr_behaves_like_hivemind_s() -> None:
    peer = str(Identity.generate().peer_id)
    addr = Multiaddr(f"/ip4/10.1.2.3/tcp/4001/p2p/{peer}")
    assert addr["p2p"] == peer and addr["ip4"] == "10.1.2.3" and addr["tcp"] == "4001"
    assert "ip4" in addr and "ip6" not in addr and "p2p" in addr
    assert addr.values() == ["10.1.2.3", "4001", peer]
    assert addr.protocols() == ["ip4", "tcp", "p2p"]
    assert str(addr.decapsulate(f"/p2p/{peer}")) == "/ip4/10.1.2.3/tcp/4001"
    assert Multiaddr(str(addr)) == addr and Multiaddr(addr) == addr
    assert str(Multiaddr("/ip4/0.0.0.0/udp/0/quic")) == "/ip4/0.0.0.0/udp/0/quic"
    with pytest.raises(KeyError):
        addr["ip6"]


def test_a_peer_id_behaves_like_hivemind_s() -> None:
    wire = Identity.generate().peer_id
    peer = PeerID.of(wire)
    assert peer.to_base58() == str(wire) and peer.to_bytes() == wire.raw
    assert PeerID.from_base58(str(wire)) == peer
    assert peer == wire and peer == str(wire) and peer == wire.raw
    assert hash(peer) == hash(PeerID.from_base58(str(wire)))
    assert peer.pretty() == peer.to_string() == str(wire)


def test_log_visible_maddrs_prints_the_initial_peers_line(caplog: pytest.LogCaptureFixture) -> None:
    from chaosp2p.hivemind.utils.networking import choose_ip_address, log_visible_maddrs

    peer = str(Identity.generate().peer_id)
    addrs = [f"/ip4/127.0.0.1/tcp/1/p2p/{peer}", f"/ip4/8.8.8.8/tcp/1/p2p/{peer}"]
    assert choose_ip_address([Multiaddr(a) for a in addrs]) == "8.8.8.8"
    # The hivemind-style handler stops propagation at the drop-in's logger once any test set it up,
    # so listen on that logger itself rather than on the root.
    drop_in = logging.getLogger("chaosp2p.hivemind")
    drop_in.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="chaosp2p.hivemind"):
            log_visible_maddrs([Multiaddr(a) for a in addrs], only_p2p=False)
            log_visible_maddrs([Multiaddr(a) for a in addrs], only_p2p=True)
    finally:
        drop_in.removeHandler(caplog.handler)
    assert f"--initial_peers /ip4/8.8.8.8/tcp/1/p2p/{peer}" in caplog.text
    assert f"--initial_peers /p2p/{peer}" in caplog.text


def test_the_log_handler_moves_to_the_root_logger_on_request() -> None:
    from chaosp2p.hivemind.utils import logging as hivemind_logging

    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        hivemind_logging.use_hivemind_log_handler("in_root_logger")
        handler = hivemind_logging._handler
        assert handler in root.handlers
        assert handler not in logging.getLogger("chaosp2p.hivemind").handlers
        hivemind_logging.use_hivemind_log_handler("in_hivemind")
        assert handler not in root.handlers
        assert handler in logging.getLogger("chaosp2p.hivemind").handlers
    finally:
        hivemind_logging.use_hivemind_log_handler("in_hivemind")
        root.handlers[:], root.level = before
