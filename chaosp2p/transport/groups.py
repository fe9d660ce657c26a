"""Exception groups from task groups, made readable again.

anyio task groups wrap whatever escapes them in an exception group. When exactly one error
escaped -- the common case, e.g. ``AdmissionDenied`` raised inside ``async with open_peer(...)`` --
callers should see that error itself, so ``except ChaosError`` works as documented.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def unwrap_single_error() -> Iterator[None]:
    """Re-raise a lone exception from an exception group as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        error = single_error(group)
        if error is None:
            raise
        raise error from error.__cause__
