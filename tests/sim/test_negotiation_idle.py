"""An idle run costs few negotiation messages (issue 23): while nothing changes, each member's SYNC
anti-entropy backs off from ``sync_interval_s`` to ``sync_interval_max_s``; a new configuration
brings it back, so a member that missed a COMMIT after a quiet spell still hears of it within about
``sync_interval_s``. Virtual time, so the counts are exact and nothing here times real work.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaosp2p.protocols.negotiation import NegotiationConfig
from chaosp2p.protocols.negotiation.messages import Sync, SyncReply, SyncRequest
from chaosp2p.sim.negotiation import NegotiationSwarm
from chaosp2p.wire.identity import PeerID

MEMBERS = 8


def _counting(swarm: NegotiationSwarm) -> Counter[str]:
    """Count every message the swarm's machines send, by type."""
    sent: Counter[str] = Counter()
    deliver = swarm.net._schedule_delivery

    def counted(sender: PeerID, receiver: PeerID, protocol: str, message: Any) -> None:
        sent[type(message).__name__] += 1
        deliver(sender, receiver, protocol, message)

    swarm.net._schedule_delivery = counted  # type: ignore[method-assign]
    return sent


def test_an_idle_run_backs_its_syncs_off_to_the_maximum_interval() -> None:
    config = NegotiationConfig.local()
    swarm = NegotiationSwarm(config=config, seed=3)
    swarm.preform(MEMBERS)
    swarm.run_for(10.0)  # longer than the back-off ramp (0.25 -> 2 s)
    sent = _counting(swarm)
    seconds = 20.0
    swarm.run_for(seconds)
    per_member_s = sent["Sync"] / MEMBERS / seconds
    # Up to three SYNCs per round (two ring neighbours and one random member): at the base interval
    # that is ~9-12 per member and second, backed off to 2 s at most 1.5 (and at least one round).
    assert per_member_s <= 3 / (0.75 * config.sync_interval_max_s), sent
    assert sent["Sync"] >= MEMBERS * seconds / (1.25 * config.sync_interval_max_s), sent
    assert set(sent) == {"Sync"}, sent  # nothing else while idle
    assert not swarm.violations()


def test_a_member_that_missed_a_commit_after_a_quiet_spell_hears_of_it_within_the_base_interval() -> None:
    config = NegotiationConfig.local()
    swarm = NegotiationSwarm(config=config, seed=5)
    swarm.preform(MEMBERS)
    swarm.run_for(12.1)  # everyone backed off to sync_interval_max_s
    members = swarm.members()
    deaf, a, b = members[0], members[1], members[2]
    # ``deaf`` receives nothing of the decision itself, only the anti-entropy that must repair it.
    deliver = swarm.net._schedule_delivery

    def lossy(sender: PeerID, receiver: PeerID, protocol: str, message: Any) -> None:
        if receiver == deaf and not isinstance(message, Sync | SyncRequest | SyncReply):
            return
        deliver(sender, receiver, protocol, message)

    swarm.net._schedule_delivery = lossy  # type: ignore[method-assign]
    before = swarm.peers[deaf].machine.configuration(swarm.run)
    assert before is not None
    # A link change: no member leaves (a lame duck keeps syncing at the base rate and would tell).
    swarm.call(a, lambda m, now: m.link_changed(now, a, b, up=True, bandwidth_bytes_per_s=1e9, rtt_s=0.001))
    others = [p for p in members if p != deaf]

    def others_committed() -> bool:
        return all(swarm.peers[p].last_epoch > before.epoch for p in others)

    assert swarm.run_until(others_committed, timeout_s=5.0, step_s=0.005) is not None
    caught_up = swarm.run_until(lambda: swarm.peers[deaf].last_epoch > before.epoch, timeout_s=5.0, step_s=0.005)
    # One base round (x 1.25 jitter) plus a SYNC_REQUEST / SYNC_REPLY round trip; a backed-off
    # member would take up to sync_interval_max_s (2 s).
    assert caught_up is not None and caught_up <= 1.25 * config.sync_interval_s + 0.05, caught_up
    assert not swarm.violations()
