"""Stepping a collaboration: one averaging round per step, redone until a configuration completes it.

Theory of operation
-------------------
``step(samples)`` is called after ``backward()``. The local gradients are gathered into one flat
float32 buffer; the configuration governing this step is fetched through the port's gates -- which
*wait* while a pending change gates the step, so every member switches at the same step -- and the
buffer is averaged among that configuration's members, weighted by samples, with every averaging
message tagged (run, epoch, configuration digest, step, attempt). Then the averaged gradient goes
into ``.grad`` and the optimizer steps. Every member applies the same bytes to the same state, so
parameters and optimizer state stay bit-identical.

What the averager takes from the agreed configuration rather than from anyone's word: the weight
each member's contribution may carry (its batch share, times ``local_steps`` in DiLoCo, 0 once its
leave is agreed; this member's own weight is its samples, capped the same way), and who may send
contributions ahead of this member's round (:meth:`Stepping._admits_contribution`).

A round that fails (a member failed, left or stalled) is final: the member waits (bounded) for the
run to agree on a new configuration for this step and redoes the round under it. When nothing
changes, some members may have completed the round before it failed here: their result is fetched
(``FetchUpdate``) instead of redoing it, because redoing a completed round is impossible. A change
agreed while the round ran may govern this very step; then the round's result is discarded.

In DiLoCo mode most calls only step the local optimizer; every ``local_steps`` inner steps an
outer step averages the pseudo-gradient and applies it with the outer optimizer. Negotiated
changes apply at outer-step boundaries, which are the steps the run counts.
"""

from __future__ import annotations

import logging
import statistics as stats_module
from collections.abc import Awaitable, Callable

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
    RunRemoved,
    TrainingError,
)
from chaosp2p.protocols.averaging.link_plan import link_bandwidths, relay_routes
from chaosp2p.protocols.averaging.messages import RoundPhase, RoundTag
from chaosp2p.protocols.averaging.shard_reduce import all_finite
from chaosp2p.protocols.averaging.weights import weight_allowances
from chaosp2p.protocols.collab.messages import PROTOCOL, FetchUpdate, UpdateHeader, codec
from chaosp2p.protocols.negotiation import Configuration, ring_order
from chaosp2p.training.averager import RoundStats
from chaosp2p.training.collab_core import CollaborationCore, StepStatistics, participants
from chaosp2p.training.link_report import report_unreachable
from chaosp2p.training.stalls import sign_stalls
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")

Apply = Callable[[np.ndarray], None]
"""What a step does with the round's averaged update (apply it, keep it, or discard it)."""

SUPERSEDED_POLL_S = 0.05
"""How often a running round checks whether a new configuration governs its step (then it is dropped)."""


class Stepping(CollaborationCore):
    """The stepping role of a collaboration (see the module docstring)."""

    async def step(self, samples: int) -> StepStatistics:
        """Average this step's gradients among the members, then step the optimizer.

        Call after ``loss.backward()``; ``samples`` is the local batch size behind the gradients
        (averages are weighted by it). In DiLoCo mode most calls only step the local optimizer.
        """
        if not self._started or self._left:
            raise LocalProtocolError("start() the collaboration before stepping it (and not after leave())")
        if samples < 0:
            raise ConfigError("samples must be >= 0")
        began = self.port.clock.now()
        self._activity.begin(began)  # inside step() nobody is idle (stepping_aside.py)
        try:
            return await self._timed_step(samples, began)
        finally:
            self._activity.end(self.port.clock.now())

    async def _timed_step(self, samples: int, began: float) -> StepStatistics:
        await self._resume_after_aside()
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
        self._last_end = self.port.clock.now()
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

    async def _governing_or_rejoin(self, step: int) -> Configuration | None:
        """The configuration governing ``step``; None after this peer was removed and rejoined."""
        try:
            return await self.port.runs.configuration_for_step(self.run, step)
        except RunRemoved:
            if self._passive:  # serving with weight 0 until removed: removed is the end, not a rejoin
                raise
            self._refuse_rejoin_if_evicted()
            await self._rejoin("removed from the run")
            return None

    async def _averaged_step(self, weight: int, *, apply: Apply) -> StepStatistics:
        """One averaging round for ``self.step_index`` (redone until a configuration completes it)."""
        runs = self.port.runs
        if await self._check_resync():
            weight = 0  # see below: its gradient is of the state it just replaced
        step = self.step_index
        buffer = np.empty_like(self._local)
        attempts = 0
        failed_rounds = self._failed_rounds  # (step, configuration digest) -> rounds started
        for stale in [key for key in failed_rounds if key[0] != step]:
            del failed_rounds[stale]
        round_started = self.port.clock.now()
        outcome: RoundStats | None
        while True:
            config = await self._governing_or_rejoin(step)
            # Looked for again here, not only on entering: the commit that voids a step this member
            # completed typically arrives while it waits at the next step's gate, or while that
            # step's round runs (star run 5: it stepped on while the others redid the voided step).
            if config is None:
                return await self._averaged_step(weight, apply=apply)
            if await self._check_resync():
                # Rejoined with the run's state: the gradient it came with was of the diverged
                # state (and the weight-0 serving zeroed it), so it adds nothing to this step.
                return await self._averaged_step(0, apply=apply)
            runs.report_step(self.run, entered=step)
            attempts += 1
            attempt_started = self.port.clock.now()
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
            allowances = weight_allowances(config, step, newest=runs.configuration(self.run))
            timeout_s = self._round_timeout()
            try:
                outcome = await self._unless_superseded(
                    step,
                    config,
                    self.service.averager.all_reduce(
                        tag,
                        buffer,
                        # More samples than the share (a drop-in caller's last call overshooting it)
                        # count as the share: the owners refuse more than the configuration allows.
                        weight=min(float(weight), allowances.get(self.port.peer_id, 0.0)),
                        max_weights=allowances,
                        members=participants(config, step),
                        addrs=self.port.dial_addrs,
                        bandwidth=link_bandwidths(participants(config, step), config.links),
                        relays=relay_routes(participants(config, step), config.links, self.port.peer_id),
                        wire_dtype=self.config.wire_dtype,
                        timeout_s=timeout_s,
                    ),
                )
            except ContributionRefused as exc:
                # Most owners refused our contribution's header (length, dtype or weight): we are the odd one
                # out (a different model?). NaN/Inf values are not refused: they are excluded from the round.
                raise TrainingError(f"step {step}: the members refused this peer's contribution: {exc}") from exc
            except (RoundAborted, RoundMismatch) as exc:
                log.info("run %r step %d: round under epoch %d failed: %s", self.run, step, config.epoch, exc)
                report_unreachable(self.port.runs, self.service.averager, tag)  # first-hand LINK_DOWN
                if isinstance(exc, RoundAborted) and not self._passive:  # issue 19: go on without idle members
                    me = self.port.peer_id
                    await sign_stalls(runs, self.service.averager, me=me, tag=tag, config=config, timeout_s=timeout_s)
                if attempts >= self.config.max_round_attempts:
                    raise TrainingError(f"step {step} of run {self.run!r} failed {attempts} times: {exc}") from exc
                # A round that fails at once (a peer behind NAT: "network unreachable" in microseconds)
                # must not use up every attempt before the LINK_DOWN it raised governs the step
                # (issue 21: 50 attempts in about a second, then the member gave up and crashed).
                await self._pace_retry(attempt_started)
                if await self._wait_for_new_configuration(step, config):
                    continue
                # No change: either some members completed the round before it failed here (fetch
                # their result; redoing it is impossible) or nobody did (retry as a new round).
                if await self._fetch_update(config, step, buffer):
                    outcome = None
                    governing_now = runs.governing(self.run, step)
                    if governing_now is not None and governing_now.digest == config.digest:
                        runs.report_step(self.run, completed=step)
                        break
                    continue  # a change now governs this step: redo it under the new configuration
                continue
            if outcome is None:
                log.info(
                    "run %r step %d: a new configuration governs the step; dropped the round under epoch %d",
                    self.run,
                    step,
                    config.epoch,
                )
                continue
            # A change agreed while the round ran may govern this very step (a failure found mid-round
            # is redone at the stuck step): then this round's result is discarded, never applied.
            governing = await self._governing_or_rejoin(step)
            if governing is None:
                return await self._averaged_step(weight, apply=apply)
            if governing.digest == config.digest:
                # Completed now, before any await: a gate raised later (a change decided while we
                # apply the update) must find this step already completed, not in progress.
                runs.report_step(self.run, completed=step)
                break
            log.info("run %r step %d: redoing the round under epoch %d", self.run, step, governing.epoch)
        communication_s = self.port.clock.now() - round_started
        if outcome is not None:
            self._judge_contributions(config, step, outcome.invalid)
        # Newcomers observing us get the update before we apply it (applying only reads it): a
        # newcomer admitted at step + 1 replays it while we apply it, instead of after, and is
        # that much less late for its first round, in which every member waits for it.
        self.feed.publish(step=step, epoch=config.epoch, config_digest=config.digest, update=buffer)
        await anyio.to_thread.run_sync(apply, buffer)
        self._history.append((step, config.digest, config.epoch, buffer))
        # Serving with weight 0, the update is not applied here: a snapshot would not be this step's state.
        if not self._passive and (self.snapshots.wanted(step) or self.config.snapshot_every_step):
            await self._publish_snapshot(step, config)
        self.snapshots.give_up_before(step + 1)
        self.step_index = step + 1
        rebalance = step % self.config.rebalance_interval_steps == 0 and len(config.members) > 1
        if rebalance and self._throughput and self.config.balance and not self._passive:
            try:
                runs.set_throughput(self.run, self._throughput)
            except LocalProtocolError:  # removed meanwhile: the next step finds out and rejoins
                log.debug("run %r: not reporting throughput (no longer a member)", self.run)
        return StepStatistics(
            step=step,
            epoch=config.epoch,
            config_digest=config.digest.hex(),
            members=len(participants(config, step)),
            samples=weight,
            round_s=communication_s if outcome is None else outcome.seconds,
            idle_s=communication_s,
            attempts=attempts,
            bytes_sent=0 if outcome is None else outcome.bytes_sent,
            bytes_received=buffer.nbytes if outcome is None else outcome.bytes_received,
            excluded=() if outcome is None else tuple(str(e.peer) for e in outcome.excluded),
        )

    def _admits_contribution(self, peer: PeerID) -> bool:
        """May ``peer`` send contributions to this run's rounds before they start here?

        A member of the newest configuration known here (a newcomer ahead of us), of the one
        governing our next step, or one whose removal is agreed for a later step (it still
        takes part until then). Called by the averager for every early contribution: lookups only.
        """
        runs = self.port.runs
        newest = runs.configuration(self.run)
        if newest is None:
            return False
        if newest.has_member(peer):
            return True
        governing = runs.governing(self.run, self.step_index)
        if governing is not None and governing.has_member(peer):
            return True
        departed = newest.departed_entry(peer)
        return departed is not None and departed.activation_step > self.step_index

    def _judge_contributions(self, config: Configuration, step: int, invalid: tuple[PeerID, ...]) -> None:
        """Sign an EVICT of each member whose contributions failed our own checks (as a shard owner)
        ``evict_after_invalid_rounds`` rounds in a row (see :mod:`chaosp2p.protocols.averaging.contributions`)."""
        if self._passive:
            return
        for peer in self._invalid.observe(participants(config, step), invalid):
            if self.port.runs.evict(self.run, peer):
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
        if self.port.runs.removed_reason(self.run) == "evicted":
            raise TrainingError(
                f"run {self.run!r} evicted this peer: a quorum of members found its contributions invalid "
                f"{self.config.evict_after_invalid_rounds}+ rounds in a row (different model? NaN/Inf gradients?)"
            )

    async def _check_resync(self) -> bool:
        """Rejoin if a commit this peer had run past made its state wrong; True if it did."""
        resync = self.port.runs.take_resync(self.run)
        if resync is None or self._passive:
            return False
        await self._rejoin(f"state diverged from step {resync}")
        return True

    async def _unless_superseded(
        self, step: int, config: Configuration, reduce: Awaitable[RoundStats]
    ) -> RoundStats | None:
        """``reduce`` (this member's round of ``step`` under ``config``), or None as soon as a committed
        configuration other than ``config`` governs ``step``: the round's result could not be used,
        and the others are already in the new configuration's round, waiting for this member. (A round
        left running until its own timeout cost them that timeout: issue 19, a SIGSTOP's STALL.)"""
        runs = self.port.runs
        outcome: list[RoundStats] = []

        async def watch(superseded: anyio.CancelScope) -> None:
            # Polled (a dictionary lookup), not woken by wait_changed: those wake-ups mean "the step
            # waits for a decision" to whoever watches them, which a running round is not.
            while True:
                await anyio.sleep(SUPERSEDED_POLL_S)
                try:
                    current = runs.governing(self.run, step)
                except ChaosError:
                    return  # no longer ours to ask (removed, left): the round ends by itself
                if current is not None and current.digest != config.digest:
                    superseded.cancel()
                    return

        with anyio.CancelScope() as superseded, unwrap_single_error():
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, superseded)
                outcome.append(await reduce)
                tg.cancel_scope.cancel()
        return outcome[0] if outcome else None

    async def _pace_retry(self, attempt_started: float) -> None:
        """Let at least a quarter of ``retry_wait_s`` pass between the starts of two attempts."""
        left = attempt_started + self.config.retry_wait_s / 4 - self.port.clock.now()
        if left > 0:
            await anyio.sleep(left)

    async def _wait_for_new_configuration(self, step: int, failed: Configuration) -> bool:
        """After an aborted round: wait (bounded) until the configuration governing ``step`` changes.

        Not at all once a newer configuration than ``failed`` is known that does not govern
        ``step``: nothing will change for ``step`` any more, and most likely some member completed
        it (a change decided while a step is stuck activates right after the last step completed
        anywhere) -- its result is fetched at once. (The two ends of a cut waited here while the
        others were already in the next step's round, waiting for them.) If nobody has it, the
        members say so at once and the step is retried, as after the wait.
        """
        runs = self.port.runs
        newest = runs.configuration(self.run)
        if newest is not None and newest.epoch > failed.epoch and newest.activation_step > step:
            return False
        with anyio.move_on_after(self.config.retry_wait_s):
            while True:
                current = runs.governing(self.run, step)
                if current is None or current.digest != failed.digest:
                    return True  # gated (a change is being decided) or changed
                if runs.removed_reason(self.run) is not None:
                    return True
                await runs.wait_changed()
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
        me = self.port.peer_id
        newest = self.port.runs.configuration(self.run) or config
        # Members over a link the run holds down are asked last: each try waits up to the round
        # timeout, and the other end of a cut (first in ring order, say) cost the others that long
        # in the next step's round -- long enough to STALL this member (issue 19).
        cut = {m for m in config.peers if (link := newest.link(me, m)) is not None and not link.up}
        for member in sorted(ring_order(config), key=lambda m: m in cut):
            if member == me:
                continue
            try:
                with anyio.fail_after(self.config.round_timeout_min_s):
                    async with await self.port.open_stream(member, PROTOCOL) as stream:
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

    def _note_throughput(self, samples: int, compute_s: float) -> None:
        if compute_s <= 0:
            return
        rate = samples / compute_s
        self._throughput = rate if self._throughput is None else 0.7 * self._throughput + 0.3 * rate
