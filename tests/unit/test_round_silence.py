"""Who a member may take for silent after an aborted round (issue 19: STALL evidence).

A member that owns a non-empty shard expects a contribution from every other member: one from which
not a byte arrived did not take part. A member that owns an empty shard (an end of a cut link, say)
expects no contribution from anyone, and the owners' results it waits for are late whenever any
contributor is late: it has no first-hand evidence against anybody. In a real four-process run the
two ends of a cut link each signed a STALL of an owner that was itself waiting, and together removed it.
A contributor stopped in the middle of its contribution (SIGSTOP) delivered part of it: it is
partial, not silent; whether it is stopped is asked by pinging it (``Averager.stopped_in``, tested
with a fake host below: a live sender answers, a stopped one does not).
"""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from chaosp2p.protocols.averaging.messages import RoundTag, WireDtype
from chaosp2p.protocols.averaging.plan import plan_shards
from chaosp2p.training.pair_watch import unanswered
from chaosp2p.training.round_state import Inbound, RoundState
from chaosp2p.training.waiting import silent_contributors
from chaosp2p.wire.identity import Identity, PeerID

pytestmark = [pytest.mark.unit, pytest.mark.anyio]

PEERS = sorted(Identity.from_seed(bytes([i + 1]) * 32).peer_id for i in range(4))


def _round(me: PeerID, bandwidth: dict[PeerID, float]) -> RoundState:
    plan = plan_shards(PEERS, 4096, bandwidth)
    return RoundState(
        tag=RoundTag(run="r", epoch=3, config_digest=b"c" * 32, step=7),
        me=me,
        plan=plan,
        buffer=np.zeros(4096, dtype=np.float32),
        weight=1.0,
        wire=WireDtype.FLOAT32,
        chunk_elements=1024,
        max_weights=dict.fromkeys(PEERS, 1.0),
        started=0.0,
    )


async def test_an_owner_that_received_nothing_takes_every_other_member_for_silent() -> None:
    owner = PEERS[0]
    round_ = _round(owner, dict.fromkeys(PEERS, 1.0))
    assert silent_contributors(round_) == frozenset(PEERS[1:])


async def test_a_member_owning_an_empty_shard_takes_nobody_for_silent() -> None:
    owners, cut_ends = PEERS[:2], PEERS[2:]
    bandwidth = {**dict.fromkeys(owners, 1.0), **dict.fromkeys(cut_ends, 0.0)}
    for end in cut_ends:
        round_ = _round(end, bandwidth)
        assert not round_.shard.size
        assert silent_contributors(round_) == frozenset()
    # An owner still has evidence against each member whose contribution never came.
    assert silent_contributors(_round(owners[0], bandwidth)) == frozenset(PEERS) - {owners[0]}


class _Connection:
    def __init__(self, answers: bool) -> None:
        self.answers = answers

    async def ping(self) -> None:
        if not self.answers:
            await anyio.sleep(3600)  # a SIGSTOPped process: its kernel holds the connection, nobody answers


class _Host:
    """Connections by peer; a peer missing here has none."""

    def __init__(self, connections: dict[PeerID, _Connection]) -> None:
        self.connections = connections

    def connection(self, peer: PeerID) -> _Connection | None:
        return self.connections.get(peer)


async def test_a_contributor_partly_in_is_partial_not_silent_and_only_a_stopped_one_leaves_pings_unanswered() -> None:
    owner, stopped, alive, absent = PEERS
    round_ = _round(owner, dict.fromkeys(PEERS, 1.0))
    for peer in (stopped, alive):
        inbound = Inbound(peer, None, None)  # type: ignore[arg-type]  # neither is read here
        inbound.values = np.zeros(round_.shard.size, dtype=np.float32)
        inbound.received = 100
        round_.inbound[peer] = inbound
    assert round_.partial() == {stopped, alive}
    assert silent_contributors(round_) == frozenset({absent})
    host = _Host({stopped: _Connection(answers=False), alive: _Connection(answers=True)})
    with anyio.fail_after(5):
        assert await unanswered(host, round_.partial(), 0.2) == frozenset({stopped})  # type: ignore[arg-type]
