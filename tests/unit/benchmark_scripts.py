"""Importing a script of benchmarks/ in a unit test, without running it.

The scripts import their siblings (``_common``, ``training_elastic``...) as top-level modules, as
they do when run from that folder: the folder is on ``sys.path`` while the test imports them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextmanager
def benchmark_scripts(*names: str) -> Iterator[dict[str, ModuleType]]:
    """The scripts ``names`` of benchmarks/, imported, by name (for a module-scoped fixture)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(BENCHMARKS))
