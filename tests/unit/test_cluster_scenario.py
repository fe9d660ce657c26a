"""Scenario files of the cluster harness: what they mean, and bad input refused naming the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaosp2p.cluster.scenario import Action, LinkSpec, load_scenario, parse_scenario
from chaosp2p.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
[cluster]
duration_s = 30
seed = 4

[links]
bandwidth_mbit_s = 800
delay_ms = 2

[[peer]]
name = "a"
run = "digits"
args = ["--steps", "50"]

[[peer]]
name = "w"
count = 2

[[peer]]
name = "late"

[[link]]
between = ["a", "w2"]
bandwidth_mbit_s = 100
loss = 0.01

[[event]]
at_s = 5
action = "join"
peer = "late"

[[event]]
at_s = 8
action = "stall"
peer = "w1"
duration_s = 2

[[event]]
at_s = 9
action = "cut"
link = ["a", "w2"]
duration_s = 4

[[event]]
at_s = 20
action = "kill"
peer = "w1"
"""


def test_a_scenario_parses_into_peers_links_and_a_schedule() -> None:
    scenario = parse_scenario(GOOD, "good.toml")
    assert [p.name for p in scenario.peers] == ["a", "w1", "w2", "late"]
    assert [p.name for p in scenario.initial_peers] == ["a", "w1", "w2"]
    assert scenario.peer("a").run == "chaosp2p.trainers.digits"
    assert scenario.peer("a").args == ("--steps", "50")
    assert scenario.peer("w1").is_bare
    assert scenario.link_between("w2", "a") == LinkSpec(bandwidth_bytes_per_s=100e6 / 8, delay_s=0.0, loss=0.01)
    assert scenario.link_between("a", "w1") == LinkSpec(bandwidth_bytes_per_s=800e6 / 8, delay_s=0.002)
    assert scenario.shaped
    schedule = [(e.at_s, e.action, e.subject) for e in scenario.schedule()]
    assert schedule == [
        (5, Action.JOIN, "late"),
        (8, Action.STALL, "w1"),
        (9, Action.CUT, "a~w2"),
        (10, Action.CONTINUE, "w1"),
        (13, Action.RESTORE, "a~w2"),
        (20, Action.KILL, "w1"),
    ]


def test_an_unshaped_scenario_leaves_the_link_shaper_off() -> None:
    scenario = parse_scenario('[cluster]\nduration_s = 5\n[[peer]]\nname = "a"\n')
    assert not scenario.shaped
    assert scenario.default_link.neutral


def test_the_shipped_churn_demo_is_valid() -> None:
    scenario = load_scenario(REPO / "peers" / "churn-demo.toml")
    actions = {e.action for e in scenario.events}
    assert {Action.JOIN, Action.LEAVE, Action.KILL, Action.STALL, Action.CUT} <= actions
    assert len(scenario.peers) == 6
    assert all(p.run == "chaosp2p.trainers.digits" for p in scenario.peers)


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_scenario(text, "bad.toml")
    return str(info.value)


BASE = '[cluster]\nduration_s = 30\n\n[[peer]]\nname = "a"\n\n[[peer]]\nname = "b"\n'


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        # An unknown key, in each kind of table, names its own line.
        (BASE + "\n[[event]]\nat_s = 1\nactoin = 'kill'\npeer = 'a'\n", "bad.toml:12", "unknown key"),
        ('[cluster]\nduration_s = 30\ncolour = "red"\n[[peer]]\nname = "a"\n', "bad.toml:3", "'colour'"),
        (BASE + "\n[links]\ndelay_ms = 1\nbandwith_mbit_s = 10\n", "bad.toml:12", "'bandwith_mbit_s'"),
        ('[cluster]\nduration_s = 30\n[[peer]]\nname = "a"\nrun = "digits"\nargv = []\n', "bad.toml:6", "'argv'"),
        ("[cluster]\nduration_s = 30\n[tranport]\nx = 1\n[[peer]]\nname = 'a'\n", "bad.toml", "'tranport'"),
        # Impossible times.
        (BASE + "\n[[event]]\nat_s = 30\naction = 'kill'\npeer = 'a'\n", "bad.toml:11", "run ends at"),
        (BASE + "\n[[event]]\nat_s = -1\naction = 'kill'\npeer = 'a'\n", "bad.toml:11", "impossible"),
        (BASE + "\n[[event]]\nat_s = 20\naction = 'stall'\npeer = 'a'\nduration_s = 15\n", "bad.toml:14", "ends"),
        ("[cluster]\nduration_s = 0\n[[peer]]\nname = 'a'\n", "bad.toml:2", "impossible"),
        (BASE + "\n[[event]]\nat_s = 2\naction = 'kill'\npeer = 'a'\nduration_s = 3\n", "bad.toml:14", "instant"),
        (BASE + "\n[[event]]\nat_s = 2\naction = 'stall'\npeer = 'a'\n", "bad.toml:10", "duration_s"),
        # Impossible bandwidths, delays and losses.
        (BASE + "\n[links]\nbandwidth_mbit_s = 0\n", "bad.toml:11", "impossible"),
        (BASE + "\n[[link]]\nbetween = ['a', 'b']\nbandwidth_mbit_s = -5\n", "bad.toml:12", "impossible"),
        (BASE + "\n[[link]]\nbetween = ['a', 'b']\ndelay_ms = 'slow'\n", "bad.toml:12", "number"),
        (BASE + "\n[links]\nloss = 0.9\n", "bad.toml:11", "impossible"),
        (BASE + "\n[[link]]\nbetween = ['a', 'a']\n", "bad.toml:11", "two different peers"),
        (BASE + "\n[[link]]\nbetween = ['a', 'zz']\n", "bad.toml:11", "no peer named 'zz'"),
        # Events that cannot happen in that order, or to that peer.
        (BASE + "\n[[event]]\nat_s = 1\naction = 'kill'\npeer = 'nobody'\n", "bad.toml:13", "no peer named"),
        (BASE + "\n[[event]]\nat_s = 1\naction = 'explode'\npeer = 'a'\n", "bad.toml:12", "unknown action"),
        (
            BASE + "\n[[event]]\nat_s = 1\naction = 'kill'\npeer = 'a'\n\n[[event]]\nat_s = 2\naction = 'leave'\n"
            "peer = 'a'\n",
            "bad.toml:15",
            "cannot leave peer 'a': it is gone",
        ),
        (BASE + "\n[[event]]\nat_s = 1\naction = 'restore'\nlink = ['a', 'b']\n", "bad.toml:10", "not cut"),
        (BASE + "\n[[event]]\nat_s = 1\naction = 'cut'\npeer = 'a'\n", "bad.toml:13", "names a link"),
        # Peers.
        ('[cluster]\nduration_s = 30\n[[peer]]\nname = "a"\n[[peer]]\nname = "a"\n', "bad.toml:6", "already"),
        ('[cluster]\nduration_s = 30\n[[peer]]\nname = "9lives"\n', "bad.toml:4", "not a name"),
        ('[cluster]\nduration_s = 30\n[[peer]]\nname = "a"\nrun = "rm -rf"\n', "bad.toml:5", "module"),
        ("[cluster]\nduration_s = 30\n", "bad.toml", "at least one [[peer]]"),
        ('[[peer]]\nname = "a"\n', "bad.toml", "[cluster]"),
        ("[cluster\nduration_s = 3\n", "bad.toml", "not valid TOML"),
    ],
)
def test_bad_input_is_refused_naming_the_line(text: str, where: str, says: str) -> None:
    message = _error(text)
    assert message.startswith(where + ":") or message.startswith(where + " ") or message.startswith(where), message
    if ":" in where:
        assert message.split(":")[1] == where.split(":")[1], message
    assert says in message, message


def test_a_join_of_every_peer_is_refused() -> None:
    text = '[cluster]\nduration_s = 30\n[[peer]]\nname = "a"\n[[event]]\nat_s = 1\naction = "join"\npeer = "a"\n'
    assert "at least one must start at time 0" in _error(text)
