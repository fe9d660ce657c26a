"""End to end: real ``chaosp2p peer`` processes on 127.0.0.1, driven through the CLI."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from chaosp2p.transport.keyfile import write_swarm_key

from .processes import Swarm, cli, status, swarm, wait_until

__all__ = ["swarm"]


def connected_ids(addr: str) -> set[str]:
    return {c["peer_id"] for c in status(addr)["connections"]}


def test_three_peers_bootstrapped_from_one_another_see_each_other(swarm: Swarm) -> None:
    a = swarm.start()
    b = swarm.start(bootstrap=[a.addr])
    c = swarm.start(bootstrap=[a.addr, b.addr])
    wait_until(lambda: {b.peer_id, c.peer_id} <= connected_ids(a.addr), timeout_s=15, what="a to see b and c")
    wait_until(lambda: {a.peer_id, c.peer_id} <= connected_ids(b.addr), timeout_s=15, what="b to see a and c")
    report = status(c.addr)
    assert report["peer_id"] == c.peer_id
    assert report["addrs"] == c.addrs
    assert report["uptime_s"] > 0
    assert report["reachability"]["status"] == "unknown"  # the local profile does not check
    assert {a.peer_id, b.peer_id} <= {conn["peer_id"] for conn in report["connections"]}
    assert "connected" in a.log()  # the peer logs who connects


def test_status_prints_tables(swarm: Swarm) -> None:
    a = swarm.start()
    result = cli("status", a.addr)
    assert result.returncode == 0, result.stderr
    assert a.peer_id in result.stdout and "connections" in result.stdout
    assert "reachability: unknown" in result.stdout


def test_sigterm_shuts_down_cleanly_and_says_goodbye(swarm: Swarm) -> None:
    a = swarm.start()
    b = swarm.start(bootstrap=[a.addr])
    wait_until(lambda: b.peer_id in connected_ids(a.addr), timeout_s=15, what="b to connect")
    started = time.monotonic()
    b.signal(signal.SIGTERM)
    assert b.process.wait(timeout=10) == 0
    elapsed = time.monotonic() - started
    wait_until(
        lambda: "said goodbye" in a.log() or "peer shutting down" in a.log(), timeout_s=10, what="a to log b's goodbye"
    )
    assert "shutting down" in b.log()
    print(f"shutdown took {elapsed:.2f} s")  # reported, not asserted: tests never assert speed


def test_wrong_swarm_key_is_refused_with_a_clear_message(swarm: Swarm, tmp_path: Path) -> None:
    key, other = tmp_path / "swarm.key", tmp_path / "other.key"
    write_swarm_key(key)
    write_swarm_key(other)
    a = swarm.start(extra=["--swarm-key", str(key)])
    member = swarm.start(bootstrap=[a.addr], extra=["--swarm-key", str(key)])
    wait_until(lambda: member.peer_id in connected_ids_with_key(a.addr, key), timeout_s=15, what="member to join")
    outsider = swarm.start(bootstrap=[a.addr], extra=["--swarm-key", str(other)])
    wait_until(lambda: "not in this swarm" in outsider.log(), timeout_s=15, what="the outsider to be refused")
    assert outsider.peer_id not in connected_ids_with_key(a.addr, key)
    refused = cli("status", a.addr, "--swarm-key", str(other))
    assert refused.returncode == 2 and "not in this swarm" in refused.stderr


def connected_ids_with_key(addr: str, key: Path) -> set[str]:
    return {c["peer_id"] for c in status(addr, "--swarm-key", str(key))["connections"]}


def test_dialing_a_wrong_peer_id_is_refused_with_a_clear_message(swarm: Swarm) -> None:
    a = swarm.start()
    impostor_id = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
    wrong = a.addr.rsplit("/p2p/", 1)[0] + "/p2p/" + impostor_id
    result = cli("status", wrong)
    assert result.returncode == 2
    assert f"dialed {impostor_id}" in result.stderr and a.peer_id in result.stderr


def test_identity_file_keeps_the_peer_id_across_restarts(swarm: Swarm, tmp_path: Path) -> None:
    key = tmp_path / "id.key"
    first = swarm.start(identity=key)
    first.stop()
    second = swarm.start(identity=key)
    assert first.peer_id == second.peer_id
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_status_of_an_unreachable_address_fails_clearly() -> None:
    result = cli("status", "/ip4/127.0.0.1/tcp/1", "--timeout", "3")
    assert result.returncode == 2
    assert "cannot connect" in result.stderr or "refused" in result.stderr.lower()


def test_bad_arguments_fail_clearly() -> None:
    result = cli("peer", "--listen", "127.0.0.1:4001")
    assert result.returncode == 2
    assert "invalid multiaddr" in result.stderr


@pytest.mark.timeout(420)
def test_demo_runs_the_main_job_end_to_end() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    result = cli("demo", timeout_s=400)
    assert result.returncode == 0, result.stdout + result.stderr
    for stage in ("1. peer a founds the run", "2. peer d joins", "3. b leaves", "4. what happened"):
        assert stage in result.stdout
    assert "members in parallel" in result.stdout  # a newcomer's multi-source download
    rows = [line.split("│") for line in result.stdout.splitlines() if line.startswith("│")]
    kinds = {row[1].strip() for row in rows if len(row) > 2}
    assert {"join", "leave", "fail"} <= kinds, result.stdout
    text = " ".join(result.stdout.split())  # rich wraps long lines
    assert re.search(r"bit-identical parameters after each of their \d+ common steps \(up to step \d+\): yes", text)


def test_unreachable_bootstrap_peers_are_retried_with_backoff_and_reported(swarm: Swarm) -> None:
    lonely = swarm.start(bootstrap=["/ip4/127.0.0.1/tcp/1"])
    wait_until(
        lambda: lonely.log().count("no bootstrap peer reachable") >= 2,
        timeout_s=20,
        what="two logged bootstrap retries",
    )
    assert "retrying in" in lonely.log()
    assert lonely.process.poll() is None  # still running, still trying
