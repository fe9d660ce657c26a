"""An idle member steps aside itself, so it never holds the others (issue 19, deliverable 4).

Theory of operation
-------------------
A member whose trainer stops calling ``step()`` -- a script that finished its steps but keeps its
peer up (hivemind's quickstart), an evaluation, a checkpoint -- still counts in the agreed
configuration, and every round of the others waits for its contribution. With three or more
members the others sign STALLs of it (:mod:`~chaosp2p.training.stalls`; two signers remove it). A
two-member run has no second signer (no member removes another alone: ``protocols/negotiation.md``
§3b), so the member left waited forever.

So the idle member acts itself: a member may always remove itself, and a LEAVE needs no second
signer. A watcher task -- run under the peer's task group (``TrainingPort.spawn``), cancelled by
``leave()`` and by the peer's close -- looks every ``step_aside_poll_s`` of the peer's clock; when

* contributions of others to a round of this run wait here for that round to start (the averager
  holds early contributions: somebody is held by this member), and
* the trainer is not inside ``step()`` and has made no ``step()`` or :meth:`note_activity` call for
  ``max(step_aside_idle_min_s, step_aside_gap_mult x median gap)`` -- the gaps being its own,
  measured from the end of one activity to the start of the next (a slow trainer is not idle),

it announces a LEAVE and serves the rounds with weight 0 until the run commits it, as ``leave()``
does (every round needs each member's shard). It keeps each averaged update instead of applying it
(the trainer may be evaluating the model meanwhile), publishes no snapshot (its model lacks those
updates), and stays registered with its peer.

At its next ``step()``: if the LEAVE took effect (the usual case), the round finds the member
removed and it rejoins through the join path (``joining.py``: state pull, replay of the steps
since, admission). If it did not (serving ended on an error before the commit), it replays the
kept updates and goes on as a member with the members' state.

The floors equal the round timeouts' (2 s ``local``, 10 s ``lan``, 60 s ``wan``): in a run of three
or more the others' STALLs and this LEAVE race, and either removal is followed by the same rejoin.
"""

from __future__ import annotations

import logging

import anyio
import anyio.to_thread
import numpy as np

from chaosp2p.errors import ChaosError
from chaosp2p.training.stepping import SUPERSEDED_POLL_S, Apply, Stepping
from chaosp2p.transport.groups import unwrap_single_error

log = logging.getLogger("chaosp2p.training")


def _discard(update: np.ndarray) -> None:
    """What a leaving member does with the rounds' results: nothing (it takes no further steps)."""


class SteppingAside(Stepping):
    """The role of a member that steps aside while idle (see the module docstring), and the
    weight-0 serving it shares with ``leave()``."""

    def note_activity(self) -> None:
        """Tell the collaboration its trainer is busy with the run though it does not call ``step()``
        now (an inner step of the hivemind drop-in, a micro-batch of gradient accumulation), so it is
        not taken for idle. Cheap, and safe to call from the trainer's thread."""
        self._activity.note(self.port.clock.now())

    def _start_idle_watch(self) -> None:
        """Spawn the idle watcher under the peer's task group (after ``start()`` succeeded)."""
        self._activity.note(self.port.clock.now())
        if self.config.step_aside:
            self._idle_stopped = anyio.Event()
            self.port.spawn(self._watch_idle, name=f"chaosp2p idle watcher of run {self.run!r}")

    async def _stop_idle_watch(self) -> None:
        """Cancel the watcher and wait until it ended (a round it serves is abandoned)."""
        if self._idle_scope is not None and self._idle_stopped is not None:
            self._idle_scope.cancel()
            await self._idle_stopped.wait()

    async def _watch_idle(self) -> None:
        stopped = self._idle_stopped
        try:
            with anyio.CancelScope() as scope:
                self._idle_scope = scope
                while not self._left:
                    await self.port.sleep(self.config.step_aside_poll_s)  # the peer's clock (a test steps it)
                    idle = self._holds_others()
                    if idle is not None:
                        await self._step_aside(*idle)
        finally:
            if stopped is not None:
                stopped.set()

    def _holds_others(self) -> tuple[float, float] | None:
        """(idle seconds, bound) if this member is idle past its bound while others wait on it."""
        if self._left or self._aside is not None or not self._started:
            return None
        idle_s = self._activity.idle_for(self.port.clock.now())
        if idle_s is None:
            return None
        bound_s = self._activity.bound_s(
            min_s=self.config.step_aside_idle_min_s, gap_mult=self.config.step_aside_gap_mult
        )
        if idle_s < bound_s or not self.service.averager.holds_early(self.run):
            return None
        runs = self.port.runs
        config = runs.governing(self.run, self.step_index)
        me = self.port.peer_id
        if config is None or not config.takes_part(me, self.step_index) or runs.removed_reason(self.run) is not None:
            return None  # gated (a change is being decided), or no longer taking part: nothing to step aside from
        if runs.configuration(self.run) is None or self._everyone_else_removed():
            # Every other member is leaving (its removal is agreed): what waits here is its weight-0
            # serving, and a round in which every member serves with weight 0 averages nothing.
            return None
        return idle_s, bound_s

    async def _step_aside(self, idle_s: float, bound_s: float) -> None:
        """Leave the run (self-signed) and serve its rounds with weight 0 until it commits that."""
        if not self.port.runs.announce_leave(self.run):
            return
        log.warning(
            "run %r step %d: the others wait for this member, idle for %.1f s (bound %.1f s); it steps aside "
            "(LEAVE) and rejoins at its next step()",
            self.run,
            self.step_index,
            idle_s,
            bound_s,
        )
        self._records.append(
            {
                "event": "stepped_aside",
                "step": self.step_index,
                "idle_s": round(idle_s, 3),
                "bound_s": round(bound_s, 3),
            }
        )
        # The trainer is away: its next step() ends the aside state (_resume_after_aside).
        await self._serve_aside_until_removed(apply=self._aside_updates.append, stay_aside=True)

    async def _resume_after_aside(self) -> None:
        """At ``step()`` after stepping aside: wait until the serving ended; replay the kept updates
        unless the LEAVE took effect (then the round finds this member removed and it rejoins)."""
        done = self._aside
        if done is None:
            return
        await done.wait()
        updates, self._aside_updates = self._aside_updates, []
        self._aside = None
        removed = self.port.runs.removed_from_step(self.run)
        if removed is not None and self.step_index >= removed:
            return
        for update in updates:
            await anyio.to_thread.run_sync(self._replay, update)
        log.info(
            "run %r: back at step %d after stepping aside (replayed %d updates)",
            self.run,
            self.step_index,
            len(updates),
        )

    async def _check_resync(self) -> bool:
        """Rejoin if a commit this peer had run past made its state wrong -- leaving first; True if it did.

        Its state from the resync step on is wrong, so it rejoins as a newcomer; but it still counts
        in the configuration that governs that step, and the others' rounds of the step wait for it.
        Rejoining at once held them for good in a run of two (an hour's soak stalled so: an urgent
        FAIL activated at a step this member had completed; no one else could remove it, and its
        rejoin needed the vouch of a quorum that counted itself). So, when others are in the run, it
        announces its own LEAVE, serves the rounds from the resync step with weight 0 until the run
        removes it (its state does not matter for a zero contribution), and then rejoins.
        """
        resync = self.port.runs.take_resync(self.run)
        if resync is None or self._passive:
            return False
        others = self.port.runs.configuration(self.run) is not None and not self._everyone_else_removed()
        if others and self.port.runs.announce_leave(self.run):
            log.warning(
                "run %r: state from step %d diverged; leaving (LEAVE), serving the rounds with weight 0 until "
                "removed, then rejoining",
                self.run,
                resync,
            )
            self.step_index = resync  # the others redo this step, with this member in it
            await self._serve_aside_until_removed(stay_aside=False)  # inside step(): aside ends with the serving
        await self._rejoin(f"state diverged from step {resync}")
        return True

    async def _serve_aside_until_removed(self, apply: Apply = _discard, *, stay_aside: bool) -> None:
        """Be aside while serving the rounds with weight 0 until the run removes this member.

        The one place that enters the aside state (``_aside``: an event while aside, set when the
        serving ended), for both ways in: stepping aside while idle and leaving after a
        resync. ``stay_aside``: the trainer is away, and its next ``step()`` ends the state after
        waiting for the event (:meth:`_resume_after_aside`); otherwise the caller is inside
        ``step()`` and the state ends with the serving.
        """
        done = self._aside = anyio.Event()
        try:
            await self._serve_until_removed(apply=apply)
        finally:
            done.set()
            if not stay_aside:
                self._aside = None

    def _everyone_else_removed(self) -> bool:
        """Whether the newest configuration of the run holds no member but (perhaps) this one."""
        newest = self.port.runs.configuration(self.run)
        me = self.port.peer_id
        return newest is not None and not any(m.peer_id != me for m in newest.members)

    async def _serve_until_removed(self, apply: Apply = _discard) -> None:
        """Until the run removes this member, keep doing its part of each round with zero weight.

        The run commits a leave at a future step; until then the configuration still counts this
        peer, and every round needs each member's shard, so it contributes nothing but still reduces
        its shard for the others. ``apply`` gets each round's result (a leaver discards them).
        """
        self._local.fill(0.0)
        runs = self.port.runs
        while True:
            last = runs.removed_from_step(self.run)
            if last is not None and self.step_index >= last:
                return
            try:
                with anyio.CancelScope() as alone, unwrap_single_error():
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._cancel_when_everyone_else_removed, alone)
                        await self._averaged_step(0, apply=apply)
                        tg.cancel_scope.cancel()
            except ChaosError as exc:  # best effort: the run removes us anyway
                log.info("run %r: stopped serving rounds with weight 0: %s", self.run, exc)
                return
            if alone.cancelled_caught:
                # Each other member is leaving (or gone) too, so each serves with weight 0 as well:
                # such a round averages nothing and fails, again and again, until every leaver has
                # given up on its own (max_round_attempts: seconds for each).
                log.info("run %r: every other member is leaving too; no round left to serve", self.run)
                return

    async def _cancel_when_everyone_else_removed(self, scope: anyio.CancelScope) -> None:
        # Polled on the port's clock: a lookup, and no wake-up that would read as "a decision is awaited".
        while not self._everyone_else_removed():
            await self.port.sleep(SUPERSEDED_POLL_S)
        scope.cancel()
