"""Going on without a member that does not contribute (issue 19, deliverable 4).

A member that stops calling ``step()`` (a script that finished, an evaluation, a checkpoint, a slow
data loader), is SIGSTOPped or sits in a long GC pause sends nothing to the others' rounds. Every
round waits for it for the round timeout -- the bounded wait derived from the measured step time::

    wait = max(round_timeout_min_s, round_timeout_step_mult x median(step time))

(the floor, ``round_timeout_min_s``, is 2 s in the ``local`` profile, 10 s in ``lan``, 60 s in
``wan``; the step time is a whole iteration, compute + averaging, measured by this member) -- and
then aborts. A member whose aborted round waited at least ``STALL_MIN_WAIT_FRACTION`` of that wait
without receiving *anything* from a member (not even a contribution header: see
:func:`chaosp2p.training.waiting.silent_contributors`; a slow link delivers part of one and is
never taken for a stall) signs a STALL of it (``protocols/negotiation.md`` §3c). Only an owner of a
non-empty shard has such evidence: nobody contributes to an empty shard, and the results its owner
waits for are late whenever anyone is (the ends of a cut link own nothing). Like a FAIL, a
STALL removes its subject only once FAIL_SIGNERS (2) distinct members signed a FAIL or STALL of it,
so no member alone removes a live, contributing one; the batch is urgent, so the others redo the
stuck step without it, and every member averages each step over the same participants (the
agreed configuration's). When the removed member calls ``step()`` again, the run tells it it was
removed (``RunRemoved``) and it rejoins as a newcomer, pulling the state (what it missed is not
replayed, however little: a rejoin is the one path).

A member stopped in the middle of sending its contribution (part of it arrived) is signed against
in the same attempt if it does not answer a ping on its connection after the round
(:meth:`~chaosp2p.training.averager.Averager.stopped_in`): a slow link delivers part of a
contribution too, but its sender answers. (It used to be signed against only from the next attempt:
one more round timeout, so a 30 s SIGSTOP cost the others 5.13 s.)

A member admitted for this very step is not signed against in the step's first round: it may be
finishing its catch-up (it loaded the state before asking to be admitted, so one round's wait is
enough; a newcomer that never steps is signed against from the second round on).
"""

from __future__ import annotations

import logging

from chaosp2p.protocols.averaging.link_plan import relay_routes
from chaosp2p.protocols.averaging.messages import RoundTag
from chaosp2p.protocols.negotiation import Configuration
from chaosp2p.training.averager import Averager
from chaosp2p.training.collab_core import participants
from chaosp2p.training.port import RunGates
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")

STALL_MIN_WAIT_FRACTION = 0.5
"""An aborted round counts as first-hand evidence of a stall only if it waited at least this share
of its timeout here: the first owner to time out tells the others, whose rounds end a little
earlier than their own timers would have."""


async def sign_stalls(
    runs: RunGates,
    averager: Averager,
    *,
    me: PeerID,
    tag: RoundTag,
    config: Configuration,
    timeout_s: float,
) -> list[PeerID]:
    """After the aborted round ``tag`` under ``config``: sign a STALL of every member that sent this
    member nothing for (most of) the round's bounded wait, or stopped mid-send and does not answer a
    ping (``Averager.stopped_in``). Returns whom it signed against."""
    silent, waited_s = averager.silent_in(tag)
    if waited_s < STALL_MIN_WAIT_FRACTION * timeout_s:
        return []
    silent |= await averager.stopped_in(tag)
    # A peer this member could not exchange with at all is a cut link (a LINK_DOWN, link_report.py),
    # not a stall: the two ends of a cut would otherwise sign against each other.
    silent -= averager.unreachable(tag)
    # A peer whose agreed link with this member is down exchanges with it through a relay
    # (averaging.md 5.2): its silence here may be the relay's (broken, or over its circuit caps), not
    # its own, so this member is no witness. Its directly linked members sign (and membership's FAIL
    # counts with a STALL); an idle one steps aside itself (idle.py).
    silent -= set(relay_routes(participants(config, tag.step), config.links, me))
    if not silent:
        return []
    signed = []
    for peer in sorted(silent, key=lambda p: p.raw):
        entry = config.member(peer)
        if peer == me or entry is None or not config.takes_part(peer, tag.step):
            continue
        if entry.since_step >= tag.step and tag.attempt == 0:
            continue  # admitted for this step: its first round may find it finishing its catch-up
        if runs.stall(tag.run, peer):
            signed.append(peer)
            log.warning(
                "run %r step %d: %s sent nothing to this member's round for %.1f s; signed a STALL of it "
                "(a second member's removes it; it rejoins when it steps again)",
                tag.run,
                tag.step,
                peer,
                waited_s,
            )
    return signed
