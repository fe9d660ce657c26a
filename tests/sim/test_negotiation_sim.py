"""256 simulated peers train one run while 10 % of them churn per simulated minute (crashes, leaves,
joins); once churn stops every running peer agrees on one configuration made of exactly the
running peers, and no safety invariant was broken on the way (see ``NegotiationSwarm.violations``).
"""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.protocols.negotiation import NegotiationConfig, OpKind, RunParams
from chaosp2p.sim.negotiation import NegotiationSwarm
from chaosp2p.sim.network import LinkProfile

PEERS = 256
CHURN_PER_MINUTE = 0.10
CHURN_MINUTES = 2.0


@pytest.mark.timeout(300)
def test_256_peers_with_10_percent_churn_per_minute_converge() -> None:
    config = dataclasses.replace(NegotiationConfig.lan(), sync_interval_s=2.0)
    swarm = NegotiationSwarm(
        config=config,
        seed=7,
        params=RunParams(global_batch=4096),
        link=LinkProfile(latency_s=0.001, jitter_s=0.001),
        step_time_s=0.5,
        detect_delay_s=(0.5, 2.0),
    )
    swarm.found()
    swarm.grow(PEERS - 1, spacing_s=0.002)
    assert swarm.run_until(swarm.converged, timeout_s=60.0, step_s=0.5) is not None
    formed = swarm.agreed()
    assert formed is not None and len(formed) == PEERS

    events = int(PEERS * CHURN_PER_MINUTE * CHURN_MINUTES)
    gap_s = CHURN_MINUTES * 60.0 / events
    start = swarm.net.now
    crashed = left = 0
    for i in range(events):
        members = [p for p in swarm.members() if not swarm.peers[p].leaving]
        victim = swarm.random.choice(members)
        if i % 3 == 2:
            swarm.leave(victim)
            left += 1
        else:
            swarm.crash(victim)
            crashed += 1
        swarm.spawn()  # a newcomer replaces it
        swarm.run_for(gap_s)

    took = swarm.run_until(swarm.converged, timeout_s=60.0, step_s=0.5)
    assert took is not None
    final = swarm.agreed()
    assert final is not None
    running = set(swarm.running())
    assert set(final.peers) == running and len(running) == PEERS
    assert swarm.violations() == []
    # Every crash and leave was committed, and training kept going through the churn.
    fails = {e.subject for _, _, e in swarm.op_events if e.kind is OpKind.FAIL and e.applied}
    leaves = {e.subject for _, _, e in swarm.op_events if e.kind is OpKind.LEAVE and e.applied}
    assert len(fails) >= crashed and len(leaves) == left
    steps = [c for c in swarm.completions if c[3] > start]
    assert max(k for _, k, _, _ in steps) > CHURN_MINUTES * 60.0 / swarm.step_time_s / 4


def test_a_newcomer_that_downloads_state_first_trains_once_the_download_ends() -> None:
    """With ``download_s`` the newcomer is admitted, fetches state for that long, then must begin its
    admission step by itself (no negotiation event follows to wake it): else every member, waiting
    for it in that synchronous step, stalls for good."""
    swarm = NegotiationSwarm(
        config=NegotiationConfig.lan(),
        seed=11,
        link=LinkProfile(latency_s=0.001, jitter_s=0.0),
        step_time_s=0.2,
        download_s=3.0,
    )
    swarm.preform(4)
    swarm.run_for(1.0)
    newcomer = swarm.spawn()
    assert swarm.run_until(swarm.converged, timeout_s=30.0, step_s=0.2) is not None
    swarm.run_for(5.0)
    done = [(k, at) for peer, k, _, at in swarm.completions if peer == newcomer]
    assert len(done) >= 5, f"the newcomer completed {len(done)} steps"
    assert swarm.violations() == []
