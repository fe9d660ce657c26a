"""ObservedAddrs: where other peers saw this host, counted once per observer and bounded."""

from __future__ import annotations

from chaosp2p.transport.observed import ObservedAddrs, PortMapping
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


def report(observed: ObservedAddrs, *seen: tuple[int, int, int | None]) -> ObservedAddrs:
    """``observed`` after each (observer index, port it saw us at, our socket's port) report."""
    for index, port, local_port in seen:
        observed.add(PEERS[index], f"/ip4/198.18.0.3/tcp/{port}", local_port=local_port)
    return observed


def test_changed_source_ports_need_two_observers_and_a_majority() -> None:
    observed = ObservedAddrs()
    assert observed.port_mapping() is PortMapping.UNKNOWN
    report(observed, (0, 61002, 40001))  # a symmetric NAT's new port
    report(observed, *[(0, 61003, 40002)] * 3)  # one observer repeating itself is one report
    assert observed.port_mapping() is PortMapping.UNKNOWN
    report(observed, (1, 52210, 40003))
    assert observed.port_mapping() is PortMapping.CHANGED
    report(observed, (2, 40004, 40004))  # one says kept: still a majority
    assert observed.port_mapping() is PortMapping.CHANGED
    assert observed.port_mapping(min_observers=3) is PortMapping.UNKNOWN


def test_kept_source_ports_and_a_tie_are_not_a_symmetric_nat() -> None:
    observed = report(ObservedAddrs(), (0, 40001, 40001), (1, 40002, 40002))
    assert observed.port_mapping() is PortMapping.KEPT
    report(observed, (2, 7, 40003), (3, 8, 40004))
    assert observed.port_mapping() is PortMapping.UNKNOWN  # two against two: no verdict
    # Accepted connections (no local_port) say nothing about the mapping of our outbound ones.
    assert report(ObservedAddrs(), (0, 9, None), (1, 10, None)).port_mapping(min_observers=1) is PortMapping.UNKNOWN


def test_a_changed_observer_counts_its_latest_report_only() -> None:
    observed = report(ObservedAddrs(), (0, 1, 40001), (1, 2, 40002))
    assert observed.port_mapping() is PortMapping.CHANGED
    report(observed, (1, 40003, 40003))  # a NAT that now keeps ports
    assert observed.port_mapping() is PortMapping.UNKNOWN
