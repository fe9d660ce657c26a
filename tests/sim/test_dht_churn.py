"""The DHT on a simulated network of 256+ peers: gets under churn, determinism, providers."""

from __future__ import annotations

import dataclasses
import random

from chaosp2p.dht import (
    DHTConfig,
    GetProvidersResult,
    GetResult,
    StoreResult,
    signed_key,
    state_provider_key,
)
from chaosp2p.dht.simcluster import DHTSimCluster
from chaosp2p.wire.identity import PeerID

SIM_CONFIG = dataclasses.replace(
    DHTConfig.local(),
    request_timeout_s=0.5,
    republish_interval_s=20.0,
    refresh_interval_s=600.0,  # the scenario is shorter; bootstrap self-lookups fill the tables
)


def store_keys(cluster: DHTSimCluster, count: int, rng: random.Random) -> dict[bytes, bytes]:
    """Store ``count`` keys (half signed by their writer) from random peers; return key -> value."""
    ops: list[tuple[PeerID, int]] = []
    expected: dict[bytes, bytes] = {}
    peers = cluster.alive()
    for i in range(count):
        writer = rng.choice(peers)
        machine = cluster.machines[writer]
        key = signed_key(writer, f"k{i}") if i % 2 else b"plain/%d" % i
        value = b"value-%d-" % i + bytes(rng.getrandbits(8) for _ in range(32))
        expected[key] = value
        ops.append((writer, cluster.call(writer, lambda now, k=key, v=value, m=machine: m.start_store(now, k, v))))
    results = cluster.wait_all(ops)
    for result in results:
        assert isinstance(result, StoreResult) and result.accepted >= 15, result
    return expected


def churn_scenario(seed: int, size: int, *, churn_fraction: float, stored: int, duration_s: float) -> dict[str, float]:
    rng = random.Random(seed)
    cluster = DHTSimCluster(seed=seed, config=SIM_CONFIG)
    cluster.build(size, refresh=False)
    expected = store_keys(cluster, stored, rng)
    keys = sorted(expected)

    churn_events = round(size * churn_fraction)
    step_s = duration_s / churn_events
    get_ops: list[tuple[PeerID, int, bytes]] = []

    def random_get() -> None:
        reader = rng.choice(cluster.alive())
        key = rng.choice(keys)
        machine = cluster.machines[reader]
        get_ops.append((reader, cluster.call(reader, lambda now: machine.start_get(now, key)), key))

    # Churn: each step one random peer crashes and one newcomer joins, with gets in between.
    for _ in range(churn_events):
        cluster.crash(rng.choice(cluster.alive()))
        cluster.join()
        for _ in range(4):
            random_get()
            cluster.sim.run_for(step_s / 4)
    # After the churn, every key is read from a random survivor.
    for key in keys:
        reader = rng.choice(cluster.alive())
        machine = cluster.machines[reader]
        get_ops.append((reader, cluster.call(reader, lambda now, m=machine, k=key: m.start_get(now, k)), key))
    results = cluster.wait_all([(peer, op) for peer, op, _ in get_ops], timeout_s=30.0)

    ok = 0
    hops: list[int] = []
    for (_, _, key), result in zip(get_ops, results, strict=True):
        assert isinstance(result, GetResult), "every get must complete"
        if result.value == expected[key]:
            ok += 1
            hops.append(result.stats.hops)
        else:
            assert result.value is None, "a get may miss, but must never return a wrong value"
    crashed_originals = len(cluster.crashed)
    return {
        "gets": len(get_ops),
        "success": ok / len(get_ops),
        "mean_hops": sum(hops) / max(1, len(hops)),
        "crashed": crashed_originals,
        "messages": cluster.sim.stats.sent,
        "peers": len(cluster.alive()),
    }


def test_get_success_above_99_percent_with_10_percent_churn_on_256_peers() -> None:
    report = churn_scenario(seed=2505, size=256, churn_fraction=0.10, stored=100, duration_s=60.0)
    assert report["crashed"] == 26 and report["peers"] == 256
    assert report["gets"] == 26 * 4 + 100
    assert report["success"] >= 0.99, report
    assert report["mean_hops"] <= 4.0, report


def test_same_seed_same_run() -> None:
    first = churn_scenario(seed=77, size=64, churn_fraction=0.10, stored=20, duration_s=10.0)
    second = churn_scenario(seed=77, size=64, churn_fraction=0.10, stored=20, duration_s=10.0)
    assert first == second
    third = churn_scenario(seed=78, size=64, churn_fraction=0.10, stored=20, duration_s=10.0)
    assert third["messages"] != first["messages"]


def test_records_outlive_every_original_holder() -> None:
    """Crash the writer and all k peers that first held a record: republishing moved it on."""
    rng = random.Random(5)
    cluster = DHTSimCluster(seed=5, config=SIM_CONFIG)
    cluster.build(128, refresh=False)
    writer = cluster.alive()[10]
    key = signed_key(writer, "checkpoint")
    machine = cluster.machines[writer]
    op = cluster.call(writer, lambda now: machine.start_store(now, key, b"v7", ttl_s=600.0))
    assert isinstance(cluster.wait(writer, op), StoreResult)
    original_holders = [p for p in cluster.alive() if cluster.machines[p].held_record(cluster.sim.now, key)]
    assert len(original_holders) >= 20
    # Crash the holders a few at a time, with republish intervals in between, plus the writer.
    cluster.crash(writer)
    for index in range(0, len(original_holders), 5):
        for peer in original_holders[index : index + 5]:
            if peer not in cluster.crashed:
                cluster.crash(peer)
        cluster.join()
        cluster.sim.run_for(SIM_CONFIG.republish_interval_s)
    reader = rng.choice(cluster.alive())
    reader_machine = cluster.machines[reader]
    op = cluster.call(reader, lambda now: reader_machine.start_get(now, key))
    result = cluster.wait(reader, op)
    assert isinstance(result, GetResult) and result.value == b"v7"
    assert result.record is not None and result.record.publisher == writer


def test_state_providers_found_by_a_newcomer() -> None:
    cluster = DHTSimCluster(seed=11, config=SIM_CONFIG)
    cluster.build(256, refresh=False)
    key = state_provider_key("run-42", 1000)
    providers = cluster.alive()[20:26]
    ops = []
    for peer in providers:
        machine = cluster.machines[peer]
        ops.append((peer, cluster.call(peer, lambda now, m=machine: m.start_add_provider(now, key, ttl_s=300.0))))
    assert all(r is not None and r.ok for r in cluster.wait_all(ops))
    newcomer, boot = cluster.join()
    assert cluster.wait(newcomer.peer_id, boot) is not None
    op = cluster.call(newcomer.peer_id, lambda now: newcomer.start_get_providers(now, key))
    result = cluster.wait(newcomer.peer_id, op)
    assert isinstance(result, GetProvidersResult)
    assert {p.provider for p in result.providers} == set(providers)
    assert all(p.addrs == cluster.machines[p.provider].listen_addrs for p in result.providers)
