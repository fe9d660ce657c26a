"""Who may read a peer's training runs over ``/chaos/status/1``.

Issue 20, finding 11: ``chaosp2p status`` showed every run and its members to anyone who could
connect. A peer now lists a run only to the run's members and to the observers its ``[status]``
section names, unless it opts in with ``runs_visible_to = "anyone"``.
"""

from __future__ import annotations

import pytest

from chaosp2p import PeerConfig
from chaosp2p.errors import ConfigError
from chaosp2p.protocols.negotiation import RunParams
from chaosp2p.runtime.node import Node, open_node, request_status
from chaosp2p.runtime.status import RunStatusInfo, StatusReport
from chaosp2p.wire.identity import Identity

# StatusConfig and report_for are new with the fix: imported inside the tests that use them, so the
# first test also runs (and fails) against the code before it.

pytestmark = pytest.mark.anyio
RUN = "private-run"


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def _runs_seen(node: Node, identity: Identity | None = None) -> list[str]:
    report = await request_status(node.addrs[0], identity=identity, timeout_s=10)
    assert report.peer_id == str(node.peer_id)  # the rest of the report is there either way
    return [run.run for run in report.runs]


async def test_a_throwaway_identity_sees_no_runs() -> None:
    """Issue 20, finding 11: a throwaway identity saw every run and its members."""
    async with open_node(PeerConfig.local()) as founder:
        founder.negotiation.create_run(RUN, RunParams(global_batch=4))
        assert [run.run for run in founder.status_report().runs] == [RUN]  # the peer itself sees it
        report = await request_status(founder.addrs[0], timeout_s=10)  # `chaosp2p status ADDR`
        assert report.peer_id == str(founder.peer_id) and report.members  # the rest is still there
        assert report.runs == ()


async def test_observers_named_by_the_operator_see_every_run() -> None:
    from chaosp2p.runtime.status import StatusConfig

    operator = Identity.generate()
    status = StatusConfig(observers=(str(operator.peer_id),))
    async with open_node(PeerConfig.local(status=status)) as founder:
        founder.negotiation.create_run(RUN, RunParams(global_batch=4))
        assert await _runs_seen(founder) == []
        assert await _runs_seen(founder, operator) == [RUN]  # `chaosp2p status --identity operator.key`


async def test_a_peer_may_show_its_runs_to_anyone() -> None:
    from chaosp2p.runtime.status import StatusConfig

    async with open_node(PeerConfig.local(status=StatusConfig(runs_visible_to="anyone"))) as founder:
        founder.negotiation.create_run(RUN, RunParams(global_batch=4))
        assert await _runs_seen(founder) == [RUN]


def test_a_member_of_a_run_sees_that_run_and_no_other() -> None:
    from chaosp2p.runtime.status import StatusConfig, report_for

    member, outsider = Identity.generate().peer_id, Identity.generate().peer_id
    report = StatusReport(
        peer_id="x",
        addrs=(),
        agent="a",
        uptime_s=1.0,
        connections=(),
        runs=(
            RunStatusInfo(run="a", epoch=1, step=2, config_digest="d", members=(str(member), str(outsider))),
            RunStatusInfo(run="b", epoch=1, step=2, config_digest="d", members=(str(outsider),)),
        ),
    )
    assert [r.run for r in report_for(report, member, StatusConfig()).runs] == ["a"]
    assert [r.run for r in report_for(report, outsider, StatusConfig()).runs] == ["a", "b"]
    assert report_for(report, Identity.generate().peer_id, StatusConfig()).runs == ()


def test_the_status_section_of_a_profile_is_checked() -> None:
    from chaosp2p.runtime.status import StatusConfig

    observer = str(Identity.generate().peer_id)
    config = PeerConfig.from_mapping({"status": {"runs_visible_to": "members", "observers": [observer]}})
    assert config.status == StatusConfig(observers=(observer,))
    with pytest.raises(ConfigError, match="runs_visible_to"):
        PeerConfig.from_mapping({"status": {"runs_visible_to": "everyone"}})
    with pytest.raises(ConfigError, match="invalid PeerID"):
        PeerConfig.from_mapping({"status": {"observers": ["not-a-peer-id"]}})
