"""Property test: one Byzantine member among honest ones (issue 20, "Done when").

The simulated run (``chaosp2p.sim.negotiation``, real machines, virtual time, the all-reduce
oracle) has one member, the *liar*, whose identity an adversary uses to send, at random moments,
what the protocol must survive: forged configurations in catch-up answers (unsolicited, and in
answer to a request), COMMITs without a certificate or with one only the liar signed -- a
different one to each member (equivocation) --, ACCEPTs of different values to different members
at one ballot (equivocation), FAILs of live members (alone, or as the proposer of a value), EVICTs
of honest members, and replays of anything it received, reordered. Meanwhile honest members join,
leave and crash. After every step:

* honest members never hold different configurations for one epoch (``swarm.problems`` records
  every configuration any peer installs);
* no honest member is removed unless it crashed or left: a FAIL, EVICT or LEAVE that removes an
  honest member is committed only about a crashed one, a leaver, or by a quorum's EVICTs (which
  honest members never sign here).

It also plays the two strategies that split an epoch before quorums of odd runs grew to a
majority + 1 and ballots above round 0 needed signed promises (spec sections 4b and 9): the liar
certifying two values at one ballot of its own with the acceptances its equivocating ACCEPTs earn
(at round 0 when it is the coordinator, else after a phase 1 whose promises it shows), and the
liar withholding a COMMIT it certified while proposing another value at a higher ballot (with or
without phase 1), and -- after an equivocation and a wait in which an honest member may take over --
justifying a higher ballot with only the promises that do not show the withheld value backed.
Runs start with four members or more: at three, one liar can split an epoch
(the documented limit, ``test_negotiation_certificates.py``).
"""

from __future__ import annotations

import dataclasses
import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from chaosp2p.protocols.negotiation import NegotiationConfig, OpKind, RunParams
from chaosp2p.protocols.negotiation.certificates import make_certificate, statement
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.justification import promise_statement, propose_statement
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Accepted,
    Ballot,
    Commit,
    OpsAnnounce,
    Prepare,
    Promise,
    SignedPromise,
    SyncReply,
    Value,
)
from chaosp2p.protocols.negotiation.operations import PROTOCOL, Operation, op_id, sign_operation
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.protocols.negotiation.promises import proof_of
from chaosp2p.protocols.negotiation.run_configuration import Configuration, quorum
from chaosp2p.sim.negotiation import NegotiationSwarm, sim_identity
from chaosp2p.sim.network import LinkProfile
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message
from tests.unit.test_negotiation_certificates import forged_configuration
from tests.unit.test_negotiation_property import NegotiationProperties

CONFIG = dataclasses.replace(NegotiationConfig.local(), max_history=8)
FAKES = [sim_identity(900 + i, namespace=77) for i in range(3)]


class ByzantineMember(RuleBasedStateMachine):
    """One run of honest members and one liar; see the module docstring."""

    swarm: NegotiationSwarm

    @initialize(seed=st.integers(min_value=0, max_value=2**16), size=st.integers(min_value=4, max_value=8))
    def start(self, seed: int, size: int) -> None:
        self.swarm = NegotiationSwarm(
            config=CONFIG,
            seed=seed,
            params=RunParams(global_batch=64),
            link=LinkProfile(latency_s=0.001, jitter_s=0.002),
            step_time_s=0.03,
        )
        formed = self.swarm.preform(size)
        self.liar = formed.peers[seed % size]
        self.identity = self.swarm.peers[self.liar].identity
        self.heard: list[tuple[PeerID, Message]] = []
        self.answers: list[tuple[PeerID, Promise | Accepted]] = []
        """PROMISEs and ACCEPTEDs sent to the liar: what it certifies its own values with."""
        self.crashed: set[PeerID] = set()
        self.leavers: set[PeerID] = set()
        self.round = 1000
        node = self.swarm.peers[self.liar].node
        honest_receive = node.receive

        def receive(now: float, sender: PeerID, protocol: str, message: Message) -> None:
            # The liar's machine runs (it stays a member others count on); the adversary keeps
            # a copy of what it hears, to replay.
            if len(self.heard) < 400:
                self.heard.append((sender, message))
            if isinstance(message, (Promise, Accepted)) and len(self.answers) < 400:
                self.answers.append((sender, message))
            honest_receive(now, sender, protocol, message)

        node.receive = receive  # type: ignore[method-assign]
        self.swarm.run_for(0.2)

    # ------------------------------------------------------------------ helpers
    def _honest(self) -> list[PeerID]:
        return [p for p in self.swarm.members() if p != self.liar]

    def _current(self) -> Configuration | None:
        return self.swarm.peers[self.liar].machine.configuration(self.swarm.run)

    def _honest_members(self) -> tuple[Configuration, list[PeerID]] | None:
        """The liar's configuration and its honest members, when there are two at least to lie to."""
        config = self._current()
        honest = [p for p in self._honest() if config is not None and config.has_member(p)]
        if config is None or len(honest) < 2:
            return None
        return config, honest

    def _equivocation(self) -> tuple[Configuration, list[PeerID], Ballot] | None:
        """The liar's view, the honest members to lie to (two at least) and a fresh ballot of its own."""
        config = self._current()
        honest = self._honest()
        if config is None or len(honest) < 2:
            return None
        self.round += 1
        return config, honest, Ballot(round=self.round, proposer=self.liar)

    def _send(self, to: PeerID, message: Message) -> None:
        self.swarm.net.inject(self.liar, to, PROTOCOL, message)

    def _own_op(self, config: Configuration, rate: float) -> Operation:
        return sign_operation(
            self.identity,
            kind=OpKind.THROUGHPUT,
            run=self.swarm.run,
            epoch=config.epoch,
            subject=self.liar,
            incarnation=config.incarnation_of(self.liar) or 0,
            detected_at=self.swarm.net.now,
            throughput_samples_per_s=rate,
        )

    def _may_lose(self, peer: PeerID) -> bool:
        swarm = self.swarm
        latest = swarm.configs[max(swarm.configs)]
        alive = {p for p in swarm.running() if not swarm.peers[p].leaving} - {peer, self.liar}
        return len(alive & set(latest.peers)) >= quorum(latest)

    # ------------------------------------------------------------------ honest churn
    @precondition(lambda self: len(self.swarm.peers) < 12)
    @rule()
    def join(self) -> None:
        self.swarm.spawn()

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        candidates = [p for p in self._honest() if self._may_lose(p)]
        if candidates:
            peer = data.draw(st.sampled_from(candidates))
            self.crashed.add(peer)
            self.swarm.crash(peer)

    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        candidates = [p for p in self._honest() if self._may_lose(p) and not self.swarm.peers[p].leaving]
        if candidates and len(candidates) > 2:
            peer = data.draw(st.sampled_from(candidates))
            self.leavers.add(peer)
            self.swarm.leave(peer)

    @rule(seconds=st.sampled_from([0.005, 0.05, 0.3]))
    def advance(self, seconds: float) -> None:
        self.swarm.run_for(seconds)

    # ------------------------------------------------------------------ the liar
    @rule(data=st.data(), ahead=st.integers(min_value=1, max_value=40), solicited=st.booleans())
    def forged_snapshot(self, data: st.DataObject, ahead: int, solicited: bool) -> None:
        config = self._current()
        honest = self._honest()
        if config is None or not honest:
            return
        target = data.draw(st.sampled_from(honest))
        fake = forged_configuration(config, [self.liar, *(f.peer_id for f in FAKES), target], epochs_ahead=ahead)
        ballot = Ballot(round=self.round, proposer=self.liar)
        body = statement(config.run, fake.epoch, ballot, fake.digest)
        shares = {p.raw: self.identity.sign(body) for p in (self.liar, *(f.peer_id for f in FAKES))}
        cert = make_certificate(fake, ballot, shares)
        if solicited:
            # The target asks the liar (as after the liar's SYNC beacon claiming a later epoch).
            self.swarm.call(target, lambda m, now: m._request_sync(m._runs[m.runs()[0]], self.liar))
        reply = SyncReply(run=config.run, snapshot=fake.encode(), certificate=cert, previous=fake.encode())
        self._send(target, reply)

    @rule(data=st.data(), signed=st.booleans())
    def equivocating_commits(self, data: st.DataObject, signed: bool) -> None:
        setting = self._equivocation()
        if setting is None:
            return
        config, honest, ballot = setting
        for i, target in enumerate(honest):
            op = self._own_op(config, rate=float(10 + i))
            step = config.activation_step + 2
            new, _ = next_configuration(config, [(op_id(op), op)], step)
            value = Value(ops=(op,), activation_step=step)
            commit = Commit(run=config.run, epoch=new.epoch, value=value, digest=new.digest)
            if signed:
                body = statement(config.run, new.epoch, ballot, new.digest)
                # Its own signature, and the others' names on its signature.
                forged = {p.raw: self.identity.sign(body) for p in config.peers[: quorum(config)]}
                commit = dataclasses.replace(commit, certificate=make_certificate(config, ballot, forged))
            self._send(target, commit)

    @rule(data=st.data())
    def equivocating_accepts(self, data: st.DataObject) -> None:
        setting = self._equivocation()
        if setting is None:
            return
        config, honest, ballot = setting
        step = config.activation_step + data.draw(st.integers(min_value=0, max_value=4))
        for i, target in enumerate(honest):
            value = Value(ops=(self._own_op(config, rate=float(20 + i % 2)),), activation_step=step)
            self._send(target, Accept(run=config.run, epoch=config.epoch + 1, ballot=ballot, value=value))

    @rule(data=st.data(), propose=st.booleans())
    def fail_a_live_member(self, data: st.DataObject, propose: bool) -> None:
        config = self._current()
        honest = [p for p in self._honest() if p not in self.crashed]
        if config is None or not honest:
            return
        victim = data.draw(st.sampled_from(honest))
        held = config.incarnation_of(victim)
        if held is None:
            return
        about = {"run": config.run, "epoch": config.epoch, "subject": victim, "incarnation": held}
        now = self.swarm.net.now
        fail = sign_operation(self.identity, kind=OpKind.FAIL, detected_at=now, observed_incarnation=10**6, **about)
        evict = sign_operation(self.identity, kind=OpKind.EVICT, detected_at=now, **about)
        for target in honest:
            if propose:
                ballot = Ballot(round=self.round, proposer=self.liar)
                value = Value(ops=(fail, evict), activation_step=config.activation_step)
                self._send(target, Accept(run=config.run, epoch=config.epoch + 1, ballot=ballot, value=value))
            else:
                self._send(target, OpsAnnounce(run=config.run, epoch=config.epoch, ops=(fail, evict)))
        self.round += 1

    @rule(data=st.data(), count=st.integers(min_value=1, max_value=10))
    def replay(self, data: st.DataObject, count: int) -> None:
        honest = self._honest()
        if not self.heard or not honest:
            return
        for _ in range(count):
            _, message = data.draw(st.sampled_from(self.heard))
            self._send(data.draw(st.sampled_from(honest)), message)

    def _value(self, config: Configuration, rate: float) -> tuple[Value, bytes]:
        op = self._own_op(config, rate)
        step = config.activation_step + 2
        new, _ = next_configuration(config, [(op_id(op), op)], step)
        return Value(ops=(op,), activation_step=step), new.digest

    def _phase1(self, config: Configuration, honest: list[PeerID], ballot: Ballot) -> tuple[SignedPromise, ...]:
        """The promises the liar can show for ``ballot``: round 0 needs none (if it is the
        coordinator); otherwise it asks every honest member and adds its own (claiming nothing)."""
        if ballot.round == 0:
            return ()
        epoch = config.epoch + 1
        self.answers.clear()
        for target in honest:
            self._send(target, Prepare(run=config.run, epoch=epoch, ballot=ballot))
        self.swarm.run_for(0.02)
        own = self.identity.sign(promise_statement(config.run, epoch, ballot, None, b"", -1))
        proofs = [SignedPromise(signer=self.liar, signature=own)]
        for sender, m in self.answers:
            if isinstance(m, Promise) and m.ballot == ballot and m.epoch == epoch and m.signature:
                proofs.append(proof_of(sender, m))
        return tuple(proofs)

    def _certify(
        self,
        config: Configuration,
        targets: list[PeerID],
        ballot: Ballot,
        rate: float,
        proofs: tuple[SignedPromise, ...],
    ) -> Commit:
        """Have ``targets`` accept a value of the liar's at ``ballot``; certify it with whatever
        acceptances come back and the liar's own signature."""
        value, digest = self._value(config, rate)
        epoch = config.epoch + 1
        self.answers.clear()
        signed = self.identity.sign(propose_statement(config.run, epoch, ballot, digest))
        accept = Accept(
            run=config.run,
            epoch=epoch,
            ballot=ballot,
            value=value,
            adopted=True,
            proposer_signature=signed,
            justification=proofs,
        )
        for target in targets:
            self._send(target, accept)
        self.swarm.run_for(0.02)
        body = statement(config.run, epoch, ballot, digest)
        shares = {self.liar.raw: self.identity.sign(body)}
        for sender, m in self.answers:
            if isinstance(m, Accepted) and m.ballot == ballot and m.signature:
                shares[sender.raw] = m.signature
        cert = make_certificate(config, ballot, shares)
        return Commit(run=config.run, epoch=epoch, value=value, digest=digest, certificate=cert)

    def _own_ballot(self, config: Configuration, round_zero: bool) -> Ballot:
        self.round += 1
        if round_zero and coordinator(config) == self.liar:
            return Ballot(round=0, proposer=self.liar)
        return Ballot(round=self.round, proposer=self.liar)

    @rule(data=st.data(), round_zero=st.booleans())
    def equivocation_at_own_ballot(self, data: st.DataObject, round_zero: bool) -> None:
        """Different values to two halves at one ballot of its own, each certified with the
        acceptances it earned (issue 20: split an odd run with majority quorums)."""
        found = self._honest_members()
        if found is None:
            return
        config, honest = found
        ballot = self._own_ballot(config, round_zero)
        proofs = self._phase1(config, honest, ballot)
        cut = data.draw(st.integers(min_value=1, max_value=len(honest) - 1))
        for half, rate in ((honest[:cut], 31.0), (honest[cut:], 32.0)):
            commit = self._certify(config, half, ballot, rate, proofs)
            for target in half:
                self._send(target, commit)

    @rule(data=st.data(), round_zero=st.booleans(), phase1=st.booleans())
    def withheld_commit_then_higher_ballot(self, data: st.DataObject, round_zero: bool, phase1: bool) -> None:
        """Certify v, show the COMMIT to one member only, then propose w at a higher ballot to the
        others -- without phase 1, or with a phase 1 whose promises it shows (issue 20)."""
        found = self._honest_members()
        if found is None:
            return
        config, honest = found
        ballot = self._own_ballot(config, round_zero)
        first = self._certify(config, honest, ballot, 41.0, self._phase1(config, honest, ballot))
        told = data.draw(st.sampled_from(honest))
        self._send(told, first)
        others = [p for p in honest if p != told]
        higher = Ballot(round=self.round + 1, proposer=self.liar)
        self.round += 1
        proofs = self._phase1(config, others, higher) if phase1 else ()
        second = self._certify(config, others, higher, 42.0, proofs)
        for target in others:
            self._send(target, second)

    @rule(data=st.data(), round_zero=st.booleans(), wait_ms=st.integers(min_value=0, max_value=900))
    def equivocation_then_selective_promises(self, data: st.DataObject, round_zero: bool, wait_ms: int) -> None:
        """v accepted by a quorum with the liar, w by the others, v withheld; after ``wait_ms`` (an
        honest takeover may be under way) a higher ballot justified by only the promises that do
        not show v backed. The strategy that split a run of four while a proposer's own unanswered
        acceptance counted as no claim; the race it needs is narrow here (300 examples did not hit it
        with that fix undone), so ``test_negotiation_equivocation_settling.py`` plays it exactly."""
        found = self._honest_members()
        if found is None:
            return
        config, honest = found
        ballot = self._own_ballot(config, round_zero)
        proofs = self._phase1(config, honest, ballot)
        chosen_by = honest[: quorum(config) - 1]
        v = self._certify(config, chosen_by, ballot, 51.0, proofs)
        rest = honest[len(chosen_by) :]
        if rest:
            self._certify(config, rest, ballot, 52.0, proofs)
        self.swarm.run_for(wait_ms / 1000)
        if self._current() is not config:
            return  # decided meanwhile
        higher = Ballot(round=self.round + 1, proposer=self.liar)
        self.round += 1
        shown = tuple(
            proof
            for proof in self._phase1(config, honest, higher)
            if proof.accepted_digest != v.digest or proof.backer is None
        )
        if len(shown) >= quorum(config):
            second = self._certify(config, honest, higher, 52.0, shown)
            for target in honest:
                self._send(target, v if target in chosen_by else second)

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_fork(self) -> None:
        assert self.swarm.problems == []

    @invariant()
    def nobody_removed_without_cause(self) -> None:
        removed_kinds = (OpKind.FAIL, OpKind.EVICT, OpKind.LEAVE)
        for _, _, event in self.swarm.op_events:
            if event.applied and event.kind in removed_kinds and event.subject != self.liar:
                assert event.subject in self.crashed | self.leavers, (event.kind, event.subject)

    def teardown(self) -> None:
        swarm = getattr(self, "swarm", None)
        if swarm is not None:
            assert swarm.violations() == []


ByzantineMember.TestCase.settings = settings(
    NegotiationProperties.TestCase.settings,
    max_examples=int(os.environ.get("NEGOTIATION_BYZANTINE_EXAMPLES", "25")),
)
TestByzantineMember = ByzantineMember.TestCase
