"""The ``chaosp2p`` command line: one module per command group.

``main`` (:mod:`~chaosp2p.cli.main`) is the entry point: ``peer``, ``status``, ``keygen`` and
``swarm-key`` live there; ``state`` (:mod:`~chaosp2p.cli.state`), ``cluster``
(:mod:`~chaosp2p.cli.cluster`), ``dashboard`` (:mod:`~chaosp2p.cli.dashboard`) and ``demo``
(:mod:`~chaosp2p.cli.demo`) in their own modules; :mod:`~chaosp2p.cli.common` holds what they share.
"""

from __future__ import annotations

from chaosp2p.cli.main import main

__all__ = ["main"]
