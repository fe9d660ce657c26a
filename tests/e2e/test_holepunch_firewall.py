"""Hole punching through two firewalls that drop inbound connections, in network namespaces.

A and B sit each behind a stateful firewall (nftables: inbound TCP in conntrack state ``new`` is
dropped), R is open; all three on one bridge (198.18.77.0/24, no route anywhere else). A cannot
dial B, and R cannot dial A back (A's reachability check says private). Through R, A punches: both
send their SYN from their listen port at the same moment, each firewall lets the other's SYN in as
the reply to its own, and the kernels join them (TCP simultaneous open) -- the path loopback cannot
show, where the first SYN always meets a listener. Needs root, ``ip`` and ``nft``; skipped otherwise.
Everything it makes is removed at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .punching import run_agents

pytestmark = pytest.mark.e2e

IPS = {"a": "198.18.77.1", "b": "198.18.77.2", "r": "198.18.77.3"}
FIREWALL = (
    "add table inet fw",
    "add chain inet fw input { type filter hook input priority 0; policy accept; }",
    "add rule inet fw input meta l4proto tcp ct state new drop",
)


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=20)


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("needs root, ip and nft (network namespaces with a firewall)")
    prefix = f"cpunch{os.getpid() % 100000}"
    hub = f"{prefix}-hub"
    names = {role: f"{prefix}-{role}" for role in IPS}
    made: list[str] = []
    try:
        for name in (hub, *names.values()):
            _run("ip", "netns", "add", name)
            made.append(name)
            _run("ip", "-n", name, "link", "set", "lo", "up")
        _run("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", hub, "link", "set", "br0", "up")
        for role, name in names.items():
            _run("ip", "-n", hub, "link", "add", f"v{role}", "type", "veth", "peer", "name", "eth0", "netns", name)
            _run("ip", "-n", hub, "link", "set", f"v{role}", "master", "br0", "up")
            _run("ip", "-n", name, "addr", "add", f"{IPS[role]}/24", "dev", "eth0")
            _run("ip", "-n", name, "link", "set", "eth0", "up")
        for role in ("a", "b"):
            for rule in FIREWALL:
                _run("ip", "netns", "exec", names[role], "nft", rule)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        pytest.skip(f"cannot build the namespaces here: {exc}")
    try:
        yield names
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_a_punch_through_two_firewalls_gives_a_direct_connection(namespaces: dict[str, str], tmp_path: Path) -> None:
    roles = {"relay": "r", "target": "b", "source": "a"}
    result, target = run_agents(
        lambda role, command: ["ip", "netns", "exec", namespaces[roles[role]], *command],
        {role: IPS[host] for role, host in roles.items()},
        tmp_path,
    )
    assert result["reachability"] == "private"  # R's dial-back is dropped by A's firewall
    assert result["direct_dial"] != "connected"  # B's firewall drops A's SYN
    assert result["relayed"] is True
    assert result["punched"] is True, result
    assert result["echo"] == "direct" and result["relayed_echo"] == "relayed"
    assert target["punched"] == 1
    # Neither listener took the SYN: both sockets connected, the smaller PeerID dialed the handshake.
    assert any("(initiate," in line or "(respond," in line for line in result["lines"]), result["lines"]
