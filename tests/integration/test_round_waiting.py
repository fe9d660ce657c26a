"""A member waiting on a round says whom it waits for, over which link, for how long (issue 19).

Deliverable 5: the round's wait is logged every ``waiting_log_interval_s`` (not on every poll), and
``status`` (``waiting_for`` of each run, a key added beside the existing ones) shows the same.
"""

from __future__ import annotations

import dataclasses
import logging

import anyio
import numpy as np
import pytest

from chaosp2p import PeerConfig, open_peer
from chaosp2p.errors import RoundAborted
from chaosp2p.protocols.averaging.messages import RoundTag
from chaosp2p.protocols.negotiation import RunParams
from chaosp2p.runtime.status import STATUS_CODEC, RunStatusInfo, StatusReport, WaitingInfo
from chaosp2p.wire.framing import pack, unpack

from ..conditions import eventually

pytestmark = pytest.mark.anyio
RUN = "run"


async def test_a_round_waiting_on_a_silent_member_names_it_in_the_log_and_in_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="chaosp2p.training")
    async with open_peer(PeerConfig.local()) as waiting, open_peer(PeerConfig.local()) as silent:
        await waiting.connect(silent.addrs[0])
        averager = waiting.training.averager
        averager.config = dataclasses.replace(averager.config, waiting_log_interval_s=0.2)
        # The silent member holds our contribution for a round it never starts (it stopped stepping).
        silent.training.averager.expect_run(RUN, lambda peer: True)
        waiting.negotiation.create_run(RUN, RunParams(global_batch=4))
        members = sorted([waiting.peer_id, silent.peer_id])
        tag = RoundTag(run=RUN, epoch=0, config_digest=b"config-0", step=3)
        assert waiting.status_report().to_json()["runs"][0]["waiting_for"] is None  # no round yet
        outcome: list[BaseException] = []

        async def round_() -> None:
            try:
                await averager.all_reduce(
                    tag,
                    np.ones(4096, dtype=np.float32),
                    weight=1.0,
                    max_weights=dict.fromkeys(members, 10.0),
                    members=members,
                    addrs=lambda peer: silent.addrs if peer == silent.peer_id else (),
                    timeout_s=30.0,
                )
            except RoundAborted as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(round_)
            lines = lambda: [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]  # noqa: E731
            await eventually(lambda: len(lines()) >= 2, timeout_s=10)
            report = waiting.status_report().to_json()
            tg.cancel_scope.cancel()

        line = lines()[0]
        assert f"run {RUN!r} step 3 (attempt 0)" in line
        assert f"contributions from {silent.peer_id.short()}" in line
        assert f"results from {silent.peer_id.short()}" in line
        assert f"links {silent.peer_id.short()}~{waiting.peer_id.short()}" in line
        [run] = report["runs"]
        assert {"run", "epoch", "step", "activation_step", "config_digest", "members", "pending"} <= set(run)
        wait = run["waiting_for"]
        assert wait["step"] == 3 and wait["attempt"] == 0 and wait["waited_s"] > 0
        assert wait["what"] == "contributions+results"
        assert wait["peers"] == wait["contributions_from"] == wait["results_from"] == [str(silent.peer_id)]
        assert wait["links"] == [f"{silent.peer_id.short()}~{waiting.peer_id.short()}"]
        assert averager.waiting(RUN) is None  # the round is over


def _report(waiting: WaitingInfo | None) -> StatusReport:
    run = RunStatusInfo(run=RUN, epoch=1, step=3, config_digest="ab", members=("a", "b"), waiting_for=waiting)
    return StatusReport(peer_id="p", addrs=(), agent="x", uptime_s=1.0, connections=(), runs=(run,))


def test_waiting_for_travels_in_the_status_report_and_an_older_peers_report_decodes_without_it() -> None:
    info = WaitingInfo(
        step=3, attempt=1, waited_s=6.25, what="results", peers=("b",), results_from=("b",), links=("b~a",)
    )
    decoded = STATUS_CODEC.from_obj(STATUS_CODEC.to_obj(_report(info)))
    assert decoded.runs[0].waiting_for == info
    assert decoded.to_json()["runs"][0]["waiting_for"] == {
        "step": 3,
        "attempt": 1,
        "waited_s": 6.25,
        "what": "results",
        "peers": ["b"],
        "contributions_from": [],
        "results_from": ["b"],
        "links": ["b~a"],
    }
    # A peer from before the field sends each run without it: it decodes, with nothing waited for.
    wire = unpack(pack(STATUS_CODEC.to_obj(_report(None))), max_bytes=1 << 20)
    run = wire[8][0]  # [type, peer_id, addrs, agent, uptime_s, connections, members, links, runs, reachability]
    assert run[-1] is None
    del run[-1]
    assert STATUS_CODEC.from_obj(wire).runs[0].waiting_for is None
