"""Dial-back reachability, the pure pieces: the server's gate (only the requester's own observed
IP, rate per requester, dials at once) and the requester's machine (schedule, classification)."""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.errors import LocalProtocolError
from chaosp2p.protocols.reachability import (
    CheckState,
    DialBackCode,
    DialBackGate,
    DialResponse,
    Reachability,
    ReachabilityConfig,
    ReachabilityMachine,
    answer,
    eligible_addrs,
)
from chaosp2p.runtime.announced_addrs import MAX_EXTERNAL_ADDRS, AnnouncedAddrs
from chaosp2p.wire.identity import Identity

A, B, C, D = (Identity.from_seed(bytes([seed]) * 32).peer_id for seed in (1, 2, 3, 4))
CONFIG = ReachabilityConfig(
    probe_peers=3,
    min_confirmations=2,
    first_probe_delay_s=1.0,
    probe_interval_s=100.0,
    retry_interval_s=5.0,
    requests_per_peer_per_s=0.1,
    request_burst=2,
    max_concurrent_dials=2,
    max_dials_per_request=2,
)
OK = answer(DialBackCode.OK, addr="/ip4/198.18.0.11/tcp/4001")
FAILED = answer(DialBackCode.DIAL_FAILED, "no answer")


# ------------------------------------------------------------------ gate
def test_a_request_naming_a_third_party_address_is_refused() -> None:
    gate = DialBackGate(CONFIG)
    result = gate.admit(A, "198.18.0.11", ["/ip4/198.18.0.99/tcp/4001", "/ip4/10.0.0.1/tcp/22"], now=0.0)
    assert isinstance(result, DialResponse)
    assert result.code == DialBackCode.BAD_REQUEST
    assert "198.18.0.11" in result.reason
    assert gate.statistics().refused_address == 1
    assert gate.statistics().active == 0


def test_only_the_addresses_at_the_observed_ip_are_dialed() -> None:
    gate = DialBackGate(CONFIG)
    result = gate.admit(
        A,
        "198.18.0.11",
        [
            "/ip4/10.0.0.1/tcp/4001",
            f"/ip4/198.18.0.11/tcp/4001/p2p/{A}",
            "/ip4/198.18.0.11/tcp/4001",
            "/ip4/198.18.0.11/tcp/5",
        ],
        now=0.0,
    )
    assert isinstance(result, list)
    assert [str(a) for a in result] == ["/ip4/198.18.0.11/tcp/4001", "/ip4/198.18.0.11/tcp/5"]
    assert gate.statistics().active == 1
    gate.release()
    assert gate.statistics().active == 0


@pytest.mark.parametrize(
    "addr",
    [
        "/ip4/198.18.0.11/tcp/0",  # port 0
        f"/ip4/198.18.0.11/tcp/4001/p2p/{B}",  # names another peer
        "/dns/example.org/tcp/4001",  # a name: could resolve anywhere
        "/ip4/198.18.0.11/udp/4001",  # not TCP
        "garbage",
        "/ip6/::ffff:198.18.0.11/tcp/4001",  # another spelling is another address
    ],
)
def test_ineligible_addresses_are_skipped(addr: str) -> None:
    assert eligible_addrs(A, "198.18.0.11", [addr]) == []


def test_ipv6_addresses_compare_as_addresses() -> None:
    assert [str(a) for a in eligible_addrs(A, "2001:db8::1", ["/ip6/2001:db8:0::1/tcp/4001"])] == [
        "/ip6/2001:db8:0::1/tcp/4001"
    ]


def test_requests_beyond_the_burst_are_refused_per_requester() -> None:
    gate = DialBackGate(CONFIG)
    addrs = ["/ip4/198.18.0.11/tcp/4001"]
    for _ in range(2):
        assert isinstance(gate.admit(A, "198.18.0.11", addrs, now=0.0), list)
        gate.release()
    refused = gate.admit(A, "198.18.0.11", addrs, now=0.0)
    assert isinstance(refused, DialResponse) and refused.code == DialBackCode.REFUSED
    assert isinstance(gate.admit(B, "198.18.0.12", ["/ip4/198.18.0.12/tcp/1"], now=0.0), list)  # B has its own
    gate.release()
    assert isinstance(gate.admit(A, "198.18.0.11", addrs, now=10.0), list)  # refilled: 0.1/s
    assert gate.statistics().refused_rate == 1


def test_dial_backs_under_way_are_capped() -> None:
    gate = DialBackGate(CONFIG)
    assert isinstance(gate.admit(A, "198.18.0.11", ["/ip4/198.18.0.11/tcp/1"], now=0.0), list)
    assert isinstance(gate.admit(B, "198.18.0.12", ["/ip4/198.18.0.12/tcp/1"], now=0.0), list)
    busy = gate.admit(C, "198.18.0.13", ["/ip4/198.18.0.13/tcp/1"], now=0.0)
    assert isinstance(busy, DialResponse) and busy.code == DialBackCode.REFUSED
    assert gate.statistics().refused_busy == 1


def test_a_server_that_does_not_serve_says_so() -> None:
    gate = DialBackGate(ReachabilityConfig(serve=False))
    result = gate.admit(A, "198.18.0.11", ["/ip4/198.18.0.11/tcp/1"], now=0.0)
    assert isinstance(result, DialResponse) and result.code == DialBackCode.DISABLED


def test_at_most_max_dials_per_request_addresses_are_dialed() -> None:
    addrs = [f"/ip4/198.18.0.11/tcp/{port}" for port in range(1, 6)]
    result = DialBackGate(CONFIG).admit(A, "198.18.0.11", addrs, now=0.0)
    assert isinstance(result, list) and len(result) == CONFIG.max_dials_per_request


# ------------------------------------------------------------------ machine
def test_the_first_check_waits_for_its_delay_and_asks_up_to_probe_peers() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    assert machine.next_deadline() == 1.0
    assert machine.handle_timeout(0.5, [A, B]) == []
    asked = machine.handle_timeout(1.0, [D, C, B, A])
    assert len(asked) == 3 and machine.state is CheckState.CHECKING
    assert machine.next_deadline() is None


def test_a_check_with_nobody_to_ask_is_retried_soon() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    assert machine.handle_timeout(1.0, []) == []
    assert machine.next_deadline() == 1.0 + CONFIG.retry_interval_s
    assert machine.reachability is Reachability.UNKNOWN


def test_two_agreeing_answers_make_a_peer_public_or_private() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    machine.start_check(0.0, [A, B, C])
    machine.record(A, OK, 0.1)
    assert machine.reachability is Reachability.UNKNOWN  # one answer of two needed
    machine.record(B, OK, 0.2)
    assert machine.reachability is Reachability.PUBLIC
    assert machine.confirmed_addrs() == ["/ip4/198.18.0.11/tcp/4001"]
    machine.record(C, None, 0.3)
    assert machine.state is CheckState.IDLE
    assert machine.next_deadline() == pytest.approx(0.3 + CONFIG.probe_interval_s)

    private = ReachabilityMachine(CONFIG, now=0.0)
    private.start_check(0.0, [A, B])
    private.record(A, FAILED, 0.1)
    private.record(B, FAILED, 0.1)
    assert private.reachability is Reachability.PRIVATE


def test_one_reached_answer_keeps_failures_from_calling_a_peer_private() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    machine.start_check(0.0, [A, B, C])
    for server, response in ((A, FAILED), (B, FAILED), (C, OK)):
        machine.record(server, response, 0.1)
    assert machine.reachability is Reachability.UNKNOWN


def test_with_one_peer_to_ask_its_answer_decides() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    machine.start_check(0.0, [A])
    assert machine.needed == 1
    machine.record(A, FAILED, 0.1)
    assert machine.reachability is Reachability.PRIVATE


def test_refusals_and_silence_say_nothing_and_bring_a_retry() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    machine.start_check(0.0, [A, B])
    machine.record(A, answer(DialBackCode.REFUSED, "rate limit"), 0.1)
    machine.record(B, answer(DialBackCode.BAD_REQUEST, "no address"), 0.2)
    assert machine.reachability is Reachability.UNKNOWN and machine.answers() == []
    assert machine.next_deadline() == pytest.approx(0.2 + CONFIG.retry_interval_s)


def test_a_server_counts_once_with_its_newest_answer() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    for at, response in ((0.0, OK), (10.0, FAILED)):
        machine.start_check(at, [A])
        machine.record(A, response, at)
    assert len(machine.answers()) == 1 and not machine.answers()[0].reached


def test_the_peers_asked_longest_ago_are_asked_first() -> None:
    machine = ReachabilityMachine(dataclasses.replace(CONFIG, probe_peers=2), now=0.0)
    first = machine.start_check(0.0, [A, B, C, D])
    for server in first:
        machine.record(server, OK, 0.0)
    second = machine.start_check(1.0, [A, B, C, D])
    assert len(second) == 2 and not set(first) & set(second)


def test_an_answer_nobody_asked_for_and_a_second_check_at_once_are_errors() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    with pytest.raises(LocalProtocolError):
        machine.record(A, OK, 0.0)
    machine.start_check(0.0, [A])
    with pytest.raises(LocalProtocolError):
        machine.start_check(0.0, [B])


def test_background_checks_off_means_no_deadline() -> None:
    assert ReachabilityMachine(ReachabilityConfig.local(), now=0.0).next_deadline() is None
    assert ReachabilityMachine(ReachabilityConfig.lan(), now=0.0).next_deadline() == 2.0


def test_an_address_is_working_only_once_min_confirmations_servers_reached_it() -> None:
    machine = ReachabilityMachine(CONFIG, now=0.0)
    machine.start_check(0.0, [A, B, C])
    machine.record(A, OK, 0.1)
    other = answer(DialBackCode.OK, addr="/ip4/198.18.0.99/tcp/4001")  # a server naming another IP
    machine.record(B, other, 0.2)
    assert set(machine.confirmed_addrs()) == {str(OK.addr), str(other.addr)}
    assert machine.working_addrs() == []  # each address has one server's word only
    machine.record(C, OK, 0.3)
    assert machine.working_addrs() == [OK.addr]


def test_announced_addresses_put_proven_ones_first_and_announce_only_on_a_change() -> None:
    working: list[str] = []
    announced: list[list[str]] = []
    listen = ["/ip4/198.19.1.10/tcp/4001"]
    addrs = AnnouncedAddrs(lambda: listen, lambda: working, announced.append, max_addrs=8)
    assert not addrs.refresh() and announced == []  # nothing proven: the listen addresses stand
    working[:] = [*listen, "/ip4/198.18.0.11/tcp/4001"]  # a listen address proven is not "external"
    assert addrs.refresh()
    assert announced == [["/ip4/198.18.0.11/tcp/4001", *listen]]
    assert not addrs.refresh()  # unchanged: no new incarnation
    working[:] = [f"/ip4/198.18.0.{i}/tcp/4001" for i in range(20, 25)]
    assert addrs.refresh() and announced[-1] == [*working[:MAX_EXTERNAL_ADDRS], *listen]
    working.clear()  # no longer proven (the check found us private): back to the listen addresses
    assert addrs.refresh() and announced[-1] == listen and addrs.external == []
