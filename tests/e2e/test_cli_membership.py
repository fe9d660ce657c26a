"""End to end: five real peers detect a crashed and a stalled peer, and a restarted peer rejoins."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from .processes import Swarm, status, swarm, wait_until

__all__ = ["swarm"]


def member_states(addr: str) -> dict[str, str]:
    return {m["peer_id"]: m["state"] for m in status(addr)["members"]}


def test_kill_and_sigstop_are_reported_failed_and_a_restarted_peer_rejoins(swarm: Swarm, tmp_path: Path) -> None:
    first = swarm.start()
    identity = tmp_path / "victim.key"
    others = [swarm.start(bootstrap=[first.addr]) for _ in range(2)]
    killed = swarm.start(bootstrap=[first.addr], identity=identity)
    stalled = swarm.start(bootstrap=[first.addr])
    everyone = [first, *others, killed, stalled]
    ids = {p.peer_id for p in everyone}
    for peer in everyone:
        wait_until(lambda peer=peer: {k for k, v in member_states(peer.addr).items() if v == "alive"} == ids,
                   timeout_s=20, what=f"{peer.peer_id} to see all five members alive")

    killed.signal(signal.SIGKILL)
    stalled.signal(signal.SIGSTOP)
    started = time.monotonic()
    survivors = [first, *others]

    def both_failed() -> bool:
        views = [member_states(p.addr) for p in survivors]
        return all(v.get(killed.peer_id) == "failed" and v.get(stalled.peer_id) == "failed" for v in views)

    wait_until(both_failed, timeout_s=15, what="all three survivors to report both peers failed")
    print(f"both reported failed by all survivors after {time.monotonic() - started:.2f} s (polling included)")
    for survivor in survivors:
        assert "member failed" in survivor.log()

    stalled.signal(signal.SIGCONT)  # a stalled peer that wakes up refutes and is alive again
    restarted = swarm.start(bootstrap=[first.addr], identity=identity)
    assert restarted.peer_id == killed.peer_id
    for survivor in survivors:
        wait_until(
            lambda s=survivor: (v := member_states(s.addr)).get(killed.peer_id) == "alive"
            and v.get(stalled.peer_id) == "alive",
            timeout_s=20,
            what=f"{survivor.peer_id} to see the restarted and the resumed peer alive again",
        )
    # Both came back by out-voting the "failed" verdict with a higher incarnation.
    view = {m["peer_id"]: m for m in status(first.addr)["members"]}
    assert view[killed.peer_id]["incarnation"] >= 1
    assert view[stalled.peer_id]["incarnation"] >= 1
