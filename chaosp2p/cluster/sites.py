"""Hosts on simulated sites: each peer in its own network namespace, public, behind NAT or a firewall.

Theory of operation
-------------------
One run builds, with ``ip`` and ``nft`` (root only), a small internet that never touches the
machine's own interfaces:

* ``<prefix>-inet``: the "internet", one bridge (``br0``) and no addresses of its own. No link
  leaves it, so nothing in the run has a route to the host's interfaces (or the host to them).
* a ``public`` host: its namespace ``<prefix>-h-<host>`` has ``eth0`` on the bridge with a public
  address from 198.18.0.0/16; every public address is on one link, so no routes are needed.
* a ``firewall`` host: the same, plus an nftables input chain that drops every packet not part of a
  connection the host opened (a university firewall that allows only outbound connections).
* a ``nat`` / ``symmetric-nat`` site: a router namespace ``<prefix>-r-<site>`` with ``wan`` on the
  bridge (a public address) and a ``lan`` bridge (``198.19.<n>.1/24``) to its hosts
  (``198.19.<n>.10`` and up, default route via the router). nftables masquerades what leaves on
  ``wan`` and its forward chain drops whatever was not asked for from inside. ``nat`` is Linux's
  plain masquerade: it keeps a connection's source port when it can, so one inside socket maps to
  one outside port whatever the destination (endpoint-independent mapping, the kind hole punching
  gets through). ``symmetric-nat`` masquerades with ``fully-random``: every connection gets a
  random outside port (endpoint-dependent mapping, the kind it does not).

Per-host bandwidth (a site's ``bandwidth_mbit_s``) is ``tc tbf`` on both ends of the host's veth:
the host's end shapes its upload, the other end its download. Delay and loss are left to the
transport's shaper (the kernel here has no ``sch_netem``).

Every name carries the per-run prefix ``chaosp2p-<pid>-<n>``: :func:`remove_stale` deletes the
namespaces of runs whose process is gone (a harness killed with SIGKILL), and :meth:`close` --
called from ``finally`` blocks and context-manager exits, so also on Ctrl-C and on failure --
deletes this run's. Deleting a namespace deletes its veth ends and nftables tables with it; the
processes started in a namespace must have exited first (the harness stops them before).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from chaosp2p.cluster.netns import NetnsUnavailable
from chaosp2p.cluster.scenario import SiteKind, SiteSpec
from chaosp2p.errors import ConfigError

PUBLIC_PREFIX_LEN = 16
"""Public addresses: 198.18.0.0/16 (one link: the internet bridge)."""
LAN_PREFIX_LEN = 24
"""A NAT site's inside network: 198.19.<site index>.0/24."""
MAX_LAN_HOSTS = 200
_STALE = re.compile(r"^chaosp2p-(\d+)(?:-|$)")
_runs = itertools.count(1)


@dataclass(frozen=True, slots=True)
class HostPlacement:
    """Where one host ended up."""

    host: str
    site: str
    namespace: str
    address: str
    """Its interface address (a NAT host's is private: others see the router's)."""
    public_address: str
    """The address others see its connections come from (the router's for a NAT host)."""


def public_address(index: int) -> str:
    """The ``index``-th public address (from 198.18.0.2 on; 198.18.0.0/16 holds 65 000)."""
    number = index + 2
    if not 0 <= number < 65_534:
        raise ConfigError(f"public address #{index} is outside 198.18.0.0/16")
    return f"198.18.{number // 256}.{number % 256}"


def lan_address(site_index: int, host_index: int) -> str:
    """Host ``host_index`` of the ``site_index``-th NAT site (the router is ``.1``)."""
    if not 0 <= site_index < 256 or not 0 <= host_index < MAX_LAN_HOSTS:
        raise ConfigError(f"NAT site #{site_index} host #{host_index} is outside 198.19.0.0/16")
    return f"198.19.{site_index}.{10 + host_index}"


def check_tools() -> None:
    """Raise :class:`NetnsUnavailable` naming what is missing (root, ``ip``, ``tc``, ``nft``)."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("[[site]] namespaces need root (ip netns add, nft)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"[[site]] namespaces need the {tool!r} command (apt-get install {package})")


def remove_stale() -> list[str]:
    """Delete the namespaces left by chaosp2p runs whose process has exited; return their names."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    removed = []
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _STALE.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SiteNetwork:
    """The namespaces, links and rules of one run; :meth:`close` (or ``with``) removes them all."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.hosts: dict[str, HostPlacement] = {}
        self._namespaces: list[str] = []

    @classmethod
    def create(cls, sites: Sequence[SiteSpec], hosts: Sequence[tuple[str, str]]) -> SiteNetwork:
        """Build the network: ``hosts`` are ``(host, site name)`` pairs, every site named in ``sites``.

        Raises :class:`NetnsUnavailable` if namespaces cannot be made here (everything made so far
        is removed first), :class:`ConfigError` for a host on an unknown site.
        """
        by_name = {site.name: site for site in sites}
        for host, site in hosts:
            if site not in by_name:
                raise ConfigError(f"host {host!r} is on site {site!r}, which is not defined")
        check_tools()
        remove_stale()
        network = cls(f"chaosp2p-{os.getpid()}-{next(_runs)}")
        try:
            network._build(sites, hosts)
        except BaseException:
            network.close()
            raise
        return network

    def namespace(self, host: str) -> str:
        """The namespace ``host`` runs in."""
        return self.hosts[host].namespace

    def address(self, host: str) -> str:
        """The address ``host`` listens on."""
        return self.hosts[host].address

    def wrap(self, host: str, command: list[str]) -> list[str]:
        """``command`` run in ``host``'s namespace (``ip netns exec`` execs it: the PID is the command's)."""
        return ["ip", "netns", "exec", self.namespace(host), *command]

    def close(self) -> None:
        """Delete every namespace of the run (idempotent; links and nftables tables go with them)."""
        while self._namespaces:
            name = self._namespaces.pop()
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)

    def __enter__(self) -> SiteNetwork:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------ building
    def _add_namespace(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}"
        _run(["ip", "netns", "add", name])
        self._namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _build(self, sites: Sequence[SiteSpec], hosts: Sequence[tuple[str, str]]) -> None:
        inet = self._add_namespace("inet")
        _run(["ip", "-n", inet, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", inet, "link", "set", "br0", "up"])
        ports = itertools.count()
        publics = itertools.count()
        nat_sites = itertools.count()

        def attach(namespace: str, device: str) -> str:
            """A veth from ``device`` in ``namespace`` to a new port of the internet bridge."""
            port = f"p{next(ports)}"
            _veth(namespace, device, inet, port)
            _run(["ip", "-n", inet, "link", "set", port, "master", "br0", "up"])
            return port

        for site in sites:
            members = [host for host, name in hosts if name == site.name]
            if site.kind in (SiteKind.PUBLIC, SiteKind.FIREWALL):
                for host in members:
                    namespace = self._add_namespace(f"h-{host}")
                    address = public_address(next(publics))
                    port = attach(namespace, "eth0")
                    _address(namespace, "eth0", f"{address}/{PUBLIC_PREFIX_LEN}")
                    _shape(site, (namespace, "eth0"), (inet, port))
                    if site.kind is SiteKind.FIREWALL:
                        _nft(namespace, _FIREWALL)
                    self.hosts[host] = HostPlacement(host, site.name, namespace, address, address)
                continue
            if len(members) > MAX_LAN_HOSTS:
                raise ConfigError(f"site {site.name!r}: {len(members)} hosts, at most {MAX_LAN_HOSTS}")
            index = next(nat_sites)
            router = self._add_namespace(f"r-{site.name}")
            wan = public_address(next(publics))
            attach(router, "wan")
            _address(router, "wan", f"{wan}/{PUBLIC_PREFIX_LEN}")
            _run(["ip", "-n", router, "link", "add", "lan", "type", "bridge"])
            _address(router, "lan", f"198.19.{index}.1/{LAN_PREFIX_LEN}")
            _run(["ip", "netns", "exec", router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
            random = " fully-random" if site.kind is SiteKind.SYMMETRIC_NAT else ""
            _nft(router, _NAT.format(random=random))
            for number, host in enumerate(members):
                namespace = self._add_namespace(f"h-{host}")
                address = lan_address(index, number)
                port = f"h{number}"
                _veth(namespace, "eth0", router, port)
                _run(["ip", "-n", router, "link", "set", port, "master", "lan", "up"])
                _address(namespace, "eth0", f"{address}/{LAN_PREFIX_LEN}")
                _run(["ip", "-n", namespace, "route", "add", "default", "via", f"198.19.{index}.1"])
                _shape(site, (namespace, "eth0"), (router, port))
                self.hosts[host] = HostPlacement(host, site.name, namespace, address, wan)


# Inbound: only what belongs to a connection this host opened (and loopback).
_FIREWALL = """
table inet chaosp2p_firewall {
  chain input {
    type filter hook input priority 0; policy drop;
    iif lo accept
    ct state established,related accept
  }
}
"""

# Masquerade outbound; forward only what inside hosts opened; the router itself accepts nothing new
# from outside.
_NAT = """
table ip chaosp2p_nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "wan" masquerade{random}
  }}
}}
table inet chaosp2p_nat_filter {{
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
  }}
  chain input {{
    type filter hook input priority 0; policy drop;
    iif lo accept
    iifname "lan" accept
    ct state established,related accept
  }}
}}
"""


def _veth(namespace_a: str, device_a: str, namespace_b: str, device_b: str) -> None:
    # Both ends are created directly in their namespaces: no name ever exists in the host's.
    _run([
        "ip", "link", "add", "name", device_a, "netns", namespace_a,
        "type", "veth", "peer", "name", device_b, "netns", namespace_b,
    ])  # fmt: skip
    _run(["ip", "-n", namespace_a, "link", "set", device_a, "up"])
    _run(["ip", "-n", namespace_b, "link", "set", device_b, "up"])


def _address(namespace: str, device: str, cidr: str) -> None:
    _run(["ip", "-n", namespace, "addr", "add", cidr, "dev", device])
    _run(["ip", "-n", namespace, "link", "set", device, "up"])


def _shape(site: SiteSpec, *ends: tuple[str, str]) -> None:
    if site.bandwidth_bytes_per_s is None:
        return
    rate = f"{site.bandwidth_bytes_per_s * 8:.0f}bit"
    burst = f"{max(64 * 1024, int(site.bandwidth_bytes_per_s / 100))}b"
    for namespace, device in ends:
        _run([
            "ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", device, "root",
            "tbf", "rate", rate, "burst", burst, "latency", "100ms",
        ])  # fmt: skip


def _nft(namespace: str, ruleset: str) -> None:
    result = subprocess.run(
        ["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=ruleset, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise NetnsUnavailable(f"nft in {namespace} failed: {result.stderr.strip() or result.stdout.strip()}")


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = result.stderr.strip() or result.stdout.strip()
        raise NetnsUnavailable(f"{' '.join(command)} failed: {detail}")
