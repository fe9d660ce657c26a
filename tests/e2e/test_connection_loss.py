"""End to end (issue 19): a killed peer's kernel closes its connections; the survivors check it at
once and fail it on that first-hand evidence, on the ``lan`` profile's timers (probe 1 s,
suspicion 4 s), without waiting for a probe or a suspicion to run out. No timing is asserted: the
survivors' logs say which path failed it."""

from __future__ import annotations

import signal

import pytest

from .processes import Swarm, status, swarm, wait_until

__all__ = ["swarm"]

LAN = ("peer", "--listen", "/ip4/127.0.0.1/tcp/0", "--profile", "lan")


def member_states(addr: str) -> dict[str, str]:
    return {m["peer_id"]: m["state"] for m in status(addr)["members"]}


@pytest.mark.timeout(300)
def test_kill_9_is_failed_by_every_survivor_on_its_closed_connections(swarm: Swarm) -> None:
    first = swarm.start(command=LAN)
    others = [swarm.start(bootstrap=[first.addr], command=LAN) for _ in range(3)]
    everyone = [first, *others]
    ids = {p.peer_id for p in everyone}
    for peer in everyone:
        wait_until(
            lambda peer=peer: {k for k, v in member_states(peer.addr).items() if v == "alive"} == ids,
            timeout_s=90,
            what=f"{peer.peer_id} to see all four members alive",
        )
    victim = others[-1]
    survivors = everyone[:-1]
    victim.signal(signal.SIGKILL)
    wait_until(
        lambda: all(member_states(p.addr).get(victim.peer_id) == "failed" for p in survivors),
        timeout_s=90,
        what="every survivor to report the killed peer failed",
    )
    for survivor in survivors:
        log = survivor.log()
        assert f"connection to {victim.peer_id} closed by its host" in log
        assert f"member failed: {victim.peer_id} (its host closed our connection" in log
    # Nobody else was failed on the way.
    for survivor in survivors:
        states = member_states(survivor.addr)
        assert all(states[p.peer_id] == "alive" for p in survivors)
