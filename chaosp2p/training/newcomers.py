"""Serving newcomers: snapshots of a requested step, vouched for by this member.

Theory of operation
-------------------
A newcomer asks every member for a snapshot of a step a little ahead of the run
(:mod:`chaosp2p.training.joining`). A member remembers the request (``SnapshotWaiters``) and, when
it completes that step, publishes its model and optimizer state in the peer's snapshot store (from
a worker thread, while training goes on), signs a vouch over (run, step, state digest, digest of
the configuration that governed the step) and answers with it. A request for a step already past
is answered with what happened to it; one for another model architecture is refused. The answer
never waits on anything but the member's own progress, and the newcomer decides whom to load from.
"""

from __future__ import annotations

import anyio
import anyio.to_thread

from chaosp2p.protocols.collab.messages import SnapshotReply, SnapshotRequest, Ticket
from chaosp2p.protocols.collab.ticket import is_member, issue_ticket, snapshot_refusal
from chaosp2p.protocols.collab.vouch import sign_vouch, vouched_reply
from chaosp2p.protocols.negotiation import Configuration
from chaosp2p.state.torch_adapter import publish_torch
from chaosp2p.training.collab_core import VOUCHES_KEPT, CollaborationCore
from chaosp2p.training.feed import Observer
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID

NEWCOMERS_REMEMBERED = 256
"""Newcomers a member remembers as allowed to load its snapshots (the oldest are forgotten first)."""


class ServingNewcomers(CollaborationCore):
    """The member role towards newcomers (see the module docstring)."""

    # ------------------------------------------------------------------ who is served
    def _member_configurations(self) -> tuple[Configuration | None, ...]:
        """The configurations whose members this member serves: the newest it holds, and the one
        governing its next step (they differ while a change is pending)."""
        runs = self.port.runs
        return runs.configuration(self.run), runs.governing(self.run, self.step_index)

    def is_member(self, peer: PeerID) -> bool:
        """Whether ``peer`` is a member of the run's configuration (it may fetch updates)."""
        return is_member(peer, self._member_configurations())

    def may_fetch(self, peer: PeerID, step: int, config_digest: bytes) -> bool:
        """Whether ``peer`` may fetch the averaged update of ``step`` (``FetchUpdate``): a member of
        the run now, or of the configuration that governed ``step`` (``config_digest``). A member
        stopped mid-round whose contribution the others used is removed from the next step on; it
        still needs that round's result, and refusing it left it redoing a round nobody else would
        (issue 19's SIGSTOP test, after issue 20 made updates members-only)."""
        if self.is_member(peer):
            return True
        governed = self.port.runs.governing(self.run, step)
        return governed is not None and governed.digest == config_digest and is_member(peer, (governed,))

    def snapshot_refusal(self, request: SnapshotRequest, asker: PeerID) -> str | None:
        """Why ``asker``'s snapshot request is refused (not a member and no valid ticket, or a step
        too far ahead), or None to serve it (:func:`chaosp2p.protocols.collab.ticket.snapshot_refusal`).

        A newcomer whose request is served may then load this member's snapshots over
        ``/chaos/transfer/1`` for ``join_timeout_s`` (:meth:`may_load`).
        """
        configurations = self._member_configurations()
        refusal = snapshot_refusal(
            request,
            asker=asker,
            configurations=configurations,
            completed=max(self.step_index - 1, 0),
            ticket_steps=self.config.ticket_steps,
        )
        if refusal is None and not is_member(asker, configurations):
            served = self._newcomers_served
            served.pop(asker, None)
            served[asker] = self.port.clock.now() + self.config.join_timeout_s
            while len(served) > NEWCOMERS_REMEMBERED:  # the oldest first (each sponsor admits a few at a time)
                del served[next(iter(served))]
        return refusal

    def may_load(self, peer: PeerID) -> bool:
        """Whether ``peer`` may load this member's snapshots: a member of the run, or a newcomer whose
        ticketed snapshot request this member served less than ``join_timeout_s`` ago."""
        if self.is_member(peer):
            return True
        until = self._newcomers_served.get(peer)
        return until is not None and self.port.clock.now() < until

    def sponsor(self, stream: Stream) -> tuple[Ticket, Observer] | str:
        """Sponsor the newcomer observing on ``stream``: its ticket and its place in the update feed,
        or why not (this peer is no member, or already sponsors ``max_newcomers`` newcomers)."""
        newcomer = stream.remote_peer
        if not self.is_member(self.port.peer_id):
            return "this peer is not a member of the run (yet)"
        config = self.port.runs.configuration(self.run)
        if config is not None and not config.params.admits(newcomer):
            # A closed run: a peer the run would never admit gets no updates nor a ticket.
            return "this run admits listed peers only"
        self.feed.drop(newcomer)  # a newcomer observes once: a retry replaces its earlier stream
        if self.feed.observing >= self.config.max_newcomers:
            return f"this member already sponsors {self.feed.observing} newcomers; ask another member"
        until = max(self.step_index - 1, 0) + self.config.ticket_steps
        ticket = issue_ticket(self.port.identity, run=self.run, newcomer=newcomer, until_step=until)
        return ticket, self.feed.watch(stream)

    async def _publish_snapshot(self, step: int, config: Configuration) -> None:
        module, optimizer = self._snapshot_target()
        store = self.service.store
        info = await anyio.to_thread.run_sync(lambda: publish_torch(store, self.run, step, module, optimizer))
        # Vouch for it: signed (run, step, state digest, configuration that governed the step).
        vouch = sign_vouch(
            self.port.identity, run=self.run, step=step, state_digest=info.digest, config_digest=config.digest
        )
        self._vouches[step] = (vouch, config)
        while len(self._vouches) > VOUCHES_KEPT:
            del self._vouches[next(iter(self._vouches))]
        if not self._serving:  # to the members and admitted newcomers of the peer's runs only
            await self.port.serve_state(store, runs=[self.run], allow=self.service.may_load)
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
