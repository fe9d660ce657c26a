"""Configurations are installed only with a quorum certificate (issue 20, findings 1, 3, 8).

Forged, unsigned or uncertified configurations and commits -- from an outsider or from one member --
change nothing; catch-up answers are read only when asked for; a newcomer believes only the
configuration it can verify.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest

from chaosp2p.protocols.negotiation import NegotiationMachine, OpKind, RemovedFromRun, RunParams, RunState
from chaosp2p.protocols.negotiation.certificates import make_certificate, statement
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.messages import (
    Ballot,
    Commit,
    CommitRecord,
    RunInfoReply,
    SyncReply,
    SyncRequest,
    Value,
)
from chaosp2p.protocols.negotiation.operations import PROTOCOL, op_id, sign_operation
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.protocols.negotiation.promises import proof_of
from chaosp2p.protocols.negotiation.run_configuration import Configuration, make_configuration
from chaosp2p.sim.negotiation import ManualNet
from chaosp2p.wire.identity import Identity, PeerID

from .test_negotiation_machine import CFG, PARAMS, RUN, conf, justify, make_net, state

MEMBERS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(6)]
OUTSIDER = Identity.from_seed(bytes([77]) * 32)
FAKES = [Identity.from_seed(bytes([80 + i]) * 32) for i in range(2)]


def identity_of(peer: PeerID) -> Identity:
    return next(i for i in [*MEMBERS, OUTSIDER, *FAKES] if i.peer_id == peer)


def forged_configuration(current: Configuration, peers: list[PeerID], *, epochs_ahead: int = 1) -> Configuration:
    """What finding 1 sent: a higher epoch listing the attacker and made-up members, batch 64 -> 4."""
    members = sorted(peers, key=lambda p: p.raw)
    same = {"run": current.run, "activation_step": current.activation_step, "links": ()}
    return make_configuration(
        epoch=current.epoch + epochs_ahead,
        peers=members,
        incarnations=[9] * len(members),
        throughputs=[1.0] * len(members),
        params=RunParams(global_batch=4),
        seed=1,
        **same,
    )


def throughput_commit(net: ManualNet, signer: PeerID, *, rate: float, step: int) -> Commit:
    """A COMMIT of a THROUGHPUT value, with the correct digest but whatever certificate we give it."""
    config = conf(net, signer)
    op = sign_operation(
        identity_of(signer),
        kind=OpKind.THROUGHPUT,
        run=RUN,
        epoch=config.epoch,
        subject=signer,
        incarnation=config.incarnation_of(signer) or 0,
        detected_at=1.0,
        throughput_samples_per_s=rate,
    )
    value = Value(ops=(op,), activation_step=step)
    new, _ = next_configuration(config, [(op_id(op), op)], step)
    return Commit(run=RUN, epoch=new.epoch, value=value, digest=new.digest)


def test_an_unsolicited_forged_snapshot_changes_nothing() -> None:
    """Issue 20, finding 1: an outsider's SyncReply with a forged, unsigned configuration of a higher
    epoch (listing itself and made-up members) was installed wholesale."""
    net, peers = make_net(3, extra=1)
    a, outsider = peers[0], peers[3]
    before = conf(net, a)
    fake = forged_configuration(before, [outsider, *(f.peer_id for f in FAKES), a], epochs_ahead=70)
    for sender in (outsider, peers[1]):  # from the outsider, and from a member
        net.machines[a].receive(net.now, sender, PROTOCOL, SyncReply(run=RUN, snapshot=fake.encode()))
        net.collect()
        assert conf(net, a) == before
    # Even when it asked: a snapshot is installed only if a quorum of what it holds signed it.
    net.machines[a]._runs[RUN].sync_asked[peers[1].raw] = before.epoch + 1
    net.machines[a].receive(net.now, peers[1], PROTOCOL, SyncReply(run=RUN, snapshot=fake.encode()))
    assert conf(net, a) == before
    rejected = dict(net.machines[a].statistics().rejected_by_reason)
    assert rejected.get("unsolicited", 0) >= 2 and rejected.get("uncertified", 0) >= 1


def test_a_forged_commit_record_in_a_solicited_reply_is_refused() -> None:
    """Issue 20, finding 1: commit records in a catch-up answer must carry a quorum certificate."""
    net, peers = make_net(3)
    a, b, _ = peers
    before = conf(net, a)
    commit = throughput_commit(net, b, rate=50.0, step=before.activation_step + 3)
    net.call(a, lambda m, now: m._request_sync(m._runs[RUN], b))
    net.queue.clear()
    only_b = make_certificate(before, Ballot(round=9, proposer=b), {})  # no signatures at all
    reply = SyncReply(run=RUN, commits=(dataclasses.replace(commit.record(), certificate=only_b),))
    net.machines[a].receive(net.now, b, PROTOCOL, reply)
    assert conf(net, a) == before


def test_one_member_cannot_fork_an_epoch_with_different_commits() -> None:
    """Issue 20, finding 3: different COMMITs for one epoch sent to different members left two
    configurations for that epoch; one member's own signature is no quorum."""
    net, peers = make_net(5)
    liar = peers[1]
    before = conf(net, peers[0])
    ballot = Ballot(round=7, proposer=liar)
    for target, rate in ((peers[0], 50.0), (peers[2], 70.0)):
        commit = throughput_commit(net, liar, rate=rate, step=before.activation_step + 3)
        body = statement(RUN, commit.epoch, ballot, commit.digest)
        alone = make_certificate(before, ballot, {liar.raw: identity_of(liar).sign(body)})
        net.machines[target].receive(net.now, liar, PROTOCOL, dataclasses.replace(commit, certificate=alone))
        # A certificate whose signatures do not match the signers it names is no better.
        forged = make_certificate(
            before, ballot, {p.raw: identity_of(liar).sign(body) for p in peers[:3] if p != target}
        )
        net.machines[target].receive(net.now, liar, PROTOCOL, dataclasses.replace(commit, certificate=forged))
        net.collect()
    assert {conf(net, p).digest for p in peers} == {before.digest}


def test_an_honest_decision_carries_a_certificate_every_member_checks() -> None:
    net, peers = make_net(5)
    b = peers[1]
    net.call(b, lambda m, now: m.set_throughput(now, RUN, 9.0))
    net.deliver()
    commits = [m for _, _, m in net.delivered if isinstance(m, Commit)]
    assert commits and all(c.certificate is not None for c in commits)
    cert = commits[-1].certificate
    assert cert is not None and len(cert.signatures) >= 3
    assert len({conf(net, p).digest for p in peers}) == 1


def test_an_acceptor_accepts_one_value_per_ballot() -> None:
    """Issue 20, finding 3 (fork by equivocation): a proposer sending two values at one ballot gets
    at most one acceptance from each acceptor, so it cannot certify both with a quorum each."""
    net, peers = make_net(3)
    a, b, _ = peers
    config = conf(net, a)
    ballot = Ballot(round=5, proposer=b)
    values = [throughput_commit(net, b, rate=r, step=config.activation_step + 3).value for r in (40.0, 60.0)]
    m = net.machines[a]
    from chaosp2p.protocols.negotiation.messages import Accept, Accepted

    for value in values:
        accept = justify(net, Accept(run=RUN, epoch=config.epoch + 1, ballot=ballot, value=value), peers)
        m.receive(net.now, b, PROTOCOL, accept)
    answers = [o.message for o in m.take_outgoing() if isinstance(o.message, Accepted)]
    assert len(answers) == 1
    assert dict(m.statistics().rejected_by_reason).get("equivocation") == 1


def test_a_newcomer_is_not_admitted_into_a_forged_configuration() -> None:
    """Issue 20, finding 8: a newcomer took any configuration a peer handed it (a COMMIT with a
    configuration listing the newcomer, from a peer listed in that same configuration)."""
    net, peers = make_net(3, extra=2)
    a, newcomer, outsider = peers[0], peers[3], peers[4]
    net.call(newcomer, lambda m, now: m.request_join(now, RUN, a, incarnation=1, throughput=1.0))
    net.deliver(lambda s, r, m: r == newcomer and isinstance(m, Commit))  # its real admission is lost
    assert net.machines[newcomer].state_of(RUN) is RunState.JOINING
    real = conf(net, a)
    fake = forged_configuration(real, [outsider, newcomer, *(f.peer_id for f in FAKES)])
    op = sign_operation(
        identity_of(outsider), kind=OpKind.LEAVE, run=RUN, epoch=0, subject=outsider, incarnation=9, detected_at=0.0
    )
    forged = Commit(
        run=RUN,
        epoch=fake.epoch,
        value=Value(ops=(op,), activation_step=0),
        digest=fake.digest,
        configuration=fake.encode(),
    )
    net.machines[newcomer].receive(net.now, outsider, PROTOCOL, forged)
    assert net.machines[newcomer].state_of(RUN) is RunState.JOINING
    # From a member of the configuration it believes: refused for want of a certificate.
    liar = peers[1]
    net.machines[newcomer].receive(net.now, liar, PROTOCOL, forged)
    assert net.machines[newcomer].state_of(RUN) is RunState.JOINING
    assert dict(net.machines[newcomer].statistics().rejected_by_reason).get("uncertified") == 1
    net.advance(1.0)  # its retry gets it admitted for real
    assert conf(net, newcomer).digest == conf(net, a).digest


def test_a_newcomer_told_whom_to_trust_ignores_other_peers_run_info() -> None:
    """Issue 20, finding 8: with trusted (bootstrap) peers, another peer's answer about the run is
    not believed unless certified forward from what a trusted peer said."""
    ids = [*MEMBERS[:3], OUTSIDER]
    machines = [NegotiationMachine(identity=i, config=CFG, rng=random.Random(k), now=0.0) for k, i in enumerate(ids)]
    net = ManualNet(machines)
    a, b, _, newcomer = (i.peer_id for i in ids)
    net.call(a, lambda m, now: m.create_run(now, RUN, params=RunParams(global_batch=8)))
    net.machines[newcomer].trust([a])
    liar = b
    fake = forged_configuration(conf(net, a), [liar, *(f.peer_id for f in FAKES)])
    m = net.machines[newcomer]
    request_id = m._send_query(RUN, liar)
    m.take_outgoing()
    m.receive(net.now, liar, PROTOCOL, RunInfoReply(run=RUN, request_id=request_id, configuration=fake.encode()))
    infos = [e for e in m.take_events() if type(e).__name__ == "RunInfo"]
    assert infos and infos[0].configuration is None
    request_id = m._send_query(RUN, a)
    net.deliver()
    infos = [e for e in net.take(newcomer) if type(e).__name__ == "RunInfo"]
    assert infos and infos[-1].configuration == conf(net, a)


def test_sync_requests_get_answers_only_when_asked() -> None:
    net, peers = make_net(3)
    a, b, _ = peers
    reply = SyncReply(
        run=RUN, commits=(CommitRecord(epoch=99, value=Value(ops=(), activation_step=0), digest=bytes(32)),)
    )
    net.machines[a].receive(net.now, b, PROTOCOL, reply)
    assert dict(net.machines[a].statistics().rejected_by_reason).get("unsolicited") == 1
    net.machines[a].receive(net.now, b, PROTOCOL, SyncRequest(run=RUN, from_epoch=0))
    assert net.machines[a].take_outgoing()  # it answers requests


# ========================================================================= a dishonest proposer
def _accept_and_collect(
    net: ManualNet,
    liar: PeerID,
    targets: list[PeerID],
    ballot: Ballot,
    rate: float,
    promisers: Sequence[PeerID] = (),
) -> Commit:
    """The liar has ``targets`` accept a value of its own at ``ballot`` (with the signed promises of
    ``promisers`` claiming nothing accepted), and certifies it with their acceptances and its own
    signature (what a dishonest proposer can do with good-faith answers)."""
    from chaosp2p.protocols.negotiation.messages import Accept, Accepted

    config = conf(net, targets[0])
    commit = throughput_commit(net, liar, rate=rate, step=config.activation_step + 3)
    shares = {liar.raw: identity_of(liar).sign(statement(RUN, commit.epoch, ballot, commit.digest))}
    accept = justify(net, Accept(run=RUN, epoch=commit.epoch, ballot=ballot, value=commit.value), promisers)
    for target in targets:
        m = net.machines[target]
        m.receive(net.now, liar, PROTOCOL, accept)
        for out in m.take_outgoing():
            if isinstance(out.message, Accepted) and out.to == liar:
                shares[target.raw] = out.message.signature
    return dataclasses.replace(commit, certificate=make_certificate(config, ballot, shares))


def _coordinator_liar(n: int) -> tuple[ManualNet, PeerID, list[PeerID]]:
    """A run of ``n`` whose epoch coordinator is the liar: its round-0 ACCEPTs need no phase 1."""
    net, peers = make_net(n)
    liar = coordinator(conf(net, peers[0]))
    assert liar is not None
    return net, liar, [p for p in peers if p != liar]


def _equivocate(net: ManualNet, liar: PeerID, halves: list[list[PeerID]], ballot: Ballot) -> None:
    for half, rate in zip(halves, (40.0, 60.0), strict=True):
        commit = _accept_and_collect(net, liar, half, ballot, rate)
        for target in half:
            net.machines[target].receive(net.now, liar, PROTOCOL, commit)


def test_the_documented_limit_a_proposer_equivocating_splits_a_run_of_three() -> None:
    """Spec section 9: a run of three keeps crash tolerance (quorum 2), so one dishonest member can
    split it -- {liar, a} and {liar, b} are both quorums. This test shows the limit; it is stated in
    the spec and the README's security model (n >= 3f + 1: three members cannot have both)."""
    net, liar, (a, b) = _coordinator_liar(3)
    _equivocate(net, liar, [[a], [b]], Ballot(round=0, proposer=liar))
    assert conf(net, a).epoch == conf(net, b).epoch
    assert conf(net, a).digest != conf(net, b).digest


@pytest.mark.parametrize("n", [5, 7])
def test_a_proposer_equivocating_at_its_ballot_cannot_split_an_odd_run(n: int) -> None:
    """Issue 20, finding 3 (the gap left): with majority quorums, (n - 1) / 2 honest acceptances
    plus the liar's own signature were a quorum for each of two values. An odd run of five or more
    now needs a majority + 1, so two quorums share two members, one of them honest."""
    net, liar, honest = _coordinator_liar(n)
    before = conf(net, honest[0])
    half = len(honest) // 2
    _equivocate(net, liar, [honest[:half], honest[half:]], Ballot(round=0, proposer=liar))
    assert {conf(net, p).digest for p in honest} == {before.digest}


def _no_split(net: ManualNet, peers: Sequence[PeerID]) -> None:
    by_epoch: dict[int, set[bytes]] = {}
    for p in peers:
        for c in net.machines[p]._runs[RUN].configs:
            by_epoch.setdefault(c.epoch, set()).add(c.digest)
    assert all(len(d) == 1 for d in by_epoch.values()), by_epoch


def test_a_proposer_withholding_its_commit_cannot_split_a_run() -> None:
    """Issue 20 (the gap left): the liar got v accepted by a quorum, showed the certified COMMIT to
    one member only, then sent ACCEPT(w) at a higher ballot without phase 1 to the others, who
    accepted w (a higher ballot replaces an accepted value) and signed: two certified values.
    Above round 0 an ACCEPT now needs a quorum of signed promises, and the value they force."""
    from chaosp2p.protocols.negotiation.messages import Accepted, Prepare, Promise, SignedPromise

    net, liar, (a, b, c) = _coordinator_liar(4)
    first = _accept_and_collect(net, liar, [a, b, c], Ballot(round=0, proposer=liar), 40.0)
    net.machines[a].receive(net.now, liar, PROTOCOL, first)  # only a learns the decision
    assert conf(net, a).digest == first.digest
    # Without phase 1: no promises, or only its own (short of a quorum of signed promises).
    for promisers in ((), (liar,)):
        second = _accept_and_collect(net, liar, [b, c], Ballot(round=10, proposer=liar), 60.0, promisers)
        for target in (b, c):
            net.machines[target].receive(net.now, liar, PROTOCOL, second)
        _no_split(net, [a, b, c])
        assert dataclasses.replace(second, certificate=None).digest != first.digest
        assert len(second.certificate.signatures) == 1 if second.certificate else False
    # With a real phase 1: b's and c's signed promises report v (backed by the liar's own signed
    # ACCEPT), so they force v, whatever the liar's own promise claims.
    ballot = Ballot(round=11, proposer=liar)
    proofs: list[SignedPromise] = []
    for target in (b, c):
        net.machines[target].receive(net.now, liar, PROTOCOL, Prepare(run=RUN, epoch=first.epoch, ballot=ballot))
        promise = next(o.message for o in net.machines[target].take_outgoing() if isinstance(o.message, Promise))
        assert promise.signature and promise.accepted_digest == first.digest and promise.backer == liar
        proofs.append(proof_of(target, promise))
    w = throughput_commit(net, liar, rate=60.0, step=conf(net, b).activation_step + 3)
    from chaosp2p.protocols.negotiation.justification import promise_statement, propose_statement
    from chaosp2p.protocols.negotiation.messages import Accept

    # The liar's own promise claims it accepted w at a ballot of its own, backed by itself.
    own_ballot = Ballot(round=10, proposer=liar)
    body = promise_statement(RUN, w.epoch, ballot, own_ballot, w.digest, -1)
    lie = SignedPromise(
        signer=liar,
        accepted_ballot=own_ballot,
        accepted_digest=w.digest,
        backer=liar,
        backing=identity_of(liar).sign(propose_statement(RUN, w.epoch, own_ballot, w.digest)),
        signature=identity_of(liar).sign(body),
    )
    accept = Accept(
        run=RUN,
        epoch=w.epoch,
        ballot=ballot,
        value=w.value,
        adopted=True,
        proposer_signature=identity_of(liar).sign(propose_statement(RUN, w.epoch, ballot, w.digest)),
        justification=(*proofs, lie),
    )
    for target in (b, c):
        m = net.machines[target]
        m.receive(net.now, liar, PROTOCOL, accept)
        assert not [o for o in m.take_outgoing() if isinstance(o.message, Accepted)]
        assert dict(m.statistics().rejected_by_reason).get("unjustified", 0) >= 2
    _no_split(net, [a, b, c])
    # The honest way on: the next proposer's phase 1 finds v and commits it everywhere.
    net.advance(3.0)
    assert {conf(net, p).digest for p in (a, b, c)} == {first.digest}
    _no_split(net, [a, b, c])


def test_a_promise_claiming_a_value_it_does_not_show_is_not_counted() -> None:
    """A liar's promise may claim, with a real backing, a value honest members accepted, yet send
    other content (or none): counted, it would leave the proposer unable to propose the value it
    claims. Such a promise is not counted (``bad_promise``); the same claim with its content is."""
    from chaosp2p.protocols.negotiation.justification import sign_promise
    from chaosp2p.protocols.negotiation.messages import Promise

    net, liar, (a, b, _) = _coordinator_liar(4)
    v = _accept_and_collect(net, liar, [a], Ballot(round=0, proposer=liar), 40.0)
    claimed = Ballot(round=0, proposer=liar)
    # The acceptance a sent the liar (Ed25519 is deterministic: the same bytes a signed).
    share_of_a = identity_of(a).sign(statement(RUN, v.epoch, claimed, v.digest))
    m = net.machines[b]
    m._start_proposal(net.now, m._runs[RUN], fast=False)
    m.take_outgoing()  # its PREPAREs are lost: only the liar's promise arrives
    ballot = m._runs[RUN].proposer.ballot
    assert ballot is not None
    other = throughput_commit(net, liar, rate=99.0, step=conf(net, b).activation_step + 3).value
    signature = sign_promise(identity_of(liar), RUN, v.epoch, ballot, claimed, v.digest, -1)
    reasons = net.machines[b].statistics
    for content, counted in ((other, False), (v.value, True)):
        before = dict(reasons().rejected_by_reason).get("bad_promise", 0)
        promise = Promise(
            run=RUN,
            epoch=v.epoch,
            ballot=ballot,
            accepted_ballot=claimed,
            accepted_value=content,
            accepted_digest=v.digest,
            backer=a,
            backing=share_of_a,
            signature=signature,
        )
        net.machines[b].receive(net.now, liar, PROTOCOL, promise)
        assert (dict(reasons().rejected_by_reason).get("bad_promise", 0) == before) is counted
        assert (liar.raw in net.machines[b]._runs[RUN].proposer.promises) is counted


def test_a_promise_without_a_signature_justifies_nothing() -> None:
    """What an old peer sends: a PROMISE without a signature is not counted (``bad_promise``);
    an ACCEPT above round 0 without promises is refused (``unjustified``)."""
    from chaosp2p.protocols.negotiation.messages import Accept, Promise

    net, peers = make_net(4)
    a, b = peers[0], peers[1]
    epoch = conf(net, a).epoch + 1
    net.call(a, lambda m, now: m._start_proposal(now, m._runs[RUN], fast=False))
    ballot = net.machines[a]._runs[RUN].proposer.ballot
    assert ballot is not None
    net.machines[a].receive(net.now, b, PROTOCOL, Promise(run=RUN, epoch=epoch, ballot=ballot))
    assert dict(net.machines[a].statistics().rejected_by_reason).get("bad_promise") == 1
    value = throughput_commit(net, b, rate=9.0, step=conf(net, a).activation_step + 3).value
    unproven = Accept(run=RUN, epoch=epoch, ballot=Ballot(round=50, proposer=b), value=value)
    net.machines[a].receive(net.now, b, PROTOCOL, unproven)
    assert dict(net.machines[a].statistics().rejected_by_reason).get("unjustified") == 1


def test_a_long_catch_up_comes_in_frames_that_fit() -> None:
    # Certificates make commit records large: a SYNC_REPLY carries what fits, the asker asks again.
    import chaosp2p.protocols.negotiation.learning as learning

    net, peers = make_net(3)
    a, b, c = peers
    for i in range(6):
        net.call(b, lambda m, now, r=float(i + 2): m.set_throughput(now, RUN, r * 10))
        net.advance(0.3, lambda s, r, m: r == c)  # c misses everything
    target = conf(net, a)
    behind = target.epoch - conf(net, c).epoch
    assert behind >= 3
    saved = learning._SYNC_REPLY_BYTES
    learning._SYNC_REPLY_BYTES = 1  # one record per reply
    try:
        net.call(c, lambda m, now: m._request_sync(m._runs[RUN], a))
        net.deliver()
    finally:
        learning._SYNC_REPLY_BYTES = saved
    replies = [m for s, r, m in net.delivered if r == c and isinstance(m, SyncReply)]
    assert len(replies) >= behind and all(len(r.commits) <= 1 for r in replies)
    assert conf(net, c).digest == target.digest


def test_a_newcomer_whose_trusted_peers_are_no_members_falls_back_to_the_first_member() -> None:
    # Told to trust a peer that is not in the run: an untrusted answer is refused at first, the
    # trusted peer is asked, declines, and the next answer is believed (trust on first use).
    ids = [*MEMBERS[:2], OUTSIDER, FAKES[0]]
    machines = [NegotiationMachine(identity=i, config=CFG, rng=random.Random(k), now=0.0) for k, i in enumerate(ids)]
    net = ManualNet(machines)
    a, _, newcomer, bystander = (i.peer_id for i in ids)
    net.call(a, lambda m, now: m.create_run(now, RUN, params=RunParams(global_batch=8)))
    net.machines[newcomer].trust([bystander])
    for expect_config in (False, True):
        net.call(newcomer, lambda m, now: m.query_run(now, RUN, a))
        net.deliver()
        infos = [e for e in net.take(newcomer) if type(e).__name__ == "RunInfo" and e.from_peer == a]
        assert infos and (infos[-1].configuration is not None) is expect_config
        # The refused answer says so: a caller (the hivemind drop-in's founding) must ask again,
        # not take it for "no such run" and found a second run under the same name.
        assert infos[-1].withheld == ("" if expect_config else "untrusted")


def _turned_over(current: Configuration, signers: list[Identity], *, epochs_ahead: int) -> SyncReply:
    """A genuine-looking catch-up snapshot of a run that turned over while we were away: the
    configuration before it holds ``signers``, who all signed it, but few of them are our members."""
    members = sorted((s.peer_id for s in signers), key=lambda p: p.raw)
    shape = {"run": current.run, "activation_step": current.activation_step + 50, "links": ()}
    ones = {"incarnations": [1] * len(members), "throughputs": [1.0] * len(members), "params": PARAMS, "seed": 1}
    epoch = current.epoch + epochs_ahead
    previous = make_configuration(epoch=epoch - 1, peers=members, **ones, **shape)
    newest = make_configuration(epoch=epoch, peers=members, **ones, **shape)
    ballot = Ballot(round=1, proposer=members[0])
    body = statement(RUN, epoch, ballot, newest.digest)
    cert = make_certificate(previous, ballot, {s.peer_id.raw: s.sign(body) for s in signers})
    return SyncReply(run=RUN, snapshot=newest.encode(), certificate=cert, previous=previous.encode())


def test_a_member_no_one_can_prove_the_run_to_rejoins_as_a_newcomer() -> None:
    """Found by the property test: a member cut off while the run turned over (its removal, and
    every epoch since, signed by peers that were not yet its fellow members, none of whom keeps the
    commits between) got "unverifiable" snapshots forever and stalled. Two members of its
    configuration saying so make it leave as "lost" and rejoin; one alone changes nothing."""
    net, peers = make_net(5)
    a, b, c = peers[0], peers[1], peers[2]
    before = conf(net, a)
    newcomers = [Identity.from_seed(bytes([90 + i]) * 32) for i in range(3)]
    reply = _turned_over(before, [identity_of(b), identity_of(c), *newcomers], epochs_ahead=6)
    for sender in (b, c):
        net.machines[a]._runs[RUN].sync_asked[sender.raw] = before.epoch + 1
        net.machines[a].receive(net.now, sender, PROTOCOL, reply)
        net.collect()
        if sender == b:
            assert state(net, a) is not RunState.REMOVED and conf(net, a) == before
    assert state(net, a) is RunState.REMOVED
    removed = [e for e in net.events[a] if isinstance(e, RemovedFromRun)]
    assert [e.reason for e in removed] == ["lost"]
    assert net.machines[a].config_for_step(RUN, removed[0].activation_step) is None  # trains nothing more
    # ...and it can ask to join again, as any newcomer.
    net.call(a, lambda m, now: m.request_join(now, RUN, b, incarnation=2, throughput=1.0))
    assert state(net, a) is RunState.JOINING
