"""Every kind of bad input is rejected with a counted reason, reported, and changes nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import NegotiationConfig, OperationRejected, OpKind
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Ballot,
    Certificate,
    Commit,
    JoinRequest,
    OpsAnnounce,
    Prepare,
    RunInfoReply,
    Sync,
    Value,
    codec,
)
from chaosp2p.protocols.negotiation.operations import PROTOCOL, Operation, op_id, sign_operation
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

from .test_negotiation_machine import RUN, conf, justify, make_net, report_all

ID = {bytes([i + 1]) * 32: Identity.from_seed(bytes([i + 1]) * 32) for i in range(6)}


def identity(peer: PeerID) -> Identity:
    return next(i for i in ID.values() if i.peer_id == peer)


def snapshot(net: ManualNet, peer: PeerID) -> tuple[Any, ...]:
    m = net.machines[peer]
    rec = m._runs.get(RUN)
    internal = None if rec is None else (rec.promised, rec.accepted_ballot, rec.accepted_value, dict(rec.pending))
    status = m.run_status(RUN) if rec is not None else None
    return (status, m.configuration(RUN), internal)


def rejected(net: ManualNet, receiver: PeerID, sender: PeerID, message: Message, reason: str) -> None:
    """Deliver ``message``; it must be refused for ``reason`` and change nothing at ``receiver``."""
    m = net.machines[receiver]
    before = snapshot(net, receiver)
    count = dict(m.statistics().rejected_by_reason).get(reason, 0)
    m.receive(net.now, sender, PROTOCOL, message)
    assert snapshot(net, receiver) == before
    assert dict(m.statistics().rejected_by_reason).get(reason, 0) == count + 1
    events = m.take_events()
    assert OperationRejected(run=getattr(message, "run", ""), reason=reason, origin=sender) in events
    m.take_outgoing()


def signed(signer: PeerID, kind: OpKind, subject: PeerID, *, epoch: int, **extra: Any) -> Operation:
    fields: dict[str, Any] = {"incarnation": 1, "detected_at": 1.0}
    if kind in (OpKind.JOIN, OpKind.THROUGHPUT):
        fields["throughput_samples_per_s"] = 2.0
    fields.update(extra)
    return sign_operation(identity(signer), kind=kind, run=RUN, epoch=epoch, subject=subject, **fields)


@pytest.fixture
def net3() -> tuple[ManualNet, list[PeerID]]:
    return make_net(3, extra=1)


def test_operations_about_another_peer_that_it_did_not_sign(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    a, b, c, outsider = peers
    epoch = conf(net, a).epoch
    # b signs a LEAVE about c: only c may announce its own leave.
    rejected(
        net, a, b, OpsAnnounce(run=RUN, epoch=epoch, ops=(signed(b, OpKind.LEAVE, c, epoch=epoch),)), "forged_origin"
    )
    # an outsider declares c failed: only members may.
    fail = signed(outsider, OpKind.FAIL, c, epoch=epoch)
    # An outsider's announcement is not even read (issue 20, finding 7); relayed by a member, the
    # operation itself is refused.
    rejected(net, a, outsider, OpsAnnounce(run=RUN, epoch=epoch, ops=(fail,)), "not_member")
    rejected(net, a, b, OpsAnnounce(run=RUN, epoch=epoch, ops=(fail,)), "forged_origin")
    # b signs a JOIN for someone else.
    rejected(
        net,
        a,
        b,
        OpsAnnounce(run=RUN, epoch=epoch, ops=(signed(b, OpKind.JOIN, outsider, epoch=epoch),)),
        "forged_origin",
    )
    # c's LEAVE, but signed by b: the signature does not verify against c.
    forged = dataclasses.replace(signed(b, OpKind.LEAVE, b, epoch=epoch), origin=c, subject=c)
    rejected(net, a, b, OpsAnnounce(run=RUN, epoch=epoch, ops=(forged,)), "bad_signature")
    unsigned = dataclasses.replace(signed(c, OpKind.LEAVE, c, epoch=epoch), signature=bytes(64))
    rejected(net, a, c, OpsAnnounce(run=RUN, epoch=epoch, ops=(unsigned,)), "bad_signature")
    # A newcomer's JOIN_REQUEST for somebody else is refused too.
    join = signed(b, OpKind.JOIN, outsider, epoch=epoch)
    rejected(net, a, outsider, JoinRequest(run=RUN, op=join), "forged_origin")


def test_replayed_operations_and_old_epoch_proposals(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    a, b, c, _ = peers
    epoch = conf(net, a).epoch
    op = signed(b, OpKind.THROUGHPUT, b, epoch=epoch)
    net.call(b, lambda m, now: m.receive(now, c, PROTOCOL, OpsAnnounce(run=RUN, epoch=epoch, ops=(op,))))
    net.advance(0.5)
    assert conf(net, a).epoch == epoch + 1  # it committed
    # The same operation again: a replay.
    rejected(net, a, c, OpsAnnounce(run=RUN, epoch=epoch + 1, ops=(op,)), "replayed")
    # A proposal for the epoch that was already decided.
    old = Accept(
        run=RUN, epoch=epoch + 1, ballot=Ballot(round=5, proposer=b), value=Value(ops=(op,), activation_step=0)
    )
    rejected(net, a, b, old, "old_epoch")
    # A ballot below what a promised, and ballots claiming another proposer or round 0.
    net.machines[a].receive(net.now, c, PROTOCOL, Prepare(run=RUN, epoch=epoch + 2, ballot=Ballot(round=7, proposer=c)))
    net.machines[a].take_outgoing()
    rejected(net, a, b, Prepare(run=RUN, epoch=epoch + 2, ballot=Ballot(round=3, proposer=b)), "stale_ballot")
    rejected(net, a, b, Prepare(run=RUN, epoch=epoch + 2, ballot=Ballot(round=9, proposer=c)), "forged_ballot")
    rejected(net, a, b, Prepare(run=RUN, epoch=epoch + 2, ballot=Ballot(round=0, proposer=b)), "forged_ballot")


def test_round_zero_is_the_coordinators_alone(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    config = conf(net, peers[0])
    coord = coordinator(config)
    other = next(p for p in peers[:3] if p != coord)
    target = next(p for p in peers[:3] if p not in (coord, other))
    op = signed(other, OpKind.THROUGHPUT, other, epoch=config.epoch)
    value = Value(ops=(op,), activation_step=config.activation_step + 5)
    accept = Accept(run=RUN, epoch=config.epoch + 1, ballot=Ballot(round=0, proposer=other), value=value)
    rejected(net, target, other, accept, "forged_ballot")


def test_steps_in_the_past_or_absurdly_far_ahead() -> None:
    config = dataclasses.replace(NegotiationConfig.local(), max_step_ahead=1000)
    net, peers = make_net(3, config=config)
    a, b, c = peers
    report_all(net, peers, entered=50, completed=49)
    net.call(b, lambda m, now: m.set_throughput(now, RUN, 5.0))
    net.deliver()
    current = conf(net, a)
    assert current.activation_step == 52
    op = signed(c, OpKind.THROUGHPUT, c, epoch=current.epoch)
    ballot = Ballot(round=1, proposer=c)
    past = Accept(run=RUN, epoch=current.epoch + 1, ballot=ballot, value=Value(ops=(op,), activation_step=40))
    rejected(net, a, c, past, "step_in_past")
    far = Accept(run=RUN, epoch=current.epoch + 1, ballot=ballot, value=Value(ops=(op,), activation_step=52 + 1001))
    rejected(net, a, c, far, "step_too_far")
    # Within bounds it is accepted (the gate rises), which shows the two refusals were about S.
    ok = Accept(run=RUN, epoch=current.epoch + 1, ballot=ballot, value=Value(ops=(op,), activation_step=60))
    ok = justify(net, ok, peers)
    net.machines[a].receive(net.now, c, PROTOCOL, ok)
    assert net.machines[a].run_status(RUN).gate_step == 60


def test_unknown_runs_and_non_members(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    a, b, _, outsider = peers
    epoch = conf(net, a).epoch
    op = signed(b, OpKind.THROUGHPUT, b, epoch=epoch)
    for message in (
        OpsAnnounce(run="no-such-run", epoch=0, ops=(dataclasses.replace(op, run="no-such-run"),)),
        Prepare(run="no-such-run", epoch=1, ballot=Ballot(round=1, proposer=b)),
        Sync(run="no-such-run", epoch=1, digest=bytes(32)),
    ):
        rejected(net, a, b, message, "unknown_run")
    rejected(
        net, a, outsider, Prepare(run=RUN, epoch=epoch + 1, ballot=Ballot(round=4, proposer=outsider)), "not_member"
    )
    rejected(net, a, outsider, RunInfoReply(run=RUN, request_id=77), "unsolicited")


def test_digest_mismatches(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    a, b, c, _ = peers
    config = conf(net, a)
    op = signed(b, OpKind.THROUGHPUT, b, epoch=config.epoch)
    wrong = Commit(run=RUN, epoch=config.epoch + 1, value=Value(ops=(op,), activation_step=3), digest=bytes(32))
    # Without a quorum certificate it is refused before anything is computed (issue 20, finding 3).
    rejected(net, a, b, wrong, "uncertified")
    cert = Certificate(ballot=Ballot(round=1, proposer=b), signers=b"\x07", signatures=(bytes(64),) * 3)
    rejected(net, a, b, dataclasses.replace(wrong, certificate=cert), "digest_mismatch")
    rejected(net, a, c, Sync(run=RUN, epoch=config.epoch, digest=bytes(32)), "digest_mismatch")


def test_invalid_values_and_oversized_batches(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    a, b, c, _ = peers
    config = conf(net, a)
    bad = dataclasses.replace(signed(b, OpKind.THROUGHPUT, b, epoch=config.epoch), signature=bytes(64))
    accept = Accept(
        run=RUN, epoch=config.epoch + 1, ballot=Ballot(round=2, proposer=c), value=Value(ops=(bad,), activation_step=9)
    )
    rejected(net, a, c, accept, "bad_value")
    many = tuple(signed(b, OpKind.THROUGHPUT, b, epoch=config.epoch, detected_at=float(i)) for i in range(257))
    rejected(net, a, b, OpsAnnounce(run=RUN, epoch=config.epoch, ops=many), "too_many_ops")


def test_a_fail_of_a_member_known_alive_at_a_higher_incarnation(net3: tuple[ManualNet, list[PeerID]]) -> None:
    net, peers = net3
    a, b, c, _ = peers
    epoch = conf(net, a).epoch
    net.call(a, lambda m, now: m.observe_member(now, c, MemberState.ALIVE, 4))
    stale = signed(b, OpKind.FAIL, c, epoch=epoch, observed_incarnation=3)
    rejected(net, a, b, OpsAnnounce(run=RUN, epoch=epoch, ops=(stale,)), "stale_fail")


def test_flooding_is_rate_limited() -> None:
    config = dataclasses.replace(NegotiationConfig.local(), rate_limit_msgs_per_s=1.0, rate_limit_burst=5.0)
    net, peers = make_net(2, config=config)
    a, b = peers
    m = net.machines[a]
    before = m.statistics().rate_limited
    for _ in range(50):
        m.receive(net.now, b, PROTOCOL, Sync(run=RUN, epoch=0, digest=bytes(32)))
    assert m.statistics().rate_limited - before >= 44


def test_the_codec_refuses_malformed_records() -> None:
    op = sign_operation(
        Identity.from_seed(b"\x01" * 32),
        kind=OpKind.LEAVE,
        run=RUN,
        epoch=0,
        subject=Identity.from_seed(b"\x01" * 32).peer_id,
        incarnation=0,
        detected_at=0.0,
    )
    raw = codec.to_obj(OpsAnnounce(run=RUN, epoch=0, ops=(op,)))
    assert codec.from_obj(raw) == OpsAnnounce(run=RUN, epoch=0, ops=(op,))
    short_signature = [*raw]
    short_signature[3] = [[*raw[3][0][:7], b"\x00" * 10, *raw[3][0][8:]]]
    with pytest.raises(RemoteProtocolError, match="signature"):
        codec.from_obj(short_signature)
    long_run = [*raw]
    long_run[1] = "x" * 300
    with pytest.raises(RemoteProtocolError, match="run id"):
        codec.from_obj(long_run)
    with pytest.raises(RemoteProtocolError):
        codec.from_obj([1, RUN, -1, []])  # a negative epoch
    assert op_id(op) == op_id(codec.from_obj(raw).ops[0])  # type: ignore[attr-defined]
