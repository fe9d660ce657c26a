"""The exact kernel: water-filling + partition + heap equals the one-pop-per-job greedy, bit for bit."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.scheduling.kernel import assign_identical, assign_identical_heap, relaxed_threshold

machines = st.lists(
    st.tuples(
        st.floats(0.0, 0.2),  # ready time
        st.floats(0.0, 3.0).map(lambda e: 1e-4 * 10**e),  # step, spanning 1000x
    ),
    min_size=1,
    max_size=40,
)


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[float], list[float], int]:
    base = draw(machines)
    # Duplicate some machines exactly so that ties between equal items are exercised.
    copies = draw(st.lists(st.sampled_from(base), max_size=8))
    pairs = base + copies
    count = draw(st.one_of(st.integers(0, 64), st.integers(0, 20_000)))
    return [r for r, _ in pairs], [p for _, p in pairs], count


@settings(max_examples=300, deadline=None)
@given(instances())
def test_fast_kernel_equals_heap_greedy(instance: tuple[list[float], list[float], int]) -> None:
    ready, step, count = instance
    counts, makespan = assign_identical(np.asarray(ready), np.asarray(step), count)
    ref_counts, ref_makespan = assign_identical_heap(ready, step, count)
    assert int(counts.sum()) == count == sum(ref_counts)
    assert makespan == ref_makespan
    # Both are the count-th smallest item; with ties the split may differ but never the makespan.
    finish = [r + c * p for r, p, c in zip(ready, step, counts.tolist(), strict=True) if c]
    assert max(finish, default=float("-inf")) == makespan


@settings(max_examples=200, deadline=None)
@given(instances())
def test_relaxation_is_a_lower_bound(instance: tuple[list[float], list[float], int]) -> None:
    ready, step, count = instance
    if count == 0:
        return
    ready_a, step_a = np.asarray(ready), np.asarray(step)
    bound = relaxed_threshold(ready_a, step_a, count, np.argsort(ready_a, kind="stable"))
    _, makespan = assign_identical(ready_a, step_a, count)
    assert bound <= makespan * (1 + 1e-12)
    # ...and a tight one: one more job per machine always fits above it.
    assert makespan <= bound + max(step) + 1e-12


def test_identical_machines_split_evenly_and_ties_go_to_lower_index() -> None:
    counts, makespan = assign_identical(np.zeros(3), np.ones(3), 7)
    assert counts.tolist() == [3, 2, 2]
    assert makespan == 3.0


def test_ready_time_keeps_a_late_machine_idle() -> None:
    # Machine 1 is twice as fast but starts too late to help with two jobs.
    counts, makespan = assign_identical(np.array([0.0, 1.5]), np.array([1.0, 0.5]), 2)
    assert counts.tolist() == [2, 0]
    assert makespan == 2.0


def test_collapsed_items_fall_back_to_the_heap() -> None:
    # Steps far below the ulp of the ready time: all items collide in double precision.
    ready = np.array([1e9, 1e9 + 1.0])
    step = np.array([1e-9, 1e-9])
    counts, makespan = assign_identical(ready, step, 5)
    ref_counts, ref_makespan = assign_identical_heap(ready.tolist(), step.tolist(), 5)
    assert int(counts.sum()) == 5 == sum(ref_counts)
    assert makespan == ref_makespan
