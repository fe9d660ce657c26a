"""Shared by the namespaced tests: skip with the reason where namespaces cannot be made."""

from __future__ import annotations

import subprocess

import pytest

from chaosp2p.cluster.netns import NetnsUnavailable
from chaosp2p.cluster.sites import check_tools


def require_sites() -> None:
    """Skip the test, saying why, unless this machine can build [[site]] namespaces (root, ip, tc, nft)."""
    try:
        check_tools()
    except NetnsUnavailable as exc:
        pytest.skip(f"namespaced hosts unavailable: {exc}")


def namespaces() -> set[str]:
    """The network namespaces that exist now."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in listed.splitlines() if line.split()}
