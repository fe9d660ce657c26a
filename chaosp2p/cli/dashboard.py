"""``chaosp2p dashboard`` and the ``--http`` option of ``chaosp2p peer``.

Nothing here imports the server (Starlette, Hypercorn) until a dashboard is actually started, so
the CLI works without the ``dashboard`` extra and says how to install it when it is needed.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import click
from rich.markup import escape

from chaosp2p.cli.common import PeerOptions, announce_ready, fail, load_config, peer_options, setup_logging
from chaosp2p.dashboard.config import DashboardConfig
from chaosp2p.errors import ChaosError, ConfigError
from chaosp2p.runtime.config import PeerConfig

F = TypeVar("F", bound=Callable[..., Any])
TOKEN_ENV = "CHAOSP2P_HTTP_TOKEN"
INSTALL_HINT = "the dashboard needs its extra: pip install 'chaosp2p[dashboard]'"


def http_token_option(function: F) -> F:
    """``--http-token`` (or ``$CHAOSP2P_HTTP_TOKEN``): required to serve off loopback."""
    return click.option(
        "--http-token",
        "http_token",
        envvar=TOKEN_ENV,
        default=None,
        metavar="TOKEN",
        help=f"Token every dashboard request must present (required off loopback; or ${TOKEN_ENV}).",
    )(function)


def dashboard_config(http: str | None, token: str | None, *, role: str) -> DashboardConfig | None:
    """The dashboard settings for ``--http``/``--http-token`` (None without ``--http``); exits on errors."""
    if http is None:
        return None
    try:
        config = DashboardConfig.from_bind(http, token=token or None, role=role)
        import chaosp2p.dashboard.server  # noqa: F401  (fail now, not after joining, if the extra is missing)
    except ConfigError as exc:
        fail(escape(str(exc)))
    except ImportError:
        fail(escape(INSTALL_HINT))
    return config


@asynccontextmanager
async def maybe_dashboard(node: Any, config: DashboardConfig | None) -> AsyncIterator[None]:
    """Serve the dashboard for ``node`` during the block when ``config`` is given; print its URL."""
    if config is None:
        yield
        return
    from chaosp2p.dashboard.server import open_dashboard

    async with open_dashboard(node, config) as dashboard:
        hint = "  (open it with ?token=TOKEN once)" if config.token else ""
        click.echo(f"dashboard on {dashboard.url}{hint}")
        yield


@click.command()
@peer_options
@click.option(
    "--http",
    "http",
    default="127.0.0.1:8765",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve the page (port 0: any free port). Off loopback a token is required.",
)
@http_token_option
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write {peer_id, addrs} as JSON here once serving (for scripts and tests).",
)
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def dashboard(
    peer: PeerOptions,
    http: str,
    http_token: str | None,
    ready_file: str | None,
    log_level: str,
) -> None:
    """Join a swarm as an observer (it trains nothing) and serve a live web dashboard of it."""
    setup_logging(log_level)
    if not peer.bootstrap:
        fail("the dashboard watches an existing swarm: give --bootstrap MULTIADDR")
    try:
        config = load_config(peer)
    except ConfigError as exc:
        fail(str(exc))
    settings = dashboard_config(http, http_token, role="observer")
    try:
        anyio.run(_run_observer, config, settings, ready_file, backend=peer.backend)
    except ChaosError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(escape(f"cannot serve the dashboard on {http}: {exc}"))


async def _run_observer(config: PeerConfig, settings: DashboardConfig | None, ready_file: str | None) -> None:
    from chaosp2p.runtime.node import Node, open_node

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_node(config, node_class=Node) as node:
            node.membership.advertise_observer()
            async with maybe_dashboard(node, settings):
                await announce_ready(node.peer_id, node.addrs, ready_file)
                async for signum in signals:
                    logging.getLogger("chaosp2p.peer").info("received %s, shutting down", signal.Signals(signum).name)
                    break
