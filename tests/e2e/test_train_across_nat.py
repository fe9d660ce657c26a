"""Training across NAT (issue 21): a public founder P and trainers A and B behind two different NATs
(endpoint-independent and symmetric), each in its own network namespace, train the digits example.

Only P can be dialled. B joins a run A already trains in, reaching A only through P's relay: it is
still vouched for by a quorum and admitted (the issue saw "no state vouched for by a quorum (1 valid
vouches)"). The A~B link is agreed down and P, linked to both, carries the averaging. Every shared
step has one configuration digest and one parameter digest; each newcomer's first step matches P's.
(A firewalled peer: ``peers/nat-demo.toml``, run by hand -- one e2e run here keeps the suite short.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaosp2p.cluster.runner import run_scenario
from chaosp2p.cluster.scenario import parse_scenario

from .sites import namespaces, require_sites

pytestmark = pytest.mark.netns

SCENARIO = """\
[cluster]
duration_s = 18
profile = "lan"
startup_timeout_s = 90
stop_timeout_s = 5

[[site]]
name = "dc"
kind = "public"
[[site]]
name = "home"
kind = "nat"
[[site]]
name = "cafe"
kind = "symmetric-nat"

[[peer]]
name = "p"
run = "digits"
site = "dc"
args = ["--steps", "1000000", "--pace", "0.03"]
[[peer]]
name = "a"
run = "digits"
site = "home"
args = ["--steps", "1000000", "--pace", "0.03"]
[[peer]]
name = "b"
run = "digits"
site = "cafe"
args = ["--steps", "1000000", "--pace", "0.03"]

[[event]]                # b joins a run that a already trains in: b can reach only p
at_s = 0
action = "join"
peer = "b"
"""


def records(out: Path, name: str) -> list[dict[str, Any]]:
    path = out / "peers" / f"{name}.metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(240)
def test_peers_behind_two_nats_train_with_a_public_founder(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    require_sites()
    before = namespaces()
    result = run_scenario(parse_scenario(SCENARIO, "nat.toml"), tmp_path / "run")
    assert namespaces() == before  # every namespace of the run is gone
    out = result.out_dir
    names = ("p", "a", "b")
    metrics = {name: records(out, name) for name in names}
    logs = {name: (out / "peers" / f"{name}.log").read_text(errors="replace")[-3000:] for name in names}
    ids = {name: json.loads((out / "peers" / f"{name}.ready.json").read_text())["peer_id"] for name in names}

    steps: dict[int, dict[str, dict[str, Any]]] = {}
    for name, recs in metrics.items():
        for rec in recs:
            if isinstance(rec.get("step"), int):
                steps.setdefault(rec["step"], {})[name] = rec
    shared = {step: by for step, by in steps.items() if len(by) > 1}
    for step, by in shared.items():
        assert len({r["config_digest"] for r in by.values()}) == 1, (step, by)
        assert len({r["param_digest"] for r in by.values()}) == 1, (step, by)
    full = [step for step, by in steps.items() if len(by) == 3 and all(r["members"] == 3 for r in by.values())]
    assert full, f"no step with all three members; logs: {logs}"

    # Each newcomer was admitted (vouched for by a quorum, though it reaches the founder only) and
    # its first step is the founder's, bit for bit.
    for name in ("a", "b"):
        (joined,) = [r for r in metrics[name] if r.get("event") == "joined"]
        first = next(r for r in metrics[name] if isinstance(r.get("step"), int))
        assert first["step"] == joined["admitted_step"]
        assert first["param_digest"] == steps[first["step"]]["p"]["param_digest"]

    # The links between the unreachable ones were agreed down (by operations every member applied).
    down = {
        frozenset((r["subject"], r["other"]))
        for r in metrics["p"]
        if r.get("event") == "operation" and r.get("kind") == "link_down"
    }
    assert frozenset((ids["a"], ids["b"])) in down, f"a~b not agreed down: {down}"
    # ...and steps went on with all three after it: the founder carried the averaging.
