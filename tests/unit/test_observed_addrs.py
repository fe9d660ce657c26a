"""ObservedAddrs: where other peers saw this host, counted once per observer and bounded."""

from __future__ import annotations

from chaosp2p.transport.observed import ObservedAddrs
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

PEERS = [Identity.generate().peer_id for _ in range(4)]
NAT = "/ip4/198.18.0.3/tcp/50324"


def test_an_address_is_confirmed_by_distinct_observers_only() -> None:
    observed = ObservedAddrs()
    for _ in range(5):  # one peer repeating itself confirms nothing
        observed.add(PEERS[0], NAT)
    assert [str(a) for a in observed.all()] == [NAT] and observed.confirmed() == []
    observed.add(PEERS[1], NAT + f"/p2p/{PEERS[3]}")
    assert [str(a) for a in observed.confirmed()] == [NAT]


def test_bad_or_empty_reports_are_ignored() -> None:
    observed = ObservedAddrs()
    assert observed.add(PEERS[0], "") is None
    assert observed.add(PEERS[0], "/ip4/999.1.1.1/tcp/1") is None
    assert observed.add(PEERS[0], "not an address") is None
    assert observed.all() == []


def test_the_table_is_bounded() -> None:
    observed = ObservedAddrs(max_addrs=3, max_observers=2)
    for port in range(10):
        for peer in PEERS:
            observed.add(peer, f"/ip4/198.18.0.3/tcp/{1000 + port}")
    assert [a.port for a in observed.all()] == [1007, 1008, 1009]
    assert len(observed.confirmed(min_observers=2)) == 3 and observed.confirmed(min_observers=3) == []


def test_ips_not_our_own_mean_a_nat_in_between() -> None:
    observed = ObservedAddrs()
    own = [Multiaddr.parse("/ip4/198.19.0.10/tcp/4001")]
    observed.add(PEERS[0], "/ip4/198.19.0.10/tcp/4001")
    assert observed.public_ips(own) == []
    observed.add(PEERS[1], NAT)
    observed.add(PEERS[2], "/ip4/198.18.0.3/tcp/61000")
    assert observed.public_ips(own) == ["198.18.0.3"]
