"""Joining a run: observe a sponsor, load a vouched snapshot from the members, replay, get admitted.

Theory of operation
-------------------
A newcomer never stops the run. It finds a member (any peer it can reach may know the run), opens
an *observe* stream to it (its sponsor), which from then on streams the averaged update of every
step it completes, and asks every member of the configuration for a snapshot of a step a little
ahead (``snapshot_ahead_steps``), showing them the ticket its sponsor signed for it (members serve
snapshots to members and ticketed newcomers only). Members snapshot that step while they keep
training, and each vouches for it: a signature over (run, step, state digest, configuration). Only
the state a quorum of the configuration that governed the step vouches for is loaded, from the
members that vouched for it, in parallel, pinned to its digest (see
:mod:`chaosp2p.protocols.collab.vouch`).

Then the newcomer replays the sponsor's updates after the snapshot step, asks to be admitted once
it is within ``join_lag_steps`` of the sponsor, and keeps replaying until the admission step: its
state is then bit-identical to the members'. A failed attempt (no vouched state, the sponsor cut
the stream, a timeout) is retried with backoff; errors reach the caller as chaosp2p errors, never
wrapped in an exception group.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from chaosp2p.errors import ChaosError, TrainingError, TransferError
from chaosp2p.protocols.collab.messages import PROTOCOL, Refused, SnapshotReply, SnapshotRequest, Ticket, codec
from chaosp2p.protocols.collab.vouch import choose_vouched_state, read_vouches
from chaosp2p.protocols.negotiation import Configuration
from chaosp2p.state.service import load_into_torch
from chaosp2p.training.catchup import UpdateReceiver
from chaosp2p.training.collab_core import CollaborationCore, mean_throughput
from chaosp2p.transport.groups import unwrap_single_error
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")

QUERY_RUN_TIMEOUT_S = 2.0
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0


class Joining(CollaborationCore):
    """The newcomer role of a collaboration (see the module docstring)."""

    async def _rejoin(self, why: str) -> None:
        log.warning("run %r: rejoining as a newcomer (%s)", self.run, why)
        self.port.runs.forget_removal(self.run)
        with anyio.fail_after(self.config.join_timeout_s):
            await self._join()

    async def _join(self) -> None:
        """Observe a sponsor, load a snapshot from the members, replay, get admitted (with retries)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._join_once()
                return
            except (ChaosError, TimeoutError) as exc:
                if isinstance(exc, TrainingError):
                    raise
                delay = min(RETRY_MIN_S * 2**attempt, RETRY_MAX_S)
                log.warning("joining run %r failed (%s); retrying in %.1f s", self.run, exc, delay)
                await anyio.sleep(delay)

    async def _find_run(self) -> tuple[PeerID, Configuration]:
        """A member of the run that answers, and its view of the configuration."""
        candidates = [peer for peer in self.port.run_contacts() if peer != self.port.peer_id]
        if not candidates:
            raise TransferError("no peer to ask about the run yet")
        for candidate in candidates:
            try:
                info = await self.port.runs.query_run(self.run, candidate, timeout_s=QUERY_RUN_TIMEOUT_S)
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
        stream = await self.port.open_stream(sponsor, PROTOCOL)
        receiver = await UpdateReceiver.open(
            stream, run=self.run, layout=self.layout, numel=self.flat.numel, max_queued=self.config.max_catchup_updates
        )
        failures: list[BaseException] = []
        with unwrap_single_error():
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
        # Nothing completed yet (a run at its first step): the first step it completes.
        snapshot_step = max(receiver.sponsor_completed + self.config.snapshot_ahead_steps, 0)
        if receiver.ticket is not None:  # members serve no snapshot past what the sponsor's ticket covers
            snapshot_step = min(snapshot_step, receiver.ticket.until_step)
        replies = await self._request_snapshots(config, snapshot_step, receiver.ticket)
        # Only the state a quorum of the configuration that held the step vouches for (see vouch.py),
        # from the members that vouched for it; the pull pins its digest.
        limits = self.port.runs.config
        vouches, cited = read_vouches(
            [(member, reply) for member, _, reply in replies],
            run=self.run,
            anchor=config,
            max_members=limits.max_members,
            max_links=limits.max_links,
        )
        vouched = choose_vouched_state(vouches, run=self.run, step=snapshot_step, anchor=config, configurations=cited)
        for peer, why in vouched.refused:
            log.warning("run %r step %d: not loading from member %s: %s", self.run, snapshot_step, peer, why)
        sources = [addr for member, addr, _ in replies if member in vouched.vouchers and addr]
        if self.config.max_snapshot_sources:  # every member was asked (one refusing must not fail the join)
            sources = sources[: self.config.max_snapshot_sources]
        if not sources:
            raise TransferError(f"no member that vouched for step {snapshot_step} can be dialled")
        started = self.port.clock.now()
        loaded = await self.port.load_state(self.run, step=snapshot_step, sources=sources, digest=vouched.state_digest)
        module, optimizer = self._snapshot_target()
        await anyio.to_thread.run_sync(lambda: load_into_torch(loaded, module, optimizer))
        if self._outer is not None:
            self._outer.copy_to_model(self.flat)
        load_s = self.port.clock.now() - started
        log.info("run %r: loaded step %d from %d members in %.2f s", self.run, snapshot_step, len(sources), load_s)
        applied = snapshot_step
        admission = None
        # The replay loop raises TransferError inside this group: it must leave as itself, not as an
        # exception group that _join_once and _join's retry loop would not catch (issue 19).
        with unwrap_single_error():
            async with anyio.create_task_group() as tg:
                admitted: list[Configuration] = []
                # Set once ``admitted`` holds the admission, for a wait on the next update. Not the
                # run's change notification: that fires before this task resumes to record the
                # admission, and a run admitted at the step under way changes no more until the
                # newcomer takes part, so a waiter that missed it waited forever.
                admission_arrived = anyio.Event()

                async def ask_admission() -> None:
                    # Bounded by join_timeout_s around the whole join; never raises into this group.
                    admitted.append(
                        await self.port.runs.join(
                            self.run,
                            sponsor,
                            incarnation=self.port.own_incarnation(),
                            # Unmeasured yet: the members' mean, so the newcomer starts with an average share.
                            throughput=self._throughput or mean_throughput(config),
                            timeout_s=math.inf,
                        )
                    )
                    admission_arrived.set()

                asked = False
                while True:
                    if admitted:
                        admission = admitted[0]
                        me = admission.member(self.port.peer_id)
                        since = admission.activation_step if me is None else me.since_step
                        if applied >= since - 1:
                            break
                    elif not asked and (receiver.latest or applied) - applied <= self.config.join_lag_steps:
                        asked = True
                        tg.start_soon(ask_admission)
                    header, update = await self._next_update(receiver, admission_arrived)
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
        me = admission.member(self.port.peer_id)
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
        self, receiver: UpdateReceiver, admission_arrived: anyio.Event
    ) -> tuple[Any, np.ndarray] | tuple[None, None]:
        """The next update, or (None, None) when admission arrived while waiting."""
        result: list[tuple[Any, np.ndarray]] = []
        errors: list[ChaosError] = []
        with unwrap_single_error():
            async with anyio.create_task_group() as tg:

                async def take() -> None:
                    try:
                        result.append(await receiver.next())
                    except ChaosError as exc:  # raised below, outside the task group (no exception group)
                        errors.append(exc)
                    tg.cancel_scope.cancel()

                async def admission() -> None:
                    await admission_arrived.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(take)
                if not admission_arrived.is_set():
                    tg.start_soon(admission)
        if errors:
            raise errors[0]
        return result[0] if result else (None, None)

    async def _request_snapshots(
        self, config: Configuration, step: int, ticket: Ticket | None
    ) -> list[tuple[PeerID, str, SnapshotReply]]:
        """Ask every member to snapshot ``step``, showing the sponsor's ``ticket``: (member,
        address, reply) of each that did, in the order they answered."""
        ready: list[tuple[PeerID, str, SnapshotReply]] = []
        request = SnapshotRequest(
            run=self.run, step=step, layout=self.layout, config_digest=config.digest, ticket=ticket
        )

        async def ask(member: PeerID) -> None:
            try:
                with anyio.fail_after(self.config.join_timeout_s):
                    async with await self.port.open_stream(member, PROTOCOL) as stream:
                        await stream.send_message(codec, request)
                        reply = await stream.receive_message(codec)
            except (ChaosError, TimeoutError) as exc:
                log.info("member %s cannot serve a snapshot: %s", member, exc)
                return
            if isinstance(reply, SnapshotReply) and reply.ok:
                addrs = self.port.dial_addrs(member)
                ready.append((member, f"{addrs[0]}/p2p/{member}" if addrs else "", reply))
            elif isinstance(reply, (SnapshotReply, Refused)):
                log.info("member %s will not snapshot step %d: %s", member, step, reply.reason)

        with unwrap_single_error():
            async with anyio.create_task_group() as tg:
                for member in config.members:
                    if member.peer_id != self.port.peer_id:
                        tg.start_soon(ask, member.peer_id)
        return ready
