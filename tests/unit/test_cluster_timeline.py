"""The cluster timeline: peers' metrics files tailed onto one clock."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from chaosp2p.cluster.timeline import TimelineWriter, read_timeline


def test_records_are_placed_on_one_clock_and_partial_lines_wait(tmp_path: Path) -> None:
    zero = time.monotonic() - 100.0  # the harness started 100 s ago
    writer = TimelineWriter(tmp_path / "timeline.jsonl", zero_mono=zero)
    metrics = tmp_path / "a.metrics.jsonl"
    writer.follow("a", metrics)
    writer.set_peer_id("a", "12D3KooWa")
    assert writer.poll() == 0  # the file does not exist yet
    wall = time.time()
    lines = [
        {"event": "peer_failed", "at": zero + 5.0, "peer": "12D3KooWb"},  # monotonic stamp
        {"step": 3, "members": 2, "time": wall},  # wall-clock stamp
        {"event": "operation", "kind": "fail", "detected_at": zero + 6.0, "proposed_at": zero + 6.5,
         "committed_at": zero + 6.75},
        {"event": "joined", "bytes": 10},  # no stamp: placed when read
    ]  # fmt: skip
    with metrics.open("w") as file:
        file.write("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 4, "mem')  # a torn last line
    assert writer.poll() == 4
    records = writer.records
    assert all(r["source"] == "a" and r["peer_id"] == "12D3KooWa" for r in records)
    assert records[0]["t"] == pytest.approx(5.0)
    assert records[1]["t"] == pytest.approx(writer.now(), abs=1.0)  # wall time mapped onto the monotonic clock
    assert (records[2]["detected_t"], records[2]["proposed_t"], records[2]["committed_t"]) == pytest.approx(
        (6.0, 6.5, 6.75)
    )
    assert records[2]["t"] == pytest.approx(6.75)  # an operation sits at its commit
    assert records[3]["t"] == records[3]["seen_t"]
    with metrics.open("a") as file:
        file.write('bers": 2}\nnot json\n')
    assert writer.poll() == 2
    assert writer.records[4]["record"] == {"step": 4, "members": 2}
    assert writer.records[5]["record"] == {"unparsed": "not json"}
    writer.harness("inject", action="kill", peer="b")
    path = writer.close()
    on_disk = read_timeline(path)
    assert len(on_disk) == 7
    assert [r["t"] for r in on_disk] == sorted(r["t"] for r in on_disk)


def test_a_torn_timeline_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "timeline.jsonl"
    path.write_text('{"t": 1.0, "source": "harness", "event": "scenario"}\n{"t": 2.0, "sou')
    assert read_timeline(path) == [{"t": 1.0, "source": "harness", "event": "scenario"}]
