"""Links cut for good among four training processes (issue 19), through the cluster harness.

Four ``digits`` peers (real processes, the transport's link shaper on 127.0.0.1) train; the harness
cuts links and never restores them. On the code before issue 19 one cut (w1~w2) stopped the run:
every member completed one more step and then none. Now the two ends declare the link down
first-hand, the run commits the LINK_DOWN and re-plans the averaging around it.

Two disjoint cuts (a~w1, w2~w3) leave no member linked to all the others: every member owns a
shard and each cut pair must exchange. Before the relay (``protocols/averaging.md`` section 5.2)
such rounds failed for good; now each cut pair exchanges through a member linked to both: all four
keep training to the end, with equal parameter digests at every step two of them completed, and
nobody is removed. (One cut alone is the in-process test
``tests/integration/test_collaboration_links.py``; a harness run of it cost the suite ~45 s more.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaosp2p.cluster.timeline import read_timeline

HARNESS_TIMEOUT_S = 300.0

SCENARIO = """\
[cluster]
duration_s = 33
profile = "local"
startup_timeout_s = 120
stop_timeout_s = 20

[links]
delay_ms = 1

[[peer]]
name = "a"
run = "digits"
args = ["--steps", "1000000", "--pace", "0.05"]

[[peer]]
name = "w"
count = 3
run = "digits"
args = ["--steps", "1000000", "--pace", "0.05"]

"""

CUT = """
[[event]]
at_s = 10
action = "cut"
link = ["{0}", "{1}"]
"""


def _steps(records: list[dict[str, Any]]) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    steps: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for r in records:
        record = r.get("record")
        if isinstance(record, dict) and isinstance(record.get("step"), int) and "param_digest" in record:
            steps.setdefault(str(r["source"]), []).append((float(r.get("seen_t", r["t"])), record))
    return steps


@pytest.mark.timeout(400)
def test_four_processes_train_on_through_relays_after_two_disjoint_permanent_cuts(tmp_path: Path) -> None:
    short = _train_through_cuts(tmp_path, [("a", "w1"), ("w2", "w3")])
    assert not short, short


def _train_through_cuts(tmp_path: Path, cuts: list[tuple[str, str]]) -> list[str]:
    """Run the scenario with ``cuts`` at 10 s; check that all four trained on with equal digests
    and that a LINK_DOWN was committed; return the members last seen in a smaller configuration."""
    pytest.importorskip("torch")
    scenario = tmp_path / "cut.toml"
    scenario.write_text(SCENARIO + "".join(CUT.format(*pair) for pair in cuts))
    out = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-m", "chaosp2p", "cluster", str(scenario), "--out", str(out), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        output, _ = harness.communicate(timeout=HARNESS_TIMEOUT_S)
    finally:
        if harness.poll() is None:
            harness.send_signal(signal.SIGINT)  # the harness stops its peers on Ctrl-C
            harness.wait(timeout=60)
    assert harness.returncode == 0, output

    records = read_timeline(out / "timeline.jsonl")
    injected = [r for r in records if r.get("source") == "harness" and r.get("event") == "inject"]
    assert len(injected) == len(cuts) and all(r["action"] == "cut" and r["applied"] for r in injected)
    cut = injected[-1]
    stopping = next(float(r["t"]) for r in records if r.get("event") == "stopping")
    steps = _steps(records)
    assert set(steps) == {"a", "w1", "w2", "w3"}
    cut_t = float(cut["t"])
    by_step: dict[int, set[str]] = {}
    for seen in steps.values():
        for _, record in seen:
            by_step.setdefault(record["step"], set()).add(record["param_digest"])
    assert all(len(digests) == 1 for digests in by_step.values()), "members disagree on a step's parameters"
    operations = [r["record"] for r in records if isinstance(r.get("record"), dict)]
    assert any(o.get("event") == "operation" and o.get("kind") == "link_down" for o in operations)
    short: list[str] = []
    for peer, seen in steps.items():
        late = [record for t, record in seen if t > cut_t + (stopping - cut_t) / 2]
        # Still training in the second half of the time after the cut, all four together.
        assert len(late) >= 10, f"{peer} stopped training after the cut"
        if late[-1]["members"] != 4:
            short.append(f"{peer}: {late[-1]}")
    return short
