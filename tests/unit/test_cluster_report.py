"""``chaosp2p cluster report`` on recorded timelines (tests/unit/data/cluster_*_timeline.jsonl).

``cluster_bare_timeline.jsonl`` was recorded by running a scenario of four bare peers (a join, a
kill, a 6 s cut of p1~p3, a leave) with ``chaosp2p cluster``.
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
