"""Who a member may take for silent after an aborted round (issue 19: STALL evidence).

A member that owns a non-empty shard expects a contribution from every other member: one from which
not a byte arrived did not take part. A member that owns an empty shard (an end of a cut link, say)
expects no contribution from anyone, and the owners' results it waits for are late whenever any
contributor is late: it has no first-hand evidence against anybody. In a real four-process run the
two ends of a cut link each signed a STALL of an owner that was itself waiting, and together removed it.
(The tests are async only because a round state's beacons are anyio events.)
"""

from __future__ import annotations

import numpy as np
import pytest

from chaosp2p.protocols.averaging.messages import RoundTag, WireDtype
from chaosp2p.protocols.averaging.plan import plan_shards
from chaosp2p.training.round_state import RoundState
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
