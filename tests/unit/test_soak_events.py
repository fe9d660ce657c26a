"""Which events benchmarks/soak.py may cause next, without running it (:func:`event_kinds`).

The one-hour soak could kill into a run of two: a newcomer still joining counted as a member, so
with the founder, one member and one joiner it allowed a kill -- and a run of two survives no crash
(nobody removes another alone). Only members that train count now.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.benchmark_scripts import benchmark_scripts


@pytest.fixture(scope="module")
def soak() -> Iterator[Any]:
    with benchmark_scripts("soak") as scripts:
        yield scripts["soak"]


def test_a_newcomer_still_joining_is_no_member_a_kill_could_spare(soak: Any) -> None:
    # The founder and one member train; a third process is still joining: only a join may come.
    assert soak.event_kinds(committed=2, processes=3, touchable=2, max_processes=6) == ["join"]
    # Once the joiner trains there are three members: a crash leaves two that remove the third.
    assert set(soak.event_kinds(committed=3, processes=3, touchable=2, max_processes=6)) == {
        "join",
        "leave",
        "kill",
        "stall",
    }


def test_joins_stop_at_the_process_cap_and_an_untouchable_run_only_grows(soak: Any) -> None:
    assert "join" not in soak.event_kinds(committed=6, processes=6, touchable=5, max_processes=6)
    # At the cap with joiners not yet trained: nothing, until they do.
    assert soak.event_kinds(committed=2, processes=6, touchable=5, max_processes=6) == []
    assert soak.event_kinds(committed=1, processes=1, touchable=0, max_processes=6) == ["join"]
