"""Shared pytest configuration: anyio backends and one marker per test tier.

The tiers (DESIGN.md, docs/architecture.md), each a folder whose tests get its marker:

* ``unit`` -- pure machines, codecs and planners; byte pipes between two machines; no sockets;
* ``sim`` -- many peers on the in-memory network in virtual time;
* ``integration`` -- real sockets on 127.0.0.1 in one process;
* ``e2e`` -- real ``chaosp2p`` processes, on 127.0.0.1 or in namespaces the test made;
* ``lint`` -- ruff and mypy --strict over the tree.

Select with ``-m``, e.g. ``python -m pytest -m "unit or sim"``.
"""

from __future__ import annotations

import pytest

TIERS = ("unit", "sim", "integration", "e2e", "lint")


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Async tests run on both backends chaosp2p supports."""
    return str(request.param)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for tier in TIERS:
            if f"/tests/{tier}/" in str(item.fspath):
                item.add_marker(getattr(pytest.mark, tier))
