"""The package's shape is checked, not hoped for: layer order, no import cycles, no imports of the root.

DESIGN.md's layers, bottom-up: a module imports only modules of its own layer or the layers below.
Every import statement counts -- module-level, inside functions, and under ``TYPE_CHECKING``
(an annotation is a dependency too); the few annotation-only exceptions are listed below with
their reason. The check reads the source with :mod:`ast`, so it imports nothing.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaosp2p import _moved

PACKAGE = Path(__file__).resolve().parents[2] / "chaosp2p"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "chaosp2p.errors",
            "chaosp2p.clock",
            "chaosp2p.configbase",
            "chaosp2p._version",
            "chaosp2p._moved",
            "chaosp2p.atomic_file",
        ),
    ),
    ("wire", ("chaosp2p.wire",)),
    ("scheduling", ("chaosp2p.scheduling",)),
    ("protocols", ("chaosp2p.protocols",)),
    ("dht", ("chaosp2p.dht",)),
    ("sim", ("chaosp2p.sim",)),
    ("transport", ("chaosp2p.transport",)),
    ("runtime", ("chaosp2p.runtime",)),
    ("state", ("chaosp2p.state",)),
    ("training", ("chaosp2p.training",)),
    ("api", ("chaosp2p.api", "chaosp2p")),
    (
        "apps",
        (
            "chaosp2p.cli",
            "chaosp2p.__main__",
            "chaosp2p.hivemind",
            "chaosp2p.cluster",
            "chaosp2p.dashboard",
            "chaosp2p.trainers",
        ),
    ),
)
"""Layer name and the module prefixes in it, bottom-up (``chaosp2p`` alone is the root package)."""

ANNOTATION_ONLY = {
    ("chaosp2p.errors", "chaosp2p.wire.identity"): "RoundAborted.missing and ContributionRefused.by name PeerIDs",
}
"""Upward imports allowed under ``TYPE_CHECKING`` only, each with its reason."""


@dataclass(frozen=True, slots=True)
class Import:
    source: str
    target: str
    line: int
    type_checking: bool
    names: tuple[str, ...]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, index = -1, -1
    for position, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "chaosp2p"
            if (module == prefix if exact else module == prefix or module.startswith(prefix + ".")) and len(
                prefix
            ) > best:
                best, index = len(prefix), position
    assert index >= 0, f"{module} is in no layer: add it to LAYERS"
    return index


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, package: str, level: int) -> str:
    if level == 0:
        return module
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join([*base, module] if module else base)


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for inner in node.body:
                guarded.update(id(n) for n in ast.walk(inner))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "chaosp2p":
                    yield Import(module, alias.name, node.lineno, id(node) in guarded, ())
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node.module or "", package, node.level)
            if target.split(".")[0] != "chaosp2p":
                continue
            names = tuple(alias.name for alias in node.names)
            submodules = [f"{target}.{name}" for name in names if f"{target}.{name}" in MODULES]
            # ``from package import submodule`` depends on the submodule, not on the package's namespace.
            if target == "chaosp2p" and submodules and len(submodules) == len(names):
                for sub in submodules:
                    yield Import(module, sub, node.lineno, id(node) in guarded, ())
                continue
            yield Import(module, target, node.lineno, id(node) in guarded, names)
            for sub in submodules:
                yield Import(module, sub, node.lineno, id(node) in guarded, ())


ALL_IMPORTS = [found for module, path in MODULES.items() for found in imports_of(module, path)]


def _where(found: Import) -> str:
    return f"{MODULES[found.source].relative_to(PACKAGE.parent)}:{found.line}"


def test_every_module_sits_in_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_imports_follow_the_layer_order() -> None:
    wrong = []
    for found in ALL_IMPORTS:
        if found.target not in MODULES:
            continue
        source, target = layer_of(found.source), layer_of(found.target)
        if target <= source:
            continue
        if found.type_checking and (found.source, found.target) in ANNOTATION_ONLY:
            continue
        wrong.append(f"{_where(found)}: {LAYERS[source][0]} imports {LAYERS[target][0]} ({found.target})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_module_imports_the_package_root() -> None:
    """The root is the public surface: importing names from it pulls the whole API under any layer."""
    wrong = [
        f"{_where(found)}: from chaosp2p import {', '.join(found.names)}"
        for found in ALL_IMPORTS
        if found.target == "chaosp2p" and found.source != "chaosp2p"
    ]
    assert not wrong, "\n".join(wrong)


def test_every_import_names_a_module_that_exists() -> None:
    """Old paths (chaosp2p._moved) are for users' code; the package itself uses the new ones."""
    missing = [
        f"{_where(found)}: {found.target}"
        for found in ALL_IMPORTS
        if found.target not in MODULES and found.target.rpartition(".")[0] not in MODULES
    ]
    moved = [
        f"{_where(found)}: {found.target}.{name} (now in {_moved.MOVED_NAMES[(found.target, name)]})"
        for found in ALL_IMPORTS
        for name in found.names
        if (found.target, name) in _moved.MOVED_NAMES
    ]
    assert not missing and not moved, "\n".join(missing + moved)


def _cycles() -> list[list[str]]:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for found in ALL_IMPORTS:
        if found.target in MODULES and found.target != found.source:
            # A package's __init__ re-exporting its own modules is not a dependency of theirs on it.
            if found.source == found.target.rpartition(".")[0]:
                continue
            if found.type_checking and (found.source, found.target) in ANNOTATION_ONLY:
                continue
            graph[found.source].add(found.target)
    # Tarjan's strongly connected components (iterative, so deep chains cannot overflow the stack).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_import_cycles_between_modules() -> None:
    cycles = _cycles()
    assert not cycles, "modules importing each other (directly or through others):\n" + "\n".join(
        " <-> ".join(component) for component in cycles
    )


@pytest.mark.parametrize("limit", [800])
def test_no_module_holds_more_than_one_idea_by_size(limit: int) -> None:
    """DESIGN.md: a machine past about 800 lines has several ideas; split it along them."""
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > limit
    }
    assert not long, f"modules over {limit} lines: {long}"
