"""Found a run or join it: what the first ``hivemind.Optimizer`` of a run does.

Theory of operation
-------------------
hivemind has no founder: the first peer of a run simply trains, and others find it through the
DHT. A chaosp2p run has agreed members, so the drop-in decides at ``Optimizer(...)`` whether a
run exists: it asks every peer it can find whether it takes part -- the live members of its
membership view, the peers it is connected to, its DHT contacts, and the peers announced in the
DHT as members of the run (each member announces itself under :func:`run_key`). The first peer
that answers with a configuration is where to join; if nobody does, this optimizer founds the run.

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

QUERY_TIMEOUT_S = 2.0
"""How long one peer may take to say whether it takes part in the run."""
QUERY_ATTEMPTS = 4
"""Tries per peer within that time: a peer that does not know us yet may drop the first question."""
ANNOUNCE_TTL_S = 600.0
"""How long a member's announcement lasts (renewed at epoch ends once half of it is gone)."""


def run_key(run: str) -> bytes:
    """The DHT key whose providers are members of ``run``."""
    return b"chaosp2p.hivemind/run/" + run.encode()


async def find_member(peer: AsyncPeer, run: str) -> PeerID | None:
    """A peer that takes part in ``run`` and answered so, or None if no peer this one can find does."""
    me = peer.peer_id
    try:
        with anyio.fail_after(QUERY_TIMEOUT_S * 2):
            announced = await peer.dht.get_providers(run_key(run))
    except (ChaosError, TimeoutError) as exc:
        log.debug("looking up the members of run %r in the DHT failed: %s", run, exc)
        announced = ()
    providers = [record for record in announced if record.provider != me]
    candidates = list(dict.fromkeys([*peer.training_port.run_contacts(), *(r.provider for r in providers)]))
    candidates = [candidate for candidate in candidates if candidate != me]
    addrs = {record.provider: record.addrs for record in providers}
    found: list[PeerID] = []

    async def ask(candidate: PeerID, scope: anyio.CancelScope) -> None:
        try:
            with anyio.fail_after(QUERY_TIMEOUT_S):
                for addr in addrs.get(candidate, ()):
                    try:  # an announced member need not be a contact yet: reach it first
                        await peer.connect(Multiaddr.parse(addr).with_peer(candidate))
                        break
                    except ChaosError:
                        continue
                info = None
                for _ in range(QUERY_ATTEMPTS):
                    try:
                        info = await peer.negotiation.query_run(
                            run, candidate, timeout_s=QUERY_TIMEOUT_S / QUERY_ATTEMPTS
                        )
                        break
                    except TimeoutError:
                        continue
        except (ChaosError, TimeoutError):
            return
        if info is not None and info.configuration is not None:
            found.append(candidate)
            scope.cancel()

    async with anyio.create_task_group() as tg:
        for candidate in candidates:
            tg.start_soon(ask, candidate, tg.cancel_scope)
    if found:
        return found[0]
    log.debug("none of %d peers takes part in run %r", len(candidates), run)
    return None


async def announce_member(peer: AsyncPeer, run: str) -> None:
    """Announce this peer as a member of ``run`` in the DHT (best effort)."""
    try:
        await peer.dht.add_provider(run_key(run), ttl_s=ANNOUNCE_TTL_S)
    except ChaosError as exc:
        log.warning("announcing this peer as a member of run %r failed: %s", run, exc)


__all__ = ["ANNOUNCE_TTL_S", "announce_member", "find_member", "run_key"]
