"""A warning logger for events an attacker can trigger in bulk (failed handshakes, evictions)."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("chaosp2p.transport")


class QuietLog:
    """At most one warning per interval for events an attacker can trigger in bulk; counts the rest."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self._interval_s = interval_s
        self._next: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: object) -> None:
        """Log ``message % args`` unless a warning of ``kind`` was logged within the interval."""
        now = time.monotonic()
        if now < self._next.get(kind, 0.0):
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._next[kind] = now + self._interval_s
        suppressed = self._suppressed.pop(kind, 0)
        suffix = f" (and {suppressed} more like it in the last {self._interval_s:g} s)" if suppressed else ""
        log.warning(message + suffix, *args)
