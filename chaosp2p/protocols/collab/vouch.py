"""Which snapshot a newcomer to a training run may load: the one the run vouches for.

Theory of operation
-------------------
A newcomer loads a snapshot of step ``s`` from the members of the run. A member is a peer like any
other: a majority vote among the sources it happens to use proves nothing (with one source, the
source decides alone). So inside a run the snapshot must be *vouched for* by the run itself:

* **The statement.** A member that publishes a snapshot of step ``s`` signs, with its Ed25519
  identity key, the canonical msgpack array ``["chaosp2p/collab/vouch/1", run, s, state_digest,
  config_digest]``: the SHA-256 digest of the snapshot's manifest (which covers every chunk hash)
  and the digest of the configuration that governed step ``s`` on that member. Synchronous members
  hold bit-identical state after every step, so every honest member of that configuration signs
  the same pair. The signature travels in the ``SnapshotReply``; a member whose configuration is
  not the one the newcomer named in its request adds that configuration's encoding.
* **The rule** (:func:`choose_vouched_state`). The newcomer holds an *anchor*: the configuration it
  was given when it found the run, the one its JOIN is signed against. It accepts state digest
  ``D`` for step ``s`` only if, for some configuration ``X`` of the run with
  ``X.activation_step <= s``:

  1. valid signatures over ``(run, s, D, X.digest)`` come from at least ``q(X)`` distinct members
     of ``X`` that take part in step ``s``, where ``q`` is a strict majority of those members;
  2. if ``X`` is not the anchor, the same signers include ``q(anchor)`` of the anchor's members
     that take part in step ``s`` -- a configuration the newcomer has only from a peer's reply is
     believed only as far as a majority of the configuration it already trusts vouches for it;
  3. no other digest satisfies 1-2 (two vouched states for one step mean equivocating members;
     the newcomer refuses both and tries again later).

  A member that signs two different digests for the step counts for neither. Signatures by peers
  that are not members, for another run or step, or that do not verify, count for nothing.
  Vouches are read one per member (the newcomer asks each member once), so their number is
  bounded by the anchor's size; a configuration is decoded only once per digest and at most
  ``MAX_CONFIGURATIONS`` distinct ones per decision.
* **Then** the newcomer pulls with the digest pinned (every chunk is checked against the vouched
  manifest), from the members that vouched for it; the others are reported and never used.

Why a plain majority, when negotiation's quorums share two members: the newcomer is the one
observer of every vouch it counts, and counts each member once, so one liar can neither make a
state other than the honest members' pass nor get two states a majority each (``collab.md`` §5.4).
What this does not defend against: a majority of the participants lying together, or a made-up
anchor (configurations are certified, but a newcomer whose bootstrap peers are no members takes
its anchor from the first member that answers: ask peers you trust, ``--bootstrap``).

``protocols/collab.md`` is the normative description, with the statement's test vector.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from chaosp2p.errors import ChaosError, RemoteProtocolError, TransferError
from chaosp2p.protocols.collab.messages import SnapshotReply
from chaosp2p.protocols.negotiation import Configuration
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID

log = logging.getLogger("chaosp2p.training")

VOUCH_DOMAIN = "chaosp2p/collab/vouch/1"
"""First item of every signed statement, so a vouch signature means nothing in another protocol."""
DIGEST_BYTES = 32
"""Size of the state and configuration digests a vouch names (SHA-256)."""
SIGNATURE_BYTES = 64
"""Size of an Ed25519 signature."""
MAX_CONFIGURATIONS = 4
"""Distinct cited configurations a newcomer decodes per decision (honest members cite one, or
two around a change); vouches citing others are not counted."""


class StateNotVouched(TransferError):
    """No snapshot of the step is vouched for by a quorum of the run's configuration."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Vouch:
    """A member's signed statement: ``run`` at ``step`` under ``config_digest`` is ``state_digest``."""

    voucher: PeerID
    run: str
    step: int
    state_digest: bytes
    config_digest: bytes
    signature: bytes

    def verify(self) -> bool:
        """Whether the signature is the voucher's over this statement (sizes checked first)."""
        if (
            len(self.state_digest) != DIGEST_BYTES
            or len(self.config_digest) != DIGEST_BYTES
            or len(self.signature) != SIGNATURE_BYTES
        ):
            return False
        return self.voucher.verify(
            self.signature, vouch_statement(self.run, self.step, self.state_digest, self.config_digest)
        )


def vouch_statement(run: str, step: int, state_digest: bytes, config_digest: bytes) -> bytes:
    """The bytes a vouch signs (see the module docstring)."""
    return pack([VOUCH_DOMAIN, run, step, state_digest, config_digest])


def sign_vouch(identity: Identity, *, run: str, step: int, state_digest: bytes, config_digest: bytes) -> Vouch:
    """``identity``'s vouch for the snapshot ``state_digest`` of ``run`` at ``step``."""
    signature = identity.sign(vouch_statement(run, step, state_digest, config_digest))
    return Vouch(
        voucher=identity.peer_id,
        run=run,
        step=step,
        state_digest=state_digest,
        config_digest=config_digest,
        signature=signature,
    )


def vouched_reply(vouch: Vouch, config: Configuration, *, asker_config_digest: bytes) -> SnapshotReply:
    """The ``ok`` answer to a snapshot request carrying ``vouch``; ``config`` (what governed the
    step) travels along only when the asker does not already hold it."""
    return SnapshotReply(
        ok=True,
        step=vouch.step,
        state_digest=vouch.state_digest,
        config_digest=vouch.config_digest,
        signature=vouch.signature,
        configuration=b"" if config.digest == asker_config_digest else config.encode(),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class VouchedState:
    """The outcome of :func:`choose_vouched_state`."""

    state_digest: bytes
    configuration: Configuration
    """The configuration that held the step (the one the vouches cite)."""
    vouchers: tuple[PeerID, ...]
    """Members whose valid vouch counted, sorted."""
    refused: tuple[tuple[PeerID, str], ...]
    """Peers whose vouch did not count, with why (another digest, bad signature, not a member...)."""


def read_vouches(
    replies: Iterable[tuple[PeerID, SnapshotReply]],
    *,
    run: str,
    anchor: Configuration,
    max_members: int,
    max_links: int,
) -> tuple[list[Vouch], dict[bytes, Configuration]]:
    """The vouches in members' ``ok`` replies, and the configurations they cite besides ``anchor``.

    Each cited configuration is decoded once per digest (its content checked against the digest),
    at most ``MAX_CONFIGURATIONS`` of them; one that fails to decode is simply not known (its
    vouchers then cite a configuration this newcomer does not hold).
    """
    vouches: list[Vouch] = []
    configurations: dict[bytes, Configuration] = {}
    tried: set[bytes] = {anchor.digest}
    for peer, reply in replies:
        if not reply.ok or not reply.signature:
            continue
        vouches.append(
            Vouch(
                voucher=peer,
                run=run,
                step=reply.step,
                state_digest=reply.state_digest,
                config_digest=reply.config_digest,
                signature=reply.signature,
            )
        )
        if reply.configuration and reply.config_digest not in tried and len(tried) <= MAX_CONFIGURATIONS:
            tried.add(reply.config_digest)
            try:
                config = decode_configuration(reply.configuration, max_members=max_members, max_links=max_links)
            except RemoteProtocolError as exc:
                log.info("member %s sent a configuration that does not decode: %s", peer, exc)
                continue
            if config.digest == reply.config_digest:
                configurations[config.digest] = config
    return vouches, configurations


def _quorum(config: Configuration, step: int) -> tuple[frozenset[PeerID], int]:
    takers = frozenset(config.participants(step))
    return takers, len(takers) // 2 + 1


def choose_vouched_state(
    vouches: Iterable[Vouch],
    *,
    run: str,
    step: int,
    anchor: Configuration,
    configurations: Mapping[bytes, Configuration] | None = None,
) -> VouchedState:
    """The state digest of ``run`` at ``step`` that the run vouches for (the rule above).

    ``configurations`` are the configurations the vouches cite besides ``anchor``, by digest
    (already decoded, which checked each digest against its content). Raises
    :class:`StateNotVouched` when no digest, or more than one, meets the rule.
    """
    if anchor.run != run:
        raise ChaosError(f"the anchor configuration is of run {anchor.run!r}, not {run!r}")
    known = {anchor.digest: anchor}
    for digest, config in (configurations or {}).items():
        if len(known) > MAX_CONFIGURATIONS:
            break
        if config.digest == digest and config.run == run:
            known[digest] = config
    refused: dict[PeerID, str] = {}
    signed: dict[PeerID, tuple[bytes, bytes]] = {}  # voucher -> (state digest, config digest)
    for vouch in vouches:
        peer = vouch.voucher
        if peer in refused:
            continue
        if vouch.run != run or vouch.step != step:
            refused[peer] = f"vouched for {vouch.run!r} step {vouch.step}, not step {step}"
            continue
        cited = known.get(vouch.config_digest)
        if cited is None:
            refused[peer] = "cites a configuration this newcomer does not hold"
            continue
        if cited.activation_step > step:
            refused[peer] = f"cites epoch {cited.epoch}, which governs only from step {cited.activation_step}"
            continue
        if not cited.takes_part(peer, step):
            refused[peer] = f"takes no part in step {step} of the configuration it cites"
            continue
        if not vouch.verify():
            refused[peer] = "signature does not verify"
            continue
        pair = (vouch.state_digest, vouch.config_digest)
        previous = signed.get(peer)
        if previous is not None and previous != pair:
            del signed[peer]
            refused[peer] = "signed two different states for the step"
            continue
        signed[peer] = pair
    anchor_takers, anchor_quorum = _quorum(anchor, step)
    backers: dict[tuple[bytes, bytes], set[PeerID]] = {}
    for peer, pair in signed.items():
        backers.setdefault(pair, set()).add(peer)
    passed: list[tuple[bytes, Configuration, set[PeerID]]] = []
    for (state_digest, config_digest), peers in backers.items():
        config = known[config_digest]
        takers, needed = _quorum(config, step)
        if len(peers & takers) < needed:
            continue
        if config is not anchor and len(peers & anchor_takers) < anchor_quorum:
            continue
        passed.append((state_digest, config, peers))
    states = {state for state, _, _ in passed}
    if len(states) != 1:
        what = "no state" if not states else f"{len(states)} different states"
        raise StateNotVouched(
            f"run {run!r} step {step}: {what} vouched for by a quorum of the configuration "
            f"({len(signed)} valid vouches, {len(refused)} refused)"
        )
    state_digest, config, peers = passed[0]
    for peer, (other, _) in signed.items():
        if other != state_digest:
            refused[peer] = f"vouched for another state ({other.hex()[:16]}…)"
    return VouchedState(
        state_digest=state_digest,
        configuration=config,
        vouchers=tuple(sorted(peers, key=lambda p: p.raw)),
        refused=tuple(sorted(refused.items(), key=lambda item: item[0].raw)),
    )


__all__ = [
    "MAX_CONFIGURATIONS",
    "VOUCH_DOMAIN",
    "StateNotVouched",
    "Vouch",
    "VouchedState",
    "choose_vouched_state",
    "read_vouches",
    "sign_vouch",
    "vouch_statement",
    "vouched_reply",
]
