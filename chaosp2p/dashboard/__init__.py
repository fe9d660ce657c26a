"""The built-in web dashboard: the swarm, its links, events, transfers and training runs, live.

``chaosp2p dashboard --bootstrap ADDR`` joins a swarm as an observer and serves the page;
``chaosp2p peer --http 127.0.0.1:8765`` serves it from a running peer. From Python::

    async with chaosp2p.open_peer(config) as peer:
        async with open_dashboard(peer, DashboardConfig(port=8765)) as dashboard:
            print(dashboard.url)

The server needs the ``dashboard`` extra (Starlette and Hypercorn); the feed and the settings do
not, so importing this package never requires them.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from chaosp2p.dashboard.config import DashboardConfig, parse_bind
from chaosp2p.dashboard.feed import DashboardFeed, FeedClient, FeedSource, SwarmView, TooManyClients

if TYPE_CHECKING:
    from chaosp2p.dashboard.server import Dashboard

__all__ = [
    "DashboardConfig",
    "DashboardFeed",
    "FeedClient",
    "FeedSource",
    "SwarmView",
    "TooManyClients",
    "open_dashboard",
    "parse_bind",
]


def open_dashboard(node: FeedSource, config: DashboardConfig | None = None) -> AbstractAsyncContextManager[Dashboard]:
    """Serve the dashboard for ``node`` for the duration of an ``async with`` block.

    See :func:`chaosp2p.dashboard.server.open_dashboard`; needs ``pip install 'chaosp2p[dashboard]'``.
    """
    from chaosp2p.dashboard.server import open_dashboard as open_server

    return open_server(node, config)
