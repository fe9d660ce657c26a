"""Bandwidth probes and state pulls on real connections: probes never share a link with a transfer,
and a pull is planned with the download direction's estimate (issue 24)."""

from __future__ import annotations

import dataclasses

import anyio
import numpy as np
import pytest

from chaosp2p import PeerConfig, SnapshotStore, open_peer
from chaosp2p.protocols.membership import LinkDirection
from chaosp2p.protocols.transfer import TransferProgress

from ..conditions import all_see_alive, eventually

pytestmark = pytest.mark.anyio


def capped(bytes_per_s: float) -> PeerConfig:
    config = PeerConfig.local()
    return config.replace(transport=dataclasses.replace(config.transport, max_upload_bytes_per_s=bytes_per_s))


async def test_a_pull_pauses_the_probes_on_both_sides_and_measures_the_download_direction() -> None:
    async with (
        open_peer(PeerConfig.local()) as source,
        open_peer(PeerConfig.local(bootstrap=(str(source.addrs[0]),))) as newcomer,
    ):
        await eventually(lambda: all_see_alive([source, newcomer], 2))
        store = SnapshotStore(source.config.transfer)
        store.publish("run", 1, {"w": np.arange(8 << 20, dtype=np.float32)})
        await source.serve_state(store, runs=["run"])
        await source.state.wait_announced("run")
        # The newcomer's probe of the source measured its own upload: not what a pull gets.
        newcomer.membership.record_transfer(source.peer_id, 64 << 20, 0.01, LinkDirection.SEND)
        assert newcomer.link_estimate(source.peer_id)[0] is None
        (found,) = await newcomer.state.find_sources("run", limit=4)
        assert found.bytes_per_s is None  # the pull measures the link rather than trust that
        # A fresh (and absurdly low) upload estimate at the source: what serving measures moves it.
        source.membership.record_transfer(newcomer.peer_id, 1 << 20, 1000.0, LinkDirection.SEND)
        paused: list[tuple[bool, bool]] = []

        def during(progress: TransferProgress) -> None:
            if progress.bytes_done < progress.bytes_total:
                paused.append((newcomer.membership.machine.probes_paused, source.membership.machine.probes_paused))

        loaded = await newcomer.load_state("run", sources=[str(source.addrs[0])], progress=during)
        assert paused and all(p == (True, True) for p in paused)
        assert not newcomer.membership.machine.probes_paused
        await eventually(lambda: not source.membership.machine.probes_paused)  # its stream ended
        # The pull measured the download direction, and the planner is told that next time.
        (count,) = [n for _, n in loaded.completed.bytes_by_source]
        measured = count / loaded.completed.elapsed_s
        assert newcomer.link_estimate(source.peer_id)[0] == pytest.approx(measured)
        received, _ = newcomer.membership.link_estimate(source.peer_id, LinkDirection.RECEIVE)
        assert received == pytest.approx(measured)
        (again,) = await newcomer.state.find_sources("run", limit=4)
        assert again.bytes_per_s == pytest.approx(measured)
        served = source.membership.machine._members[newcomer.peer_id].bandwidth
        assert served is not None and served > 1000 * (1 << 20) / 1000.0


async def test_a_transfer_abandons_the_probes_in_flight_and_refuses_new_ones() -> None:
    # A 2 MB/s uplink: an 8 MiB probe would take 4 s, all of it competing with the transfer.
    async with (
        open_peer(capped(2e6)) as prober,
        open_peer(PeerConfig.local(bootstrap=(str(prober.addrs[0]),))) as other,
    ):
        await eventually(lambda: all_see_alive([prober, other], 2))
        service = prober.membership
        done = anyio.Event()

        async def probe() -> None:
            await service._probe(other.peer_id, 8 << 20)
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            await eventually(lambda: bool(service._probe_scopes))
            with service.bulk_transfer():
                with anyio.fail_after(2):
                    await done.wait()  # abandoned at once, not 4 s later
                assert service.link_estimate(other.peer_id)[0] is None  # nothing recorded
                # And a probe to a peer busy with a transfer is refused at once.
                with other.membership.bulk_transfer():
                    with anyio.fail_after(2):
                        await other.membership._probe(prober.peer_id, 1 << 20)
                assert other.link_estimate(prober.peer_id)[0] is None
