"""``chaosp2p cluster report`` on recorded timelines (tests/unit/data/cluster_*_timeline.jsonl).

``cluster_bare_timeline.jsonl`` was recorded by running a scenario of four bare peers (a join, a
kill, a 6 s cut of p1~p3, a leave) with ``chaosp2p cluster``. ``cluster_digits_timeline.jsonl`` is
``chaosp2p cluster peers/churn-demo.toml`` (six digits peers), thinned to every 10th step record
plus the steps around operations and the long waits, with digests and losses dropped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from chaosp2p.cluster.report import PLOT_NAMES, print_summary, summarize, summary_json, write_plots
from chaosp2p.cluster.timeline import read_timeline

DATA = Path(__file__).parent / "data"


def test_bare_peers_events_are_answered_by_membership_events() -> None:
    summary = summarize(read_timeline(DATA / "cluster_bare_timeline.jsonl"))
    rows = {(e.action, e.subject): e for e in summary.events}
    assert list(rows) == [("join", "p4"), ("kill", "p2"), ("cut", "p1~p3"), ("restore", "p1~p3"), ("leave", "p3")]
    # The first membership event about the subject, after the injection, by any peer.
    assert rows[("join", "p4")].kind == "peer_joined"
    assert rows[("join", "p4")].detection_s == pytest.approx(0.958, abs=1e-3)
    assert rows[("kill", "p2")].kind == "peer_suspected"
    assert rows[("kill", "p2")].detection_s == pytest.approx(1.502, abs=1e-3)
    assert rows[("kill", "p2")].reporters == 3  # p1, p3 and p4 all suspected it
    # A cut is seen by its two ends only.
    assert rows[("cut", "p1~p3")].kind == "link_down" and rows[("cut", "p1~p3")].reporters == 2
    assert rows[("restore", "p1~p3")].kind == "link_up"
    # That recording's bare peers closed without announcing a leave (the agent does since): not seen.
    assert rows[("leave", "p3")].kind is None and rows[("leave", "p3")].detection_s is None
    # No training: no operations, joins of a run or idle time.
    assert all(e.decision_ms is None and e.applied_s is None for e in summary.events)
    assert summary.joins == () and summary.idle == ()
    # Processes running: p1 alone, then p2 and p3 joining it, p4 at its join, p3's exit, the stop.
    assert [count for _, count in summary.processes] == [0, 1, 2, 3, 4, 3, 0]


def test_report_output_tables_json_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    summary = summarize(read_timeline(DATA / "cluster_bare_timeline.jsonl"))
    console = Console(width=150, record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert "peer_suspected" in text and "1.502 s" in text and "not seen" in text
    json.dumps(summary_json(summary))  # JSON-ready
    written = write_plots(summary, tmp_path)
    assert [p.name for p in written] == list(PLOT_NAMES)
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_events_joins_and_idle_time() -> None:
    summary = summarize(read_timeline(DATA / "cluster_digits_timeline.jsonl"))
    rows = {e.action: e for e in summary.events}
    assert [e.action for e in summary.events] == ["join", "leave", "kill", "stall", "continue", "cut", "restore"]
    # Each injection answered by the committed operation: detection, decision, commit, applied step.
    join, leave, kill = rows["join"], rows["leave"], rows["kill"]
    assert (join.kind, join.activation_step, join.reporters) == ("join", 354, 5)
    assert join.detection_s == pytest.approx(11.788, abs=1e-3)  # from the newcomer's process start
    assert join.decision_ms == pytest.approx(37.147)
    assert (leave.kind, leave.activation_step) == ("leave", 368)
    assert leave.detection_s == pytest.approx(0.152, abs=1e-3)
    assert leave.applied_s == pytest.approx(0.650, abs=1e-3)
    assert (kill.kind, kill.activation_step, kill.reporters) == ("fail", 437, 4)  # w4 itself is dead
    assert kill.detection_s == pytest.approx(5.196, abs=1e-3)
    assert kill.committed_s is not None and kill.applied_s is not None
    assert kill.detection_s < kill.committed_s < kill.applied_s
    # The 3 s stall and the 8 s cut were not answered by an operation, but training waited through them.
    assert rows["stall"].kind is None and rows["stall"].longest_wait_s == pytest.approx(4.078, abs=1e-3)
    assert rows["cut"].kind is None and rows["cut"].longest_wait_s == pytest.approx(9.580, abs=1e-3)
    # Joins: the four initial joiners and the scheduled newcomer, sources named by peer.
    joins = {j.peer: j for j in summary.joins}
    assert set(joins) == {"w1", "w2", "w3", "w4", "newcomer"}
    newcomer = joins["newcomer"]
    assert newcomer.scheduled and not joins["w1"].scheduled
    assert newcomer.bytes_total == 115972 == sum(newcomer.bytes_by_source.values())
    assert set(newcomer.bytes_by_source) == {"a", "w1", "w2", "w3", "w4"}
    assert newcomer.scale_out_s == pytest.approx(12.299, abs=1e-3)
    assert newcomer.rates_bytes_per_s()["a"] == pytest.approx(115972 / 0.2081)
    # Idle time: every training peer, the ones that trained longest waited longest.
    idle = {row.peer: row for row in summary.idle}
    assert set(idle) == {"a", "w1", "w2", "w3", "w4", "newcomer"}
    assert all(0 < row.idle_fraction < 1 for row in idle.values())
    assert idle["a"].idle_s > idle["w3"].idle_s  # w3 left at 43 s
    # Membership: processes 1 -> 5 -> 6 (join) -> 5 (leave) -> 4 (kill) -> 0 (stop), configurations too.
    assert [count for _, count in summary.processes] == [0, 1, 2, 3, 4, 5, 6, 5, 4, 0]
    assert max(count for _, count in summary.membership["a"]) == 6
    assert summary.membership["a"][-1][1] == 4


def test_training_report_renders(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    summary = summarize(read_timeline(DATA / "cluster_digits_timeline.jsonl"))
    console = Console(width=150, record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert "newcomer" in text and "t=40.80 (scheduled)" in text and "37.1 ms" in text
    assert all(path.stat().st_size > 10_000 for path in write_plots(summary, tmp_path))
