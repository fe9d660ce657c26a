"""The ``relay_addrs`` of a status report's ``reachability`` (appended; capped like its ``addrs``)."""

from __future__ import annotations

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.runtime.status import MAX_STATUS_ENTRIES, STATUS_CODEC, ReachabilityInfo, StatusReport


def report(info: ReachabilityInfo) -> StatusReport:
    return StatusReport(peer_id="p", addrs=(), agent="a", uptime_s=1.0, connections=(), reachability=info)


def test_relay_addrs_are_shown_and_an_older_report_decodes_without_them() -> None:
    info = ReachabilityInfo(status="private", relay_addrs=("/ip4/198.18.0.1/tcp/1/p2p/R/p2p-circuit/p2p/B",))
    assert report(info).to_json()["reachability"]["relay_addrs"] == list(info.relay_addrs)
    wire = STATUS_CODEC.to_obj(report(info))
    older = [*wire[:-1], wire[-1][:5]]  # a peer before relay addresses: five reachability fields
    decoded = STATUS_CODEC.from_obj(older)
    assert isinstance(decoded, StatusReport) and decoded.reachability is not None
    assert decoded.reachability.relay_addrs == ()


def test_too_many_relay_addrs_are_refused() -> None:
    info = ReachabilityInfo(status="private", relay_addrs=("x",) * (MAX_STATUS_ENTRIES + 1))
    with pytest.raises(RemoteProtocolError, match="reachability addrs"):
        STATUS_CODEC.from_obj(STATUS_CODEC.to_obj(report(info)))
