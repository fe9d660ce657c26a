"""The public surface is a snapshot: what users import cannot change by accident.

``tests/unit/data/public_surface.txt`` lists every name the public modules export and, for each
class and function among them, its public members and signatures. A change to the surface fails
here until the snapshot is regenerated on purpose::

    CHAOSP2P_UPDATE_SURFACE=1 python -m pytest tests/unit/test_public_surface.py

and the diff of the snapshot is reviewed with the change. The old import paths that moved when the
package was laid out by layers are checked too: each one still imports, and is the new module.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chaosp2p import _moved

SNAPSHOT = Path(__file__).parent / "data" / "public_surface.txt"
PUBLIC_MODULES = (
    "chaosp2p",
    "chaosp2p.api",
    "chaosp2p.training",
    "chaosp2p.errors",
    "chaosp2p.hivemind",
    "chaosp2p.state",
    "chaosp2p.dht",
    "chaosp2p.protocols.membership",
    "chaosp2p.protocols.negotiation",
    "chaosp2p.protocols.transfer",
    "chaosp2p.protocols.averaging",
    "chaosp2p.protocols.collab",
)


def _signature(value: object) -> str:
    try:
        return str(inspect.signature(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"


def _describe(module_name: str, name: str, value: object) -> list[str]:
    where = getattr(value, "__module__", None)
    lines = [f"{module_name}.{name}: {type(value).__name__} from {where}"]
    if inspect.isclass(value):
        for member in sorted(dir(value)):
            if member.startswith("_") and member != "__init__":
                continue
            item = inspect.getattr_static(value, member)
            if any(vars(base).get(member) is item for base in (BaseException, object)):
                continue  # inherited from the builtins, not chaosp2p's surface
            if isinstance(item, property):
                lines.append(f"    .{member}: property")
            elif isinstance(item, (staticmethod, classmethod)):
                lines.append(f"    .{member}{_signature(item.__func__)} [{type(item).__name__}]")
            elif inspect.isfunction(item):
                lines.append(f"    .{member}{_signature(item)}")
        fields = getattr(value, "__dataclass_fields__", None)
        if fields:
            lines.append(f"    fields: {', '.join(fields)}")
        declared = [name for name in inspect.get_annotations(value) if not name.startswith("_")]
        if declared and not fields:  # e.g. a Protocol's attributes
            lines.append(f"    attributes: {', '.join(declared)}")
    elif inspect.isfunction(value):
        lines[0] += f" {_signature(value)}"
    return lines


def surface() -> str:
    lines: list[str] = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names = sorted(getattr(module, "__all__", ()))
        lines.append(f"[{module_name}] {len(names)} names")
        for name in names:
            lines.extend(_describe(module_name, name, getattr(module, name)))
    return "\n".join(lines) + "\n"


def test_public_surface_matches_the_snapshot() -> None:
    current = surface()
    if os.environ.get("CHAOSP2P_UPDATE_SURFACE"):
        SNAPSHOT.write_text(current)
    assert SNAPSHOT.read_text() == current, (
        "the public surface changed; if on purpose, regenerate with CHAOSP2P_UPDATE_SURFACE=1 and review the diff"
    )


def test_the_root_exports_one_peer_per_style() -> None:
    import chaosp2p

    peers = {name for name in chaosp2p.__all__ if name.endswith("Peer")}
    assert peers == {"AsyncPeer", "Peer"}
    assert "Node" not in chaosp2p.__all__ and "open_node" not in chaosp2p.__all__
    # Still reachable for existing scripts, from the layer that defines it.
    from chaosp2p.runtime.node import Node

    assert chaosp2p.Node is Node


def test_the_collaboration_the_docstrings_promise_exists() -> None:
    import chaosp2p
    from chaosp2p.api.blocking_collaboration import Collaboration

    assert chaosp2p.Collaboration is Collaboration
    assert chaosp2p.training.Collaboration is Collaboration  # the old path


@pytest.mark.parametrize("old", sorted(_moved.MOVED_MODULES))
def test_a_moved_module_imports_from_its_old_path_as_the_new_module(old: str) -> None:
    new = _moved.MOVED_MODULES[old]
    assert importlib.import_module(old) is importlib.import_module(new)


@pytest.mark.parametrize(("package", "name"), sorted(_moved.MOVED_NAMES))
def test_a_moved_name_is_still_exported_where_it_was(package: str, name: str) -> None:
    module = importlib.import_module(_moved.MOVED_NAMES[(package, name)])
    assert getattr(importlib.import_module(package), name) is getattr(module, name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import chaosp2p

    with pytest.raises(AttributeError, match="no attribute 'Nonexistent'"):
        chaosp2p.Nonexistent  # noqa: B018


def test_the_old_trainer_path_still_runs_with_python_dash_m() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chaosp2p.training.digits", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert "--join" in result.stdout and "--steps" in result.stdout


ROOT = Path(__file__).resolve().parents[2]


def _documented_imports() -> list[tuple[str, str]]:
    """(where, statement) for every chaosp2p import in the README's code blocks, docs and examples."""
    found: list[tuple[str, str]] = []
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]
    for path in sources:
        text = path.read_text()
        if path.suffix == ".md":  # only inside ```python blocks
            blocks = text.split("```")
            text = "\n".join(block.removeprefix("python\n") for block in blocks[1::2] if block.startswith("python\n"))
        for number, line in enumerate(text.splitlines(), 1):
            statement = line.split("#")[0].strip()
            if statement.startswith(("import chaosp2p", "from chaosp2p")):
                found.append((f"{path.relative_to(ROOT)}:{number}", statement))
    return found


@pytest.mark.parametrize(("where", "statement"), _documented_imports())
def test_every_import_in_the_readme_docs_and_examples_works(where: str, statement: str) -> None:
    exec(statement, {})  # the statement alone: a name that moved away fails here
