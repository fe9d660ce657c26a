"""Training through link cuts (issue 19): the cluster scenario ``peers/link-chaos.toml`` on this
checkout and, with ``--baseline DIR``, on another checkout (e.g. the code before issue 19), in one run.

For every injected event (a cut, its restore) and every training peer it prints the longest gap
between two of the peer's consecutive steps that overlaps the event's window (from the event to the
next one; a peer that stops stepping counts until the window ends) and the steps it completed in the
window. The figures are seconds of wall time on this machine; compare the two checkouts' rows
(same machine, same load, same scenario), not absolute values. The load is printed.

    python benchmarks/link_chaos.py --baseline /work/main --out /tmp/link-chaos
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "peers" / "link-chaos.toml"


def run_scenario(checkout: Path, out: Path, scenario: Path) -> Path:
    """Run the scenario with ``checkout``'s code; the timeline's path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "chaosp2p", "cluster", str(scenario), "--out", str(out)]
    subprocess.run(command, env=env, cwd=checkout, check=True, stdout=subprocess.DEVNULL)
    return out / "timeline.jsonl"


def gaps(timeline: Path) -> list[dict[str, Any]]:
    """Per event window and peer: the longest gap between steps and the steps completed."""
    records = [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]
    stopping = [float(r["t"]) for r in records if r.get("event") == "stopping"]  # the final leaves
    end = stopping[0] if stopping else max(float(r["t"]) for r in records)
    zero = next((float(r["zero_t"]) for r in records if r.get("event") == "schedule"), 0.0)
    events = [r for r in records if r.get("event") == "inject"]
    steps: dict[str, list[float]] = {}
    for r in records:
        record = r.get("record")
        if isinstance(record, dict) and "step" in record and "event" not in record:
            steps.setdefault(str(r["source"]), []).append(float(r.get("seen_t", r["t"])))
    rows = []
    for i, event in enumerate(events):
        start = float(event["t"])
        stop = float(events[i + 1]["t"]) if i + 1 < len(events) else end
        subject = "~".join(event.get("link") or [event.get("peer") or ""])
        what = f"{event['action']} {subject} @{float(event.get('scheduled_t', start)) - zero:.0f}s"
        for peer, times in sorted(steps.items()):
            longest = 0.0
            for before, after in itertools.pairwise([*times, math.inf]):
                if after > start and before < stop:
                    # A peer that stopped stepping waits until the window ends.
                    gap = min(after, stop) - max(before, start) if after == math.inf else after - before
                    longest = max(longest, gap)
            done = sum(1 for t in times if start <= t < stop)
            rows.append({"event": what, "peer": peer, "longest_gap_s": round(longest, 2), "steps": done})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="another checkout to run the same scenario with")
    parser.add_argument("--scenario", type=Path, default=SCENARIO)
    parser.add_argument("--out", type=Path, default=Path("/tmp/link-chaos"))
    args = parser.parse_args()
    print("load:", Path("/proc/loadavg").read_text().strip())
    results = {"this": gaps(run_scenario(REPO, args.out / "this", args.scenario.resolve()))}
    if args.baseline is not None:
        print("load:", Path("/proc/loadavg").read_text().strip())
        results["baseline"] = gaps(
            run_scenario(args.baseline.resolve(), args.out / "baseline", args.scenario.resolve())
        )
    print("load:", Path("/proc/loadavg").read_text().strip())
    print(f"{'event':28} {'peer':6}" + "".join(f" {name + ' gap s':>16} {name + ' steps':>12}" for name in results))
    keyed = {name: {(r["event"], r["peer"]): r for r in rows} for name, rows in results.items()}
    for key in [(r["event"], r["peer"]) for r in results["this"]]:
        line = f"{key[0]:28} {key[1]:6}"
        for name in results:
            row = keyed[name].get(key)
            line += f" {row['longest_gap_s'] if row else '-':>16} {row['steps'] if row else '-':>12}"
        print(line)
    (args.out / "link_chaos.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
