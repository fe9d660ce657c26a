"""An idle membership machine wakes up about once per probe interval (issue 23): heartbeats share
the SWIM probe's tick, the timeouts of answered pings are not waited for, and the gossip tick stops
while there is no news (queued news restarts it on its old grid). Virtual time: exact counts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaosp2p.protocols.membership import MembershipConfig
from chaosp2p.sim.membership import MembershipSwarm
from chaosp2p.wire.identity import PeerID

PEERS = 8


def _count_wakeups(swarm: MembershipSwarm) -> Counter[int]:
    woken: Counter[int] = Counter()
    for peer in swarm.peers.values():
        machine = peer.machine
        handle = machine.handle_timeout

        def counted(now: float, handle: Any = handle, index: int = peer.index) -> None:
            woken[index] += 1
            handle(now)

        machine.handle_timeout = counted  # type: ignore[method-assign]
    return woken


def test_an_idle_lan_peer_wakes_about_once_per_probe_interval() -> None:
    config = MembershipConfig.lan()
    swarm = MembershipSwarm(config=config, seed=11)
    swarm.grow(PEERS)
    assert swarm.run_until(swarm.converged, timeout_s=60, step_s=1.0) is not None
    swarm.net.run_for(60.0)  # the gossip of the joins dies down
    woken = _count_wakeups(swarm)
    sent = swarm.net.stats.sent
    seconds = 60.0
    swarm.net.run_for(seconds)
    per_peer_s = sum(woken.values()) / PEERS / seconds
    # One tick per second for probe + heartbeats, plus the slow timers (links and info every 5 s,
    # sweep and reconnect every 10 s, push-pull every 30 s): ~1.6. Before: ~9.6 (a gossip tick
    # every 0.2 s, separate probe and heartbeat ticks, a wake-up per answered ping's timeout).
    assert per_peer_s <= 2.0, per_peer_s
    # The heartbeats themselves still flow: every link PINGed and ACKed each second.
    links = sum(len(p.machine.links()) for p in swarm.peers.values())
    assert swarm.net.stats.sent - sent >= 2 * links * seconds * 0.9
    assert swarm.false_suspicions() == 0


def test_a_probe_of_a_links_peer_stands_for_that_links_heartbeat() -> None:
    """The probe and the heartbeats share a tick; a member that is both probed and linked gets one
    PING in that tick, not two, and its link's timeouts are counted as before (links stay up)."""
    config = MembershipConfig.lan()
    swarm = MembershipSwarm(config=config, seed=12, record=True)
    swarm.grow(PEERS)
    assert swarm.run_until(swarm.converged, timeout_s=60, step_s=1.0) is not None
    swarm.net.run_for(30.0)
    start = swarm.net.now
    swarm.net.run_for(30.0)
    pings: Counter[tuple[float, PeerID, PeerID]] = Counter(
        (d.at, d.sender, d.receiver)
        for d in swarm.net.deliveries
        if d.at >= start and type(d.message).__name__ == "Ping"
    )
    assert pings and max(pings.values()) == 1, [k for k, v in pings.items() if v > 1][:3]
    assert all(link.up for p in swarm.peers.values() for link in p.machine.links())
    assert swarm.false_suspicions() == 0
