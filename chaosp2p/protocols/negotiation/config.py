"""Configuration of the negotiation machine.

One frozen dataclass, units in field names, validated in ``__post_init__``, with three profiles whose
timers are scaled like :class:`~chaosp2p.protocols.membership.MembershipConfig`'s:

* ``local()`` -- peers on one machine (loopback RTTs well under a millisecond): a decision takes a
  few milliseconds and a stuck proposal is taken over within ~0.1 s.
* ``lan()``   -- a data-centre network (RTT ~0.1-1 ms, failures detected in a few seconds).
* ``wan()``   -- peers across the internet (RTT up to a few hundred ms).

How the timers combine is described in ``protocols/negotiation.md`` ("Timers").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from chaosp2p.configbase import require, require_non_negative, require_positive

MAX_STEP = (1 << 53) - 1
"""Largest training step, epoch or incarnation accepted anywhere (exact in a JSON double)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NegotiationConfig:
    """Every knob of :class:`~chaosp2p.protocols.negotiation.NegotiationMachine`."""

    # --- who proposes, and when
    proposer_backoff_s: float = 0.05
    """A member that is not the preferred proposer waits this long x its rank before proposing."""
    announce_fanout: int = 3
    """New operations are announced to this many of the best-ranked proposers (not to every member)."""
    phase_timeout_s: float = 0.25
    """A proposer that has no quorum of answers after this long retries with a higher ballot."""
    decision_timeout_s: float = 0.5
    """A member that accepted a value (or saw a proposal) and learned no decision after this long
    runs phase 1 itself to finish the instance (the proposer may have died)."""
    relay_threshold: int = 64
    """ACCEPT and COMMIT go to every member directly up to this many members; beyond, to about
    sqrt(n) relays that forward to about sqrt(n) members each (one more hop, O(sqrt n) work per
    call instead of O(n) at the proposer)."""
    retry_jitter: float = 0.5
    """Retries wait their base time x (1 + uniform(0, retry_jitter)) so duelling proposers drift apart."""

    # --- the activation step
    decision_floor_s: float = 0.02
    """Added to 4 x the slowest RTT to estimate how long a decision takes (activation margin)."""
    default_rtt_s: float = 0.005
    """RTT assumed for a member pair with no measurement in the link snapshot."""
    default_margin_steps: int = 2
    """Margin in steps when no step time is known yet."""
    max_margin_steps: int = 1000
    """Cap on the computed margin (a tiny step time must not push S absurdly far)."""
    max_step_ahead: int = 100_000
    """A proposal whose activation step is more than this many steps past the acceptor's progress
    (or the configuration's activation step) is rejected as absurd."""

    # --- synchronisation and joins
    sync_interval_s: float = 1.0
    """Every member sends SYNC(epoch, digest) to its two ring neighbours this often."""
    sync_interval_max_s: float = 8.0
    """While the run is quiet (no new configuration, nothing pending, no open instance) the SYNC
    interval doubles each round up to this; any new configuration brings it back to
    ``sync_interval_s``. An idle run thus costs few messages per member and second, and a member
    that missed a COMMIT still hears of it within ``sync_interval_s`` of that commit."""
    join_retry_s: float = 1.0
    """A newcomer not admitted after this long resends its JOIN_REQUEST (to the next member)."""
    rebalance_threshold: float = 0.2
    """set_throughput raises a THROUGHPUT op only if the rate moved by more than this fraction."""
    link_change_threshold: float = 0.5
    """link_changed raises LINK_UP for a link already up only if bandwidth moved by this fraction."""

    # --- limits on what peers send us
    max_runs: int = 64
    """Runs this peer tracks (as member, newcomer or removed)."""
    max_run_id_chars: int = 128
    max_members: int = 4096
    """Members of one configuration."""
    max_links: int = 32768
    """Link entries of one configuration."""
    max_ops_per_batch: int = 256
    """Operations in one proposed value (also per OPS_ANNOUNCE / PROMISE)."""
    max_pending_ops: int = 4096
    """Pending (valid, undecided) operations kept per run; more are refused."""
    max_history: int = 64
    """Committed values kept per run for catch-up and replay detection; an op older than this many
    epochs is refused, and a member further behind is sent a snapshot instead."""
    verified_cache_size: int = 65536
    """Signatures remembered as verified (each verification costs ~60-100 us)."""
    rate_limit_msgs_per_s: float = 2000.0
    """Per-sender token bucket refill rate (messages per second)."""
    rate_limit_burst: float = 4000.0
    max_tracked_senders: int = 8192

    def __post_init__(self) -> None:
        require_positive(
            self,
            "proposer_backoff_s",
            "announce_fanout",
            "relay_threshold",
            "phase_timeout_s",
            "decision_timeout_s",
            "default_rtt_s",
            "default_margin_steps",
            "max_margin_steps",
            "max_step_ahead",
            "sync_interval_s",
            "sync_interval_max_s",
            "join_retry_s",
            "rebalance_threshold",
            "link_change_threshold",
            "max_runs",
            "max_run_id_chars",
            "max_members",
            "max_links",
            "max_ops_per_batch",
            "max_pending_ops",
            "max_history",
            "verified_cache_size",
            "rate_limit_msgs_per_s",
            "rate_limit_burst",
            "max_tracked_senders",
        )
        require_non_negative(self, "retry_jitter", "decision_floor_s")
        for name in (
            "announce_fanout",
            "relay_threshold",
            "default_margin_steps",
            "max_margin_steps",
            "max_step_ahead",
            "max_runs",
            "max_run_id_chars",
            "max_members",
            "max_links",
            "max_ops_per_batch",
            "max_pending_ops",
            "max_history",
            "verified_cache_size",
            "max_tracked_senders",
        ):
            value = getattr(self, name)
            require(type(value) is int, f"NegotiationConfig.{name} must be an int (got {value!r})")
        require(self.max_step_ahead < MAX_STEP, "NegotiationConfig.max_step_ahead is larger than any step")
        require(
            self.max_margin_steps <= self.max_step_ahead,
            "NegotiationConfig.max_margin_steps must not exceed max_step_ahead",
        )
        require(
            self.max_pending_ops >= self.max_ops_per_batch,
            "NegotiationConfig.max_pending_ops must be >= max_ops_per_batch",
        )
        require(
            self.sync_interval_max_s >= self.sync_interval_s,
            "NegotiationConfig.sync_interval_max_s must be >= sync_interval_s",
        )
        require(
            self.decision_timeout_s >= self.phase_timeout_s,
            "NegotiationConfig.decision_timeout_s must be >= phase_timeout_s",
        )

    # ------------------------------------------------------------------ profiles
    @classmethod
    def lan(cls) -> NegotiationConfig:
        """A data-centre network: sub-millisecond RTTs, decisions in a few milliseconds."""
        return cls()

    @classmethod
    def local(cls) -> NegotiationConfig:
        """One machine / loopback: takeovers within ~0.5 s, resync every 0.25 s.

        Decisions take a few milliseconds when nothing is lost; the phase and takeover timeouts
        only matter when messages are. They are not shorter than lan's because peers on one
        machine share its cores: on a busy machine a message can sit for tens of milliseconds,
        and shorter timeouts made proposers abandon rounds that would have succeeded (duels).
        """
        return dataclasses.replace(
            cls(),
            proposer_backoff_s=0.01,
            phase_timeout_s=0.25,
            decision_timeout_s=0.5,
            decision_floor_s=0.005,
            default_rtt_s=0.001,
            sync_interval_s=0.25,
            sync_interval_max_s=2.0,
            join_retry_s=0.25,
        )

    @classmethod
    def wan(cls) -> NegotiationConfig:
        """Peers across the internet: RTTs up to a few hundred ms, slower takeovers."""
        return dataclasses.replace(
            cls(),
            proposer_backoff_s=0.5,
            phase_timeout_s=2.0,
            decision_timeout_s=4.0,
            decision_floor_s=0.2,
            default_rtt_s=0.1,
            sync_interval_s=5.0,
            sync_interval_max_s=40.0,
            join_retry_s=5.0,
            rate_limit_msgs_per_s=500.0,
            rate_limit_burst=2000.0,
        )
