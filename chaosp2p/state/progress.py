"""Progress reporting for pulls: the :class:`TransferProgress` record and text formatting.

The pull machine emits :class:`TransferProgress` events (at most one per
``TransferConfig.progress_interval_s``, plus one at the start and one at the end); the driver hands
them to a :data:`ProgressCallback`. A rich progress bar in the CLI is one such callback;
:func:`format_progress` is the plain-text one.
"""

from __future__ import annotations

from collections.abc import Callable

from chaosp2p.protocols.transfer import SourceProgress, TransferProgress

__all__ = ["ProgressCallback", "SourceProgress", "TransferProgress", "format_bytes", "format_progress"]

ProgressCallback = Callable[[TransferProgress], None]
"""Called with each progress event; must return quickly (it runs on the network loop)."""


def format_bytes(count: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_progress(progress: TransferProgress) -> str:
    """One line: percentage, bytes, rate, ETA and active sources."""
    eta = "?" if progress.eta_s is None else f"{progress.eta_s:.1f}s"
    active = sum(1 for s in progress.sources if s.active)
    return (
        f"{progress.fraction * 100:5.1f}% {format_bytes(progress.bytes_done)}/{format_bytes(progress.bytes_total)} "
        f"{format_bytes(progress.rate_bytes_per_s)}/s ETA {eta} ({active} sources)"
    )
