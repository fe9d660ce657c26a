"""Defaults that work across hosts: wildcard listeners announce routable addresses, loopback only alone."""

from __future__ import annotations

import ipaddress
import socket

import chaosp2p
from chaosp2p.cli.common import DEFAULT_PROFILE, PeerOptions, load_config
from chaosp2p.transport.host import _advertised
from chaosp2p.transport.interfaces import announceable, interface_addresses
from chaosp2p.wire.multiaddr import Multiaddr


def test_a_wildcard_listener_announces_interface_addresses_but_not_loopback() -> None:
    announced = _advertised(Multiaddr.parse("/ip4/0.0.0.0/tcp/4001"))
    hosts = [a.host for a in announced]
    assert "0.0.0.0" not in hosts and hosts
    assert all(a.port == 4001 for a in announced)
    # Issue 21: a peer's loopback reaches only itself from elsewhere; announced only if it is all there is.
    assert hosts == announceable(interface_addresses(socket.AF_INET))


def test_loopback_is_announced_only_when_there_is_nothing_else() -> None:
    assert announceable(["198.19.1.10", "10.0.0.2", "127.0.0.1"]) == ["198.19.1.10", "10.0.0.2"]
    assert announceable(["127.0.0.1"]) == ["127.0.0.1"]
    assert announceable(["::1", "2001:db8::1"]) == ["2001:db8::1"]
    assert not any(ipaddress.ip_address(a).is_loopback for a in announceable(["127.0.0.2", "192.0.2.1"]))


def test_a_concrete_listener_announces_itself_only() -> None:
    assert [str(a) for a in _advertised(Multiaddr.parse("/ip4/127.0.0.1/tcp/5"))] == ["/ip4/127.0.0.1/tcp/5"]


def test_ipv6_wildcard_never_announces_link_local_or_the_wildcard() -> None:
    for address in interface_addresses(socket.AF_INET6):
        ip = ipaddress.ip_address(address)
        assert not ip.is_link_local and not ip.is_unspecified


def test_the_commands_default_to_a_profile_other_hosts_can_reach() -> None:
    assert DEFAULT_PROFILE == "lan"
    peer = load_config(PeerOptions(profile=DEFAULT_PROFILE))
    assert peer.profile == "lan" and peer.listen == ("/ip4/0.0.0.0/tcp/4001",)
    # state serve/pull: the same profile on a free port, so they can run beside a peer on 4001
    assert load_config(PeerOptions(profile=DEFAULT_PROFILE), any_port=True).listen == ("/ip4/0.0.0.0/tcp/0",)
    assert load_config(PeerOptions(profile=DEFAULT_PROFILE, listen=("/ip4/0.0.0.0/tcp/9",)), any_port=True).listen == (
        "/ip4/0.0.0.0/tcp/9",
    )
    assert load_config(PeerOptions(profile="local")).listen == ("/ip4/127.0.0.1/tcp/0",)


def test_the_blocking_facade_defaults_to_lan_on_every_interface() -> None:
    peer = chaosp2p.Peer(start=False)
    assert peer.config.profile == "lan"
    assert peer.config.listen == ("/ip4/0.0.0.0/tcp/0",)
    assert peer.config.membership == chaosp2p.PeerConfig.lan().membership
