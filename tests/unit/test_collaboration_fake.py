"""The fake port the collaboration's unit tests run on keeps up with the real port.

``tests/unit/fake_port.py`` serves :class:`~chaosp2p.training.port.TrainingPort` and
:class:`~chaosp2p.training.port.RunGates` by duck typing; when the port grows a name, the fake must
grow it too, or the collaboration's unit tests would pass against a port that no longer exists.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from chaosp2p.training.port import EventQueue, RunGates, TrainingPort
from tests.unit.fake_port import FakeEvents, FakeGates, FakePort


def _names(protocol: type) -> list[str]:
    return sorted(name for name in vars(protocol) if not name.startswith("_"))


def _parameters(function: object) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


FAKES: dict[type, Callable[[], object]] = {
    TrainingPort: FakePort,
    RunGates: lambda: FakeGates(FakePort().peer_id),
    EventQueue: FakeEvents,
}


@pytest.mark.parametrize("protocol", list(FAKES), ids=lambda protocol: protocol.__name__)
def test_the_fake_serves_every_name_of_the_protocol_with_the_same_parameters(protocol: type) -> None:
    instance = FAKES[protocol]()
    fake = type(instance)
    for name in _names(protocol):
        declared = vars(protocol)[name]
        assert hasattr(instance, name), f"{fake.__name__} lacks {name}"
        if isinstance(declared, property):
            continue
        served = getattr(fake, name)
        assert _parameters(served) == _parameters(declared), f"{fake.__name__}.{name} takes other parameters"
        assert inspect.iscoroutinefunction(served) == inspect.iscoroutinefunction(declared), name
