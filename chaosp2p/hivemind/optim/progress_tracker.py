"""``hivemind.optim.progress_tracker``: the tracker's records and a read-only tracker view.

hivemind's ``ProgressTracker`` estimates the run's progress from what each peer publishes in the
DHT and decides when the epoch ends. Here the epoch is agreed by the run (every member switches at
the same collaboration step), so ``optimizer.tracker`` only *reports*: the global epoch is the
run's, ``num_peers`` the members of its agreed configuration, and ``samples_accumulated`` is
estimated from this peer's progress through its share (members fill their shares in step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from chaosp2p.hivemind.utils.timed_storage import get_dht_time


@dataclass(frozen=False)
class GlobalTrainingProgress:
    """The run's progress in the current epoch (hivemind's fields)."""

    epoch: int
    samples_accumulated: int
    target_batch_size: int
    num_peers: int
    num_clients: int
    eta_next_epoch: float
    next_fetch_time: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalTrainingProgress:
    """This peer's progress in the current epoch (hivemind's fields)."""

    peer_id: bytes
    epoch: int
    samples_accumulated: int
    samples_per_second: float
    time: float
    client_mode: bool


class ProgressSource(Protocol):
    """What the tracker view reads from the optimizer."""

    @property
    def local_epoch(self) -> int:
        """The run's current epoch."""

    @property
    def local_progress(self) -> LocalTrainingProgress:
        """This peer's progress."""

    def run_shape(self) -> tuple[int, int, int]:
        """``(members, global batch, this peer's share)`` of the current configuration."""


class ProgressTracker:
    """Read-only view of the run's progress (see the module docstring); ``optimizer.tracker``."""

    def __init__(self, source: ProgressSource) -> None:
        self._source = source

    @property
    def target_batch_size(self) -> int:
        """Samples per epoch, all members together (the run's, set by its founder)."""
        return self._source.run_shape()[1]

    @property
    def local_progress(self) -> LocalTrainingProgress:
        """This peer's progress in the current epoch."""
        return self._source.local_progress

    @property
    def global_progress(self) -> GlobalTrainingProgress:
        """The run's progress in the current epoch."""
        members, global_batch, share = self._source.run_shape()
        local = self._source.local_progress
        fraction = min(local.samples_accumulated / max(share, 1), 1.0)
        left = max(share - local.samples_accumulated, 0)
        eta = get_dht_time() + (left / local.samples_per_second if local.samples_per_second > 0 else 0.0)
        return GlobalTrainingProgress(
            epoch=self._source.local_epoch,
            samples_accumulated=round(fraction * global_batch),
            target_batch_size=global_batch,
            num_peers=members,
            num_clients=0,
            eta_next_epoch=eta,
            next_fetch_time=get_dht_time(),
        )

    @property
    def global_epoch(self) -> int:
        """The run's epoch (every member is at it)."""
        return self._source.local_epoch

    @property
    def ready_to_update_epoch(self) -> bool:
        """Whether this peer's share of the epoch is complete (its next ``step()`` ends the epoch)."""
        return self._source.local_progress.samples_accumulated >= self._source.run_shape()[2]

    def is_alive(self) -> bool:
        """True: the view lives as long as its optimizer."""
        return True

    def shutdown(self, timeout: float | None = None) -> None:
        """Nothing to stop (the optimizer's ``shutdown()`` leaves the run)."""


__all__ = ["GlobalTrainingProgress", "LocalTrainingProgress", "ProgressSource", "ProgressTracker"]
