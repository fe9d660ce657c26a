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
from chaosp2p.sim.dht import ChurnReport, DHTSimCluster, run_churn_scenario

SIM_CONFIG = dataclasses.replace(
    DHTConfig.local(),
    request_timeout_s=0.5,
    republish_interval_s=20.0,
    refresh_interval_s=600.0,  # the scenario is shorter; bootstrap self-lookups fill the tables
)


def test_get_success_above_99_percent_with_10_percent_churn_on_256_peers() -> None:
    report = run_churn_scenario(seed=2505, size=256, churn_fraction=0.10, stored=100, duration_s=60.0,
                                config=SIM_CONFIG)
    assert (report.crashed, report.joined, report.peers) == (26, 26, 256)
    assert report.gets == 26 * 4 + 100
    assert report.incomplete == 0 and report.wrong_values == 0
    assert report.success_rate >= 0.99, report
    assert report.mean_hops <= 4.0, report


def test_same_seed_same_run() -> None:
    def run(seed: int) -> ChurnReport:
        return run_churn_scenario(seed=seed, size=64, churn_fraction=0.10, stored=20, duration_s=10.0,
                                  config=SIM_CONFIG)

    first = run(77)
    assert run(77) == first
    assert run(78).messages != first.messages


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
