"""Hosts on simulated sites (chaosp2p.cluster.sites): public, NAT, symmetric NAT, firewall -- who can
reach whom, the address a NAT host is seen at, and that every namespace is gone afterwards (also
when building fails halfway, and those a killed run left behind)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaosp2p.cluster import sites as sites_module
from chaosp2p.cluster.netns import NetnsUnavailable
from chaosp2p.cluster.scenario import SiteKind, SiteSpec
from chaosp2p.cluster.sites import SiteNetwork, remove_stale

from .processes import wait_until
from .sites import namespaces, require_sites
from .test_cluster import start_harness

pytestmark = pytest.mark.netns

SITES = [
    SiteSpec(name="dc", kind=SiteKind.PUBLIC),
    SiteSpec(name="home", kind=SiteKind.NAT, bandwidth_bytes_per_s=10e6),
    SiteSpec(name="cafe", kind=SiteKind.SYMMETRIC_NAT),
    SiteSpec(name="campus", kind=SiteKind.FIREWALL),
]
HOSTS = [("p", "dc"), ("q", "dc"), ("a", "home"), ("b", "cafe"), ("f", "campus")]
PORT = 5000
SOURCE_PORT = 40001

# Answers each connection with the address it came from.
SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PORT})); s.listen()
print("up", flush=True)
while True:
    c, a = s.accept(); c.sendall(("%s:%d" % a).encode()); c.close()
"""
# Dials each address from one source port; prints what each server saw (or the error).
CLIENT = f"""
import json, socket, sys
seen = {{}}
for host in sys.argv[1:]:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.settimeout(1.0)
    s.bind(("0.0.0.0", {SOURCE_PORT}))
    try:
        s.connect((host, {PORT})); seen[host] = s.recv(64).decode()
    except OSError as exc:
        seen[host] = "error: " + type(exc).__name__
    s.close()
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def network() -> Iterator[SiteNetwork]:
    require_sites()
    net = SiteNetwork.create(SITES, HOSTS)
    servers: list[subprocess.Popen[str]] = []
    try:
        for host, _ in HOSTS:
            server = subprocess.Popen(net.wrap(host, [sys.executable, "-c", SERVER]), stdout=subprocess.PIPE, text=True)
            servers.append(server)
        for server in servers:
            assert server.stdout is not None and server.stdout.readline().strip() == "up"
        yield net
    finally:
        for server in servers:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        net.close()
    assert not {n for n in namespaces() if n.startswith(net.prefix)}, "namespaces left behind"


def dial(net: SiteNetwork, source: str, *targets: str) -> dict[str, str]:
    """What each target's server saw when ``source`` dialled it (``error: ...`` if it could not)."""
    addrs = [net.address(t) for t in targets]
    out = subprocess.run(
        net.wrap(source, [sys.executable, "-c", CLIENT, *addrs]), capture_output=True, text=True, timeout=30
    )
    seen = json.loads(out.stdout)
    return {target: seen[addr] for target, addr in zip(targets, addrs, strict=True)}


def test_addresses_are_from_the_benchmarking_range(network: SiteNetwork) -> None:
    for placement in network.hosts.values():
        assert placement.address.startswith(("198.18.", "198.19."))
        assert placement.public_address.startswith("198.18.")
    assert network.hosts["a"].address.startswith("198.19.")  # private, behind its router


def test_public_hosts_reach_each_other_and_see_real_addresses(network: SiteNetwork) -> None:
    seen = dial(network, "p", "q")
    assert seen["q"] == f"{network.address('p')}:{SOURCE_PORT}"


def test_nat_hosts_dial_out_and_are_seen_at_their_router(network: SiteNetwork) -> None:
    home = dial(network, "a", "p", "q")
    router_a = network.hosts["a"].public_address
    # Endpoint-independent mapping: one inside port keeps one outside port whatever the destination.
    assert home["p"] == home["q"] == f"{router_a}:{SOURCE_PORT}"
    cafe = dial(network, "b", "p", "q")
    router_b = network.hosts["b"].public_address
    ports = {cafe["p"].split(":")[1], cafe["q"].split(":")[1]}
    assert all(seen.startswith(f"{router_b}:") for seen in cafe.values())
    # Symmetric: a random outside port per connection.
    assert len(ports) == 2 and str(SOURCE_PORT) not in ports


def test_nobody_dials_in_to_nat_or_firewalled_hosts(network: SiteNetwork) -> None:
    seen = dial(network, "p", "a", "b", "f")
    assert all(value.startswith("error") for value in seen.values()), seen
    seen = dial(network, "a", "b", "f")
    assert all(value.startswith("error") for value in seen.values()), seen
    assert dial(network, "f", "p")["p"] == f"{network.address('f')}:{SOURCE_PORT}"  # outbound works


def test_a_failed_build_removes_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    require_sites()
    before = namespaces()

    def broken(namespace: str, ruleset: str) -> None:
        raise NetnsUnavailable("nft broke")

    monkeypatch.setattr(sites_module, "_nft", broken)
    with pytest.raises(NetnsUnavailable, match="nft broke"):
        SiteNetwork.create(SITES, HOSTS)
    assert namespaces() == before


def test_stale_namespaces_of_dead_runs_are_removed() -> None:
    require_sites()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    time.sleep(0.05)
    name = f"chaosp2p-{gone.pid}-1-inet"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in remove_stale()
        assert name not in namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


BARE_SITES = """\
[cluster]
duration_s = 300
profile = "lan"

[[site]]
name = "dc"
[[site]]
name = "home"
kind = "nat"

[[peer]]
name = "p"
site = "dc"
[[peer]]
name = "a"
site = "home"
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ending", ["ctrl-c", "a peer that never starts"])
def test_a_run_on_sites_leaves_no_namespace_behind(tmp_path: Path, ending: str) -> None:
    require_sites()
    text = BARE_SITES
    if ending != "ctrl-c":
        text += '[[peer]]\nname = "broken"\nsite = "home"\nrun = "chaosp2p.no_such_module"\n'
    scenario = tmp_path / "sites.toml"
    scenario.write_text(text)
    out = tmp_path / "run"
    before = namespaces()
    harness = start_harness([], str(scenario), "--out", str(out), "--no-report")
    try:
        if ending == "ctrl-c":
            timeline = out / "timeline.jsonl"
            wait_until(
                lambda: timeline.exists() and '"event": "schedule"' in timeline.read_text(),
                timeout_s=90,
                what="both peers up in their namespaces",
            )
            assert len(namespaces() - before) == 4  # the internet, a's router, two hosts
            harness.send_signal(signal.SIGINT)
        output, _ = harness.communicate(timeout=120)
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.communicate()
    assert harness.returncode == (130 if ending == "ctrl-c" else 2), output
    assert namespaces() == before, output
    records = [json.loads(line) for line in (out / "timeline.jsonl").read_text().splitlines()]
    (scenario_record,) = [r for r in records if r.get("event") == "scenario"]
    assert scenario_record["sites"]["p"][1].startswith("198.18.") and scenario_record["sites"]["a"][1].startswith(
        "198.19."
    )
