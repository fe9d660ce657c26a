"""The ``chaosp2p cluster`` command: ``cluster SCENARIO.toml [--out DIR] [--netns]`` runs a scenario,
``cluster report DIR/timeline.jsonl [--out DIR]`` summarizes one."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape

from chaosp2p.errors import ChaosError


class _ClusterGroup(click.Group):
    """``cluster SCENARIO`` is short for ``cluster run SCENARIO`` (the subcommands keep their names)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("cluster", cls=_ClusterGroup)
def cluster() -> None:
    """Run many peers on this machine from a scenario file, with churn and link shaping; report on a run.

    \b
    chaosp2p cluster SCENARIO.toml [--out DIR] [--netns]
    chaosp2p cluster report DIR/timeline.jsonl [--out DIR]
    """


@cluster.command("run")
@click.argument("scenario", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for timeline.jsonl and the peers' logs (default: cluster-<scenario>-<time>).",
)
@click.option(
    "--netns",
    is_flag=True,
    help="Run the peers in a network namespace whose loopback tc shapes as [links] (root only; minimal).",
)
@click.option("--report/--no-report", default=True, show_default=True, help="Print the report at the end.")
def run_command(scenario: str, out_dir: str | None, netns: bool, report: bool) -> None:
    """Run SCENARIO (a TOML file, see peers/churn-demo.toml) and write DIR/timeline.jsonl."""
    from chaosp2p.cluster.runner import Interrupted, run_scenario
    from chaosp2p.cluster.scenario import load_scenario

    console = _console()
    try:
        parsed = load_scenario(scenario)
    except ChaosError as exc:
        _fail(console, str(exc))
    out = Path(out_dir) if out_dir else Path(f"cluster-{Path(scenario).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    console.print(
        f"[bold]cluster[/] {scenario}: {len(parsed.peers)} peers, {len(parsed.events)} events, "
        f"{parsed.duration_s:g} s -> {out}/"
    )
    started = time.monotonic()

    def log(message: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:7.2f}s[/] {escape(message)}")

    try:
        result = run_scenario(parsed, out, netns=netns, log=log)
    except Interrupted as exc:
        console.print(f"[yellow]{escape(str(exc))}[/]: {out / 'timeline.jsonl'}")
        raise SystemExit(130) from None
    except ChaosError as exc:
        console.print(f"partial timeline: {out / 'timeline.jsonl'}")
        _fail(console, str(exc))
    console.print(f"timeline: {result.timeline}")
    if report:
        _report(result.timeline, out, console)


@cluster.command("report")
@click.argument("timeline", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the PNG plots and summary.json (default: the timeline's directory).",
)
def report_command(timeline: str, out_dir: str | None) -> None:
    """Print the summary of TIMELINE (a run's timeline.jsonl) and write PNG plots."""
    path = Path(timeline)
    _report(path, Path(out_dir) if out_dir else path.parent, _console())


def _console() -> Console:
    """A console wide enough for the event table even when output goes to a file or a pipe."""
    console = Console()
    return console if console.is_terminal else Console(width=150)


def _report(timeline: Path, out_dir: Path, console: Console) -> None:
    from chaosp2p.cluster.report import print_summary, summarize, summary_json, write_plots
    from chaosp2p.cluster.timeline import read_timeline

    records = read_timeline(timeline)
    if not records:
        _fail(console, f"{timeline} holds no timeline records")
    summary = summarize(records)
    print_summary(summary, console)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary_json(summary), indent=1))
    try:
        plots = write_plots(summary, out_dir)
    except ImportError as exc:
        _fail(console, f"the plots need matplotlib: pip install 'chaosp2p[train]' ({exc}); summary.json was written")
    console.print("plots: " + ", ".join(str(p) for p in plots))


def _fail(console: Console, message: str) -> NoReturn:
    """Print ``message`` (verbatim: scenario errors quote ``[[tables]]``) and exit with status 2."""
    console.print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(2)
