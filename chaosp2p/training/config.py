"""Configuration of a collaboration (one training run joined by this peer).

One frozen dataclass with units in its field names, validated in ``__post_init__``, and the usual
``local()``/``lan()``/``wan()`` profiles. What must be equal on every member of a run (mode, global
batch, local steps) travels in the run's configuration (``RunParams``, agreed at creation); the
fields here are this peer's own choices: timeouts, wire format, memory for catch-up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from chaosp2p.configbase import require, require_positive
from chaosp2p.wire.identity import PeerID

MODES = ("sync", "diloco")
WIRE_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True, slots=True, kw_only=True)
class CollaborationConfig:
    """Every knob of :class:`~chaosp2p.training.AsyncCollaboration`."""

    mode: str = "sync"
    """``sync``: gradients averaged every step. ``diloco``: ``local_steps`` inner steps, then an outer
    step on the averaged pseudo-gradient (only the run's founder's choice counts)."""
    global_batch: int = 0
    """Samples per step over all members; the founder of a run must set it (joiners take the run's)."""
    local_steps: int = 20
    """DiLoCo: inner steps per outer step (H)."""
    admitted_peers: tuple[str, ...] = ()
    """Founding only: make the run *closed* -- only these peers (PeerIDs, ``12D3KooW…``; the founder
    is added) may join it or see its configuration, and its members sponsor no one else. Empty: an
    open run, which any peer that reaches a member may join (``protocols/negotiation.md`` §6)."""
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    """DiLoCo's outer optimizer: SGD with Nesterov momentum (the DiLoCo paper's values)."""
    wire_dtype: str = "float32"
    """Averages travel as float32, or compressed to float16/bfloat16 (accumulation stays float32)."""
    round_timeout_min_s: float = 2.0
    """A round waits at least this long for a member's contribution before aborting..."""
    round_timeout_step_mult: float = 4.0
    """...and at most this many median step times (compute + averaging), when that is longer."""
    retry_wait_s: float = 1.0
    """After an aborted round, wait this long for negotiation to change the configuration."""
    max_round_attempts: int = 50
    """Give up a step (raising) after this many aborted rounds without a configuration change."""
    update_history: int = 1
    """Averaged updates kept (one copy of the model size each) for a member whose round failed
    after the others completed it: it fetches the update instead of redoing the step."""
    max_catchup_updates: int = 64
    """A newcomer buffers at most this many updates while it loads the snapshot (memory bound)."""
    join_lag_steps: int = 2
    """A newcomer asks to be admitted once it is this close to the members' step."""
    join_timeout_s: float = 600.0
    """Give up joining after this long (snapshot download and catch-up included)."""
    snapshot_ahead_steps: int = 2
    """A newcomer asks the members to snapshot this many steps ahead of the newest it saw (0: the
    step its sponsor completed last, which members keep only with ``snapshot_every_step``)."""
    snapshot_every_step: bool = False
    """Publish and vouch for a snapshot after every completed step, so a newcomer can load the step
    its sponsor completed last at once instead of waiting for a step ahead. Costs one copy of the
    model and optimizer state per step: meant for long steps (the hivemind drop-in's epochs)."""
    rebalance_interval_steps: int = 50
    """Report measured throughput to the run every this many steps (straggler balancing)."""
    balance: bool = True
    """Follow the run's batch shares (``local_batch_size``) from measured throughput."""
    evict_after_invalid_rounds: int = 3
    """A member whose contribution this peer, as the owner of a shard, found invalid (wrong shape,
    dtype or weight, NaN/Inf) in this many consecutive rounds gets an EVICT signed by this peer; it
    is removed from the run once a quorum of members signed one. 0 = never sign."""
    max_snapshot_sources: int = 0
    """A newcomer loads its snapshot from at most this many of the members that prepared it (0 =
    all of them). 1 is a single-source download: the baseline of ``benchmarks/training_elastic.py``."""
    max_newcomers: int = 4
    """Newcomers this member sponsors at once (observe streams, each with a ticket); more are refused
    (``protocols/collab.md`` §4.4)."""
    ticket_steps: int = 16
    """A sponsor's ticket lets its newcomer ask for snapshots of steps up to the sponsor's completed
    step + this; no member snapshots a step further ahead of its own completed step than this."""
    step_aside: bool = True
    """An idle member steps aside itself: while the others' contributions wait for it and its
    trainer has been idle (no ``step()`` or ``note_activity()``) for the bound below, it leaves the
    run, and rejoins at its next ``step()`` (:mod:`~chaosp2p.training.stepping_aside`)."""
    step_aside_idle_min_s: float = 2.0
    """The bound is at least this long..."""
    step_aside_gap_mult: float = 4.0
    """...and this many median gaps between the trainer's activity calls, when that is longer."""
    step_aside_poll_s: float = 0.25
    """How often the idle watcher looks (it only reads local state)."""

    def __post_init__(self) -> None:
        require(self.mode in MODES, f"mode must be one of {MODES} (got {self.mode!r})")
        require(self.wire_dtype in WIRE_DTYPES, f"wire_dtype must be one of {WIRE_DTYPES}")
        require(self.global_batch >= 0, "global_batch must be >= 0")
        for text in self.admitted_peers:
            PeerID.parse(text)  # a ConfigError names the bad one
        require_positive(
            self,
            "local_steps",
            "outer_lr",
            "round_timeout_min_s",
            "round_timeout_step_mult",
            "retry_wait_s",
            "max_round_attempts",
            "update_history",
            "max_catchup_updates",
            "join_timeout_s",
            "rebalance_interval_steps",
            "max_newcomers",
            "ticket_steps",
            "step_aside_idle_min_s",
            "step_aside_gap_mult",
            "step_aside_poll_s",
        )
        require(0 <= self.outer_momentum < 1, "outer_momentum must be in [0, 1)")
        require(self.join_lag_steps >= 1, "join_lag_steps must be >= 1")
        require(self.max_snapshot_sources >= 0, "max_snapshot_sources must be >= 0 (0 = all members)")
        require(self.evict_after_invalid_rounds >= 0, "evict_after_invalid_rounds must be >= 0 (0 = never)")
        require(self.snapshot_ahead_steps >= 0, "snapshot_ahead_steps must be >= 0")
        require(
            self.snapshot_ahead_steps >= 1 or self.snapshot_every_step,
            "snapshot_ahead_steps = 0 asks for a step already completed: set snapshot_every_step so members keep it",
        )
        require(
            self.snapshot_ahead_steps <= self.ticket_steps,
            "snapshot_ahead_steps must be <= ticket_steps (a sponsor's ticket covers no further)",
        )

    def replace(self, **changes: Any) -> CollaborationConfig:
        """A copy with fields replaced."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def local(cls, **changes: Any) -> CollaborationConfig:
        """Peers on one machine: short timeouts."""
        return cls(round_timeout_min_s=2.0, retry_wait_s=0.5, step_aside_idle_min_s=2.0, step_aside_poll_s=0.1).replace(
            **changes
        )

    @classmethod
    def lan(cls, **changes: Any) -> CollaborationConfig:
        """A data-center or campus network."""
        return cls(
            round_timeout_min_s=10.0, retry_wait_s=2.0, step_aside_idle_min_s=10.0, step_aside_poll_s=0.5
        ).replace(**changes)

    @classmethod
    def profile_named(cls, name: str) -> CollaborationConfig:
        """The profile called ``name`` (``local``, ``lan`` or ``wan``)."""
        require(name in ("local", "lan", "wan"), f"unknown profile {name!r}")
        return {"local": cls.local, "lan": cls.lan, "wan": cls.wan}[name]()

    @classmethod
    def wan(cls, **changes: Any) -> CollaborationConfig:
        """Institutions across the internet."""
        return cls(
            round_timeout_min_s=60.0,
            retry_wait_s=10.0,
            join_timeout_s=3600.0,
            step_aside_idle_min_s=60.0,
            step_aside_poll_s=2.0,
        ).replace(**changes)
