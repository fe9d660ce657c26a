"""Reading the fenced blocks of test vectors out of the specs in ``protocols/``."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.framing import pack
from chaosp2p.wire.messages import Message, MessageCodec

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


def message_vector_tests(
    spec: str, codec: MessageCodec, messages: Callable[[], dict[str, Message]], bad: list[list[object]]
) -> dict[str, Callable[..., None]]:
    """The four checks every protocol's vectors get, as test functions by name for a test module to
    take in (``globals().update(...)``): the spec lists exactly ``messages()``, every message type has
    one, each vector encodes and decodes both ways, and each of ``bad`` (a msgpack array) is refused."""

    def spec_lists_exactly_the_known_vectors() -> None:
        assert set(named_lines(spec, "vectors")) == set(messages())

    def every_message_type_has_a_vector() -> None:
        assert {m.TYPE for m in messages().values()} == set(codec.message_classes())

    @pytest.mark.parametrize("name", sorted(messages()))
    def vector_encodes_and_decodes(name: str) -> None:
        expected = messages()[name]
        data = bytes.fromhex(named_lines(spec, "vectors")[name])
        assert codec.encode(expected) == data
        assert codec.decode(data, max_bytes=1 << 16) == expected

    @pytest.mark.parametrize("obj", bad)
    def bad_messages_are_refused(obj: list[object]) -> None:
        with pytest.raises(RemoteProtocolError):
            codec.decode(pack(obj), max_bytes=1 << 16)

    checks = (
        spec_lists_exactly_the_known_vectors,
        every_message_type_has_a_vector,
        vector_encodes_and_decodes,
        bad_messages_are_refused,
    )
    return {f"test_{check.__name__}": check for check in checks}


def print_vectors(codec: MessageCodec, messages: dict[str, Message]) -> None:
    """Print the ```vectors block's lines for a spec (``python tests/unit/test_<x>_vectors.py``)."""
    for name, message in messages.items():
        print(name, codec.encode(message).hex())
