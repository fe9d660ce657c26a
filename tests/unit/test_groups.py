"""Unwrapping exception groups from task groups without swallowing cancellations."""

from __future__ import annotations

import sys

import pytest

from chaosp2p.errors import ConnectionClosed, StreamReset
from chaosp2p.transport.groups import chaos_errors_beside_cancellation, unwrap_single_error

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup


class Cancelled(BaseException):
    """Stands in for a backend's cancellation exception."""


def test_a_lone_error_comes_out_as_itself() -> None:
    with pytest.raises(StreamReset), unwrap_single_error():
        raise BaseExceptionGroup("tasks", [ExceptionGroup("inner", [StreamReset("reset")])])


def test_several_chaos_errors_collapse_to_the_first() -> None:
    with pytest.raises(StreamReset), unwrap_single_error():
        raise ExceptionGroup("tasks", [StreamReset("reset"), ConnectionClosed("closed")])


def test_a_cancellation_among_errors_is_never_collapsed() -> None:
    with pytest.raises(BaseExceptionGroup), unwrap_single_error():
        raise BaseExceptionGroup("tasks", [StreamReset("reset"), Cancelled()])


def test_errors_beside_a_cancellation_are_collected_and_the_cancellation_goes_on() -> None:
    with pytest.raises(BaseExceptionGroup) as raised, chaos_errors_beside_cancellation() as errors:
        raise BaseExceptionGroup("tasks", [StreamReset("reset"), Cancelled()])
    assert [type(e) for e in errors] == [StreamReset]
    assert [type(e) for e in raised.value.exceptions] == [Cancelled]


def test_only_chaos_errors_are_absorbed() -> None:
    with chaos_errors_beside_cancellation() as errors:
        raise ExceptionGroup("tasks", [ConnectionClosed("closed")])
    assert len(errors) == 1
    with pytest.raises(ExceptionGroup), chaos_errors_beside_cancellation():
        raise ExceptionGroup("tasks", [ValueError("a bug")])
