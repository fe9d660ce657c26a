"""Unwrapping exception groups from task groups without swallowing cancellations."""

from __future__ import annotations

import contextlib
import sys

import anyio
import anyio.lowlevel
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


def test_a_cancellation_among_errors_goes_on_alone() -> None:
    with pytest.raises(BaseExceptionGroup) as raised, unwrap_single_error():
        raise BaseExceptionGroup("tasks", [StreamReset("reset"), Cancelled()])
    assert [type(e) for e in raised.value.exceptions] == [Cancelled]


def test_a_bug_beside_a_cancellation_stays_in_the_group() -> None:
    with pytest.raises(BaseExceptionGroup) as raised, unwrap_single_error():
        raise BaseExceptionGroup("tasks", [ValueError("a bug"), Cancelled()])
    assert {type(e) for e in raised.value.exceptions} == {ValueError, Cancelled}


@pytest.mark.anyio
async def test_a_reset_racing_an_enclosing_cancellation_does_not_escape_its_scope() -> None:
    """The shape that crashed training processes: an enclosing scope is cancelled while the body of
    a task group fails with a chaosp2p error; the scope must absorb the cancellation and nothing
    escapes but the error itself (before, on trio, a group holding the StreamReset came out of the
    scope). On asyncio the task group absorbs its child's cancellation, so the error comes out alone,
    which callers catch as usual."""
    with contextlib.suppress(StreamReset), anyio.CancelScope() as outer, unwrap_single_error():
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.sleep_forever)
            await anyio.lowlevel.checkpoint()  # the child is now waiting
            outer.cancel()
            raise StreamReset("closed the stream without answering")
    assert outer.cancel_called


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
