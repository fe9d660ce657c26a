"""A collaboration: this peer's part in training one model together with the members of a run.

Theory of operation
-------------------
A run is a sequence of configurations agreed by its members through negotiation
(:mod:`chaosp2p.protocols.negotiation`): who is in, from which step, with which batch shares. A
collaboration turns that into training. It is composed the way the negotiation machine is, from a
core (:mod:`~chaosp2p.training.collab_core`: state and the run's view) and one module per role:

* **Stepping** (:mod:`~chaosp2p.training.stepping`): synchronous averaging of each step's
  gradients among the agreed members, or DiLoCo's local steps and outer steps; a round that fails
  is redone under the configuration the run agrees on next, so every member applies the same bytes.
* **Joining** (:mod:`~chaosp2p.training.joining`): a newcomer observes a sponsor, loads a vouched
  snapshot of a near-future step from the members in parallel while they keep training, replays
  the updates after it and is admitted with a state bit-identical to theirs.
* **Stepping aside** (:mod:`~chaosp2p.training.stepping_aside`): an idle member whose trainer
  holds the others leaves by itself (a LEAVE needs no second signer) and rejoins at its next step.
* **Serving newcomers** (:mod:`~chaosp2p.training.newcomers`): snapshots of the steps newcomers ask
  for, vouched for by this member.

Here: the lifecycle. ``start`` founds the run or joins it and starts the idle watcher (a task
under the peer's task group); ``leave`` stops the watcher, announces the departure and, until the
run commits it at an agreed step, keeps doing this member's part of each round with zero weight
(every round needs each member's shard).

**Straggler balancing.** Each member measures its own samples per second of compute and reports
it every ``rebalance_interval_steps``; negotiation turns large changes into new batch shares,
which ``local_batch_size`` follows, so every member finishes its compute at about the same time
while the global batch stays constant.

Everything the collaboration needs from its peer goes through the
:class:`~chaosp2p.training.port.TrainingPort`; it never reaches into the runtime.
"""

from __future__ import annotations

import logging

import anyio

from chaosp2p.errors import ConfigError, LocalProtocolError, TrainingError
from chaosp2p.protocols.negotiation import RunParams
from chaosp2p.training.collab_core import StepStatistics
from chaosp2p.training.joining import Joining
from chaosp2p.training.newcomers import ServingNewcomers
from chaosp2p.training.stepping_aside import SteppingAside
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")

__all__ = ["AsyncCollaboration", "StepStatistics", "TrainingError"]


class AsyncCollaboration(SteppingAside, Joining, ServingNewcomers):
    """Train ``model`` with ``optimizer`` together with the members of ``run`` (async API).

    Create it with :meth:`chaosp2p.AsyncPeer.collaborate`; the blocking equivalent for plain
    scripts is :class:`chaosp2p.Collaboration`.
    """

    async def start(self, *, found: bool, timeout_s: float | None = None) -> int:
        """Found the run (``found=True``) or join it; return the step training continues from.

        If founding or joining fails, nothing stays registered: the call may be repeated, or
        another collaboration for the run created.
        """
        if self._started:
            raise LocalProtocolError("this collaboration has already started")
        if found and self.config.global_batch < 1:
            raise ConfigError("founding a run needs CollaborationConfig.global_batch (samples per step, all members)")
        self.service.register(self)
        # Before any round: members ahead of us send contributions early (unregister forgets it).
        self.service.averager.expect_run(self.run, self._admits_contribution)
        self._subscription = self.port.subscribe()
        self._started = True
        # A removal this peer saw in an earlier collaboration of this run (it left, or was removed)
        # concerns that membership, not the new one.
        self.port.runs.forget_removal(self.run)
        try:
            if found:
                params = RunParams(
                    global_batch=self.config.global_batch,
                    mode=self.config.mode,
                    local_steps=self.config.local_steps,
                    admitted=tuple(PeerID.parse(text) for text in self.config.admitted_peers),
                )
                self.port.runs.create_run(self.run, params)
                self.step_index = 0
                log.info("founded run %r (%s)", self.run, self.config.mode)
            else:
                with anyio.fail_after(timeout_s or self.config.join_timeout_s):
                    await self._join()
        except BaseException:
            self._started = False
            self._subscription = None
            self.service.unregister(self)
            raise
        self._start_idle_watch()
        return self.step_index

    async def leave(self, *, timeout_s: float = 30.0) -> None:
        """Leave the run gracefully: the members commit our departure and go on without us."""
        if self._left or not self._started:
            return
        self._left = True
        try:
            await self._stop_idle_watch()
            if self.port.runs.announce_leave(self.run):
                with anyio.move_on_after(timeout_s) as scope:
                    await self._serve_until_removed()
                if scope.cancelled_caught:
                    log.warning("run %r did not commit our leave within %.1f s", self.run, timeout_s)
        finally:
            self.service.unregister(self)
