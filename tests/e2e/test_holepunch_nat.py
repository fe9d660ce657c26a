"""Hole punching across NATs, in network namespaces (issue 21, "Done when").

R is public; A sits behind one endpoint-independent NAT ("home", kind ``nat``), B behind another
("office", ``nat``), C behind a symmetric NAT ("cafe", ``symmetric-nat``). Only R can be dialled.
A reaches B through R's relay and punches: each side connects from its listen port to the other's
observed IP and listen port; both masquerades keep the port, so the later SYN arrives on the
mapping the earlier one opened (conntrack's reply direction; the earlier one was dropped at the
other router) and the kernels join them (simultaneous open) -- a direct connection. C's NAT gives
every connection a new random port, so a SYN of C's would come from a port A was not told: a punch
cannot work. C knows it before trying: A, B and C also connect to W, a second public peer on R's
host, and R and W both saw C's connections come from other ports than C's sockets had, so C refuses
A's punch at once, saying why (``PORTS_CHANGED``, ``protocols/holepunch.md`` §3a), and the relayed
connection stays and still carries a stream round trip. The hosts run ``punch_agent.py`` (the
firewall test's); everything is removed at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaosp2p.cluster.scenario import SiteKind, SiteSpec
from chaosp2p.cluster.sites import SiteNetwork
from chaosp2p.wire.multiaddr import Multiaddr

from .punching import run_agents
from .sites import namespaces, require_sites

pytestmark = pytest.mark.netns

SITES = [
    SiteSpec(name="dc", kind=SiteKind.PUBLIC),
    SiteSpec(name="home", kind=SiteKind.NAT),
    SiteSpec(name="office", kind=SiteKind.NAT),
    SiteSpec(name="cafe", kind=SiteKind.SYMMETRIC_NAT),
]
HOSTS = [("r", "dc"), ("a", "home"), ("b", "office"), ("c", "cafe")]


@pytest.fixture(scope="module")
def network() -> Iterator[SiteNetwork]:
    require_sites()
    net = SiteNetwork.create(SITES, HOSTS)
    made = {placement.namespace for placement in net.hosts.values()}
    try:
        yield net
    finally:
        net.close()
    assert not made & namespaces()


def run_punch(net: SiteNetwork, source: str, target: str, folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The relay on R, the target and the source on their hosts; the source's result, the target's."""
    hosts = {"relay": "r", "witness": "r", "target": target, "source": source}
    return run_agents(
        lambda role, command: net.wrap(hosts[role], command),
        {role: net.address(host) for role, host in hosts.items()},
        folder,
    )


def test_a_punch_between_two_endpoint_independent_nats_gives_a_direct_connection(
    network: SiteNetwork, tmp_path: Path
) -> None:
    result, target = run_punch(network, "a", "b", tmp_path)
    assert result["reachability"] == "private"  # R's dial-back is dropped by A's NAT
    assert result["direct_dial"] != "connected"  # B's private address is not routed from A
    assert result["relayed"] is True
    assert result["punched"] is True, result
    assert (result["port_mapping"], target["port_mapping"]) == ("kept", "kept")  # both masquerades keep ports
    assert result["echo"] == "direct" and result["relayed_echo"] == "relayed"
    # Through both NATs: A's direct connection ends at B's router's public address.
    assert result["direct_remote"][0] == network.hosts["b"].public_address
    # ... on B's listen port: B's masquerade kept the port of the SYN B sent from it.
    assert result["direct_remote"][1] == Multiaddr.parse((tmp_path / "target.addr").read_text()).port
    assert target["punched"] == 1


def test_a_symmetric_nat_declines_the_punch_by_evidence_and_the_relayed_connection_still_carries_streams(
    network: SiteNetwork, tmp_path: Path
) -> None:
    result, target = run_punch(network, "a", "c", tmp_path)
    assert result["relayed"] is True
    assert (result["port_mapping"], target["port_mapping"]) == ("kept", "changed")  # by R's and W's reports
    assert result["punched"] is False, result
    # Declined by evidence, not by a timeout: C refused before either side sent a SYN.
    assert "the peer's NAT changes source ports (symmetric)" in result["error"], result
    assert (target["refused"], target["punched"]) == (1, 0)
    assert result["relayed_echo"] == "relayed"  # a stream round trip over the relay
