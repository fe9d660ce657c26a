"""``chaosp2p cluster report``: what a run's timeline says, as tables and PNG plots.

:func:`summarize` reads the records of a ``timeline.jsonl`` (see :mod:`chaosp2p.cluster.timeline`)
into a :class:`Summary`:

* **events** -- one row per injected action: when the swarm *detected* it (the matching committed
  operation's ``detected_at``; for a bare peer, the first membership event about the subject), how
  long the *decision* took (commit minus proposal) and when the change was *applied* (the first
  step record at or after the operation's activation step), all relative to the injection;
* **joins** -- one row per peer that joined a run: its *scale-out delay* (from its process start to
  its first training step), the state download's time and the bytes each source sent;
* **idle** -- per training peer: steps, the time spent waiting in rounds (``idle_s`` summed) and
  that time as a fraction of the peer's training span.

:func:`print_summary` renders it with rich; :func:`write_plots` writes ``membership.png``,
``scaleout.png``, ``transfer_rates.png`` and ``idle.png`` (needs matplotlib, in the ``test`` and
``train`` extras); :func:`summary_json` is the same data for scripts (``summary.json``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

PLOT_NAMES = ("membership.png", "scaleout.png", "transfer_rates.png", "idle.png")

# What a committed operation (training peers) or a membership event (bare peers) looks like when
# the swarm has handled an injected action.
_OPERATION_KINDS = {
    "join": ("join",),
    "leave": ("leave",),
    "kill": ("fail",),
    "stall": ("fail", "link_down"),
    "cut": ("link_down",),
    "restore": ("link_up",),
}
_MEMBERSHIP_EVENTS = {
    "join": ("peer_joined",),
    "leave": ("peer_left",),
    "kill": ("peer_suspected", "peer_failed"),
    "stall": ("peer_suspected", "link_down", "peer_failed"),
    "cut": ("link_down",),
    "restore": ("link_up",),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRow:
    """One injected action and how the swarm handled it (seconds after the injection)."""

    t: float
    action: str
    subject: str
    kind: str | None = None
    """The operation (or membership event) that answered it; ``None``: nothing did."""
    detection_s: float | None = None
    decision_ms: float | None = None
    committed_s: float | None = None
    activation_step: int | None = None
    applied_s: float | None = None
    reporters: int = 0
    """How many peers recorded it."""
    longest_wait_s: float | None = None
    """The longest any training peer waited in one round while this event was the latest (a cut or a
    stall that no operation answers still shows here)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRow:
    """One peer's join of the run."""

    peer: str
    scheduled: bool
    """Joined by a ``join`` event (else: one of the initial peers)."""
    t: float
    scale_out_s: float | None
    """From the process start to its first training step."""
    load_s: float | None
    bytes_total: int
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    """Source peer name (or PeerID when unknown) -> bytes."""
    snapshot_step: int | None = None
    admitted_step: int | None = None

    def rates_bytes_per_s(self) -> dict[str, float]:
        """Average rate of each source over the download."""
        if not self.load_s:
            return {}
        return {source: count / self.load_s for source, count in self.bytes_by_source.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleRow:
    """One training peer's steps and waiting."""

    peer: str
    steps: int
    idle_s: float
    span_s: float

    @property
    def idle_fraction(self) -> float:
        """Idle time over the training span."""
        return self.idle_s / self.span_s if self.span_s > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """A run's timeline, summarized."""

    events: tuple[EventRow, ...]
    joins: tuple[JoinRow, ...]
    idle: tuple[IdleRow, ...]
    membership: dict[str, list[tuple[float, int]]]
    """Per peer: (t, members of the configuration it trained in) at each step; for a bare peer, (t,
    members alive in its view) at each membership event."""
    processes: list[tuple[float, int]]
    """(t, peer processes running)."""
    injections: list[tuple[float, str]]
    """(t, "action subject") of every injection."""
    duration_t: float


def summarize(records: Sequence[dict[str, Any]]) -> Summary:
    """Summarize a timeline's records (from :func:`chaosp2p.cluster.timeline.read_timeline`)."""
    harness = [r for r in records if r.get("source") == "harness"]
    peer_records = [r for r in records if r.get("source") != "harness" and isinstance(r.get("record"), dict)]
    ids: dict[str, str] = {}
    started: dict[str, float] = {}
    for r in harness:
        if r.get("event") == "ready" and r.get("peer_id"):
            ids[str(r["peer"])] = str(r["peer_id"])
        elif r.get("event") == "started":
            started.setdefault(str(r["peer"]), float(r["t"]))
    names = {peer_id: name for name, peer_id in ids.items()}
    steps = [r for r in peer_records if isinstance(r["record"].get("step"), int) and "members" in r["record"]]
    steps.sort(key=lambda r: r["t"])
    operations = _operations(peer_records)
    injections = [r for r in harness if r.get("event") == "inject"]
    events = tuple(
        replace(
            _event_row(r, ids, operations, peer_records, steps),
            longest_wait_s=_longest_wait(steps, float(r["t"]), float(nxt["t"]) if nxt else math.inf),
        )
        for r, nxt in zip(injections, [*injections[1:], None], strict=True)
    )
    scheduled_joins = {str(r.get("peer")) for r in injections if r.get("action") == "join"}
    joins = tuple(_join_rows(peer_records, steps, started, names, scheduled_joins))
    idle = tuple(_idle_rows(steps))
    membership: dict[str, list[tuple[float, int]]] = {}
    for r in steps:
        membership.setdefault(r["source"], []).append((float(r["t"]), int(r["record"]["members"])))
    membership.update(_membership_views(peer_records, exclude=set(membership)))
    running = 0
    processes: list[tuple[float, int]] = [(0.0, 0)]
    for r in harness:
        if r.get("event") == "started":
            running += 1
        elif r.get("event") == "exited":
            running -= 1
        elif r.get("event") == "stopped":
            running = 0
        else:
            continue
        processes.append((float(r["t"]), running))
    return Summary(
        events=events,
        joins=joins,
        idle=idle,
        membership=membership,
        processes=processes,
        injections=[(float(r["t"]), f"{r.get('action')} {_subject(r)}") for r in injections],
        duration_t=max((float(r["t"]) for r in records), default=0.0),
    )


def _membership_views(peer_records: Sequence[dict[str, Any]], exclude: set[str]) -> dict[str, list[tuple[float, int]]]:
    """For peers without step records (bare peers): members alive in each one's view, itself included."""
    views: dict[str, set[str]] = {}
    series: dict[str, list[tuple[float, int]]] = {}
    for r in sorted(peer_records, key=lambda r: r["t"]):
        event, subject = r["record"].get("event"), r["record"].get("peer")
        if r["source"] in exclude or subject is None:
            continue
        alive = views.setdefault(r["source"], set())
        if event in ("peer_joined", "peer_alive"):
            alive.add(str(subject))
        elif event in ("peer_failed", "peer_left"):
            alive.discard(str(subject))
        else:
            continue
        series.setdefault(r["source"], []).append((float(r["t"]), len(alive) + 1))
    return series


def _longest_wait(steps: Sequence[dict[str, Any]], start: float, end: float) -> float | None:
    """The longest round wait (``idle_s``) of any step whose wait overlaps [start, end]."""
    waits = [
        float(r["record"].get("idle_s", 0.0))
        for r in steps
        if r["t"] >= start and r["t"] - float(r["record"].get("idle_s", 0.0)) <= end
    ]
    return round(max(waits), 6) if waits else None


def _subject(inject: dict[str, Any]) -> str:
    if inject.get("link"):
        return "~".join(inject["link"])
    return str(inject.get("peer", "?"))


def _operations(peer_records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Committed operations, one per (kind, subject, epoch), with the earliest times any peer saw."""
    merged: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in peer_records:
        record = r["record"]
        if record.get("event") != "operation":
            continue
        key = (str(record.get("kind")), str(record.get("subject")), int(record.get("epoch", -1)))
        entry = merged.get(key)
        if entry is None:
            merged[key] = entry = {
                "kind": key[0],
                "subject": key[1],
                "origin": str(record.get("origin")),
                "activation_step": record.get("activation_step"),
                "decision_ms": record.get("decision_ms"),
                "reporters": 0,
            }
        entry["reporters"] += 1
        for name in ("detected_t", "proposed_t", "committed_t"):
            if isinstance(r.get(name), (int, float)):
                entry[name] = min(entry.get(name, float("inf")), float(r[name]))
    return sorted(merged.values(), key=lambda e: e.get("committed_t", float("inf")))


def _event_row(
    inject: dict[str, Any],
    ids: dict[str, str],
    operations: list[dict[str, Any]],
    peer_records: Sequence[dict[str, Any]],
    steps: Sequence[dict[str, Any]],
) -> EventRow:
    t = float(inject["t"])
    action = str(inject.get("action"))
    subject = _subject(inject)
    names = inject.get("link") or [inject.get("peer")]
    targets = {ids[n] for n in names if n in ids}
    base = EventRow(t=t, action=action, subject=subject)
    if not targets:
        return base
    for op in operations:
        if op["kind"] not in _OPERATION_KINDS.get(action, ()) or op.get("committed_t", -1) < t:
            continue
        if op["subject"] not in targets and not (len(targets) > 1 and op["origin"] in targets):
            continue
        applied_s = None
        step = op.get("activation_step")
        if isinstance(step, int):
            applied = next((r for r in steps if r["record"]["step"] >= step and r["t"] >= t), None)
            applied_s = None if applied is None else round(applied["t"] - t, 6)
        detected = op.get("detected_t")
        committed = op.get("committed_t")
        return EventRow(
            t=t,
            action=action,
            subject=subject,
            kind=op["kind"],
            detection_s=None if detected is None else round(detected - t, 6),
            decision_ms=op.get("decision_ms"),
            committed_s=None if committed is None else round(committed - t, 6),
            activation_step=step if isinstance(step, int) else None,
            applied_s=applied_s,
            reporters=op["reporters"],
        )
    # A bare peer (or a change no run needed to agree on): the first membership event about it.
    wanted = _MEMBERSHIP_EVENTS.get(action, ())
    seen = [
        r
        for r in peer_records
        if r["record"].get("event") in wanted and str(r["record"].get("peer")) in targets and r["t"] >= t
    ]
    if action == "cut":  # a cut is seen by its two ends only
        seen = [r for r in seen if r.get("peer_id") in targets]
    if not seen:
        return base
    first = min(seen, key=lambda r: r["t"])
    return EventRow(
        t=t,
        action=action,
        subject=subject,
        kind=str(first["record"]["event"]),
        detection_s=round(first["t"] - t, 6),
        reporters=len({r["source"] for r in seen}),
    )


def _join_rows(
    peer_records: Sequence[dict[str, Any]],
    steps: Sequence[dict[str, Any]],
    started: dict[str, float],
    names: dict[str, str],
    scheduled: set[str],
) -> list[JoinRow]:
    rows = []
    for r in peer_records:
        record = r["record"]
        if record.get("event") != "joined":
            continue
        peer = str(r["source"])
        first_step = next((s for s in steps if s["source"] == peer), None)
        begin = started.get(peer)
        by_source = record.get("bytes_by_source") or {}
        rows.append(
            JoinRow(
                peer=peer,
                scheduled=peer in scheduled,
                t=float(r["t"]),
                scale_out_s=None if first_step is None or begin is None else round(first_step["t"] - begin, 6),
                load_s=record.get("load_s"),
                bytes_total=int(record.get("bytes", 0)),
                bytes_by_source={names.get(str(k), str(k)): int(v) for k, v in by_source.items()},
                snapshot_step=record.get("snapshot_step"),
                admitted_step=record.get("admitted_step"),
            )
        )
    return rows


def _idle_rows(steps: Sequence[dict[str, Any]]) -> list[IdleRow]:
    by_peer: dict[str, list[dict[str, Any]]] = {}
    for r in steps:
        by_peer.setdefault(r["source"], []).append(r)
    rows = []
    for peer, records in sorted(by_peer.items()):
        idle = sum(float(r["record"].get("idle_s", 0.0)) for r in records)
        span = records[-1]["t"] - records[0]["t"] + float(records[0]["record"].get("round_s", 0.0))
        rows.append(IdleRow(peer=peer, steps=len(records), idle_s=round(idle, 6), span_s=round(span, 6)))
    return rows


# ------------------------------------------------------------------------------------------ output
def _s(value: float | None, unit: str = "s", scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.3f} {unit}".rstrip()


def print_summary(summary: Summary, console: Console) -> None:
    """The summary as three tables."""
    events = Table(title="events (times after the injection)", title_justify="left")
    columns = ("t", "action", "subject", "handled as", "detected", "decision", "committed", "step", "applied")
    for column in (*columns, "longest wait"):
        events.add_column(column)
    for e in summary.events:
        events.add_row(
            f"{e.t:.2f}",
            e.action,
            e.subject,
            e.kind or ("[dim]not seen[/]" if e.action in _OPERATION_KINDS else "-"),
            _s(e.detection_s),
            "-" if e.decision_ms is None else f"{e.decision_ms:.1f} ms",
            _s(e.committed_s),
            "-" if e.activation_step is None else str(e.activation_step),
            _s(e.applied_s),
            _s(e.longest_wait_s),
        )
    console.print(events)
    joins = Table(title="joins (scale-out: process start to first step)", title_justify="left")
    for column in ("peer", "when", "scale-out", "download", "MB", "bytes per source"):
        joins.add_column(column)
    for j in summary.joins:
        sources = ", ".join(f"{source} {count / 1e6:.2f} MB" for source, count in sorted(j.bytes_by_source.items()))
        joins.add_row(
            j.peer,
            f"t={j.t:.2f}" + (" (scheduled)" if j.scheduled else ""),
            _s(j.scale_out_s),
            _s(j.load_s),
            f"{j.bytes_total / 1e6:.2f}",
            sources or "-",
        )
    console.print(joins if summary.joins else "[dim]no joins of a training run[/]")
    idle = Table(title="idle time per peer", title_justify="left")
    for column in ("peer", "steps", "idle", "span", "idle %"):
        idle.add_column(column)
    for row in summary.idle:
        idle.add_row(row.peer, str(row.steps), _s(row.idle_s), _s(row.span_s), f"{row.idle_fraction * 100:.1f}")
    console.print(idle if summary.idle else "[dim]no training peers: no idle time[/]")


def summary_json(summary: Summary) -> dict[str, Any]:
    """The summary as JSON-ready data."""
    return {
        "events": [asdict(e) for e in summary.events],
        "joins": [asdict(j) | {"rates_bytes_per_s": j.rates_bytes_per_s()} for j in summary.joins],
        "idle": [asdict(i) | {"idle_fraction": i.idle_fraction} for i in summary.idle],
        "injections": summary.injections,
        "duration_t": summary.duration_t,
    }


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    with warnings.catch_warnings():
        # Older matplotlib releases trip deprecation warnings of newer pyparsing/numpy at import:
        # theirs to fix, and nothing the report does depends on them.
        warnings.simplefilter("ignore", DeprecationWarning)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    return plt


def write_plots(summary: Summary, out_dir: Path) -> list[Path]:
    """Write the four PNG plots into ``out_dir`` and return their paths (needs matplotlib)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def marks(axes: Any) -> None:
        for t, label in summary.injections:
            axes.axvline(t, color="grey", linestyle=":", linewidth=0.8)
            axes.annotate(label, (t, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7, va="top")

    figure, axes = plt.subplots(figsize=(9, 4))
    if summary.processes:
        xs, ys = zip(*summary.processes, strict=True)
        axes.step(xs, ys, where="post", label="processes running", color="black", linewidth=1.5)
    for peer, series in sorted(summary.membership.items()):
        xs, ys = zip(*series, strict=True)
        axes.step(xs, ys, where="post", label=f"{peer}: members", alpha=0.7)
    marks(axes)
    axes.yaxis.get_major_locator().set_params(integer=True)
    axes.set_xlabel("time (s)")
    axes.set_ylabel("peers")
    axes.set_title("membership over time")
    axes.legend(fontsize=7, loc="lower right")
    written.append(_save(plt, figure, out_dir / "membership.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    joins = [j for j in summary.joins if j.scale_out_s is not None]
    labels = [j.peer + ("*" if j.scheduled else "") for j in joins]
    axes.bar(labels, [j.scale_out_s for j in joins], color="tab:blue", label="process start to first step")
    axes.bar(labels, [j.load_s or 0.0 for j in joins], color="tab:orange", label="state download")
    axes.set_ylabel("seconds")
    axes.set_title("scale-out delay per join (* = scheduled join)")
    axes.legend(fontsize=8)
    written.append(_save(plt, figure, out_dir / "scaleout.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    sources = sorted({s for j in summary.joins for s in j.bytes_by_source})
    width = 0.8 / max(1, len(sources))
    for index, source in enumerate(sources):
        positions = [k + index * width for k in range(len(summary.joins))]
        rates = [j.rates_bytes_per_s().get(source, 0.0) / 1e6 for j in summary.joins]
        axes.bar(positions, rates, width=width, label=source)
    axes.set_xticks([k + 0.4 - width / 2 for k in range(len(summary.joins))], [j.peer for j in summary.joins])
    axes.set_ylabel("MB/s (average over the download)")
    axes.set_title("per-source transfer rate per join")
    if sources:
        axes.legend(fontsize=8, title="source")
    written.append(_save(plt, figure, out_dir / "transfer_rates.png"))

    figure, axes = plt.subplots(figsize=(7, 4))
    axes.bar([r.peer for r in summary.idle], [r.idle_s for r in summary.idle], color="tab:red")
    for index, row in enumerate(summary.idle):
        axes.annotate(f"{row.idle_fraction * 100:.0f}%", (index, row.idle_s), ha="center", va="bottom", fontsize=8)
    axes.set_ylabel("seconds waiting in rounds")
    axes.set_title("idle time per peer (% of its training span)")
    written.append(_save(plt, figure, out_dir / "idle.png"))
    return written


def _save(plt: Any, figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
