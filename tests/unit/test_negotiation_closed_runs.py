"""Closed runs: who may see a run's configuration and join it (issue 20, "members-only services").

A run whose founder lists the peers it admits (``RunParams.admitted``) answers RUN_INFO, catch-up
and old-epoch Paxos traffic only to them, and every honest member refuses any other JOIN as
invalid (``not_admitted``), so no single member -- sponsor or proposer -- can bring an outsider in.
An open run (no list) behaves as before: anyone may ask and join.
"""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.negotiation import (
    Admitted,
    JoinRefused,
    OperationRejected,
    OpKind,
    RunInfo,
    RunParams,
)
from chaosp2p.protocols.negotiation.configuration_change import check_operation
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Ballot,
    Commit,
    JoinRequest,
    OpsAnnounce,
    Prepare,
    RunInfoReply,
    RunInfoRequest,
    SyncReply,
    SyncRequest,
    Value,
)
from chaosp2p.protocols.negotiation.messages import (
    JoinRefused as JoinRefusedMessage,
)
from chaosp2p.protocols.negotiation.operations import PROTOCOL, Operation, sign_operation
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.framing import pack, unpack
from chaosp2p.wire.identity import Identity, PeerID

from .test_negotiation_machine import RUN
from .test_negotiation_machine import make_net as machine_net

IDS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(6)]
PEERS = [i.peer_id for i in IDS]


def sorted_peers(*peers: PeerID) -> tuple[PeerID, ...]:
    return tuple(sorted(peers, key=lambda p: p.raw))


def make_net(n: int, *, admitted: tuple[PeerID, ...]) -> ManualNet:
    """A run of ``n`` members (PEERS[:n], founded by PEERS[0]) admitting ``admitted`` (the founder is
    added by ``create_run``); PEERS[n:] are other peers on the network."""
    net, peers = machine_net(n, extra=len(PEERS) - n, params=RunParams(global_batch=64, admitted=admitted))
    assert peers == PEERS
    return net


def outsider_join(net: ManualNet) -> Operation:
    """PEERS[5]'s JOIN, signed against the run's configuration."""
    config = net.machines[PEERS[0]].configuration(RUN)
    assert config is not None
    return sign_operation(
        IDS[5],
        kind=OpKind.JOIN,
        run=RUN,
        epoch=config.epoch,
        subject=PEERS[5],
        incarnation=1,
        detected_at=1.0,
        throughput_samples_per_s=1.0,
    )


def ask_run_info(net: ManualNet, asker: PeerID, member: PeerID) -> RunInfoReply:
    """``asker``'s RUN_INFO_REQUEST delivered to ``member``; the one reply it sends back."""
    m = net.machines[member]
    m.receive(net.now, asker, PROTOCOL, RunInfoRequest(run=RUN, request_id=7))
    replies = [msg for o in m.take_outgoing() if o.to == asker for msg in (o.message,)]
    assert len(replies) == 1 and isinstance(replies[0], RunInfoReply)
    return replies[0]


# ------------------------------------------------------------------ the configuration carries the list


def test_a_closed_runs_list_is_part_of_the_agreed_configuration_and_round_trips() -> None:
    net = make_net(3, admitted=sorted_peers(PEERS[1], PEERS[2], PEERS[3]))
    config = net.machines[PEERS[0]].configuration(RUN)
    assert config is not None
    # The founder is listed too (it must be able to rejoin its own run), and the list is sorted.
    assert config.params.admitted == sorted_peers(*PEERS[:4])
    assert decode_configuration(config.encode(), max_members=64, max_links=64) == config
    # The digest covers the list: another list, another configuration.
    other = dataclasses.replace(config.params, admitted=sorted_peers(*PEERS[:3]))
    assert other.row() != config.params.row()


def test_an_open_runs_encoding_is_unchanged() -> None:
    """No list: the params item keeps its three items (the digest old peers compute)."""
    assert RunParams(global_batch=8).row() == [8, "sync", 1]
    assert RunParams(global_batch=8, admitted=(PEERS[0],)).row() == [8, "sync", 1, [PEERS[0].raw]]


@pytest.mark.parametrize(
    ("listed", "why"),
    [
        ([], "non-empty"),
        ("x", "non-empty"),
        ([b"\x00" * 38], "not a PeerID"),
        ([PEERS[0].raw, PEERS[0].raw], "sorted and distinct"),
        (sorted((p.raw for p in PEERS[:2]), reverse=True), "sorted and distinct"),
        ([p.raw for p in sorted_peers(*PEERS)], "admitted peers"),  # more than max_members (4)
    ],
)
def test_a_bad_admission_list_is_refused_before_anything_is_built(listed: object, why: str) -> None:
    net = make_net(1, admitted=(PEERS[1],))
    config = net.machines[PEERS[0]].configuration(RUN)
    assert config is not None
    body = unpack(config.encode(), max_bytes=1 << 20)
    body[8] = [64, "sync", 1, listed]
    with pytest.raises(RemoteProtocolError, match=why):
        decode_configuration(pack(body), max_members=4, max_links=4)


# ------------------------------------------------------------------ RUN_INFO


def test_an_outsider_gets_the_empty_reply_from_a_closed_run() -> None:
    net = make_net(3, admitted=sorted_peers(*PEERS[:4]))
    outsider = PEERS[5]
    reply = ask_run_info(net, outsider, PEERS[1])
    # What a peer that is no member would say: no configuration, no step, not even that the run exists.
    assert reply == RunInfoReply(run=RUN, request_id=7)
    assert dict(net.machines[PEERS[1]].statistics().rejected_by_reason)["not_admitted"] == 1


def test_an_admitted_peer_and_a_member_get_the_configuration() -> None:
    net = make_net(3, admitted=sorted_peers(*PEERS[:4]))
    config = net.machines[PEERS[1]].configuration(RUN)
    assert config is not None
    for asker in (PEERS[3], PEERS[2]):  # listed but no member yet; a member
        reply = ask_run_info(net, asker, PEERS[1])
        assert reply.configuration == config.encode()
        assert reply.certificate is not None


def test_an_open_run_answers_anyone() -> None:
    net = make_net(3, admitted=())
    assert ask_run_info(net, PEERS[5], PEERS[1]).configuration


def test_catch_up_and_old_epoch_answers_are_not_given_to_outsiders() -> None:
    net = make_net(3, admitted=sorted_peers(*PEERS[:4]))
    member, outsider, listed = PEERS[1], PEERS[5], PEERS[3]
    m = net.machines[member]
    epoch = m.configuration(RUN).epoch  # type: ignore[union-attr]
    for sender in (outsider, listed):
        m.receive(net.now, sender, PROTOCOL, SyncRequest(run=RUN, from_epoch=0))
        m.receive(net.now, sender, PROTOCOL, Prepare(run=RUN, epoch=epoch, ballot=Ballot(round=3, proposer=sender)))
    sent = m.take_outgoing()
    # The outsider gets neither the commit records nor the COMMIT of an old epoch; the listed peer
    # (a newcomer catching up) gets both.
    assert not [o for o in sent if o.to == outsider]
    assert {type(o.message) for o in sent if o.to == listed} == {SyncReply, Commit}


# ------------------------------------------------------------------ JOIN


def test_an_outsiders_join_is_refused_by_every_member() -> None:
    net = make_net(3, admitted=sorted_peers(*PEERS[:4]))
    outsider = PEERS[5]
    config = net.machines[PEERS[0]].configuration(RUN)
    assert config is not None
    join = outsider_join(net)
    assert check_operation(join, config) == "not_admitted"
    for member in PEERS[:3]:
        m = net.machines[member]
        m.receive(net.now, outsider, PROTOCOL, JoinRequest(run=RUN, op=join))
        sent = m.take_outgoing()
        # The answer a peer outside the run gives: it does not tell the run exists here.
        assert [o.message for o in sent] == [JoinRefusedMessage(run=RUN, reason="not_member")]
        assert OperationRejected(run=RUN, reason="not_admitted", origin=outsider) in m.take_events()
        assert not m.run_status(RUN).pending  # type: ignore[union-attr]


def test_an_outsider_asking_to_join_a_closed_run_is_refused_and_a_listed_peer_is_admitted() -> None:
    net = make_net(3, admitted=sorted_peers(*PEERS[:4]))
    outsider, listed = PEERS[5], PEERS[3]
    net.call(outsider, lambda m, now: m.request_join(now, RUN, PEERS[1], incarnation=1, throughput=1.0))
    net.call(listed, lambda m, now: m.request_join(now, RUN, PEERS[1], incarnation=1, throughput=1.0))
    net.advance(0.1)
    events = net.take(outsider)
    assert next(e for e in events if isinstance(e, RunInfo)).configuration is None
    assert next(e.reason for e in events if isinstance(e, JoinRefused)) == "not_member"
    assert net.machines[outsider].configuration(RUN) is None
    assert [e for e in net.take(listed) if isinstance(e, Admitted)]
    config = net.machines[PEERS[0]].configuration(RUN)
    assert config is not None and config.has_member(listed) and not config.has_member(outsider)


def test_a_member_cannot_admit_a_peer_outside_the_list() -> None:
    """A dishonest member proposes a value carrying the outsider's JOIN (which it sponsored itself):
    every honest acceptor refuses it, and announcing it to an honest proposer fails the same way."""
    net = make_net(4, admitted=sorted_peers(*PEERS[:4]))
    config = net.machines[PEERS[0]].configuration(RUN)
    assert config is not None
    liar = coordinator(config)  # round 0: no phase 1, the fewest checks a proposer faces
    assert liar is not None
    join = outsider_join(net)
    value = Value(ops=(join,), activation_step=9)
    accept = Accept(run=RUN, epoch=config.epoch + 1, ballot=Ballot(round=0, proposer=liar), value=value)
    for honest in (p for p in PEERS[:4] if p != liar):
        m = net.machines[honest]
        m.receive(net.now, liar, PROTOCOL, accept)
        assert OperationRejected(run=RUN, reason="bad_value", origin=liar) in m.take_events()
        assert m.run_status(RUN).gate_step is None  # type: ignore[union-attr]
        m.take_outgoing()
    # Announcing it (to make an honest proposer carry it) is refused the same way.
    announce = OpsAnnounce(run=RUN, epoch=config.epoch, ops=(join,))
    for honest in (p for p in PEERS[:4] if p != liar):
        m = net.machines[honest]
        m.receive(net.now, liar, PROTOCOL, announce)
        assert OperationRejected(run=RUN, reason="not_admitted", origin=liar) in m.take_events()
        assert not m.run_status(RUN).pending  # type: ignore[union-attr]
