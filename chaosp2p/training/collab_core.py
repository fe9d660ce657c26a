"""The state every role of a collaboration shares, and the run's view from this member.

Theory of operation
-------------------
A collaboration (:mod:`chaosp2p.training.collaboration`) is split the way the negotiation machine
is: this core holds the state and the read-only view of the run; role classes add behaviour --
stepping through averaging rounds (:mod:`~chaosp2p.training.stepping`), joining as a newcomer
(:mod:`~chaosp2p.training.joining`) and serving newcomers (:mod:`~chaosp2p.training.newcomers`) --
and :class:`~chaosp2p.training.collaboration.AsyncCollaboration` composes them with the lifecycle.

Everything the core knows about the peer comes through the :class:`~chaosp2p.training.port.TrainingPort`
and the peer's :class:`~chaosp2p.training.service.TrainingService` (the averager, the snapshot
store, the routing of collab requests). The view of the run is a pure function of the agreed
configuration governing the next step, so every member computes the same batch slices and ranks.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.protocols.averaging.contributions import InvalidStreaks
from chaosp2p.protocols.collab.vouch import Vouch
from chaosp2p.protocols.negotiation import Configuration, OperationCommitted, ring_order
from chaosp2p.training.activity import Activity
from chaosp2p.training.config import CollaborationConfig
from chaosp2p.training.feed import SnapshotWaiters, UpdateFeed
from chaosp2p.training.flat import FlatParameters, layout_digest, parameter_digest
from chaosp2p.training.outer import OuterState
from chaosp2p.training.port import EventQueue, TrainingPort
from chaosp2p.wire.identity import PeerID

if TYPE_CHECKING:
    from chaosp2p.training.service import TrainingService

log = logging.getLogger("chaosp2p.training")

_STEP_TIME_WINDOW = 16
MAX_RUN_ID_CHARS = 256
VOUCHES_KEPT = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStatistics:
    """What one ``step()`` did (returned by it, and the last one by ``statistics()``)."""

    step: int
    """The step (synchronous) or outer step (DiLoCo) this call completed; -1 for a DiLoCo inner step."""
    epoch: int
    config_digest: str
    members: int
    samples: int
    round_s: float
    """Time spent averaging (0 for a DiLoCo inner step)."""
    idle_s: float
    """Time this member spent in ``step()`` not computing: waiting at a gate, for the others'
    contributions, for the network, and in rounds that failed."""
    attempts: int
    """Rounds it took (more than 1 after a failure or a configuration change)."""
    bytes_sent: int
    bytes_received: int
    excluded: tuple[str, ...] = ()
    """Members whose contribution failed validation and was left out."""


def mean_throughput(config: Configuration) -> float:
    """The mean measured speed of a configuration's members (1.0 if none is known)."""
    known = [m.throughput_samples_per_s for m in config.members if m.throughput_samples_per_s > 0]
    return sum(known) / len(known) if known else 1.0


def participants(config: Configuration, step: int) -> list[PeerID]:
    """A round's members in ring order: the configuration's members taking part in ``step``."""
    return [peer for peer in ring_order(config) if config.takes_part(peer, step)]


class CollaborationCore:
    """State and view shared by the roles of a collaboration (see the module docstring)."""

    def __init__(
        self,
        port: TrainingPort,
        service: TrainingService,
        *,
        run: str,
        model: Any,
        optimizer: Any,
        config: CollaborationConfig,
    ) -> None:
        if not run or len(run) > MAX_RUN_ID_CHARS:
            raise ConfigError(f"a run id must have 1..{MAX_RUN_ID_CHARS} characters")
        self.port = port
        self.service = service
        self.run = run
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.flat = FlatParameters(list(model.parameters()))
        self.layout = layout_digest(model)
        self.step_index = 0
        """The next step (synchronous) or outer step (DiLoCo) to run."""
        self.feed = UpdateFeed(max_queued=config.max_catchup_updates)
        self.snapshots = SnapshotWaiters()
        self._local = self.flat.host_array()
        self._step_times: deque[float] = deque(maxlen=_STEP_TIME_WINDOW)
        # Rounds that failed, per (step, configuration digest): a failed round is final, so a retry
        # under the same configuration is a new round (the count is its attempt number).
        self._failed_rounds: dict[tuple[int, bytes], int] = {}
        self._history: deque[tuple[int, bytes, int, np.ndarray]] = deque(maxlen=config.update_history)
        self._throughput: float | None = None
        self._last_end: float | None = None
        self._last_begin: float | None = None
        self._last: StepStatistics | None = None
        self._inner_steps = 0
        self._inner_samples = 0
        self._outer = OuterState(model, lr=config.outer_lr, momentum=config.outer_momentum) if self.diloco else None
        self._serving = False
        self._newcomers_served: dict[PeerID, float] = {}  # newcomer -> until when it may load our snapshots
        self._vouches: dict[int, tuple[Vouch, Configuration]] = {}  # step -> our vouch, what governed it
        self._subscription: EventQueue | None = None
        self._records: list[dict[str, Any]] = []
        self._started = False
        self._left = False
        self._invalid = InvalidStreaks(config.evict_after_invalid_rounds)
        # Stepping aside while idle (stepping_aside.py): the trainer's activity, the watcher task's
        # scope and end, and -- while aside -- the serving's end (one value: aside is "an event
        # exists", so flag and event cannot disagree) and the updates it kept.
        self._activity = Activity()
        self._idle_scope: anyio.CancelScope | None = None
        self._idle_stopped: anyio.Event | None = None
        self._aside: anyio.Event | None = None
        self._aside_updates: list[np.ndarray] = []

    @property
    def numel(self) -> int:
        """Elements of the flat parameter buffer (what every averaged update holds)."""
        return self.flat.numel

    @property
    def diloco(self) -> bool:
        """Whether this collaboration runs DiLoCo (local steps + outer steps)."""
        return self.config.mode == "diloco"

    # ------------------------------------------------------------------ the run's view
    @property
    def configuration(self) -> Configuration:
        """The newest agreed configuration of the run."""
        found = self.port.runs.configuration(self.run)
        if found is None:
            raise LocalProtocolError(f"this peer takes no part in run {self.run!r} (start() first)")
        return found

    def _governing(self) -> Configuration:
        """The configuration for the next step as far as known now (the newest one if it is gated)."""
        found = self.port.runs.governing(self.run, self.step_index)
        return found if found is not None else self.configuration

    @property
    def local_batch_size(self) -> int:
        """This member's share of the global batch for the next step."""
        start, stop = self.batch_slice()
        return stop - start

    def batch_slice(self) -> tuple[int, int]:
        """Where this member's samples sit in the step's global batch: ``[start, stop)``.

        Members are laid out in ring order with their batch shares, so the members of a
        configuration together cover the global batch exactly once.
        """
        config = self._governing()
        shares = {m.peer_id: int(m.batch_share) for m in config.members}
        start = 0
        ring = participants(config, self.step_index)
        for peer in ring:
            if peer == self.port.peer_id:
                return start, start + shares[peer]
            start += shares[peer]
        if self._started and not self._left and self.port.runs.removed_reason(self.run) is not None:
            # Removed while it did not step (stalled, failed, lost): its next step() rejoins it. A
            # script asks for its slice before that; it gets an equal share of a run one larger,
            # and the share the admitting configuration gives it caps what its samples weigh.
            share = max(1, config.params.global_batch // (len(ring) + 1))
            return 0, share
        raise LocalProtocolError(f"this peer is not a member of run {self.run!r}")

    @property
    def rank(self) -> int:
        """This member's position in the ring order of the configuration for the next step."""
        return participants(self._governing(), self.step_index).index(self.port.peer_id)

    @property
    def world_size(self) -> int:
        """Members of the configuration for the next step."""
        return len(participants(self._governing(), self.step_index))

    @property
    def global_batch(self) -> int:
        """Samples per step over all members."""
        config = self._governing()
        return sum(int(m.batch_share) for m in config.members if config.takes_part(m.peer_id, self.step_index))

    def statistics(self) -> StepStatistics | None:
        """What the last ``step()`` did."""
        return self._last

    def parameter_digest(self) -> str:
        """Hash of the parameters (equal on every member of a synchronous run after each step)."""
        return parameter_digest(self.model)

    def take_events(self) -> list[dict[str, Any]]:
        """What happened to the run since the last call, as JSON-ready records.

        Operations the run committed (kind, subject, and when each was detected, proposed,
        committed and applied) and, on a newcomer, how its join went (sources, bytes, seconds).
        Times are this host's monotonic clock (``detected_at`` is the detecting peer's).
        """
        records, self._records = self._records, []
        if self._subscription is not None:
            for event in self._subscription.drain():
                if isinstance(event, OperationCommitted) and event.run == self.run:
                    records.append(
                        {
                            "event": "operation",
                            "kind": event.kind.name.lower(),
                            "subject": str(event.subject),
                            # A link op's other endpoint (None otherwise): which link went down.
                            "other": None if event.other is None else str(event.other),
                            "origin": str(event.origin),
                            "epoch": event.epoch,
                            "detected_at": event.detected_at,
                            "proposed_at": event.proposed_at,
                            "committed_at": event.committed_at,
                            "activation_step": event.activation_step,
                            "decision_ms": round((event.committed_at - event.proposed_at) * 1e3, 3),
                        }
                    )
        return records

    # ------------------------------------------------------------------ applying updates
    def _snapshot_target(self) -> tuple[Any, Any]:
        """What a snapshot holds: the outer (global) model in DiLoCo, the model itself otherwise."""
        if self._outer is not None:
            return self._outer.module, self._outer.optimizer
        return self.model, self.optimizer

    def _apply_gradient(self, averaged: np.ndarray) -> None:
        self.flat.scatter_grads(averaged)
        self.optimizer.step()

    def _apply_outer(self, averaged: np.ndarray) -> None:
        assert self._outer is not None
        self._outer.apply(averaged, self.flat)

    def _replay(self, update: np.ndarray | None) -> None:
        """Do with a member's averaged update exactly what the members did with it."""
        assert update is not None
        if self._outer is not None:
            self._outer.apply(update, self.flat)
        else:
            self._apply_gradient(update)

    # ------------------------------------------------------------------ provided by the roles
    async def _rejoin(self, why: str) -> None:
        """Join the run again as a newcomer (:class:`~chaosp2p.training.joining.Joining`)."""
        raise NotImplementedError

    async def _resume_after_aside(self) -> None:
        """At ``step()``, after this member stepped aside (:class:`~chaosp2p.training.stepping_aside.SteppingAside`)."""
        raise NotImplementedError

    @property
    def _passive(self) -> bool:
        """Serving rounds with weight 0 (leaving, or stepped aside): no rejoin, no judging others, no
        snapshot (the updates are not applied), no throughput report."""
        return self._left or self._aside is not None

    async def _publish_snapshot(self, step: int, config: Configuration) -> None:
        """Snapshot and vouch for ``step`` (:class:`~chaosp2p.training.newcomers.ServingNewcomers`)."""
        raise NotImplementedError
