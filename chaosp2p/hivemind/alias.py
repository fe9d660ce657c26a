"""Run scripts written for hivemind unchanged: ``hivemind`` (and ``hivemind.*``) imports resolve here.

``python -m chaosp2p.hivemind script.py ARGS`` (or :func:`install_alias` before the script's
imports) makes ``import hivemind``, ``from hivemind.utils.logging import get_logger``,
``from hivemind.optim.state_averager import LRSchedulerBase`` and the like return the drop-in's
modules: the very module objects of ``chaosp2p.hivemind.*``, so classes and ``isinstance`` agree
whichever name a script used. The finder goes first on ``sys.meta_path``, so an installed
hivemind is shadowed while the alias is on (the point: the same script, chaosp2p underneath).
A hivemind module the drop-in lacks fails to import with a message naming it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

ALIAS = "hivemind"
TARGET = "chaosp2p.hivemind"
RENAMED = {
    "hivemind.optim.optimizer": "chaosp2p.hivemind.optimizer",
    "hivemind.dht.dht": "chaosp2p.hivemind.dht.handle",
}
"""hivemind modules whose counterpart sits at another path here."""


def target_of(fullname: str) -> str:
    """The drop-in module that stands for the hivemind module ``fullname``."""
    return RENAMED.get(fullname, TARGET + fullname[len(ALIAS) :])


class _Loader(importlib.abc.Loader):
    """Hands out the already-imported drop-in module, keeping its own ``__spec__``."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the alias spec on the module: give it its own back
        if self._spec is not None:
            module.__spec__ = self._spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = target_of(fullname)
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(f"chaosp2p.hivemind does not provide {fullname} (no {real})", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _Loader(real), is_package=fullname == ALIAS)


def install_alias() -> None:
    """Make ``hivemind`` imports resolve to the drop-in in this process (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in [name for name in sys.modules if name == ALIAS or name.startswith(ALIAS + ".")]:
        if not sys.modules[name].__name__.startswith(TARGET):
            del sys.modules[name]  # a real hivemind imported earlier would keep answering


__all__ = ["install_alias", "target_of"]
