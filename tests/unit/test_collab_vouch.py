"""The rule by which a newcomer accepts a run's snapshot: a quorum of the configuration vouches for it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from chaosp2p.errors import RemoteProtocolError, TransferError
from chaosp2p.protocols.collab.messages import SnapshotReply, SnapshotRequest, codec
from chaosp2p.protocols.collab.vouch import (
    StateNotVouched,
    Vouch,
    choose_vouched_state,
    read_vouches,
    sign_vouch,
    vouch_statement,
)
from chaosp2p.protocols.negotiation import Configuration, RunParams
from chaosp2p.protocols.negotiation.run_configuration import make_configuration
from chaosp2p.wire.identity import Identity

RUN = "run-v"
STEP = 12
GOOD = hashlib.sha256(b"the members' state").digest()
BAD = hashlib.sha256(b"a substituted state").digest()
SPEC = Path(__file__).resolve().parents[2] / "protocols" / "collab.md"


def ids(count: int, base: int = 0) -> list[Identity]:
    return [Identity.from_seed(bytes([base + i + 1]) * 32) for i in range(count)]


def config(members: list[Identity], *, epoch: int = 3, activation_step: int = 10) -> Configuration:
    peers = sorted((m.peer_id for m in members), key=lambda p: p.raw)
    return make_configuration(
        run=RUN,
        epoch=epoch,
        activation_step=activation_step,
        peers=peers,
        incarnations=[1] * len(peers),
        throughputs=[1.0] * len(peers),
        links=(),
        params=RunParams(global_batch=12),
        seed=7,
    )


def vouch(identity: Identity, digest: bytes, held: Configuration, step: int = STEP) -> Vouch:
    return sign_vouch(identity, run=RUN, step=step, state_digest=digest, config_digest=held.digest)


def test_a_quorum_of_the_configuration_decides_and_a_lying_member_is_refused() -> None:
    a, b, liar = ids(3)
    held = config([a, b, liar])
    chosen = choose_vouched_state(
        [vouch(liar, BAD, held), vouch(a, GOOD, held), vouch(b, GOOD, held)], run=RUN, step=STEP, anchor=held
    )
    assert chosen.state_digest == GOOD
    assert set(chosen.vouchers) == {a.peer_id, b.peer_id}
    assert [peer for peer, _ in chosen.refused] == [liar.peer_id]
    assert "another state" in chosen.refused[0][1]


def test_without_a_quorum_nothing_is_accepted_not_even_the_first_or_largest_answer() -> None:
    honest, liar = ids(2)
    held = config([honest, liar])
    with pytest.raises(StateNotVouched, match="no state"):  # 1 of 2 is not a majority, either way
        choose_vouched_state([vouch(liar, BAD, held), vouch(honest, GOOD, held)], run=RUN, step=STEP, anchor=held)
    assert issubclass(StateNotVouched, TransferError)


def test_outsiders_bad_signatures_and_other_steps_count_for_nothing() -> None:
    a, b, c = ids(3)
    outsiders = ids(5, base=50)
    held = config([a, b, c])
    forged = Vouch(
        voucher=b.peer_id,
        run=RUN,
        step=STEP,
        state_digest=BAD,
        config_digest=held.digest,
        signature=a.sign(vouch_statement(RUN, STEP, BAD, held.digest)),  # a's signature, b's name
    )
    sybils = [vouch(o, BAD, held) for o in outsiders]
    replayed = vouch(c, BAD, held, step=STEP - 1)  # a genuine vouch, for another step
    with pytest.raises(StateNotVouched):
        choose_vouched_state([*sybils, forged, replayed, vouch(a, BAD, held)], run=RUN, step=STEP, anchor=held)
    chosen = choose_vouched_state(
        [*sybils, forged, vouch(a, GOOD, held), vouch(c, GOOD, held)], run=RUN, step=STEP, anchor=held
    )
    assert chosen.state_digest == GOOD
    reasons = dict(chosen.refused)
    assert reasons[b.peer_id] == "signature does not verify"
    assert all("no part" in reasons[o.peer_id] for o in outsiders)


def test_a_member_that_signs_two_states_counts_for_neither() -> None:
    a, b, c = ids(3)
    held = config([a, b, c])
    with pytest.raises(StateNotVouched):
        choose_vouched_state(
            [vouch(a, GOOD, held), vouch(b, BAD, held), vouch(b, GOOD, held)], run=RUN, step=STEP, anchor=held
        )


def test_members_admitted_after_the_step_do_not_vouch_for_it() -> None:
    a, b, late = ids(3)
    base = config([a, b, late])
    since = tuple(STEP + 1 if p == late.peer_id else base.activation_step for p in base.peers)
    held = make_configuration(
        run=RUN,
        epoch=base.epoch,
        activation_step=base.activation_step,
        peers=base.peers,
        incarnations=base.incarnations,
        throughputs=base.throughputs,
        links=(),
        params=base.params,
        seed=base.seed,
        since_steps=since,
    )
    # Two of the step's participants (a, b) are its quorum; the late member's vouch is not counted.
    with pytest.raises(StateNotVouched):
        choose_vouched_state([vouch(a, GOOD, held), vouch(late, GOOD, held)], run=RUN, step=STEP, anchor=held)
    chosen = choose_vouched_state([vouch(a, GOOD, held), vouch(b, GOOD, held)], run=RUN, step=STEP, anchor=held)
    assert chosen.state_digest == GOOD


def test_a_later_configuration_counts_only_if_a_quorum_of_the_anchor_vouches_for_it() -> None:
    a, b, c = ids(3)
    anchor = config([a, b, c], epoch=3, activation_step=10)
    successor = config([a, b], epoch=4, activation_step=11)  # c failed before the step
    chosen = choose_vouched_state(
        [vouch(a, GOOD, successor), vouch(b, GOOD, successor)],
        run=RUN,
        step=STEP,
        anchor=anchor,
        configurations={successor.digest: successor},
    )
    assert chosen.state_digest == GOOD and chosen.configuration == successor
    # A configuration made up of the liar's own identities is a quorum of itself, not of the anchor.
    sybils = ids(3, base=80)
    fake = config([*sybils, a], epoch=4, activation_step=11)
    with pytest.raises(StateNotVouched):
        choose_vouched_state(
            [vouch(s, BAD, fake) for s in sybils],
            run=RUN,
            step=STEP,
            anchor=anchor,
            configurations={fake.digest: fake},
        )
    # A configuration that starts after the step did not hold it.
    future = config([a, b, c], epoch=4, activation_step=STEP + 1)
    with pytest.raises(StateNotVouched):
        choose_vouched_state(
            [vouch(m, GOOD, future) for m in (a, b, c)],
            run=RUN,
            step=STEP,
            anchor=anchor,
            configurations={future.digest: future},
        )


def test_replies_carry_the_vouch_and_a_cited_configuration_is_decoded_once_and_checked() -> None:
    a, b, c = ids(3)
    anchor = config([a, b, c])
    successor = config([a, b], epoch=4, activation_step=11)

    def reply(identity: Identity, held: Configuration, encoded: bytes) -> SnapshotReply:
        v = vouch(identity, GOOD, held)
        return SnapshotReply(
            ok=True,
            step=STEP,
            state_digest=v.state_digest,
            config_digest=v.config_digest,
            signature=v.signature,
            configuration=encoded,
        )

    tampered = bytearray(successor.encode())
    tampered[-40] ^= 1  # content no longer matches the digest it carries
    vouches, cited = read_vouches(
        [
            (a.peer_id, reply(a, successor, bytes(tampered))),
            (b.peer_id, reply(b, successor, successor.encode())),
            (c.peer_id, SnapshotReply(ok=False, step=STEP, reason="already past that step")),
        ],
        run=RUN,
        anchor=anchor,
        max_members=64,
        max_links=64,
    )
    assert [v.voucher for v in vouches] == [a.peer_id, b.peer_id]
    # The first (tampered) copy is refused and the digest is not tried again: nothing is cited.
    assert cited == {}
    vouches, cited = read_vouches(
        [(b.peer_id, reply(b, successor, successor.encode())), (a.peer_id, reply(a, successor, b""))],
        run=RUN,
        anchor=anchor,
        max_members=64,
        max_links=64,
    )
    assert cited == {successor.digest: successor}
    assert choose_vouched_state(vouches, run=RUN, step=STEP, anchor=anchor, configurations=cited).vouchers


@pytest.mark.parametrize(
    "fields",
    [
        {"state_digest": b"x" * 31},
        {"config_digest": b"x" * 33},
        {"signature": b"x" * 63},
    ],
)
def test_vouch_fields_of_the_wrong_size_are_refused_when_decoded(fields: dict[str, bytes]) -> None:
    good = {"state_digest": GOOD, "config_digest": GOOD, "signature": b"s" * 64}
    message = SnapshotReply(ok=True, step=STEP, **{**good, **fields})
    with pytest.raises(RemoteProtocolError):
        codec.decode(codec.encode(message), max_bytes=1 << 16)
    with pytest.raises(RemoteProtocolError):
        codec.decode(
            codec.encode(SnapshotRequest(run=RUN, step=1, layout=b"l" * 16, config_digest=b"d" * 31)), max_bytes=1 << 16
        )


def test_the_statement_matches_the_spec_vector() -> None:
    match = re.search(r"```vouch-vector\n(\S+) ([0-9a-f]+)\n```", SPEC.read_text())
    assert match, "protocols/collab.md has no vouch-vector block"
    assert match.group(1) == "VouchStatement"
    statement = vouch_statement("run-a", 42, bytes(range(32)), bytes(range(32, 64)))
    assert statement.hex() == match.group(2)
    signer = Identity.from_seed(bytes(32))
    signed = sign_vouch(signer, run="run-a", step=42, state_digest=bytes(range(32)), config_digest=bytes(range(32, 64)))
    assert signed.verify()
    assert not Vouch(
        voucher=ids(1)[0].peer_id,
        run="run-a",
        step=42,
        state_digest=signed.state_digest,
        config_digest=signed.config_digest,
        signature=signed.signature,
    ).verify()
