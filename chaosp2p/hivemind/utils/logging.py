"""``hivemind.utils.logging``: ``get_logger`` and ``use_hivemind_log_handler``.

hivemind installs one stream handler, on the ``hivemind`` logger by default or on the root logger
with ``use_hivemind_log_handler("in_root_logger")`` (albert's scripts call that first). Here the
handler sits on the drop-in's logger (``chaosp2p.hivemind``) by default and moves to the root
logger on request, so a script's own ``get_logger(__name__)`` lines appear as with hivemind.
The level comes from ``HIVEMIND_LOGLEVEL`` (default INFO).
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading


class HandlerMode(enum.Enum):
    """Where the hivemind-style handler is installed."""

    NOWHERE = 0
    IN_HIVEMIND = 1
    IN_ROOT_LOGGER = 2


_PACKAGE_LOGGER = "chaosp2p.hivemind"
_lock = threading.Lock()
_handler: logging.Handler | None = None
_mode = HandlerMode.IN_HIVEMIND


def _level() -> int:
    name = os.environ.get("HIVEMIND_LOGLEVEL", "INFO").upper()
    level = logging.getLevelName(name)
    return level if isinstance(level, int) else logging.INFO


def _install(name: str | None) -> None:
    assert _handler is not None
    target = logging.getLogger(name)
    if name is None:
        # as hivemind does: drop a plain stderr handler someone put on the root (e.g. basicConfig)
        for existing in list(target.handlers):
            if type(existing) is logging.StreamHandler and existing.stream is sys.stderr:
                target.removeHandler(existing)
    target.addHandler(_handler)
    target.propagate = name is None
    target.setLevel(_level())


def _uninstall(name: str | None) -> None:
    assert _handler is not None
    target = logging.getLogger(name)
    target.removeHandler(_handler)
    target.propagate = True
    target.setLevel(logging.NOTSET)


def _initialize() -> None:
    global _handler
    with _lock:
        if _handler is not None:
            return
        _handler = logging.StreamHandler()
        _handler.setFormatter(
            logging.Formatter("%(asctime)s.%(msecs)03d [%(levelname)s] %(message)s", datefmt="%b %d %H:%M:%S")
        )
        _install(_PACKAGE_LOGGER)


def get_logger(name: str | None = None) -> logging.Logger:
    """``logging.getLogger(name)``, with the hivemind-style handler set up on first use."""
    _initialize()
    return logging.getLogger(name)


def use_hivemind_log_handler(where: HandlerMode | str) -> None:
    """Install the handler ``"in_hivemind"`` (default), ``"in_root_logger"`` or ``"nowhere"``."""
    global _mode
    mode = HandlerMode[where.upper()] if isinstance(where, str) else where
    _initialize()
    if mode == _mode:
        return
    if _mode == HandlerMode.IN_HIVEMIND:
        _uninstall(_PACKAGE_LOGGER)
    elif _mode == HandlerMode.IN_ROOT_LOGGER:
        _uninstall(None)
    _mode = mode
    if mode == HandlerMode.IN_HIVEMIND:
        _install(_PACKAGE_LOGGER)
    elif mode == HandlerMode.IN_ROOT_LOGGER:
        _install(None)


__all__ = ["HandlerMode", "get_logger", "use_hivemind_log_handler"]
