"""This host's IP addresses, to announce when a listener is bound to a wildcard (0.0.0.0 or ::).

A peer listening on ``0.0.0.0`` cannot hand out ``0.0.0.0``: others need an address that reaches
it. We enumerate the addresses of the host's interfaces (on Linux: ``SIOCGIFADDR`` per interface for
IPv4, ``/proc/net/if_inet6`` for IPv6) and order them routable first, loopback last, so a remote
peer that tries them in order reaches us without first timing out on an address that only works
locally. Elsewhere, or when the kernel says nothing, the host name's addresses stand in.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

_SIOCGIFADDR = 0x8915  # linux/sockios.h
_IFREQ = struct.Struct("16s16x")


def interface_addresses(family: int = socket.AF_INET) -> list[str]:
    """Addresses of this host's interfaces in ``family``, routable first, loopback last.

    IPv6 link-local addresses are left out: they need a zone (``%eth0``) to be dialed.
    """
    found = _linux_ipv4() if family == socket.AF_INET else _linux_ipv6()
    if not found:
        found = _from_host_name(family)
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=_rank)


def announceable(addresses: list[str]) -> list[str]:
    """``addresses`` without loopback ones, unless loopback is all there is.

    A peer's loopback reaches only itself from any other host or namespace: announced, it sent
    others' dials to their own listeners (issue 21: a peer behind NAT announced ``127.0.0.1`` and
    others' failed dials fell back to it). Peers on one machine reach each other at its routable
    addresses as well.
    """
    routable = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
    return routable or list(addresses)


def _rank(address: str) -> tuple[int, str]:
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return (2, address)
    if ip.is_private or ip.is_link_local:
        return (1, address)
    return (0, address)


def _linux_ipv4() -> list[str]:
    if fcntl is None:  # pragma: no cover
        return []
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return []
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, _IFREQ.pack(name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface (or not Linux)
                continue
            out.append(socket.inet_ntoa(reply[20:24]))
    return out


def _linux_ipv6() -> list[str]:
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if not fields or len(fields[0]) != 32:
            continue
        ip = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
        if not ip.is_link_local:
            out.append(str(ip))
    return out


def _from_host_name(family: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM)
    except OSError:
        infos = []
    loopback = "127.0.0.1" if family == socket.AF_INET else "::1"
    return [str(info[4][0]) for info in infos] + [loopback]
