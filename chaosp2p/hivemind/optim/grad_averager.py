"""``hivemind.optim.grad_averager``: a read-only view of the gradient accumulation (``optimizer.grad_averager``)."""

from __future__ import annotations

from collections.abc import Callable


class GradientAveragerView:
    """Gradients accumulated towards this peer's share of the epoch (averaged when it is full)."""

    def __init__(
        self, accumulation: Callable[[], tuple[int, int]], alive: Callable[[], bool], *, reuse_grad_buffers: bool
    ) -> None:
        self._accumulation, self._alive = accumulation, alive
        self.reuse_grad_buffers = reuse_grad_buffers
        """Whether gradients accumulate in the parameters' ``.grad`` (the script never zeroes them)."""

    @property
    def local_samples_accumulated(self) -> int:
        """Samples whose gradients were accumulated in the current epoch."""
        return self._accumulation()[0]

    @property
    def local_times_accumulated(self) -> int:
        """``step()`` calls accumulated in the current epoch."""
        return self._accumulation()[1]

    def is_alive(self) -> bool:
        """Whether the optimizer still takes part in its run."""
        return self._alive()


__all__ = ["GradientAveragerView"]
