"""Import paths that moved when the package was laid out by layers, kept working for existing code.

Theory of operation
-------------------
Two tables say where things went. :data:`MOVED_MODULES` maps an old module path to the module that
now holds its code: importing the old path returns that very module object (not a copy), so classes,
``isinstance`` checks and pickles agree whichever path a script used, and ``python -m <old path>``
runs the new module. :data:`MOVED_NAMES` maps a name a package used to export to the module that
defines it now (``chaosp2p.Node`` stayed in the runtime layer; the root exports one peer per style).

One meta-path finder serves the first table. It is consulted after the regular finders, so it can
never shadow a module that exists. Nothing inside chaosp2p imports an old path (the layer test in
``tests/unit/test_layers.py`` checks); new code uses the paths in the README.

This module imports nothing from chaosp2p: it sits in the base layer and names modules as strings.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import Any

MOVED_MODULES: dict[str, str] = {
    "chaosp2p.sync": "chaosp2p.api.blocking_peer",
    # Needs nothing but the standard library: the example scripts' ready files are written with it
    # under interpreters that have hivemind but not chaosp2p's dependencies.
    "chaosp2p.state.atomic_file": "chaosp2p.atomic_file",
    "chaosp2p.training.blocking": "chaosp2p.api.blocking_collaboration",
    "chaosp2p.training.digits": "chaosp2p.trainers.digits",
    "chaosp2p.training.script": "chaosp2p.trainers.script",
    "chaosp2p.cli_common": "chaosp2p.cli.common",
    "chaosp2p.cli_state": "chaosp2p.cli.state",
    "chaosp2p.demo": "chaosp2p.cli.demo",
    "chaosp2p.cluster.command": "chaosp2p.cli.cluster",
    "chaosp2p.dashboard.command": "chaosp2p.cli.dashboard",
    "chaosp2p.protocols.transfer_messages": "chaosp2p.protocols.transfer.messages",
    "chaosp2p.protocols.transfer_config": "chaosp2p.protocols.transfer.config",
    "chaosp2p.protocols.transfer.states": "chaosp2p.protocols.transfer.transitions",
    "chaosp2p.training.average_messages": "chaosp2p.protocols.averaging.messages",
    "chaosp2p.training.reduce_plan": "chaosp2p.protocols.averaging.plan",
    "chaosp2p.training.shard_reduce": "chaosp2p.protocols.averaging.shard_reduce",
    "chaosp2p.training.contributions": "chaosp2p.protocols.averaging.contributions",
    "chaosp2p.training.messages": "chaosp2p.protocols.collab.messages",
    "chaosp2p.training.vouch": "chaosp2p.protocols.collab.vouch",
    "chaosp2p.protocols.negotiation.simswarm": "chaosp2p.sim.negotiation",
    "chaosp2p.protocols.negotiation.state": "chaosp2p.protocols.negotiation.transitions",
    "chaosp2p.protocols.negotiation.configuration_columns": "chaosp2p.protocols.negotiation.configuration_body",
    "chaosp2p.dht.simcluster": "chaosp2p.sim.dht",
    "chaosp2p.protocols.membership.simswarm": "chaosp2p.sim.membership",
    "chaosp2p.protocols.membership.records": "chaosp2p.protocols.membership.bookkeeping",
    "chaosp2p.protocols.membership.state": "chaosp2p.protocols.membership.transitions",
    "chaosp2p.protocols.noise": "chaosp2p.protocols.channel.handshake",
    "chaosp2p.protocols.records": "chaosp2p.protocols.channel.record_layer",
    "chaosp2p.protocols.mux": "chaosp2p.protocols.channel.mux",
    "chaosp2p.protocols.hello": "chaosp2p.protocols.channel.hello",
}
"""Old module path -> the module that holds its code now."""

MOVED_NAMES: dict[tuple[str, str], str] = {
    ("chaosp2p", "Node"): "chaosp2p.runtime.node",
    ("chaosp2p", "open_node"): "chaosp2p.runtime.node",
    ("chaosp2p.training", "Collaboration"): "chaosp2p.api.blocking_collaboration",
}
"""(package, name it used to export) -> the module that defines the name now."""


def moved_name(package: str, name: str) -> Any:
    """``package.name`` from where it lives now, or the usual AttributeError (for a package ``__getattr__``)."""
    module = MOVED_NAMES.get((package, name))
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the new module itself; ``get_code`` serves ``python -m``."""

    def __init__(self, target: str) -> None:
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self._target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""

    def get_code(self, fullname: str) -> CodeType | None:
        spec = importlib.util.find_spec(self._target)
        loader = None if spec is None else spec.loader
        if not isinstance(loader, importlib.abc.InspectLoader):
            raise ImportError(f"{fullname} moved to {self._target}, which cannot be run as a script")
        return loader.get_code(self._target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED_MODULES` (only when no real module has that name)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        # The new file as origin: ``python -m <old path>`` puts it in sys.argv[0], as for any module.
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(new), origin=None if found is None else found.origin
        )


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


install()
