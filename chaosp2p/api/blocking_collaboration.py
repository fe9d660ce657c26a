"""The blocking collaboration for plain training scripts (no ``async`` in the caller's code).

::

    peer = chaosp2p.Peer(initial_peers=[addr])                      # joins the swarm
    collab = chaosp2p.Collaboration(peer, run="mlp", model=model, optimizer=opt)
    for x, y in data:
        loss_fn(model(x), y).backward()
        collab.step(samples=len(x))     # averaged among the run's members, then optimizer.step()
        opt.zero_grad()
    collab.leave()

A peer started without ``initial_peers`` founds the run; one with them joins it (downloading the
members' state and catching up first). ``found=`` overrides that choice.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from chaosp2p.api.blocking_peer import Peer
from chaosp2p.protocols.negotiation import Configuration
from chaosp2p.training.collaboration import AsyncCollaboration, StepStatistics
from chaosp2p.training.config import CollaborationConfig


class Collaboration:
    """Train one model with the members of ``run``, from synchronous code (see the module docstring).

    The blocking twin of :class:`chaosp2p.training.AsyncCollaboration`, running on a
    :class:`chaosp2p.Peer`'s event loop.
    """

    def __init__(
        self,
        peer: Peer,
        *,
        run: str,
        model: Any,
        optimizer: Any,
        config: CollaborationConfig | None = None,
        found: bool | None = None,
        timeout: float | None = None,
    ) -> None:
        self._peer = peer
        running = peer.async_peer
        chosen = config or CollaborationConfig.profile_named(running.config.profile)
        self._collab = AsyncCollaboration(
            running.training_port, running.training, run=run, model=model, optimizer=optimizer, config=chosen
        )
        if found is None:
            found = not peer.config.bootstrap
        self.start_step: int = peer.call(partial(self._collab.start, found=found, timeout_s=timeout))
        """The step training starts from (0 for the founder, the admission step for a newcomer)."""

    def step(self, samples: int) -> StepStatistics:
        """Average this step's gradients among the members and step the optimizer."""
        return self._peer.call(self._collab.step, samples)

    def note_activity(self) -> None:
        """The trainer is busy with the run though it does not call :meth:`step` now (see
        :meth:`chaosp2p.training.AsyncCollaboration.note_activity`); called from this thread directly."""
        self._collab.note_activity()

    def leave(self, timeout: float = 30.0) -> None:
        """Leave the run gracefully (the members go on without this peer)."""
        self._peer.call(partial(self._collab.leave, timeout_s=timeout))

    @property
    def step_index(self) -> int:
        """The next step to run."""
        return self._collab.step_index

    @property
    def local_batch_size(self) -> int:
        """This member's share of the global batch (follows measured throughput)."""
        return self._collab.local_batch_size

    def batch_slice(self) -> tuple[int, int]:
        """``[start, stop)`` of this member's samples in the step's global batch."""
        return self._collab.batch_slice()

    @property
    def global_batch(self) -> int:
        """Samples per step over all members."""
        return self._collab.global_batch

    @property
    def rank(self) -> int:
        """This member's index in the current configuration (for sharding data)."""
        return self._collab.rank

    @property
    def world_size(self) -> int:
        """Members in the current configuration."""
        return self._collab.world_size

    @property
    def configuration(self) -> Configuration:
        """The newest agreed configuration of the run."""
        return self._collab.configuration

    def statistics(self) -> StepStatistics | None:
        """What the last ``step()`` did."""
        return self._collab.statistics()

    def parameter_digest(self) -> str:
        """Hash of the parameters (equal on all members of a synchronous run)."""
        return self._collab.parameter_digest()

    def take_events(self) -> list[dict[str, Any]]:
        """The run's committed operations and this peer's join report since the last call."""
        return self._collab.take_events()

    def __enter__(self) -> Collaboration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.leave()
