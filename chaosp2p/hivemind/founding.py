"""Found a run or join it: what the first ``hivemind.Optimizer`` of a run does.

Theory of operation
-------------------
hivemind has no founder: the first peer of a run simply trains, and others find it through the
DHT. A chaosp2p run has agreed members, so the drop-in decides at ``Optimizer(...)`` whether a
run exists: it asks every peer it can find whether it takes part -- the live members of its
membership view, the peers it is connected to, its DHT contacts, and the peers announced in the
DHT as members of the run (each member announces itself under :func:`run_key`). The first peer
that answers with a configuration is where to join; if every peer says it does not (or cannot be
reached at all), this optimizer founds the run. A peer that is reachable but does not answer is
asked again: founding a second run because a member was slow would split the run in two.

So a DHT-only peer (albert's monitor) never is a member and never blocks one: it answers that it
does not take part, and the first trainer founds the run; a trainer that restarts after every
other left founds it again. Two trainers started within the same second may both find no run
and found two runs under one id; start them one after the other (albert's README does).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from chaosp2p.errors import ChaosError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

if TYPE_CHECKING:
    from chaosp2p.api.async_peer import AsyncPeer

log = logging.getLogger("chaosp2p.hivemind")

QUERY_TIMEOUT_S = 3.0
"""How long one peer may take to say whether it takes part in the run."""
QUERY_ATTEMPTS = 6
"""Tries per peer within that time: a peer that does not know us yet may drop the first question."""
ANNOUNCE_TTL_S = 600.0
"""How long a member's announcement lasts (renewed at epoch ends once half of it is gone)."""
RETRY_S = 0.5
"""Pause before asking again the peers that neither answered nor turned out unreachable."""


def run_key(run: str) -> bytes:
    """The DHT key whose providers are members of ``run``."""
    return b"chaosp2p.hivemind/run/" + run.encode()


async def _candidates(peer: AsyncPeer, run: str) -> dict[PeerID, list[Multiaddr]]:
    """Every peer that may take part in ``run``, with addresses to reach it."""
    me = peer.peer_id
    with anyio.move_on_after(QUERY_TIMEOUT_S):
        await peer.dht.wait_ready()  # a lookup from an empty routing table finds no announced member
    try:
        with anyio.fail_after(QUERY_TIMEOUT_S * 2):
            announced = await peer.dht.get_providers(run_key(run))
    except (ChaosError, TimeoutError) as exc:
        log.debug("looking up the members of run %r in the DHT failed: %s", run, exc)
        announced = ()
    found: dict[PeerID, list[Multiaddr]] = {}
    for candidate in peer.training_port.run_contacts():
        found[candidate] = list(peer.training_port.dial_addrs(candidate))
    for record in announced:
        parsed = [Multiaddr.parse(addr).with_peer(record.provider) for addr in record.addrs]
        found.setdefault(record.provider, []).extend(parsed)
    found.pop(me, None)
    return found


async def _ask(peer: AsyncPeer, run: str, candidate: PeerID, addrs: list[Multiaddr]) -> bool | None:
    """True: ``candidate`` takes part; False: it does not, or it cannot be reached; None: it did not say."""
    try:
        with anyio.fail_after(QUERY_TIMEOUT_S):
            await peer.host.connection_to(candidate, addrs)
    except (ChaosError, TimeoutError):
        return False  # a peer nobody can reach trains with nobody
    for _ in range(QUERY_ATTEMPTS):
        try:
            info = await peer.negotiation.query_run(run, candidate, timeout_s=QUERY_TIMEOUT_S / QUERY_ATTEMPTS)
        except TimeoutError:
            continue
        except ChaosError:
            return False
        if info.configuration is None and info.withheld:
            # A member answered, but this newcomer does not believe it yet (it waits for its trusted
            # initial peers, e.g. a DHT-only monitor, to decline first): ask again, never found.
            continue
        return info.configuration is not None
    return None


async def _record_verdict(
    peer: AsyncPeer,
    run: str,
    candidate: PeerID,
    addrs: list[Multiaddr],
    verdicts: dict[PeerID, bool | None],
    scope: anyio.CancelScope,
) -> None:
    verdicts[candidate] = await _ask(peer, run, candidate, addrs)
    if verdicts[candidate]:
        scope.cancel()  # one member is enough


async def find_member(peer: AsyncPeer, run: str, *, patience_s: float) -> PeerID | None:
    """A peer that takes part in ``run``; None once every peer this one can find said it does not.

    A peer that is connected but does not answer leaves the question open: it is asked again (a
    run must not be founded twice because a member was slow), for at most ``patience_s``.
    """
    deadline = anyio.current_time() + patience_s
    while True:
        candidates = await _candidates(peer, run)
        verdicts: dict[PeerID, bool | None] = {}

        async with anyio.create_task_group() as tg:
            for candidate, addrs in candidates.items():
                tg.start_soon(_record_verdict, peer, run, candidate, addrs, verdicts, tg.cancel_scope)
        members = [candidate for candidate, verdict in verdicts.items() if verdict]
        if members:
            return members[0]
        silent = [candidate for candidate, verdict in verdicts.items() if verdict is None]
        if not silent:
            log.debug("none of %d peers takes part in run %r", len(candidates), run)
            return None
        if anyio.current_time() > deadline:
            names = ", ".join(str(candidate) for candidate in silent)
            raise TimeoutError(f"peers {names} neither said whether they train run {run!r} nor became unreachable")
        log.info("run %r: %d peers did not answer whether they train it; asking again", run, len(silent))
        await anyio.sleep(RETRY_S)


async def announce_member(peer: AsyncPeer, run: str) -> None:
    """Announce this peer as a member of ``run`` in the DHT (best effort)."""
    try:
        await peer.dht.add_provider(run_key(run), ttl_s=ANNOUNCE_TTL_S)
    except ChaosError as exc:
        log.warning("announcing this peer as a member of run %r failed: %s", run, exc)


__all__ = ["ANNOUNCE_TTL_S", "announce_member", "find_member", "run_key"]
