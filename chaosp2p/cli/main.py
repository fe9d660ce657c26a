"""The ``chaosp2p`` command line.

``chaosp2p peer`` runs a peer until Ctrl-C/SIGTERM; ``chaosp2p status ADDR`` asks a running peer
what it sees; ``chaosp2p demo`` runs a local swarm on the built-in defaults. Every command runs on
trio through anyio unless ``--backend asyncio`` is given.
"""

from __future__ import annotations

import json
import logging
import signal

import anyio
import click
from rich.console import Console
from rich.table import Table

from chaosp2p._version import __version__
from chaosp2p.api.async_peer import open_peer
from chaosp2p.cli.cluster import cluster as cluster_command
from chaosp2p.cli.common import (
    BACKENDS,
    PeerOptions,
    announce_ready,
    fail,
    load_config,
    peer_options,
    setup_logging,
)
from chaosp2p.cli.dashboard import dashboard as dashboard_command
from chaosp2p.cli.dashboard import dashboard_config, http_token_option, maybe_dashboard
from chaosp2p.cli.state import state as state_commands
from chaosp2p.dashboard.config import DashboardConfig
from chaosp2p.errors import ChaosError, ConfigError
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.runtime.node import request_status
from chaosp2p.runtime.status import StatusReport
from chaosp2p.transport.keyfile import load_identity, load_or_create_identity, load_swarm_key, write_swarm_key
from chaosp2p.wire.identity import Identity


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chaosp2p")
def main() -> None:
    """chaosp2p: peer-to-peer networking for elastic, decentralized deep-learning training."""


# ---------------------------------------------------------------------------------------------- peer
@main.command()
@peer_options
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write {peer_id, addrs} as JSON here once listening (for scripts and tests).",
)
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
@click.option(
    "--http",
    "http",
    default=None,
    metavar="HOST:PORT",
    help="Also serve the live web dashboard here, e.g. 127.0.0.1:8765 (needs the dashboard extra).",
)
@http_token_option
def peer(
    peer: PeerOptions,
    ready_file: str | None,
    log_level: str,
    http: str | None,
    http_token: str | None,
) -> None:
    """Run a peer until interrupted (Ctrl-C or SIGTERM shut it down cleanly)."""
    setup_logging(log_level)
    try:
        config = load_config(peer)
    except ConfigError as exc:
        fail(str(exc))
    dashboard = dashboard_config(http, http_token, role="peer")
    try:
        anyio.run(_run_peer, config, ready_file, dashboard, backend=peer.backend)
    except ChaosError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot serve the dashboard on {http}: {exc}" if http else str(exc))


async def _run_peer(config: PeerConfig, ready_file: str | None, dashboard: DashboardConfig | None = None) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_peer(config) as node, maybe_dashboard(node, dashboard):
            await announce_ready(node.peer_id, node.addrs, ready_file)
            async for signum in signals:
                logging.getLogger("chaosp2p.peer").info("received %s, shutting down", signal.Signals(signum).name)
                break


# -------------------------------------------------------------------------------------------- status
@main.command()
@click.argument("addr", metavar="MULTIADDR")
@click.option("--json", "as_json", is_flag=True, help="Print the documented JSON shape instead of tables.")
@click.option(
    "--swarm-key",
    "swarm_key_path",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="The swarm key, if the swarm has one.",
)
@click.option(
    "--identity",
    "identity_path",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Ask as this identity (a key file): a peer lists its training runs only to their members and "
    "to the observers its [status] section names. Default: a throwaway identity, which sees no runs.",
)
@click.option("--timeout", "timeout_s", default=5.0, show_default=True, help="Seconds to wait for an answer.")
@click.option("--backend", default="trio", show_default=True, type=click.Choice(BACKENDS))
def status(
    addr: str, as_json: bool, swarm_key_path: str | None, identity_path: str | None, timeout_s: float, backend: str
) -> None:
    """Ask the peer at MULTIADDR for its id, addresses, connections, members and the runs it may show."""
    setup_logging("warning")
    try:
        swarm_key = load_swarm_key(swarm_key_path) if swarm_key_path else None
        identity = load_identity(identity_path) if identity_path else None
        report = anyio.run(_status, addr, swarm_key, identity, timeout_s, backend=backend)
    except TimeoutError:
        fail(f"no status answer from {addr} within {timeout_s:g} s")
    except ChaosError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_status(report, Console())
        if not report.runs:
            Console().print(
                "[dim]runs: none shown to this identity (a peer lists a run to its members and to the "
                "observers of its [status] section; ask with --identity)[/]"
            )


async def _status(addr: str, swarm_key: bytes | None, identity: Identity | None, timeout_s: float) -> StatusReport:
    return await request_status(addr, swarm_key=swarm_key, timeout_s=timeout_s, identity=identity)


def print_status(report: StatusReport, out: Console) -> None:
    """Render a status report as tables."""
    out.print(f"[bold]peer[/] {report.peer_id}  [dim]{report.agent}, up {report.uptime_s:.1f} s[/]")
    for addr in report.addrs:
        out.print(f"  {addr}")
    reach = report.reachability
    if reach is not None:
        reached = f"reached at {', '.join(reach.addrs)}" if reach.addrs else "no address confirmed"
        out.print(f"  reachability: {reach.status} ({reach.reached} reached, {reach.not_reached} not; {reached})")
    table = Table(title=f"connections ({len(report.connections)})", title_justify="left")
    for column in ("peer", "address", "direction", "rtt ms", "streams"):
        table.add_column(column)
    for c in report.connections:
        table.add_row(
            c.peer_id, c.address, c.direction, "-" if c.rtt_ms is None else f"{c.rtt_ms:.2f}", str(c.open_streams)
        )
    out.print(table)
    if report.members:
        members = Table(title=f"members ({len(report.members)})", title_justify="left")
        for column in ("peer", "state", "incarnation"):
            members.add_column(column)
        for m in report.members:
            members.add_row(m.peer_id, m.state, str(m.incarnation))
        out.print(members)
    if report.links:
        links = Table(title=f"links ({len(report.links)})", title_justify="left")
        for column in ("peer", "state", "rtt ms", "bandwidth MB/s"):
            links.add_column(column)
        for link in report.links:
            links.add_row(
                link.peer_id,
                link.state,
                "-" if link.rtt_ms is None else f"{link.rtt_ms:.2f}",
                "-" if link.bandwidth_bytes_per_s is None else f"{link.bandwidth_bytes_per_s / 1e6:.1f}",
            )
        out.print(links)
    for run in report.runs:
        table = Table(
            title=f"run {run.run}: epoch {run.epoch}, step {run.step}, config {run.config_digest[:12]}",
            title_justify="left",
        )
        table.add_column("members")
        table.add_column("pending")
        pending = [f"{p.kind} {p.subject[:16]}" for p in run.pending]
        for index in range(max(len(run.members), len(pending))):
            table.add_row(
                run.members[index] if index < len(run.members) else "",
                pending[index] if index < len(pending) else "",
            )
        out.print(table)
        waiting = run.waiting_for
        if waiting is not None:
            out.print(
                f"  step {waiting.step}: waiting {waiting.waited_s:.1f} s for {waiting.what} from "
                f"{', '.join(p[-8:] for p in waiting.peers)} (links {', '.join(waiting.links)})"
            )


# ---------------------------------------------------------------------------------------------- keys
@main.command()
@click.argument("path", type=click.Path(dir_okay=False))
def keygen(path: str) -> None:
    """Create (or show) the identity key file at PATH and print its PeerID."""
    try:
        identity = load_or_create_identity(path)
    except ConfigError as exc:
        fail(str(exc))
    click.echo(str(identity.peer_id))


@main.command("swarm-key")
@click.argument("path", type=click.Path(dir_okay=False))
def swarm_key(path: str) -> None:
    """Create a new random swarm key file at PATH (share it only with your swarm's peers)."""
    try:
        write_swarm_key(path)
    except ConfigError as exc:
        fail(str(exc))
    click.echo(f"wrote swarm key to {path} (mode 0600)")


# ---------------------------------------------------------------------------------------------- demo
@main.command()
def demo() -> None:
    """Train a model with a local swarm on loopback: joins, a leave and a crash, narrated."""
    from chaosp2p.cli.demo import run_demo

    setup_logging("error")
    try:
        run_demo(Console())
    except ChaosError as exc:
        fail(str(exc))
    except ImportError as exc:
        fail(f"the demo trains a PyTorch model on scikit-learn's digits: pip install 'chaosp2p[train]' ({exc})")


main.add_command(state_commands)
main.add_command(dashboard_command)
main.add_command(cluster_command)

if __name__ == "__main__":  # pragma: no cover
    main()
