"""PNG plot of a ``benchmarks/soak.py`` run: the founder's RSS and open fds over time, with the churn.

    python benchmarks/_soak_plot.py benchmarks/results/soak_3600.json docs/results/soak_3600.png

The top panel is the founder's resident memory, the bottom one its open file descriptors; every
churn event is a tick on the time axis (its kind by colour). The second half's least-squares slope,
the figure the soak is judged by, is drawn over the RSS and written in the title.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here; must precede pyplot
import matplotlib.pyplot as plt

EVENT_COLOURS = {"join": "tab:green", "leave": "tab:blue", "kill": "tab:red", "stall": "tab:orange"}


def plot(report: dict[str, Any], out: Path) -> Path:
    samples = [s for s in report["samples"] if s["rss_mb"] is not None and s["fds"] is not None]
    minutes = [s["t"] / 60 for s in samples]
    end = samples[-1]["t"]
    half = [(s["t"], s["rss_mb"]) for s in samples if s["t"] >= end / 2]
    fit = statistics.linear_regression([t for t, _ in half], [v for _, v in half])
    figure, (rss, fds) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5))
    rss.plot(minutes, [s["rss_mb"] for s in samples], lw=0.8, color="tab:purple", label="founder RSS")
    rss.plot(
        [half[0][0] / 60, half[-1][0] / 60],
        [fit.intercept + fit.slope * half[0][0], fit.intercept + fit.slope * half[-1][0]],
        color="black",
        lw=1.5,
        ls="--",
        label=f"second half: {60 * fit.slope:+.3f} MB/min",
    )
    rss.set_ylabel("RSS (MB)")
    rss.legend(loc="lower right")
    fds.plot(minutes, [s["fds"] for s in samples], lw=0.8, color="tab:gray")
    fds.set_ylabel("open fds")
    fds.set_xlabel("minutes into the soak")
    for event in report["events"]:
        for axis in (rss, fds):
            axis.axvline(event["t"] / 60, color=EVENT_COLOURS.get(event["kind"], "k"), lw=0.4, alpha=0.5)
    kinds = sorted({e["kind"] for e in report["events"]})
    counts = ", ".join(f"{sum(e['kind'] == k for e in report['events'])} {k}" for k in kinds)
    rss.set_title(f"soak {end / 60:.0f} min, events: {counts} (vertical lines; colour by kind)", fontsize=10)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, out = Path(sys.argv[1]), Path(sys.argv[2])
    whole = json.loads(source.read_text())
    print(plot(whole.get("soak", whole), out))


if __name__ == "__main__":
    main()
