"""After a proven equivocation, how many promises settle the open instance (spec section 4b).

A proposer that signed two values at its ballot is the liar; which of them a quorum may have chosen
is settled by the promises of k = 2(n - q) + 1 other members (each with a backed claim, or none):
every other member but one in an odd run of five or more, so that one more crash no longer stalls
the instance; every other member in an even run, where safety needs them all. The exhaustive test
below checks the count against every way the run can have voted. The last test is the fork this
work found on the way: a proposer's unbacked acceptance of its own value hid the value it had
accepted before, and one liar had another value forced over it.
"""

from __future__ import annotations

import itertools

import pytest

from chaosp2p.protocols.negotiation.justification import WAIT, Claim, forced, settling_promises
from chaosp2p.protocols.negotiation.messages import Ballot
from chaosp2p.protocols.negotiation.promises import proof_of
from chaosp2p.protocols.negotiation.run_configuration import Configuration, quorum_of

from .test_negotiation_justification import config_of

V, W = b"\x02" * 32, b"\x01" * 32  # W sorts first: a tie would pick it


def equivocated(n: int) -> tuple[Configuration, Ballot, list[Claim]]:
    """The liar (the first member) had v accepted at its round-0 ballot by q - 1 honest members (a
    quorum with itself) and w by the n - q others; their promises, in that order."""
    config = config_of(n)
    liar, *honest = config.peers
    top = Ballot(round=0, proposer=liar)
    q = quorum_of(n)
    votes = [V] * (q - 1) + [W] * (n - q)
    return config, top, [Claim(p.raw, top, d, -1, d) for p, d in zip(honest, votes, strict=True)]


def test_the_count_is_two_n_minus_q_plus_one_and_less_than_every_other_member_in_odd_runs() -> None:
    assert [settling_promises(n) for n in range(2, 10)] == [1, 2, 3, 3, 5, 5, 7, 7]
    for n in range(4, 64):
        assert settling_promises(n) == 2 * (n - quorum_of(n)) + 1
        assert settling_promises(n) == (n - 2 if n % 2 else n - 1)


@pytest.mark.parametrize("n", [5, 7, 9])
def test_in_an_odd_run_a_crash_after_the_equivocation_no_longer_stalls_the_instance(n: int) -> None:
    config, top, claims = equivocated(n)
    crashed = claims.pop(0)  # one of the quorum: the worst case
    assert forced(claims, config) == (top, V)  # before: WAIT, until the crashed member returned
    assert forced([*claims, crashed], config) == (top, V)


@pytest.mark.parametrize("n", [4, 6, 8])
def test_in_an_even_run_every_other_member_is_still_needed(n: int) -> None:
    config, top, claims = equivocated(n)
    # Without one of the quorum, v and w are reported equally often: nothing tells them apart.
    assert forced(claims[1:], config) == WAIT
    assert forced(claims, config) == (top, V)


def test_an_unbacked_claim_does_not_settle_an_equivocation() -> None:
    """A member of the quorum that chose v may since have accepted its own proposal at a higher
    ballot that nobody answered yet: its promise then claims nothing backed, hiding its v. Counted
    as 'accepted nothing', it let w (the lower digest) win a tie in a run of four."""
    config = config_of(4)
    liar, a, b, c = config.peers
    top = Ballot(round=0, proposer=liar)
    claims = [
        Claim(a.raw, None, b"", -1, V),  # accepted v at top, then its own value at round 3: unbacked
        Claim(b.raw, top, V, -1, V),
        Claim(c.raw, top, W, -1, W),
        Claim(liar.raw, top, W, -1, W),
    ]
    assert forced(claims, config) == WAIT


@pytest.mark.parametrize("n", range(4, 9))
def test_whatever_the_run_voted_a_settled_equivocation_forces_the_value_a_quorum_chose(n: int) -> None:
    """Every quorum Q that may have chosen v at the liar's ballot, every split of the honest members
    outside Q (accepted w there, or nothing), any one member outside Q whose claim is unbacked,
    every claim the liar can back, and every quorum of promises: the verdict is v or WAIT, and WAIT
    only when fewer than the count of settling promises came (so odd runs live through one crash
    more). (An unbacked member of Q is the case above, and spec section 9's remaining gap.)"""
    config = config_of(n)
    peers = config.peers
    liar = peers[0]
    top = Ballot(round=0, proposer=liar)
    q = quorum_of(n)
    need = settling_promises(n)
    for chosen_by in itertools.combinations(range(n), q):
        outside = [i for i in range(1, n) if i not in chosen_by]
        for w_voters in itertools.product((False, True), repeat=len(outside)):
            voted = {i: V for i in chosen_by if i != 0} | {i: W for i, w in zip(outside, w_voters, strict=True) if w}
            # The liar's own claim counts only with another member's backing: an honest acceptance.
            backable = {V, *voted.values()}
            liar_claims = [Claim(liar.raw, top, d, -1, d) for d in backable] + [Claim(liar.raw, None, b"", -1, b"")]
            for unbacked in (None, *outside):
                honest: list[Claim] = []
                for i in range(1, n):
                    said = voted.get(i, b"")
                    if i == unbacked:
                        honest.append(Claim(peers[i].raw, None, b"", -1, said or W))
                    elif said:
                        honest.append(Claim(peers[i].raw, top, said, -1, said))
                    else:
                        honest.append(Claim(peers[i].raw, None, b"", -1, b""))
                for liar_claim in liar_claims:
                    for size in range(max(need - 1, q - 1), n):  # a quorum of promises, the liar's too
                        for promised in itertools.combinations(honest, size):
                            verdict = forced([liar_claim, *promised], config)
                            if verdict == WAIT:
                                settling = sum(1 for c in promised if c.ballot is not None or not c.said)
                                assert settling < need, (n, chosen_by, w_voters, unbacked, size)
                                continue
                            assert verdict is not None and verdict[1] == V, (n, chosen_by, w_voters, unbacked)


def test_machines_after_an_equivocation_and_a_crash_an_odd_run_decides_the_chosen_value() -> None:
    """Seven members: the coordinator had v accepted by four honest members (with its own share, a
    quorum of five: it could certify v) and w by the other two, then went silent, and one of the
    four crashed. The five left are a quorum; they used to wait for the sixth promise forever."""
    from .test_negotiation_certificates import _accept_and_collect, _coordinator_liar
    from .test_negotiation_machine import RUN, conf

    net, liar, honest = _coordinator_liar(7)
    epoch = conf(net, honest[0]).epoch
    top = Ballot(round=0, proposer=liar)
    v = _accept_and_collect(net, liar, honest[:4], top, 40.0)
    w = _accept_and_collect(net, liar, honest[4:], top, 60.0)
    assert v.digest != w.digest and v.certificate is not None  # v was chosen; the liar keeps it to itself
    net.crashed.update({liar, honest[0]})
    net.advance(10.0)
    survivors = honest[1:]
    for peer in survivors:
        config = net.machines[peer].configuration(RUN)
        assert config is not None and config.epoch > epoch, "the instance stalled"
        assert next(c for c in net.machines[peer]._runs[RUN].configs if c.epoch == epoch + 1).digest == v.digest


def test_a_proposers_unbacked_acceptance_does_not_hide_the_value_it_accepted_before() -> None:
    """One liar, four members, no message lost: the liar (the coordinator) gets v accepted by a and
    b at round 0 (a quorum with itself: it holds v's certificate) and w by c. a takes over at round
    1 and, seeing the equivocation settled by b, c and itself, accepts v again as its own proposal;
    the liar's PREPARE for round 2 reaches b and c before a's ACCEPT, so nobody answers a. a's
    promise for round 2 then claimed its own, unbacked acceptance -- counted as nothing -- and w
    was the only claim at the highest ballot: the liar had w accepted at round 2 by a and c and
    certified both v and w for one epoch. Now a reports the acceptance another member backs."""
    from chaosp2p.protocols.negotiation.certificates import make_certificate, statement
    from chaosp2p.protocols.negotiation.justification import promise_statement, propose_statement
    from chaosp2p.protocols.negotiation.messages import Accept, Accepted, Commit, Prepare, Promise, SignedPromise
    from chaosp2p.protocols.negotiation.operations import PROTOCOL

    from .test_negotiation_certificates import _accept_and_collect, _coordinator_liar, identity_of
    from .test_negotiation_machine import RUN, conf

    net, liar, (a, b, c) = _coordinator_liar(4)
    config = conf(net, a)
    epoch = config.epoch + 1
    v = _accept_and_collect(net, liar, [a, b], Ballot(round=0, proposer=liar), 40.0)
    w = _accept_and_collect(net, liar, [c], Ballot(round=0, proposer=liar), 60.0)
    ma = net.machines[a]
    # a's phase 1 at round 1: b and c promise, a forces v and accepts it; its ACCEPTs go unanswered.
    ma._start_proposal(net.now, ma._runs[RUN], fast=False)
    for out in ma.take_outgoing():
        if isinstance(out.message, Prepare) and out.to in (b, c):
            net.machines[out.to].receive(net.now, a, PROTOCOL, out.message)
            for answer in net.machines[out.to].take_outgoing():
                if isinstance(answer.message, Promise):
                    ma.receive(net.now, out.to, PROTOCOL, answer.message)
    assert ma._runs[RUN].accepted_ballot == Ballot(round=1, proposer=a)
    ma.take_outgoing()  # the ACCEPTs of round 1: they arrive after the liar's PREPARE, and are refused
    # The liar's round 2: the promises of a and c, and its own claiming nothing.
    high = Ballot(round=2, proposer=liar)
    proofs = []
    for target in (a, c):
        m = net.machines[target]
        m.receive(net.now, liar, PROTOCOL, Prepare(run=RUN, epoch=epoch, ballot=high))
        promise = next(o.message for o in m.take_outgoing() if isinstance(o.message, Promise))
        proofs.append(proof_of(target, promise))
    own = identity_of(liar).sign(promise_statement(RUN, epoch, high, None, b"", -1))
    proofs.append(SignedPromise(signer=liar, signature=own))
    accept = Accept(
        run=RUN,
        epoch=epoch,
        ballot=high,
        value=w.value,
        adopted=True,
        proposer_signature=identity_of(liar).sign(propose_statement(RUN, epoch, high, w.digest)),
        justification=tuple(proofs),
    )
    shares = {liar.raw: identity_of(liar).sign(statement(RUN, epoch, high, w.digest))}
    for target in (a, c):
        m = net.machines[target]
        m.receive(net.now, liar, PROTOCOL, accept)
        for out in m.take_outgoing():
            if isinstance(out.message, Accepted):
                shares[target.raw] = out.message.signature
    if len(shares) >= 3:  # w certified at round 2: the liar shows each side its commit
        w2 = Commit(
            run=RUN, epoch=epoch, value=w.value, digest=w.digest, certificate=make_certificate(config, high, shares)
        )
        for target in (a, c):
            net.machines[target].receive(net.now, liar, PROTOCOL, w2)
    net.machines[b].receive(net.now, liar, PROTOCOL, v)
    digests = {p: c_.digest for p in (a, b, c) for c_ in net.machines[p]._runs[RUN].configs if c_.epoch == epoch}
    assert len(set(digests.values())) <= 1, "two configurations for one epoch"
