"""Waiting on a condition with a bound, for state that exposes no event to wait on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio


async def eventually(condition: Callable[[], bool], *, timeout_s: float = 10.0, interval_s: float = 0.01) -> None:
    """Return once ``condition()`` is true; raise ``TimeoutError`` after ``timeout_s``.

    Polling is the honest tool here: counters and tables inside protocol machines change on
    message arrival and have no event of their own. The bound keeps a broken condition from
    hanging the suite.
    """
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - see the docstring
            await anyio.sleep(interval_s)


async def eventually_async(
    condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0, interval_s: float = 0.1
) -> None:
    """:func:`eventually` for a condition that must itself talk to the network (e.g. a DHT lookup)."""
    with anyio.fail_after(timeout_s):
        while not await condition():  # noqa: ASYNC110 - polling a remote state, see eventually()
            await anyio.sleep(interval_s)


def all_see_alive(peers: Sequence[Any], count: int) -> bool:
    """Whether every peer's membership view holds ``count`` alive members (itself included)."""
    return all(sum(1 for m in peer.members() if m.state.value == "alive") >= count for peer in peers)
