"""Exception groups from task groups, made readable again.

anyio task groups wrap whatever escapes them in an exception group. When exactly one error
escaped -- the common case, e.g. ``AdmissionDenied`` raised inside ``async with open_peer(...)`` --
callers should see that error itself, so ``except ChaosError`` works as documented. When several
tasks failed *only* with chaosp2p errors (a reader and a writer both seeing the same connection
drop), the first one stands for all of them. chaosp2p errors beside a cancellation give way to it:
the cancellation goes on, alone, to the scope that owns it. Anything else -- a bug among them --
stays a group, so nothing is silently swallowed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from chaosp2p.errors import ChaosError

if sys.version_info < (3, 11):  # pragma: no cover - exercised on 3.10 only
    from exceptiongroup import BaseExceptionGroup


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one leaf exception inside (possibly nested) ``group``, or ``None`` if there are several."""
    current: BaseException = group
    while isinstance(current, BaseExceptionGroup):
        if len(current.exceptions) != 1:
            return None
        current = current.exceptions[0]
    return current


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


@contextmanager
def unwrap_single_error() -> Iterator[None]:
    """Re-raise a lone exception, or the first of several chaosp2p errors, from an exception group."""
    try:
        yield
    except BaseExceptionGroup as group:
        error = single_error(group)
        if error is None:
            leaves = _leaves(group)
            if all(isinstance(leaf, ChaosError) for leaf in leaves):
                error = leaves[0]
            elif all(isinstance(leaf, ChaosError) or not isinstance(leaf, Exception) for leaf in leaves):
                # chaosp2p errors beside a cancellation (or an interrupt): an enclosing scope was
                # cancelled, so the work that failed is being torn down anyway. The cancellation
                # goes on alone: left in one group with the errors, it would be caught by its scope
                # and the errors would escape from there as a group nobody expects (a stream reset
                # racing a round's or a handler's cancellation crashed training processes so).
                _, rest = group.split(ChaosError)
                assert rest is not None
                raise rest from None
            else:
                raise
        raise error from error.__cause__


@contextmanager
def chaos_errors_beside_cancellation() -> Iterator[list[ChaosError]]:
    """Collect the chaosp2p errors of a task group that was *also* being cancelled.

    When a task fails at the moment its group is cancelled (a stream reset racing a shutdown), the
    group raises both the error and the cancellation. This keeps the cancellation going -- it is
    re-raised for the cancel scope that owns it -- and hands the chaosp2p errors to the caller
    through the yielded list instead of letting them escape as an unexpected group. Anything that
    is neither is re-raised untouched.
    """
    errors: list[ChaosError] = []
    try:
        yield errors
    except BaseExceptionGroup as group:
        chaos, rest = group.split(ChaosError)
        if chaos is not None:
            errors.extend(leaf for leaf in _leaves(chaos) if isinstance(leaf, ChaosError))
        if rest is not None:
            raise rest from None
