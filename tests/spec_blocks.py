"""Reading the fenced blocks of test vectors out of the specs in ``protocols/``."""

from __future__ import annotations

import re
from pathlib import Path

PROTOCOLS = Path(__file__).resolve().parents[1] / "protocols"
"""The repository's folder of normative wire specs."""


def spec_block(spec: str, kind: str) -> list[str]:
    """The lines of the one ```kind block of ``protocols/<spec>``, blank lines and ``#`` comments left out."""
    text = (PROTOCOLS / spec).read_text(encoding="utf-8")
    found = re.findall(rf"^```{kind}\n(.*?)^```", text, flags=re.M | re.S)
    assert len(found) == 1, f"protocols/{spec} must hold exactly one ```{kind} block"
    return [line for line in found[0].splitlines() if line.strip() and not line.startswith("#")]


def named_lines(spec: str, kind: str) -> dict[str, str]:
    """The ``name rest`` lines of that block by name (each name once)."""
    named: dict[str, str] = {}
    for line in spec_block(spec, kind):
        name, rest = line.split(" ", 1)
        assert name not in named, f"protocols/{spec}: vector {name} twice"
        named[name] = rest
    return named
