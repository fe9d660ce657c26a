"""``[[site]]`` tables in cluster scenarios: parsed into sites, and bad ones refused naming file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosp2p.cluster.runner import ClusterRun
from chaosp2p.cluster.scenario import SiteKind, load_scenario, parse_scenario
from chaosp2p.errors import ConfigError

SITES = """\
[cluster]
duration_s = 30

[[site]]
name = "dc"

[[site]]
name = "home"
kind = "symmetric-nat"
bandwidth_mbit_s = 80

[[peer]]
name = "p"
site = "dc"

[[peer]]
name = "a"
site = "home"
"""


def test_sites_parse_and_peers_name_theirs() -> None:
    scenario = parse_scenario(SITES, "s.toml")
    dc, home = scenario.sites
    assert (dc.name, dc.kind, dc.bandwidth_bytes_per_s, dc.line) == ("dc", SiteKind.PUBLIC, None, 4)
    assert (home.kind, home.bandwidth_bytes_per_s) == (SiteKind.SYMMETRIC_NAT, 10e6)
    assert [(p.name, p.site) for p in scenario.peers] == [("p", "dc"), ("a", "home")]


def test_scenarios_without_sites_are_unchanged() -> None:
    scenario = parse_scenario('[cluster]\nduration_s = 3\n[[peer]]\nname = "a"\n', "s.toml")
    assert scenario.sites == () and scenario.peers[0].site is None


@pytest.mark.parametrize(
    ("old", "new", "where", "says"),
    [
        ('kind = "symmetric-nat"', 'kind = "carrier-grade"', "s.toml:9", "unknown site kind"),
        ("bandwidth_mbit_s = 80", "bandwidth_mbit_s = 0", "s.toml:10", "impossible"),
        ("bandwidth_mbit_s = 80", "mtu = 1400", "s.toml:10", "unknown key"),
        ('name = "home"', 'name = "dc"', "s.toml:8", "already defined on line 4"),
        ('name = "home"', 'name = "home/../x"', "s.toml:8", "not a site name"),
        ('site = "home"', 'site = "moon"', "s.toml:18", "no [[site]] named 'moon'"),
        ('site = "home"\n', "", "s.toml:16", "missing key 'site'"),
        ('name = "dc"\n', "", "s.toml:4", "missing key 'name'"),
    ],
)
def test_bad_sites_are_refused_naming_the_line(old: str, new: str, where: str, says: str) -> None:
    text = SITES.replace(old, new, 1)
    with pytest.raises(ConfigError) as info:
        parse_scenario(text, "s.toml")
    message = str(info.value)
    assert message.startswith(where + ":") and says in message, message


def test_netns_and_sites_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exclude each other"):
        ClusterRun(parse_scenario(SITES, "s.toml"), tmp_path, netns=True)


def test_the_shipped_nat_demo_is_valid() -> None:
    scenario = load_scenario(Path(__file__).resolve().parents[2] / "peers" / "nat-demo.toml")
    assert {s.kind for s in scenario.sites} == {SiteKind.PUBLIC, SiteKind.NAT, SiteKind.FIREWALL}
    assert all(p.site is not None for p in scenario.peers)


def test_the_shipped_nat_star_is_valid() -> None:
    """Three trainers that cannot reach each other around one public peer (docs/results.md)."""
    scenario = load_scenario(Path(__file__).resolve().parents[2] / "peers" / "nat-star.toml")
    kinds = {p.name: next(s.kind for s in scenario.sites if s.name == p.site) for p in scenario.peers}
    assert kinds == {"p": SiteKind.PUBLIC, "a": SiteKind.NAT, "f": SiteKind.FIREWALL, "b": SiteKind.SYMMETRIC_NAT}
