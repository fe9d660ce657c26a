"""A collaboration: this peer's part in training one model together with the members of a run.

Theory of operation
-------------------
A run is a sequence of configurations agreed by its members through negotiation
(:mod:`chaosp2p.protocols.negotiation`): who is in, from which step, with which batch shares. A
collaboration turns that into training:

* **Synchronous mode.** ``step(samples)`` is called after ``backward()``. The local gradients are
  gathered into one flat float32 buffer; the configuration governing this step is fetched from
  negotiation -- which *waits* while a pending change gates the step, so every member switches at
  the same step -- and the buffer is averaged among that configuration's members, weighted by
  samples, with every averaging message tagged (run, epoch, configuration digest, step). Then the
  averaged gradient goes into ``.grad`` and the optimizer steps. Every member applies the same bytes
  to the same state, so parameters and optimizer state stay bit-identical.
* **A member fails mid-round.** The round aborts at once when the failed member's connection closes
  (or after a timeout derived from measured step times, for a stalled one). The survivors wait for
  negotiation: membership declares the member failed, the run commits its removal at this very step,
  and the round is redone among the survivors. Nothing waits on a fixed guess.
* **DiLoCo mode.** ``step`` runs the inner optimizer locally; every ``local_steps`` inner steps an
  outer step averages the pseudo-gradient (global parameters minus local parameters) and applies it
  with an outer SGD with Nesterov momentum. Negotiated changes apply at outer-step boundaries, which
  are the "steps" negotiation counts.
* **Joining.** A newcomer observes a sponsor (receives every averaged update from now on), pulls a
  snapshot of a near-future step from all members in parallel while they keep training, replays
  the updates after it, asks to be admitted once it is close, and keeps replaying until the
  admission step: its state is then bit-identical to the members'. Members never stop for it; they
  lose at most the one round in which the new configuration starts.
* **Straggler balancing.** Each member measures its own samples per second of compute and reports
  it every ``rebalance_interval_steps``; negotiation turns large changes into new batch shares,
  which ``local_batch_size`` follows, so every member finishes its compute at about the same time
  while the global batch stays constant.
"""

from __future__ import annotations

import logging
import math
import statistics as stats_module
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import numpy as np

from chaosp2p.errors import (
    ChaosError,
    ConfigError,
    ContributionRefused,
    LocalProtocolError,
    RemoteProtocolError,
    RoundAborted,
    RoundMismatch,
    TransferError,
)
from chaosp2p.protocols.averaging.contributions import InvalidStreaks
from chaosp2p.protocols.averaging.messages import RoundPhase, RoundTag
from chaosp2p.protocols.averaging.shard_reduce import all_finite
from chaosp2p.protocols.collab.messages import (
    PROTOCOL,
    FetchUpdate,
    SnapshotReply,
    SnapshotRequest,
    UpdateHeader,
    codec,
)
from chaosp2p.protocols.collab.vouch import Vouch, choose_vouched_state, read_vouches, sign_vouch, vouched_reply
from chaosp2p.protocols.negotiation import Configuration, OperationCommitted, RunParams, ring_order
from chaosp2p.runtime.events import Subscription
from chaosp2p.runtime.negotiation_service import RunRemoved
from chaosp2p.training.catchup import UpdateReceiver
from chaosp2p.training.config import CollaborationConfig
from chaosp2p.training.feed import SnapshotWaiters, UpdateFeed
from chaosp2p.training.flat import FlatParameters, layout_digest, parameter_digest
from chaosp2p.training.outer import OuterState
from chaosp2p.wire.identity import PeerID

if TYPE_CHECKING:
    from chaosp2p.api import AsyncPeer

log = logging.getLogger("chaosp2p.training")

_STEP_TIME_WINDOW = 16


def _mean_throughput(config: Configuration) -> float:
    """The mean measured speed of a configuration's members (1.0 if none is known)."""
    known = [m.throughput_samples_per_s for m in config.members if m.throughput_samples_per_s > 0]
    return sum(known) / len(known) if known else 1.0


def _discard(update: np.ndarray) -> None:
    """What a leaving member does with the rounds' results: nothing (it takes no further steps)."""


class TrainingError(ChaosError):
    """A collaboration cannot go on (for example: joining never found a member of the run)."""


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


class AsyncCollaboration:
    """Train ``model`` with ``optimizer`` together with the members of ``run`` (async API).

    Create it with :meth:`chaosp2p.AsyncPeer.collaborate`; the blocking equivalent for plain
    scripts is :class:`chaosp2p.Collaboration`.
    """

    def __init__(self, peer: AsyncPeer, *, run: str, model: Any, optimizer: Any, config: CollaborationConfig) -> None:
        if not run or len(run) > 256:
            raise ConfigError("a run id must have 1..256 characters")
        self.peer = peer
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
        self._local = np.zeros(self.flat.numel, dtype=np.float32)
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
        self._vouches: dict[int, tuple[Vouch, Configuration]] = {}  # step -> our vouch, what governed it
        self._subscription: Subscription | None = None
        self._records: list[dict[str, Any]] = []
        self._started = False
        self._left = False
        self._invalid = InvalidStreaks(config.evict_after_invalid_rounds)

    @property
    def diloco(self) -> bool:
        """Whether this collaboration runs DiLoCo (local steps + outer steps)."""
        return self.config.mode == "diloco"

    # ------------------------------------------------------------------ the run's view
    @property
    def configuration(self) -> Configuration:
        """The newest agreed configuration of the run."""
        found = self.peer.negotiation.configuration(self.run)
        if found is None:
            raise LocalProtocolError(f"this peer takes no part in run {self.run!r} (start() first)")
        return found

    @staticmethod
    def _participants(config: Configuration, step: int) -> list[PeerID]:
        """The round's members in ring order: the configuration's members taking part in ``step``."""
        return [peer for peer in ring_order(config) if config.takes_part(peer, step)]

    def _governing(self) -> Configuration:
        """The configuration for the next step as far as known now (the newest one if it is gated)."""
        found = self.peer.negotiation.machine.config_for_step(self.run, self.step_index)
        return found if found is not None else self.configuration

    @property
    def local_batch_size(self) -> int:
        """This member's share of the global batch for the next step."""
        return self.batch_slice()[1] - self.batch_slice()[0]

    def batch_slice(self) -> tuple[int, int]:
        """Where this member's samples sit in the step's global batch: ``[start, stop)``.

        Members are laid out in ring order with their batch shares, so the members of a
        configuration together cover the global batch exactly once.
        """
        config = self._governing()
        shares = {m.peer_id: int(m.batch_share) for m in config.members}
        start = 0
        for peer in self._participants(config, self.step_index):
            if peer == self.peer.peer_id:
                return start, start + shares[peer]
            start += shares[peer]
        raise LocalProtocolError(f"this peer is not a member of run {self.run!r}")

    @property
    def rank(self) -> int:
        """This member's position in the ring order of the configuration for the next step."""
        return self._participants(self._governing(), self.step_index).index(self.peer.peer_id)

    @property
    def world_size(self) -> int:
        """Members of the configuration for the next step."""
        return len(self._participants(self._governing(), self.step_index))

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

    # ------------------------------------------------------------------ lifecycle
    async def start(self, *, found: bool, timeout_s: float | None = None) -> int:
        """Found the run (``found=True``) or join it; return the step training continues from."""
        if self._started:
            raise LocalProtocolError("this collaboration has already started")
        self.peer.training.register(self)
        self._subscription = self.peer.events()
        self._started = True
        if found:
            if self.config.global_batch < 1:
                raise ConfigError(
                    "founding a run needs CollaborationConfig.global_batch (samples per step, all members)"
                )
            params = RunParams(
                global_batch=self.config.global_batch,
                mode=self.config.mode,
                local_steps=self.config.local_steps,
            )
            self.peer.negotiation.create_run(self.run, params)
            self.step_index = 0
            log.info("founded run %r (%s)", self.run, self.config.mode)
        else:
            with anyio.fail_after(timeout_s or self.config.join_timeout_s):
                await self._join()
        return self.step_index

    async def leave(self, *, timeout_s: float = 30.0) -> None:
        """Leave the run gracefully: the members commit our departure and go on without us."""
        if self._left or not self._started:
            return
        self._left = True
        try:
            if self.peer.negotiation.announce_leave(self.run):
                with anyio.move_on_after(timeout_s) as scope:
                    await self._serve_until_removed()
                if scope.cancelled_caught:
                    log.warning("run %r did not commit our leave within %.1f s", self.run, timeout_s)
        finally:
            self.peer.training.unregister(self)

    async def _serve_until_removed(self) -> None:
        """Until the leave takes effect, keep doing our part of each round with zero weight.

        The run commits a leave at a future step; until then the configuration still counts this
        peer, and every round needs each member's shard, so the leaver contributes nothing but
        still reduces its shard for the others.
        """
        self._local.fill(0.0)
        negotiation = self.peer.negotiation
        while True:
            last = negotiation.removed_from_step(self.run)
            if last is not None and self.step_index >= last:
                return
            try:
                await self._averaged_step(0, apply=_discard)
            except ChaosError as exc:  # leaving is best effort: the run removes us anyway
                log.info("run %r: stopped serving rounds while leaving: %s", self.run, exc)
                return

    # ------------------------------------------------------------------ stepping
    async def step(self, samples: int) -> StepStatistics:
        """Average this step's gradients among the members, then step the optimizer.

        Call after ``loss.backward()``; ``samples`` is the local batch size behind the gradients
        (averages are weighted by it). In DiLoCo mode most calls only step the local optimizer.
        """
        if not self._started or self._left:
            raise LocalProtocolError("start() the collaboration before stepping it (and not after leave())")
        if samples < 0:
            raise ConfigError("samples must be >= 0")
        began = self.peer.clock.now()
        if self._last_end is not None and samples > 0:
            self._note_throughput(samples, began - self._last_end)  # the caller's compute since the last step
        if self._last_begin is not None:
            self._step_times.append(began - self._last_begin)  # a whole iteration: compute + averaging
        self._last_begin = began
        if self.diloco:
            result = await self._diloco_step(samples)
        else:
            await anyio.to_thread.run_sync(self.flat.gather_grads, self._local)
            result = await self._averaged_step(samples, apply=self._apply_gradient)
        self._last_end = self.peer.clock.now()
        self._last = result
        return result

    async def _diloco_step(self, samples: int) -> StepStatistics:
        assert self._outer is not None
        await anyio.to_thread.run_sync(self.optimizer.step)
        self._inner_steps += 1
        self._inner_samples += samples
        if self._inner_steps < self.configuration.params.local_steps:
            config = self.configuration
            return StepStatistics(
                step=-1,
                epoch=config.epoch,
                config_digest=config.digest.hex(),
                members=len(config.members),
                samples=samples,
                round_s=0.0,
                idle_s=0.0,
                attempts=0,
                bytes_sent=0,
                bytes_received=0,
            )
        await anyio.to_thread.run_sync(self._outer.pseudo_gradient, self.flat, self._local)
        result = await self._averaged_step(self._inner_samples, apply=self._apply_outer)
        self._inner_steps = 0
        self._inner_samples = 0
        return result

    def _apply_gradient(self, averaged: np.ndarray) -> None:
        self.flat.scatter_grads(averaged)
        self.optimizer.step()

    def _apply_outer(self, averaged: np.ndarray) -> None:
        assert self._outer is not None
        self._outer.apply(averaged, self.flat)

    async def _averaged_step(self, weight: int, *, apply: Callable[[np.ndarray], None]) -> StepStatistics:
        """One averaging round for ``self.step_index`` (redone until a configuration completes it)."""
        negotiation = self.peer.negotiation
        await self._check_resync()
        step = self.step_index
        buffer = np.empty_like(self._local)
        attempts = 0
        failed_rounds = self._failed_rounds  # (step, configuration digest) -> rounds started
        for stale in [key for key in failed_rounds if key[0] != step]:
            del failed_rounds[stale]
        round_started = self.peer.clock.now()
        while True:
            try:
                config = await negotiation.configuration_for_step(self.run, step)
            except RunRemoved:
                if self._left:
                    raise
                self._refuse_rejoin_if_evicted()
                await self._rejoin("removed from the run")
                return await self._averaged_step(weight, apply=apply)
            negotiation.report_step(self.run, entered=step)
            attempts += 1
            np.copyto(buffer, self._local)
            phase = RoundPhase.OUTER if self.diloco else RoundPhase.GRADIENTS
            # Every round started counts, so a retry -- after a failure or a cancelled call -- is a
            # new round (a round that ran is final in the averager, whatever its outcome).
            attempt = failed_rounds.get((step, config.digest), 0)
            failed_rounds[(step, config.digest)] = attempt + 1
            tag = RoundTag(
                run=self.run,
                epoch=config.epoch,
                config_digest=config.digest,
                step=step,
                phase=phase,
                attempt=attempt,
            )
            try:
                outcome = await self.peer.training.averager.all_reduce(
                    tag,
                    buffer,
                    weight=float(weight),
                    members=self._participants(config, step),
                    addrs=self.peer.membership.machine.dial_addrs,
                    bandwidth=self._bandwidths(config),
                    wire_dtype=self.config.wire_dtype,
                    timeout_s=self._round_timeout(),
                )
            except ContributionRefused as exc:
                # Most owners refused our contribution's header (length, dtype or weight): we are the odd one
                # out (a different model?). NaN/Inf values are not refused: they are excluded from the round.
                raise TrainingError(f"step {step}: the members refused this peer's contribution: {exc}") from exc
            except (RoundAborted, RoundMismatch) as exc:
                log.info("run %r step %d: round under epoch %d failed: %s", self.run, step, config.epoch, exc)
                if attempts >= self.config.max_round_attempts:
                    raise TrainingError(f"step {step} of run {self.run!r} failed {attempts} times: {exc}") from exc
                if await self._wait_for_new_configuration(step, config):
                    continue
                # No change: either some members completed the round before it failed here (fetch
                # their result; redoing it is impossible) or nobody did (retry as a new round).
                if await self._fetch_update(config, step, buffer):
                    outcome = None
                    governing_now = negotiation.machine.config_for_step(self.run, step)
                    if governing_now is not None and governing_now.digest == config.digest:
                        negotiation.report_step(self.run, completed=step)
                        break
                    continue  # a change now governs this step: redo it under the new configuration
                continue
            # A change agreed while the round ran may govern this very step (a failure found mid-round
            # is redone at the stuck step): then this round's result is discarded, never applied.
            try:
                governing = await negotiation.configuration_for_step(self.run, step)
            except RunRemoved:
                if self._left:
                    raise
                self._refuse_rejoin_if_evicted()
                await self._rejoin("removed from the run")
                return await self._averaged_step(weight, apply=apply)
            if governing.digest == config.digest:
                # Completed now, before any await: a gate raised later (a change decided while we
                # apply the update) must find this step already completed, not in progress.
                negotiation.report_step(self.run, completed=step)
                break
            log.info("run %r step %d: redoing the round under epoch %d", self.run, step, governing.epoch)
        communication_s = self.peer.clock.now() - round_started
        if outcome is not None:
            self._judge_contributions(config, step, outcome.invalid)
        # Newcomers observing us get the update before we apply it (applying only reads it): a
        # newcomer admitted at step + 1 replays it while we apply it, instead of after, and is
        # that much less late for its first round, in which every member waits for it.
        self.feed.publish(step=step, epoch=config.epoch, config_digest=config.digest, update=buffer)
        await anyio.to_thread.run_sync(apply, buffer)
        self._history.append((step, config.digest, config.epoch, buffer))
        if self.snapshots.wanted(step):
            await self._publish_snapshot(step, config)
        self.snapshots.give_up_before(step + 1)
        self.step_index = step + 1
        rebalance = step % self.config.rebalance_interval_steps == 0 and len(config.members) > 1
        if rebalance and self._throughput and self.config.balance and not self._left:
            try:
                negotiation.set_throughput(self.run, self._throughput)
            except LocalProtocolError:  # removed meanwhile: the next step finds out and rejoins
                log.debug("run %r: not reporting throughput (no longer a member)", self.run)
        return StepStatistics(
            step=step,
            epoch=config.epoch,
            config_digest=config.digest.hex(),
            members=len(self._participants(config, step)),
            samples=weight,
            round_s=communication_s if outcome is None else outcome.seconds,
            idle_s=communication_s,
            attempts=attempts,
            bytes_sent=0 if outcome is None else outcome.bytes_sent,
            bytes_received=buffer.nbytes if outcome is None else outcome.bytes_received,
            excluded=() if outcome is None else tuple(str(e.peer) for e in outcome.excluded),
        )

    def _judge_contributions(self, config: Configuration, step: int, invalid: tuple[PeerID, ...]) -> None:
        """Sign an EVICT of each member whose contributions failed our own checks (as a shard owner)
        ``evict_after_invalid_rounds`` rounds in a row (see :mod:`chaosp2p.training.contributions`)."""
        if self._left:
            return
        for peer in self._invalid.observe(self._participants(config, step), invalid):
            if self.peer.negotiation.evict(self.run, peer):
                log.warning(
                    "run %r step %d: %s sent invalid contributions %d rounds in a row; signed its eviction",
                    self.run,
                    step,
                    peer,
                    self._invalid.streak(peer),
                )

    def _refuse_rejoin_if_evicted(self) -> None:
        """A member the run evicted does not rejoin on its own: its contributions failed the others'
        checks round after round, and rejoining would only repeat that."""
        if self.peer.negotiation.removed_reason(self.run) == "evicted":
            raise TrainingError(
                f"run {self.run!r} evicted this peer: a quorum of members found its contributions invalid "
                f"{self.config.evict_after_invalid_rounds}+ rounds in a row (different model? NaN/Inf gradients?)"
            )

    async def _wait_for_new_configuration(self, step: int, failed: Configuration) -> bool:
        """After an aborted round: wait (bounded) until the configuration governing ``step`` changes."""
        negotiation = self.peer.negotiation
        with anyio.move_on_after(self.config.retry_wait_s):
            while True:
                current = negotiation.machine.config_for_step(self.run, step)
                if current is None or current.digest != failed.digest:
                    return True  # gated (a change is being decided) or changed
                if negotiation.removed_reason(self.run) is not None:
                    return True
                await negotiation.wait_changed()
        return False

    def applied_update(self, step: int, config_digest: bytes) -> tuple[int, np.ndarray] | None:
        """The averaged update this member applied at ``step`` under ``config_digest``, if kept."""
        for kept_step, digest, epoch, update in self._history:
            if kept_step == step and digest == config_digest:
                return epoch, update
        return None

    async def _fetch_update(self, config: Configuration, step: int, out: np.ndarray) -> bool:
        """Ask the other members for the result of ``step`` under ``config``; True if one had it."""
        request = FetchUpdate(run=self.run, step=step, config_digest=config.digest)
        dial = self.peer.membership.machine.dial_addrs
        for member in ring_order(config):
            if member == self.peer.peer_id:
                continue
            try:
                with anyio.fail_after(self.config.round_timeout_min_s):
                    connection = await self.peer.host.connection_to(member, dial(member))
                    async with connection.open_stream(PROTOCOL) as stream:
                        await stream.send_message(codec, request)
                        header = await stream.receive_message(codec)
                        if not isinstance(header, UpdateHeader):
                            continue
                        if header.numel != out.size or header.step != step or header.config_digest != config.digest:
                            raise RemoteProtocolError(f"{member} answered with a different update")
                        await stream.receive_into(out.data.cast("B"))
                if not all_finite(out):
                    # Averages of validated contributions are finite: this member's are not usable.
                    raise RemoteProtocolError(f"{member} answered with non-finite values")
            except (ChaosError, TimeoutError) as exc:
                log.debug("fetching step %d from %s failed: %s", step, member, exc)
                continue
            log.info("run %r step %d: took the result %s completed (our round had failed)", self.run, step, member)
            return True
        return False

    def _round_timeout(self) -> float:
        if not self._step_times:
            return self.config.round_timeout_min_s
        median = stats_module.median(self._step_times)
        return max(self.config.round_timeout_min_s, self.config.round_timeout_step_mult * median)

    @staticmethod
    def _bandwidths(config: Configuration) -> dict[PeerID, float | None]:
        """Each member's bandwidth from the configuration's link snapshot (identical everywhere).

        The shard plan must be the same on every member, so it may only depend on the agreed
        configuration, never on this peer's own estimates: a member's figure is the median of its
        agreed links' bandwidths, or None (an equal share) if none is known.
        """
        known: dict[PeerID, list[float]] = {}
        for link in config.links:
            if link.up and link.bandwidth_bytes_per_s > 0:
                known.setdefault(link.a, []).append(link.bandwidth_bytes_per_s)
                known.setdefault(link.b, []).append(link.bandwidth_bytes_per_s)
        return {
            m.peer_id: stats_module.median(known[m.peer_id]) if m.peer_id in known else None for m in config.members
        }

    def _note_throughput(self, samples: int, compute_s: float) -> None:
        if compute_s <= 0:
            return
        rate = samples / compute_s
        self._throughput = rate if self._throughput is None else 0.7 * self._throughput + 0.3 * rate

    # ------------------------------------------------------------------ snapshots for newcomers
    def _snapshot_target(self) -> tuple[Any, Any]:
        if self._outer is not None:
            return self._outer.module, self._outer.optimizer
        return self.model, self.optimizer

    async def _publish_snapshot(self, step: int, config: Configuration) -> None:
        from chaosp2p.state.torch_adapter import publish_torch

        module, optimizer = self._snapshot_target()
        store = self.peer.training.store
        info = await anyio.to_thread.run_sync(lambda: publish_torch(store, self.run, step, module, optimizer))
        # Vouch for it: signed (run, step, state digest, configuration that governed the step).
        vouch = sign_vouch(
            self.peer.host.identity, run=self.run, step=step, state_digest=info.digest, config_digest=config.digest
        )
        self._vouches[step] = (vouch, config)
        while len(self._vouches) > 64:
            del self._vouches[next(iter(self._vouches))]
        if not self._serving:
            await self.peer.serve_state(store, runs=[self.run])
            self._serving = True
        self.snapshots.done(step, True)

    async def handle_snapshot_request(self, request: SnapshotRequest) -> SnapshotReply:
        """A newcomer wants a snapshot of ``request.step``: answer once it is served, or why not."""
        if request.layout != self.layout:
            return SnapshotReply(ok=False, step=request.step, reason="different model architecture")
        if request.step < self.step_index:
            ok = self.snapshots.outcome(request.step)
            return self._snapshot_reply(request, "" if ok else "already past that step")
        event = self.snapshots.want(request.step)
        await event.wait()
        ok = self.snapshots.outcome(request.step)
        return self._snapshot_reply(request, "" if ok else "the step was skipped")

    def _snapshot_reply(self, request: SnapshotRequest, refusal: str) -> SnapshotReply:
        """``ok`` with our vouch for the snapshot of ``request.step``, or the ``refusal``."""
        found = None if refusal else self._vouches.get(request.step)
        if found is None:
            return SnapshotReply(ok=False, step=request.step, reason=refusal or "no vouch for that step")
        vouch, config = found
        return vouched_reply(vouch, config, asker_config_digest=request.config_digest)

    # ------------------------------------------------------------------ joining
    async def _check_resync(self) -> None:
        resync = self.peer.negotiation.take_resync(self.run)
        if resync is not None and not self._left:
            await self._rejoin(f"state diverged from step {resync}")

    async def _rejoin(self, why: str) -> None:
        log.warning("run %r: rejoining as a newcomer (%s)", self.run, why)
        self.peer.negotiation.forget_removal(self.run)
        with anyio.fail_after(self.config.join_timeout_s):
            await self._join()

    async def _join(self) -> None:
        """Observe a sponsor, load a snapshot from the members, replay, get admitted."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._join_once()
                return
            except (ChaosError, TimeoutError) as exc:
                if isinstance(exc, TrainingError):
                    raise
                delay = min(0.2 * 2**attempt, 5.0)
                log.warning("joining run %r failed (%s); retrying in %.1f s", self.run, exc, delay)
                await anyio.sleep(delay)

    async def _find_run(self) -> tuple[PeerID, Configuration]:
        """A member of the run that answers, and its view of the configuration."""
        negotiation = self.peer.negotiation
        # Anyone may know the run: members in our view first, then peers we are connected to, then
        # the DHT's contacts (a newcomer's membership view may still be nearly empty).
        candidates: list[PeerID] = []
        known = [m.peer_id for m in self.peer.members() if m.state.value in ("alive", "suspect")]
        contacts = [entry.peer_id for entry in self.peer.dht.machine.routing_table]
        for peer in (*known, *self.peer.connected_peers(), *contacts):
            if peer != self.peer.peer_id and peer not in candidates:
                candidates.append(peer)
        if not candidates:
            raise TransferError("no peer to ask about the run yet")
        for candidate in candidates:
            try:
                info = await negotiation.query_run(self.run, candidate, timeout_s=2.0)
            except TimeoutError:
                continue
            if info.configuration is None:
                continue
            members = [m.peer_id for m in info.configuration.members]
            sponsor = candidate if candidate in members else members[0]
            return sponsor, info.configuration
        raise TransferError(f"none of {len(candidates)} peers takes part in run {self.run!r}")

    async def _join_once(self) -> None:
        sponsor, config = await self._find_run()
        host = self.peer.host
        dial = self.peer.membership.machine.dial_addrs
        connection = await host.connection_to(sponsor, dial(sponsor))
        stream = connection.open_stream(PROTOCOL)
        receiver = await UpdateReceiver.open(
            stream, run=self.run, layout=self.layout, numel=self.flat.numel, max_queued=self.config.max_catchup_updates
        )
        failures: list[BaseException] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiver.run)
            try:
                await self._catch_up(sponsor, config, receiver)
            except (ChaosError, TimeoutError) as exc:  # re-raised below, not as an exception group
                failures.append(exc)
            finally:
                await receiver.aclose()
                tg.cancel_scope.cancel()
        if failures:
            raise failures[0]

    async def _catch_up(self, sponsor: PeerID, config: Configuration, receiver: UpdateReceiver) -> None:
        snapshot_step = receiver.sponsor_completed + self.config.snapshot_ahead_steps
        replies = await self._request_snapshots(config, snapshot_step)
        # Only the state a quorum of the configuration that held the step vouches for (see vouch.py),
        # from the members that vouched for it; the pull pins its digest.
        negotiation_config = self.peer.negotiation.config
        vouches, cited = read_vouches(
            [(member, reply) for member, _, reply in replies],
            run=self.run,
            anchor=config,
            max_members=negotiation_config.max_members,
            max_links=negotiation_config.max_links,
        )
        vouched = choose_vouched_state(vouches, run=self.run, step=snapshot_step, anchor=config, configurations=cited)
        for peer, why in vouched.refused:
            log.warning("run %r step %d: not loading from member %s: %s", self.run, snapshot_step, peer, why)
        sources = [addr for member, addr, _ in replies if member in vouched.vouchers and addr]
        if self.config.max_snapshot_sources:  # every member was asked (one refusing must not fail the join)
            sources = sources[: self.config.max_snapshot_sources]
        if not sources:
            raise TransferError(f"no member that vouched for step {snapshot_step} can be dialled")
        started = self.peer.clock.now()
        loaded = await self.peer.state.load(self.run, step=snapshot_step, sources=sources, digest=vouched.state_digest)
        module, optimizer = self._snapshot_target()
        from chaosp2p.state.service import load_into_torch

        await anyio.to_thread.run_sync(lambda: load_into_torch(loaded, module, optimizer))
        if self._outer is not None:
            self._outer.copy_to_model(self.flat)
        load_s = self.peer.clock.now() - started
        log.info("run %r: loaded step %d from %d members in %.2f s", self.run, snapshot_step, len(sources), load_s)
        applied = snapshot_step
        admission = None
        async with anyio.create_task_group() as tg:
            admitted: list[Configuration] = []

            async def ask_admission() -> None:
                me = next(m for m in self.peer.members() if m.peer_id == self.peer.peer_id)
                # Bounded by join_timeout_s around the whole join; never raises into this group.
                admitted.append(
                    await self.peer.negotiation.join(
                        self.run,
                        sponsor,
                        incarnation=me.incarnation,
                        # Unmeasured yet: the members' mean, so the newcomer starts with an average share.
                        throughput=self._throughput or _mean_throughput(config),
                        timeout_s=math.inf,
                    )
                )

            asked = False
            while True:
                if admitted:
                    admission = admitted[0]
                    me = admission.member(self.peer.peer_id)
                    since = admission.activation_step if me is None else me.since_step
                    if applied >= since - 1:
                        break
                elif not asked and (receiver.latest or applied) - applied <= self.config.join_lag_steps:
                    asked = True
                    tg.start_soon(ask_admission)
                header, update = await self._next_update(receiver, admitted)
                if header is None:
                    continue
                if header.step <= applied:
                    continue  # from before the snapshot
                if header.step != applied + 1:
                    raise TransferError(f"catch-up needs step {applied + 1}, the sponsor sent {header.step}")
                await anyio.to_thread.run_sync(self._replay, update)
                applied = header.step
            tg.cancel_scope.cancel()
        assert admission is not None
        me = admission.member(self.peer.peer_id)
        self.step_index = admission.activation_step if me is None else me.since_step
        self._records.append(
            {
                "event": "joined",
                "snapshot_step": snapshot_step,
                "sources": len(sources),
                "vouchers": len(vouched.vouchers),
                "refused": {str(peer): why for peer, why in vouched.refused},
                "bytes": sum(count for _, count in loaded.completed.bytes_by_source),
                "bytes_by_source": {str(peer): count for peer, count in loaded.completed.bytes_by_source},
                "load_s": round(load_s, 4),
                "replayed_steps": applied - snapshot_step,
                "admitted_step": admission.activation_step,
            }
        )
        log.info("run %r: admitted at step %d (epoch %d)", self.run, admission.activation_step, admission.epoch)

    async def _next_update(
        self, receiver: UpdateReceiver, admitted: list[Configuration]
    ) -> tuple[Any, np.ndarray] | tuple[None, None]:
        """The next update, or (None, None) when admission arrived while waiting."""
        result: list[tuple[Any, np.ndarray]] = []
        errors: list[ChaosError] = []
        async with anyio.create_task_group() as tg:

            async def take() -> None:
                try:
                    result.append(await receiver.next())
                except ChaosError as exc:  # raised below, outside the task group (no exception group)
                    errors.append(exc)
                tg.cancel_scope.cancel()

            async def admission() -> None:
                while not admitted:
                    await self.peer.negotiation.wait_changed()
                tg.cancel_scope.cancel()

            tg.start_soon(take)
            if not admitted:
                tg.start_soon(admission)
        if errors:
            raise errors[0]
        return result[0] if result else (None, None)

    def _replay(self, update: np.ndarray | None) -> None:
        assert update is not None
        if self._outer is not None:
            self._outer.apply(update, self.flat)
        else:
            self._apply_gradient(update)

    async def _request_snapshots(self, config: Configuration, step: int) -> list[tuple[PeerID, str, SnapshotReply]]:
        """Ask every member to snapshot ``step``: (member, address, reply) of each that did, in
        the order they answered."""
        ready: list[tuple[PeerID, str, SnapshotReply]] = []
        request = SnapshotRequest(run=self.run, step=step, layout=self.layout, config_digest=config.digest)
        dial = self.peer.membership.machine.dial_addrs

        async def ask(member: PeerID) -> None:
            try:
                with anyio.fail_after(self.config.join_timeout_s):
                    connection = await self.peer.host.connection_to(member, dial(member))
                    async with connection.open_stream(PROTOCOL) as stream:
                        await stream.send_message(codec, request)
                        reply = await stream.receive_message(codec)
            except (ChaosError, TimeoutError) as exc:
                log.info("member %s cannot serve a snapshot: %s", member, exc)
                return
            if isinstance(reply, SnapshotReply) and reply.ok:
                addrs = dial(member)
                ready.append((member, f"{addrs[0]}/p2p/{member}" if addrs else "", reply))
            elif isinstance(reply, SnapshotReply):
                log.info("member %s will not snapshot step %d: %s", member, step, reply.reason)

        async with anyio.create_task_group() as tg:
            for member in config.members:
                if member.peer_id != self.peer.peer_id:
                    tg.start_soon(ask, member.peer_id)
        return ready
