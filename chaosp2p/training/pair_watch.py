"""Ending a round early on a broken link (``protocols/averaging.md`` section 4.5).

A round whose only missing exchanges are with peers missing *here alone* (every other owner has
their contributions) is waiting on a link, not on a peer: the peer is alive to the others. Rather
than wait for the round's timeout, the round pings those peers on their connections; one that does
not answer within ``pair_probe_timeout_s`` is cut off from this member, and the round fails at once
naming it (:meth:`Averager.unreachable`), so the collaboration can declare the link down first-hand.
A peer that answers is alive and merely slow: the round looks again after the probe timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from chaosp2p.errors import ChaosError
from chaosp2p.protocols.averaging.messages import Result, ResultStatus
from chaosp2p.training.round_state import RoundState
from chaosp2p.transport.host import Host
from chaosp2p.wire.identity import PeerID

PAIR_POLL_S = 0.1
"""How often a round looks for peers missing here alone (cheap: set arithmetic on the round state)."""


async def watch_pairs(
    round_: RoundState,
    host: Host,
    probe_timeout_s: float,
    answer_all: Callable[[RoundState, Result], Awaitable[None]],
) -> None:
    """Fail ``round_`` once only peers missing here alone are left and one of them does not answer
    a ping within ``probe_timeout_s``; ``answer_all`` tells every contributor the round ended."""
    while True:
        with anyio.move_on_after(PAIR_POLL_S):
            await round_.news.wait()
        # A pair whose agreed link is down exchanges through a relay (relayed.py): slower than the
        # direct pairs, and its circuit may still be opening (no connection to ping yet). Its lag is
        # no evidence of a link down -- that is agreed already -- so the round timeout judges it.
        suspects = round_.pair_suspects(round_.undelivered()) - set(round_.relays)
        if not suspects:
            continue
        silent = [peer for peer in sorted(suspects) if not await answers_ping(host, peer, probe_timeout_s)]
        if not silent or not set(silent) <= round_.pair_suspects(round_.undelivered()) - set(round_.relays):
            await anyio.sleep(probe_timeout_s)  # alive, just slow: look again later
            continue
        missing = frozenset(silent)
        round_.unreachable.update(missing)
        notice = Result(status=ResultStatus.ABORTED, detail="no link", missing=tuple(sorted(round_.undelivered())))
        await answer_all(round_, notice)
        names = ", ".join(p.short() for p in sorted(missing))
        round_.fail("aborted", missing, f"no exchange with {names}, alive to the others (link down?)")
        return


async def answers_ping(host: Host, peer: PeerID, timeout_s: float) -> bool:
    """Does ``peer`` answer a ping on its open connection (direct, else relayed) within ``timeout_s``?
    (No connection: no.)"""
    connection = host.connection(peer) or host.relayed_connection(peer)
    if connection is None:
        return False
    with anyio.move_on_after(timeout_s):
        try:
            await connection.ping()
        except ChaosError:
            return False
        return True
    return False


async def unanswered(host: Host, peers: frozenset[PeerID], timeout_s: float) -> frozenset[PeerID]:
    """Of ``peers``, those that do not answer a ping within ``timeout_s`` (pinged concurrently)."""
    answered: set[PeerID] = set()

    async def ping(peer: PeerID) -> None:
        if await answers_ping(host, peer, timeout_s):
            answered.add(peer)

    async with anyio.create_task_group() as tg:
        for peer in sorted(peers):
            tg.start_soon(ping, peer)
    return peers - answered


__all__ = ["PAIR_POLL_S", "answers_ping", "unanswered", "watch_pairs"]
