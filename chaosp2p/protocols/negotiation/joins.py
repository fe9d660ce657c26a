"""Joining a run (part of the negotiation machine): run info, JOIN requests, admission.

A newcomer asks a member for the run's configuration (RUN_INFO), signs a JOIN against it and is
admitted by the COMMIT that carries the configuration including it -- the proposer's copy, or the
one the members it asked pass on (they hold a connection to the newcomer; the proposer may not).
Spec section 9 argues why a late admission is safe and which two are refused.

Which configuration a newcomer believes (spec section 6, "Trust"): its *anchor* for the run is the
first configuration it accepts from a RUN_INFO -- from a peer it was told to trust (``trust``: the
operator's bootstrap peers), or, if it was told to trust nobody, from the first member that
answers (trust on first use). Everything after that must be proven to follow the anchor by quorum
certificates (``certificates.certified_forward``): a later RUN_INFO, the configuration that admits
it, a snapshot. A peer that lies about the run cannot admit the newcomer into a configuration the
run never agreed on.
"""

from __future__ import annotations

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.negotiation.certificates import certified_forward
from chaosp2p.protocols.negotiation.configuration_change import check_operation
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.core import MachineCore
from chaosp2p.protocols.negotiation.events import (
    Admitted,
    ConfigurationCommitted,
    JoinRefused,
    RunInfo,
)
from chaosp2p.protocols.negotiation.messages import (
    Certificate,
    JoinRequest,
    RunInfoReply,
    RunInfoRequest,
    SyncReply,
)
from chaosp2p.protocols.negotiation.messages import JoinRefused as JoinRefusedMessage
from chaosp2p.protocols.negotiation.operations import OpKind, op_id, sign_operation
from chaosp2p.protocols.negotiation.paxos import REPLY_EXPECTED, RunRecord, coordinator
from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.protocols.negotiation.transitions import MEMBER_STATES, RunEvent, RunState, transition
from chaosp2p.wire.identity import PeerID

_MAX_QUERIES = 1024
"""Outstanding RUN_INFO requests remembered (the oldest is forgotten first)."""
_MAX_SPONSORED = 256
"""Newcomers per run whose admission we pass on (the oldest is forgotten first)."""
Admission = tuple[PeerID, Certificate | None]
"""Who admitted a newcomer, and the certificate of the configuration that admits it."""
_MAX_ANCHORS = 64
"""Runs we hold an anchor for without being a member (the oldest is forgotten first)."""


class Joins(MachineCore):
    """Run info, join requests and admissions; the configurations a newcomer trusts."""

    def _install(self, rec: RunRecord, config: Configuration, certificate: Certificate | None = None) -> None:
        rec.config = config
        rec.configs.append(config)
        rec.unverifiable_from.clear()
        rec.sync_quiet = 0
        if certificate is not None:
            rec.certs[config.epoch] = certificate
        if len(rec.configs) > self.config.max_history:
            gone = rec.configs.pop(0)
            rec.certs.pop(gone.epoch, None)
        rec.encoded = None
        me = config.incarnation_of(self.local_peer)
        if me is not None:
            rec.incarnation = me

    def _encoded(self, rec: RunRecord) -> bytes:
        config = rec.config
        assert config is not None
        if rec.encoded is None:
            rec.encoded = config.encode()
        return rec.encoded

    def _encoded_config(self, rec: RunRecord, config: Configuration) -> bytes:
        """The wire form of one of the run's configurations, cached: anyone may ask for it (a
        newcomer), and encoding a 1024-member configuration costs about a millisecond."""
        if config is rec.config:
            return self._encoded(rec)
        cached = rec.encoded_older.get(config.epoch)
        if cached is None or cached[0] != config.digest:
            if len(rec.encoded_older) >= 4:
                del rec.encoded_older[next(iter(rec.encoded_older))]
            cached = rec.encoded_older[config.epoch] = (config.digest, config.encode())
        return cached[1]

    # ------------------------------------------------------------------ joins, run info, announcements

    def _send_query(self, run: str, peer: PeerID) -> int:
        request_id = self._rng.getrandbits(63)
        if len(self._queries) >= _MAX_QUERIES:
            self._queries.pop(next(iter(self._queries)))
        self._queries[request_id] = (run, peer)
        anchor = self._anchors.get(run)
        known = -1 if anchor is None else anchor.epoch
        self._send(peer, RunInfoRequest(run=run, request_id=request_id, known_epoch=known))
        return request_id

    def _join_attempt(self, now: float, rec: RunRecord) -> None:
        join = rec.join
        assert join is not None
        sponsor = join.sponsors[join.attempt % len(join.sponsors)]
        join.attempt += 1
        join.answered = False
        join.request_id = self._send_query(rec.run, sponsor)
        join.retry_at = now + self.config.join_retry_s * self._jitter()

    def _on_run_info_request(self, now: float, sender: PeerID, msg: RunInfoRequest) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.state not in MEMBER_STATES or rec.config is None:
            self._send(sender, RunInfoReply(run=msg.run, request_id=msg.request_id))
            return
        if not rec.config.params.admits(sender):
            # A closed run tells an outsider what a non-member would: nothing (not even that it runs).
            self._reject(msg.run, "not_admitted", sender)
            self._send(sender, RunInfoReply(run=msg.run, request_id=msg.request_id))
            return
        given = self._given_to(rec, sender)
        raw = self._encoded_config(rec, given)
        previous = b""
        if 0 <= msg.known_epoch < given.epoch - 1:
            # The asker trusts an older configuration: the one before ours names our certificate's
            # signers, so that it can count its own anchor's members among them.
            before = next((c for c in rec.configs if c.epoch == given.epoch - 1), None)
            previous = b"" if before is None else self._encoded_config(rec, before)
        self._send(
            sender,
            RunInfoReply(
                run=msg.run,
                request_id=msg.request_id,
                configuration=raw,
                step=rec.entered,
                certificate=rec.certs.get(given.epoch),
                previous=previous,
            ),
        )

    def _given_to(self, rec: RunRecord, peer: PeerID) -> Configuration:
        """The configuration to hand ``peer``: our newest, unless ``peer`` is a member that may not
        have learned its admission yet (its COMMIT was lost; we completed no step it takes part
        in, which no step can be without it) and configurations committed since then activate
        after its first step. Then it gets the newest one governing that step (the one that
        admitted it, or a later one activating earlier), and catches up from there through SYNC:
        a newcomer handed only the newest configuration would know none for the steps before its
        activation step, which the members count on it for."""
        config = rec.config
        assert config is not None
        i = config.index_of(peer)
        if i < 0 or config.activation_step <= config.since_steps[i] or config.since_steps[i] <= rec.completed:
            return config
        since, incarnation = config.since_steps[i], config.incarnations[i]
        for older in reversed(rec.configs):
            if older.activation_step <= since:
                # The newcomer trusts a configuration only from one of its members.
                if older.incarnation_of(peer) == incarnation and older.has_member(self.local_peer):
                    return older
                break
        return config  # beyond our history (or we joined later): the newest is all we can give

    def _on_run_info(self, now: float, sender: PeerID, msg: RunInfoReply) -> None:
        query = self._queries.pop(msg.request_id, None)
        if query is None or query != (msg.run, sender):
            self._reject(msg.run, "unsolicited", sender)
            return
        config: Configuration | None = None
        withheld = ""
        if msg.configuration:
            try:
                config = decode_configuration(
                    msg.configuration, max_members=self.config.max_members, max_links=self.config.max_links
                )
                previous = None
                if msg.previous:
                    previous = decode_configuration(
                        msg.previous, max_members=self.config.max_members, max_links=self.config.max_links
                    )
            except RemoteProtocolError:
                self._reject(msg.run, "bad_configuration", sender)
                return
            if config.run != msg.run or not config.has_member(sender):
                self._reject(msg.run, "bad_configuration", sender)
                config = None
            elif (reason := self._believe(msg.run, sender, config, msg.certificate, previous)) is not None:
                self._reject(msg.run, reason, sender)
                config = None
                withheld = reason
        if config is None and not msg.configuration and sender.raw in self._trusted:
            declined = self._declined.setdefault(msg.run, set())
            if len(self._declined) > _MAX_ANCHORS:
                del self._declined[next(iter(self._declined))]
            declined.add(sender.raw)
        self._events.append(
            RunInfo(run=msg.run, configuration=config, step=msg.step, from_peer=sender, withheld=withheld)
        )
        rec = self._runs.get(msg.run)
        join = None if rec is None else rec.join
        if rec is None or join is None or rec.state is not RunState.JOINING or msg.request_id != join.request_id:
            return
        join.answered = True
        if config is None:
            self._join_refused(rec, sender, "not_member")
            return
        join.known = config
        skip = (sender.raw, self.local_peer.raw)  # raw bytes compare much faster than PeerIDs
        others = [p for p in config.peers if p.raw not in skip]
        if others:
            start = self._rng.randrange(len(others))
            others = others[start:] + others[:start]
        join.sponsors = [sender, *others]
        join.attempt = 1
        mine = config.incarnation_of(self.local_peer)
        if mine is not None and mine >= join.incarnation:
            # Our admission commit was lost; this is the configuration (proven to follow our anchor).
            self._admit(now, rec, config, (sender, msg.certificate))
            return
        gone = config.departed_incarnation(self.local_peer)
        incarnation = max(join.incarnation, -1 if gone is None else gone + 1, -1 if mine is None else mine + 1)
        join.incarnation = incarnation
        join.op = sign_operation(
            self.identity,
            kind=OpKind.JOIN,
            run=rec.run,
            epoch=config.epoch,
            subject=self.local_peer,
            incarnation=incarnation,
            detected_at=now,
            throughput_samples_per_s=join.throughput,
        )
        self._count("ops_raised")
        request = JoinRequest(run=rec.run, op=join.op)
        self._send(sender, request)
        # A member that already admitted us answers with a snapshot (SYNC_REPLY): expect one.
        rec.sync_asked.pop(sender.raw, None)
        rec.sync_asked[sender.raw] = REPLY_EXPECTED
        # The epoch's coordinator proposes at once, without phase 1, when it holds the JOIN: a copy
        # to it saves the sponsor's announcement hop (the sponsor still announces it, in case the
        # coordinator is down; the duplicate is recognised by its op id).
        lead = coordinator(config)
        if lead is not None and lead.raw not in skip:
            self._send(lead, request)

    def _believe(
        self, run: str, sender: PeerID, config: Configuration, cert: Certificate | None, previous: Configuration | None
    ) -> str | None:
        """Does a newcomer take ``config`` (from a RUN_INFO of ``sender``, a member of it) as the run's?
        None if so (it becomes or advances the anchor); else why not (spec section 6, "Trust")."""
        anchor = self._anchors.get(run)
        trusted = sender.raw in self._trusted
        if anchor is not None and not trusted:
            reason = certified_forward(self._sigs, anchor, config, cert, previous, me=self.local_peer)
            if reason is not None and self._trusted:
                return reason
            if reason is not None:
                # Trusting nobody, our anchor was only the first answer: a newer first answer is as good.
                self._count("anchors_replaced")
        elif anchor is None and self._trusted and not trusted:
            # Told whom to trust, and this is not one of them -- unless none of them can speak for
            # the run: each answered that it is no member, or could not be reached. Then the first
            # member that answers is as good as it gets (trust on first use; spec section 6).
            declined = self._declined.get(run, set()) | self._trusted_down
            if not self._trusted <= declined:
                self._ask_trusted(run, declined)
                return "untrusted"
        if anchor is None or anchor.epoch <= config.epoch:
            self._anchors.pop(run, None)
            if len(self._anchors) >= _MAX_ANCHORS:
                del self._anchors[next(iter(self._anchors))]
            self._anchors[run] = config
        return None

    def _ask_trusted(self, run: str, answered: set[bytes]) -> None:
        """Ask the trusted peers that have not spoken about ``run`` yet (once each): the caller's
        next try then finds the run's configuration from one of them, or learns that none can give
        it (each declines or cannot be reached) and believes the first member that answers."""
        asked = self._trusted_asked.setdefault(run, set())
        if len(self._trusted_asked) > _MAX_ANCHORS:
            del self._trusted_asked[next(iter(self._trusted_asked))]
        for raw in self._trusted - answered - asked:
            asked.add(raw)
            self._send_query(run, PeerID(raw=raw))

    def _join_refused(self, rec: RunRecord, sponsor: PeerID, reason: str) -> None:
        rec.state = transition(rec.state, RunEvent.JOIN_REFUSED)
        self._events.append(JoinRefused(run=rec.run, sponsor=sponsor, reason=reason))

    def _on_join_refused(self, now: float, sender: PeerID, msg: JoinRefusedMessage) -> None:
        rec = self._runs.get(msg.run)
        if rec is None or rec.state is not RunState.JOINING or rec.join is None:
            return
        if sender not in rec.join.sponsors:
            self._reject(msg.run, "unsolicited", sender)
            return
        rec.join.answered = True
        self._join_refused(rec, sender, msg.reason)

    def _on_join_request(self, now: float, sender: PeerID, msg: JoinRequest) -> None:
        rec = self._runs.get(msg.run)
        op = msg.op
        if rec is None or rec.state not in MEMBER_STATES or rec.config is None:
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="not_member"))
            return
        if not rec.config.params.admits(sender):
            # As for RUN_INFO: a closed run answers an outsider what a peer outside the run would.
            self._reject(msg.run, "not_admitted", sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="not_member"))
            return
        if op.kind is not OpKind.JOIN or op.origin != sender or op.subject != sender or op.run != msg.run:
            self._reject(msg.run, "forged_origin", sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="forged_origin"))
            return
        config = rec.config
        held = config.incarnation_of(sender)
        if held is not None and held >= op.incarnation:
            given = self._given_to(rec, sender)  # already admitted: its admission COMMIT was lost
            raw = self._encoded_config(rec, given)
            self._send(sender, SyncReply(run=msg.run, snapshot=raw, certificate=rec.certs.get(given.epoch)))
            return
        ident = op_id(op)
        if ident in rec.pending:
            self._sponsor(rec, sender, op.incarnation)
            self._announce(rec, (op,))  # a retry: the first announcement may have been lost
            return
        # Cheap checks before the signature (a newcomer is not a member: anyone can send this).
        reason = "replayed" if ident in rec.applied else check_operation(op, config)
        if reason is not None:
            self._reject(msg.run, reason, sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason=reason))
            return
        if self._sigs.check(op) is None:
            self._reject(msg.run, "bad_signature", sender)
            self._send(sender, JoinRefusedMessage(run=msg.run, reason="bad_signature"))
            return
        self._sponsor(rec, sender, op.incarnation)
        if self._admit_ops(now, rec, (op,), sender):
            self._announce(rec, (op,))
            self._ops_became_pending(now, rec)

    def _sponsor(self, rec: RunRecord, newcomer: PeerID, incarnation: int) -> None:
        sponsored = rec.sponsored
        sponsored.pop(newcomer.raw, None)
        sponsored[newcomer.raw] = (newcomer, incarnation)
        if len(sponsored) > _MAX_SPONSORED:
            del sponsored[next(iter(sponsored))]  # the oldest request; its newcomer still retries

    def _admit(self, now: float, rec: RunRecord, config: Configuration, via: Admission | None = None) -> None:
        """Become a member with ``config``; ``via``: the member that admitted us and the
        configuration's certificate (None: the simulator's preformed run)."""
        sender, certificate = (None, None) if via is None else via
        rec.state = transition(rec.state, RunEvent.ADMIT)
        rec.configs.clear()
        rec.history.clear()
        rec.certs.clear()
        rec.applied.clear()
        rec.join = None
        rec.entered = rec.completed = -1
        rec.last_completed_at = None
        self._anchors.pop(rec.run, None)  # from now on the run's own chain of commits
        self._install(rec, config, certificate)
        rec.reset_instance()
        rec.sync_at = now + self.config.sync_interval_s * self._rng.uniform(0.5, 1.5)
        self._events.append(ConfigurationCommitted(run=rec.run, configuration=config, committed_at=now))
        since = config.since_steps[config.index_of(self.local_peer)]
        self._events.append(Admitted(run=rec.run, configuration=config, activation_step=since))
        if sender is not None:
            # The configuration that admitted us may have been replaced already (its COMMIT came
            # late, or a member handed us the one governing our first step): catch up at once
            # instead of at the first SYNC beacon. Nothing newer: no answer.
            self._request_sync(rec, sender)
