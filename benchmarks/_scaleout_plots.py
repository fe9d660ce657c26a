"""PNG plots of ``benchmarks/results/scaleout.json`` (matplotlib, headless), for docs/results.md."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display here; must precede pyplot
import matplotlib.pyplot as plt

LABELS = {
    "chaosp2p": "chaosp2p (all members, optimal plan)",
    "chaos_rule": "Chaos paper's assignment rule",
    "single_live": "single source, members train on (hivemind)",
    "single_barrier": "single source at a barrier (Autoscaling)",
    "restart": "checkpoint-restart",
}
STYLE = {
    "chaosp2p": ("tab:blue", "o", "-"),
    "chaos_rule": ("tab:cyan", "x", ":"),
    "single_live": ("tab:orange", "s", "-"),
    "single_barrier": ("tab:red", "^", "--"),
    "restart": ("tab:gray", "v", "-."),
}
REAL_KINDS = {"chaosp2p": "chaosp2p", "single": "single source", "restart": "checkpoint-restart"}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def plot_sim(report: dict[str, Any], out: Path) -> list[Path]:
    rows = [r for r in report["rows"] if r.get("links", "upload") == "upload"]
    states = sorted({r["state"] for r in rows}, key=lambda s: s != "resnet50")
    paths = []
    for key, methods, ylabel, name in (
        (
            "delay_s",
            ("chaosp2p", "chaos_rule", "single_live", "single_barrier", "restart"),
            "scale-out delay, s",
            "sim_delay.png",
        ),
        (
            "idle_total_s",
            ("chaosp2p", "single_barrier", "restart"),
            "existing members' idle time, summed, s",
            "sim_idle.png",
        ),
    ):
        fig, axes = plt.subplots(1, len(states), figsize=(6 * len(states), 4.2), squeeze=False)
        for ax, state in zip(axes[0], states, strict=True):
            sizes = sorted({r["members"] for r in rows if r["state"] == state})
            for method in methods:
                ys = [
                    _median([r["methods"][method][key] for r in rows if r["state"] == state and r["members"] == n])
                    for n in sizes
                ]
                color, marker, line = STYLE[method]
                ax.plot(sizes, ys, color=color, marker=marker, linestyle=line, label=LABELS[method])
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(n) for n in sizes])
            if key == "idle_total_s":
                ax.set_yscale("symlog", linthresh=1.0)
                ax.set_ylim(bottom=0)
            ax.set_xlabel("existing members")
            ax.set_ylabel(ylabel)
            mb = {"resnet50": 282, "vgg16": 1611}.get(state, 0)
            ax.set_title(f"{state} + Adam ({mb} MB), simulated")
            ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(
            f"uploads capped at 100-1000 Mbit/s per peer (seeded), step {report['step_time_s']:g} s; "
            f"medians of {report['seeds']} newcomers",
            fontsize=9,
        )
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    paths.append(plot_latency(report, out))
    return paths


def plot_latency(report: dict[str, Any], out: Path) -> Path:
    rows = report["decision_latency"]
    networks = [n for n in ("lan", "wan") if any(r.get("network", "wan") == n for r in rows)]
    fig, axes = plt.subplots(1, len(networks), figsize=(6 * len(networks), 4), squeeze=False)
    for ax, network in zip(axes[0], networks, strict=True):
        for kind, label in (
            ("LEAVE", "scale-in (LEAVE)"),
            ("LINK_UP", "connect-link"),
            ("LINK_DOWN", "disconnect-link"),
            ("FAIL", "failure"),
            ("JOIN", "scale-out admission"),
        ):
            mine = sorted(
                (
                    r
                    for r in rows
                    if r["kind"] == kind and r.get("network", "wan") == network and r["p50_ms"] is not None
                ),
                key=lambda r: r["members"],
            )
            ax.plot([r["members"] for r in mine], [r["p50_ms"] for r in mine], marker="o", label=label)
        ax.axhline(20, color="k", linestyle="--", linewidth=1, label="paper: 20 ms")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("members")
        ax.set_ylabel("detection -> last member committed, ms (median)")
        rtt = "0.5 ms RTTs, lan profile" if network == "lan" else "1-100 ms RTTs, wan profile"
        ax.set_title(f"negotiation decision latency, simulated, {rtt}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "sim_negotiation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_real(runs: dict[str, Any], out: Path) -> list[Path]:
    paths = []
    for state in sorted({r["state"] for r in runs.values()}):
        mine = sorted((r for r in runs.values() if r["state"] == state), key=lambda r: r["size"])
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        width = 0.27
        xs = list(range(len(mine)))
        for offset, (kind, label) in zip((-width, 0.0, width), REAL_KINDS.items(), strict=True):
            nan = float("nan")
            delay = [r[kind].get("to_contribute_s" if kind == "restart" else "join_to_contribute_s", nan) for r in mine]
            idle = [
                r[kind].get("excess_idle_s", r[kind].get("lost_s", nan)) if kind != "restart" else r[kind]["lost_s"]
                for r in mine
            ]
            axes[0].bar([x + offset for x in xs], delay, width, label=label)
            axes[1].bar([x + offset for x in xs], idle, width, label=label)
        for ax, ylabel in zip(
            axes,
            (
                "scale-out delay: join request (restart: stop) -> first step, s",
                "existing members' idle / lost s (mean)",
            ),
            strict=True,
        ):
            ax.set_xticks(xs, [f"N={r['size']}" for r in mine])
            ax.set_ylabel(ylabel)
            ax.grid(True, axis="y", alpha=0.3)
        axes[0].legend(fontsize=8)
        scale = mine[0]["link_scale"] if mine else 1.0
        loads = [r[k]["load_avg"] for r in mine for k in REAL_KINDS if "load_avg" in r[k]]
        fig.suptitle(
            f"real processes on 127.0.0.1, {state} + Adam x {scale:g} = {mine[0]['state_mb']:.0f} MB, "
            f"uploads capped at {scale:g} x 100-1000 Mbit/s (seeded); one trial each, "
            f"1-min load average {min(loads):.1f}-{max(loads):.1f} on 2 cores",
            fontsize=9,
        )
        fig.tight_layout()
        path = out / f"real_{state}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_all(report: dict[str, Any], out: Path) -> list[Path]:
    """Every plot the report has data for; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    if "sim" in report:
        paths += plot_sim(report["sim"], out)
    if report.get("real"):
        paths += plot_real(report["real"], out)
    return paths


# ---------------------------------------------------------------------------------------- markdown
def _md(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    """The report's tables in Markdown, for docs/results.md."""
    parts: list[str] = []
    sim = report.get("sim")
    if sim:
        for links, state in [
            (links, state)
            for links in ("upload", "symmetric")
            for state in sorted({r["state"] for r in sim["rows"]}, key=lambda s: s != "resnet50")
        ]:
            rows = []
            for n in sorted({r["members"] for r in sim["rows"] if r["state"] == state}):
                mine = [
                    r
                    for r in sim["rows"]
                    if r["state"] == state and r["members"] == n and r.get("links", "upload") == links
                ]
                if not mine:
                    continue

                def m(method: str, key: str, mine: list[dict[str, Any]] = mine) -> float:
                    return _median([r["methods"][method][key] for r in mine])

                rows.append(
                    [
                        n,
                        m("chaosp2p", "delay_s"),
                        m("chaos_rule", "delay_s"),
                        m("single_live", "delay_s"),
                        m("single_barrier", "delay_s"),
                        m("restart", "delay_s"),
                        m("chaosp2p", "idle_total_s"),
                        m("single_barrier", "idle_total_s"),
                        m("restart", "idle_total_s"),
                        _median([r["transfer"]["optimal_s"] / r["transfer"]["bound_s"] for r in mine]),
                    ]
                )
            if not rows:
                continue
            what = "uploads capped" if links == "upload" else "each peer's link caps both directions"
            parts.append(f"**{state} + Adam, simulated, {what}** (medians of {sim['seeds']} newcomers)\n")
            parts.append(
                _md(
                    [
                        "members",
                        "chaosp2p s",
                        "Chaos rule s",
                        "1 source, live s",
                        "1 source, barrier s",
                        "restart s",
                        "idle Σ chaosp2p s",
                        "idle Σ barrier s",
                        "idle Σ restart s",
                        "chaosp2p transfer / bound",
                    ],
                    rows,
                )
            )
        rows = []
        for network in ("lan", "wan"):
            for n in sorted({r["members"] for r in sim["decision_latency"]}):
                row: list[Any] = [network, n]
                for kind in ("LEAVE", "LINK_UP", "LINK_DOWN", "FAIL", "JOIN"):
                    hit = [
                        r
                        for r in sim["decision_latency"]
                        if r.get("network", "wan") == network and r["members"] == n and r["kind"] == kind
                    ]
                    row.append(hit[0]["p50_ms"] if hit and hit[0]["p50_ms"] is not None else "-")
                rows.append(row)
        parts.append("**Decision latency, simulated** (ms from detection until the last member committed; median)\n")
        parts.append(
            _md(["network", "members", "scale-in", "connect-link", "disconnect-link", "failure", "join"], rows)
        )
    real = report.get("real")
    if real:
        rows = []
        for key in sorted(real, key=lambda k: (real[k]["state"], real[k]["size"])):
            r = real[key]
            for kind in ("chaosp2p", "single", "restart"):
                t = r[kind]
                if "failed" in t:
                    rows.append([r["state"], r["size"], kind, "failed", "", "", "", "", ""])
                    continue
                exact = (
                    t["exact"] if not isinstance(t["exact"], dict) else t["exact"]["buffer"] and t["exact"]["params"]
                )
                load = t.get("load_s") if kind != "restart" else t["restart_to_loaded_s"]
                rows.append(
                    [
                        f"{r['state']} ({r['state_mb']:.0f} MB)",
                        r["size"],
                        kind,
                        (t["to_contribute_s"] if kind == "restart" else t["join_to_contribute_s"]),
                        load if load is not None else "-",
                        t["lost_s"],
                        t.get("excess_idle_s", "-"),
                        exact,
                        f"{t['load_avg']:.1f}",
                    ]
                )
        parts.append("**Real processes**\n")
        parts.append(
            _md(
                [
                    "state",
                    "N",
                    "method",
                    "scale-out delay s",
                    "state load s",
                    "members' lost s",
                    "members' excess idle s",
                    "bit-exact",
                    "load avg",
                ],
                rows,
            )
        )
    return "\n\n".join(parts) + "\n"
