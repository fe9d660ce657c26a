"""The namespaced benchmarks' arguments (benchmarks/holepunch_nat.py, benchmarks/nat_relay.py), without running them.

Both build their parser on ``benchmarks/_namespaced.py``: the docstring as help, ``--json``, and
the hidden role arguments their child processes are started with. The benchmarks themselves need
root and network namespaces and are not part of the test suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.benchmark_scripts import benchmark_scripts


@pytest.fixture(scope="module")
def scripts() -> Iterator[dict[str, Any]]:
    with benchmark_scripts("holepunch_nat", "nat_relay") as found:
        yield dict(found)


@pytest.mark.parametrize("name", ["holepunch_nat", "nat_relay"])
def test_both_share_the_json_output_the_hidden_serve_role_and_their_docstring_as_help(
    scripts: dict[str, Any], name: str
) -> None:
    module = scripts[name]
    parser = module.parser()
    assert parser.description == module.__doc__
    args = parser.parse_args(["--json", "out.json", "--serve", "/ip4/10.0.0.1/tcp/1"])
    assert (args.json, args.serve) == ("out.json", "/ip4/10.0.0.1/tcp/1")
    assert parser.parse_args([]).json is None
    help_text = parser.format_help()
    assert "--json" in help_text and "--serve" not in help_text  # the children's roles stay hidden


def test_each_keeps_its_own_roles_and_measuring_options(scripts: dict[str, Any]) -> None:
    punch = scripts["holepunch_nat"].parser()
    args = punch.parse_args(["--connect", "R", "--connect", "W", "--source", "ip", "relay", "witness", "target", "3"])
    assert (args.connect, args.source, args.tries) == (["R", "W"], ["ip", "relay", "witness", "target", "3"], 10)
    assert args.observers == 2 and "--connect" not in punch.format_help()
    assert "--source" not in punch.format_help() and "--tries" in punch.format_help()
    relay = scripts["nat_relay"].parser()
    args = relay.parse_args(["--target", "S", "--client", "{}", "1", "2", "--mbit", "100"])
    assert (args.target, args.client, args.mbit, args.mib, args.repeats) == ("S", ["{}", "1", "2"], 100.0, 256.0, 3)
    assert "--client" not in relay.format_help()
