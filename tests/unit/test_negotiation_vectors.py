"""protocols/negotiation.md: its msgpack vectors match the codec both ways, and its state diagrams
are exactly what the transition tables render."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaosp2p.protocols.negotiation.certificates import statement
from chaosp2p.protocols.negotiation.configuration_change import next_configuration
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.justification import promise_statement, propose_statement
from chaosp2p.protocols.negotiation.messages import (
    Accept,
    Accepted,
    Ballot,
    Certificate,
    Commit,
    CommitRecord,
    JoinRefused,
    JoinRequest,
    Nack,
    OpsAnnounce,
    Prepare,
    Promise,
    RefusePast,
    RunInfoReply,
    RunInfoRequest,
    SignedPromise,
    Sync,
    SyncReply,
    SyncRequest,
    Value,
    codec,
)
from chaosp2p.protocols.negotiation.operations import OpKind, op_id, sign_operation
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry, RunParams, genesis_configuration
from chaosp2p.protocols.negotiation.transitions import render_state_diagram
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.messages import Message

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "negotiation.md"

IA, IB, IC = (Identity.from_seed(bytes([b]) * 32) for b in (1, 2, 3))
A, B, C = IA.peer_id, IB.peer_id, IC.peer_id
RUN = "run-1"

LEAVE_B = sign_operation(IB, kind=OpKind.LEAVE, run=RUN, epoch=4, subject=B, incarnation=2, detected_at=12.5)
FAIL_C = sign_operation(
    IA, kind=OpKind.FAIL, run=RUN, epoch=4, subject=C, incarnation=1, detected_at=13.0, observed_incarnation=7
)
JOIN_C = sign_operation(
    IC, kind=OpKind.JOIN, run=RUN, epoch=4, subject=C, incarnation=2, detected_at=14.0, throughput_samples_per_s=120.0
)
LINK_AB = sign_operation(
    IA,
    kind=OpKind.LINK_UP,
    run=RUN,
    epoch=4,
    subject=min(A, B, key=lambda p: p.raw),
    other=max(A, B, key=lambda p: p.raw),
    incarnation=0,
    detected_at=15.0,
    bandwidth_bytes_per_s=1.25e9,
    rtt_s=0.0004,
)
EVICT_C = tuple(
    sign_operation(signer, kind=OpKind.EVICT, run=RUN, epoch=4, subject=C, incarnation=1, detected_at=16.0)
    for signer in (IA, IB)
)
STALL_C = tuple(
    sign_operation(signer, kind=OpKind.STALL, run=RUN, epoch=4, subject=C, incarnation=1, detected_at=17.0)
    for signer in (IA, IB)
)
"""Issue 19: A and B each waited a whole round on C, which sent them nothing."""
BALLOT = Ballot(round=3, proposer=A)
VALUE = Value(ops=(FAIL_C, LEAVE_B), activation_step=120, proposed_at=13.25)
ACCEPTANCE = statement(RUN, 5, BALLOT, bytes(range(32)))
CERT = Certificate(ballot=BALLOT, signers=b"\x03", signatures=(IA.sign(ACCEPTANCE), IB.sign(ACCEPTANCE)))
"""Members 0 and 1 (in PeerID order) of a C_4 signed the acceptance of VALUE at BALLOT."""

_C0 = genesis_configuration(RUN, A, incarnation=0, throughput=100.0, params=RunParams(global_batch=256))
_JOIN_B = sign_operation(
    IB, kind=OpKind.JOIN, run=RUN, epoch=0, subject=B, incarnation=2, detected_at=1.0, throughput_samples_per_s=50.0
)
PROMISED = promise_statement(RUN, 5, BALLOT, Ballot(round=1, proposer=B), bytes(range(32)), 117)
SIGNED_PROMISE = SignedPromise(
    signer=C,
    accepted_ballot=Ballot(round=1, proposer=B),
    accepted_digest=bytes(range(32)),
    backer=B,
    backing=IB.sign(propose_statement(RUN, 5, Ballot(round=1, proposer=B), bytes(range(32)))),
    completed=117,
    signature=IC.sign(PROMISED),
)
"""C promised BALLOT; it had accepted, at B's ballot 1, the value making digest 00..1f, which B
signed it proposed (issue 20, justified ballots)."""
CONFIG_1, _ = next_configuration(_C0, [(op_id(_JOIN_B), _JOIN_B)], 10)
CONFIG_BYTES = CONFIG_1.encode()

EXPECTED: dict[str, Message] = {
    "ops-announce": OpsAnnounce(run=RUN, epoch=4, ops=(LEAVE_B,), entered=118, completed=117, step_time_s=0.25),
    "ops-announce-link": OpsAnnounce(run=RUN, epoch=4, ops=(LINK_AB,)),
    "ops-announce-evict": OpsAnnounce(run=RUN, epoch=4, ops=EVICT_C),
    "ops-announce-stall": OpsAnnounce(run=RUN, epoch=4, ops=STALL_C),
    "prepare": Prepare(run=RUN, epoch=5, ballot=BALLOT),
    "promise": Promise(
        run=RUN,
        epoch=5,
        ballot=BALLOT,
        accepted_ballot=Ballot(round=1, proposer=B),
        accepted_value=VALUE,
        ops=(JOIN_C,),
        entered=118,
        completed=117,
        step_time_s=0.25,
        accepted_digest=SIGNED_PROMISE.accepted_digest,
        backer=B,
        backing=SIGNED_PROMISE.backing,
        signature=SIGNED_PROMISE.signature,
    ),
    "promise-empty": Promise(run=RUN, epoch=5, ballot=BALLOT),
    "nack": Nack(run=RUN, epoch=5, ballot=BALLOT, promised=Ballot(round=4, proposer=C), known_epoch=4),
    "accept": Accept(run=RUN, epoch=5, ballot=BALLOT, value=VALUE),
    "accept-adopted": Accept(run=RUN, epoch=5, ballot=BALLOT, value=VALUE, adopted=True),
    "accept-justified": Accept(
        run=RUN,
        epoch=5,
        ballot=BALLOT,
        value=VALUE,
        adopted=True,
        proposer_signature=IA.sign(propose_statement(RUN, 5, BALLOT, bytes(range(32)))),
        justification=(SIGNED_PROMISE,),
    ),
    "accepted": Accepted(
        run=RUN, epoch=5, ballot=BALLOT, entered=118, completed=117, step_time_s=0.25, signature=IB.sign(ACCEPTANCE)
    ),
    "refuse-past": RefusePast(run=RUN, epoch=5, ballot=BALLOT, completed=130),
    "commit": Commit(run=RUN, epoch=5, value=VALUE, digest=bytes(range(32)), certificate=CERT),
    "commit-newcomer": Commit(
        run=RUN,
        epoch=1,
        value=Value(ops=(_JOIN_B,), activation_step=10, proposed_at=1.5),
        digest=CONFIG_1.digest,
        configuration=CONFIG_BYTES,
    ),
    "sync": Sync(run=RUN, epoch=5, digest=bytes(range(32))),
    "sync-request": SyncRequest(run=RUN, from_epoch=3),
    "sync-reply": SyncReply(run=RUN, commits=(CommitRecord(epoch=5, value=VALUE, digest=bytes(range(32))),)),
    "sync-reply-snapshot": SyncReply(run=RUN, snapshot=CONFIG_BYTES),
    "run-info-request": RunInfoRequest(run=RUN, request_id=77),
    "run-info": RunInfoReply(run=RUN, request_id=77, configuration=CONFIG_BYTES, step=118),
    "join-request": JoinRequest(run=RUN, op=JOIN_C),
    "join-refused": JoinRefused(run=RUN, reason="not_member"),
}


def vectors() -> dict[str, str]:
    match = re.search(r"```vectors\n(.*?)```", SPEC.read_text(), re.S)
    assert match, f"no ```vectors block in {SPEC}"
    lines = [line.split() for line in match.group(1).splitlines() if line.strip()]
    assert all(len(parts) == 2 for parts in lines), "each vector line is `name hex`"
    return {name: hex_text for name, hex_text in lines}


def test_every_vector_has_an_expected_message_and_back() -> None:
    assert set(vectors()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vector_encodes_and_decodes(name: str) -> None:
    raw = bytes.fromhex(vectors()[name])
    assert codec.encode(EXPECTED[name]) == raw
    assert codec.decode(raw, max_bytes=1 << 20) == EXPECTED[name]


def test_the_configuration_in_the_vectors_decodes_with_its_digest() -> None:
    config = decode_configuration(CONFIG_BYTES, max_members=16, max_links=16)
    assert config == CONFIG_1 and config.digest.hex() in SPEC.read_text()
    assert config.since_steps == (0, 10) or config.since_steps == (10, 0)


def test_trailing_fields_with_defaults_may_be_omitted() -> None:
    short = codec.to_obj(Promise(run=RUN, epoch=5, ballot=BALLOT))[:4]
    assert codec.from_obj(short) == Promise(run=RUN, epoch=5, ballot=BALLOT)
    old_accept = codec.to_obj(Accept(run=RUN, epoch=5, ballot=BALLOT, value=VALUE))[:-1]
    assert codec.from_obj(old_accept) == Accept(run=RUN, epoch=5, ballot=BALLOT, value=VALUE)


def test_link_entries_sort_their_endpoints() -> None:
    assert LINK_AB.subject.raw < (LINK_AB.other or LINK_AB.subject).raw
    assert LinkEntry(a=A, b=B, up=True).up


def test_the_spec_shows_the_diagrams_the_tables_render() -> None:
    text = SPEC.read_text()
    match = re.search(r"<!-- state-diagram:begin -->\n(.*?)<!-- state-diagram:end -->", text, re.S)
    assert match, "no generated state diagram in the spec"
    assert match.group(1) == render_state_diagram(), (
        "protocols/negotiation.md is stale: paste chaosp2p.protocols.negotiation.transitions.render_state_diagram()"
    )
