"""The exact core: ``count`` identical jobs on uniformly related machines with ready times.

Theory of operation. Machine ``i`` is free at ``ready[i]`` and takes ``step[i]`` per job, so its
``k``-th job completes at ``ready[i] + k*step[i]``. Any assignment that gives machine ``i`` ``x_i``
jobs has makespan ``max ready[i] + x_i*step[i]`` over the machines used, and it is feasible within a
time ``T`` only if ``x_i <= #{k >= 1 : ready[i] + k*step[i] <= T}``. Hence the optimum makespan is the
``count``-th smallest value of the multiset ``{ready[i] + k*step[i]}`` and taking exactly the
``count`` smallest values is optimal -- which is what assigning each job to the machine that would
finish it earliest (a heap) does, one job at a time.

Popping ``count`` times costs ``count*log n``; instead we jump close to the answer. The continuous
relaxation ``sum_i max(0, T - ready[i]) / step[i] = count`` (water-filling, one sorted sweep) has a
root ``T_c`` with at most ``count`` items ``<= T_c`` and at least ``count - n`` of them, so every item
``<= T_c`` belongs to the answer. After taking those, at most ``n`` jobs remain: usually they are the
smallest "next item" of distinct machines (one ``partition``), else a short heap finishes the job.
Item values are always computed as ``ready + k*step`` in IEEE double, so every path compares the
same numbers and the result is the exact ``count``-th smallest of those doubles.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def relaxed_threshold(ready: FloatArray, step: FloatArray, count: int, order: IntArray) -> float:
    """Root ``T`` of ``sum_i max(0, T - ready[i]) / step[i] = count`` (``order`` sorts ``ready``).

    This is the makespan of the fractional relaxation, a lower bound on the integer optimum.
    """
    ready_sorted = ready[order]
    weight = 1.0 / step[order]
    candidates = (count + np.cumsum(ready_sorted * weight)) / np.cumsum(weight)
    # The root uses the machines that start before it: the first prefix whose root does not
    # reach the next machine's ready time.
    fits = np.empty(len(ready_sorted), dtype=bool)
    fits[:-1] = candidates[:-1] <= ready_sorted[1:]
    fits[-1] = True
    return float(candidates[int(np.argmax(fits))])


def _count_at_most(ready: FloatArray, step: FloatArray, threshold: float) -> FloatArray:
    """Per machine, how many items ``ready + k*step`` (k >= 1) are ``<= threshold``."""
    k = np.floor((threshold - ready) / step)
    np.maximum(k, 0.0, out=k)
    # The division may round across an integer; fix against the real item values.
    k -= (ready + k * step > threshold) & (k > 0)
    k += ready + (k + 1.0) * step <= threshold
    return k


def _count_below(ready: FloatArray, step: FloatArray, threshold: float) -> FloatArray:
    """Per machine, how many items ``ready + k*step`` (k >= 1) are ``< threshold``."""
    k = np.ceil((threshold - ready) / step) - 1.0
    np.maximum(k, 0.0, out=k)
    k -= (ready + k * step >= threshold) & (k > 0)
    k += ready + (k + 1.0) * step < threshold
    return k


def _heap_finish(ready: FloatArray, step: FloatArray, taken: FloatArray, remaining: int) -> FloatArray:
    """Give ``remaining`` more jobs, one at a time, to the machine that finishes each earliest."""
    counts = taken.astype(np.int64).tolist()
    ready_list = ready.tolist()
    step_list = step.tolist()
    heap = [(ready_list[i] + (counts[i] + 1) * step_list[i], i) for i in range(len(counts))]
    heapq.heapify(heap)
    for _ in range(remaining):
        _value, i = heap[0]
        counts[i] += 1
        heapq.heapreplace(heap, (ready_list[i] + (counts[i] + 1) * step_list[i], i))
    return np.asarray(counts, dtype=np.float64)


def assign_identical(
    ready: FloatArray, step: FloatArray, count: int, order: IntArray | None = None
) -> tuple[IntArray, float]:
    """Optimal job counts per machine and their makespan (``count``-th smallest item).

    ``step`` must be > 0 everywhere; ``order`` (optional) is ``argsort(ready)``. Ties between equal
    items go to the lower machine index. With ``count == 0`` the makespan is ``-inf``.
    """
    n = len(ready)
    if count <= 0:
        return np.zeros(n, dtype=np.int64), float("-inf")
    if order is None:
        order = np.argsort(ready, kind="stable")
    threshold = relaxed_threshold(ready, step, count, order)
    taken = _count_at_most(ready, step, threshold)
    remaining = count - int(taken.sum())
    if remaining < 0:
        # Rounding put the root a hair too high and several items sit right at it; start over.
        taken = np.zeros(n, dtype=np.float64)
        remaining = count
    if remaining > 0:
        taken = _take_rest(ready, step, taken, remaining)
    if int(taken.sum()) != count:
        # Only when steps vanish next to ready times (items collide in double precision).
        taken = _heap_finish(ready, step, np.zeros(n, dtype=np.float64), count)
    counts = taken.astype(np.int64)
    used = counts > 0
    makespan = float(np.max((ready + taken * step)[used]))
    return counts, makespan


def _take_rest(ready: FloatArray, step: FloatArray, taken: FloatArray, remaining: int) -> FloatArray:
    """Add the ``remaining`` smallest items not yet taken (every taken item is among the smallest)."""
    n = len(ready)
    if remaining > n:
        return _heap_finish(ready, step, taken, remaining)
    following = ready + (taken + 1.0) * step
    # The remaining-th smallest "next item": no answer item is larger than it.
    bound = float(np.partition(following, remaining - 1)[remaining - 1])
    extra_le = _count_at_most(ready, step, bound) - taken
    np.maximum(extra_le, 0.0, out=extra_le)
    if int(extra_le.sum()) == remaining:
        return taken + extra_le
    extra_lt = _count_below(ready, step, bound) - taken
    np.maximum(extra_lt, 0.0, out=extra_lt)
    below = int(extra_lt.sum())
    if below < remaining and float(np.max(extra_le - extra_lt)) <= 1.0:
        # All items below the bound, then ties at the bound in machine order (a machine has at
        # most one item of a given value).
        at_bound = np.flatnonzero(extra_le > extra_lt)[: remaining - below]
        result = taken + extra_lt
        result[at_bound] += 1.0
        return result
    return _heap_finish(ready, step, taken, remaining)


def assign_identical_heap(ready: list[float], step: list[float], count: int) -> tuple[list[int], float]:
    """The textbook greedy, one heap pop per job: the reference the fast path is tested against."""
    counts = [0] * len(ready)
    heap = [(ready[i] + step[i], i) for i in range(len(ready))]
    heapq.heapify(heap)
    makespan = float("-inf")
    for _ in range(count):
        value, i = heap[0]
        counts[i] += 1
        makespan = value
        heapq.heapreplace(heap, (ready[i] + (counts[i] + 1) * step[i], i))
    return counts, makespan
