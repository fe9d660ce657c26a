"""protocols/collab.md: its msgpack vectors match the codec both ways, and the vouches in them verify.

Run ``python tests/unit/test_collab_vectors.py`` to print the vectors block for the spec.
"""

from __future__ import annotations

import pytest

from chaosp2p.protocols import collab
from chaosp2p.protocols.collab import SnapshotReply, Vouch, codec, sign_vouch, vouched_reply
from chaosp2p.protocols.negotiation import Configuration, RunParams
from chaosp2p.protocols.negotiation.run_configuration import make_configuration
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.messages import Message
from tests.spec_blocks import named_lines

SPEC = "collab.md"

IA, IB = (Identity.from_seed(bytes([seed]) * 32) for seed in (1, 2))
RUN = "run-a"
STEP = 42
LAYOUT = bytes(range(16))
STATE_DIGEST = bytes(range(32))


def configuration() -> Configuration:
    """Epoch 3 of ``run-a``: A and B, active from step 40 (the configuration the vouches cite)."""
    return make_configuration(
        run=RUN,
        epoch=3,
        activation_step=40,
        peers=sorted([IA.peer_id, IB.peer_id]),
        incarnations=[1, 1],
        throughputs=[1.0, 1.0],
        links=(),
        params=RunParams(global_batch=64),
        seed=7,
    )


def ticket_for_b() -> collab.Ticket:
    """A's ticket letting B ask run-a's members for snapshots up to step 56 (40 + 16)."""
    return collab.issue_ticket(IA, run=RUN, newcomer=IB.peer_id, until_step=56)


def vector_messages() -> dict[str, Message]:
    """Every message vector by name."""
    config = configuration()
    vouch_a = sign_vouch(IA, run=RUN, step=STEP, state_digest=STATE_DIGEST, config_digest=config.digest)
    ticket = ticket_for_b()
    return {
        "ObserveRequest": collab.ObserveRequest(run=RUN, layout=LAYOUT),
        "ObserveAccepted": collab.ObserveAccepted(completed=40, numel=1000),
        "ObserveAcceptedWithTicket": collab.ObserveAccepted(completed=40, numel=1000, ticket=ticket),
        "UpdateHeader": collab.UpdateHeader(step=41, epoch=3, config_digest=config.digest, numel=1000),
        "SnapshotRequest": collab.SnapshotRequest(run=RUN, step=STEP, layout=LAYOUT, config_digest=config.digest),
        "SnapshotRequestWithTicket": collab.SnapshotRequest(
            run=RUN, step=STEP, layout=LAYOUT, config_digest=config.digest, ticket=ticket
        ),
        "SnapshotReplyVouched": vouched_reply(vouch_a, config, asker_config_digest=config.digest),
        "SnapshotReplyWithConfiguration": vouched_reply(vouch_a, config, asker_config_digest=b""),
        "SnapshotReplyRefused": SnapshotReply(ok=False, step=STEP, reason="already past that step"),
        "FetchUpdate": collab.FetchUpdate(run=RUN, step=41, config_digest=config.digest),
        "Refused": collab.Refused(reason="this peer does not train that run"),
    }


def spec_vectors() -> dict[str, str]:
    """The spec's message vectors: hex by name."""
    return named_lines(SPEC, "vectors")


def test_spec_lists_exactly_the_known_vectors() -> None:
    assert set(spec_vectors()) == set(vector_messages())


def test_every_message_type_has_a_vector() -> None:
    assert {m.TYPE for m in vector_messages().values()} == set(codec.message_classes())


@pytest.mark.parametrize("name", sorted(vector_messages()))
def test_vector_encodes_and_decodes(name: str) -> None:
    expected = vector_messages()[name]
    data = bytes.fromhex(spec_vectors()[name])
    assert codec.encode(expected) == data
    assert codec.decode(data, max_bytes=1 << 20) == expected


def test_the_vouches_in_the_vectors_verify_and_a_quorum_of_them_is_chosen() -> None:
    config = configuration()
    replies = []
    for name in ("SnapshotReplyVouched", "SnapshotReplyWithConfiguration"):
        reply = codec.decode(bytes.fromhex(spec_vectors()[name]), max_bytes=1 << 20)
        assert isinstance(reply, SnapshotReply)
        vouch = Vouch(
            voucher=IA.peer_id,
            run=RUN,
            step=reply.step,
            state_digest=reply.state_digest,
            config_digest=reply.config_digest,
            signature=reply.signature,
        )
        assert vouch.verify()
        replies.append(reply)
    assert replies[1].configuration == config.encode() and not replies[0].configuration
    # A's reply and B's (signed the same way) make a quorum of the two-member configuration.
    vouch_b = sign_vouch(IB, run=RUN, step=STEP, state_digest=STATE_DIGEST, config_digest=config.digest)
    b_reply = vouched_reply(vouch_b, config, asker_config_digest=config.digest)
    vouches, cited = collab.read_vouches(
        [(IA.peer_id, replies[0]), (IB.peer_id, b_reply)], run=RUN, anchor=config, max_members=64, max_links=64
    )
    chosen = collab.choose_vouched_state(vouches, run=RUN, step=STEP, anchor=config, configurations=cited)
    assert chosen.state_digest == STATE_DIGEST and chosen.vouchers == tuple(sorted([IA.peer_id, IB.peer_id]))


def test_the_ticket_in_the_vectors_verifies_for_its_run_only() -> None:
    for name in ("ObserveAcceptedWithTicket", "SnapshotRequestWithTicket"):
        message = codec.decode(bytes.fromhex(spec_vectors()[name]), max_bytes=1 << 20)
        ticket = getattr(message, "ticket", None)
        assert ticket is not None and (ticket.sponsor, ticket.newcomer) == (IA.peer_id, IB.peer_id)
        assert collab.verify_ticket(ticket, RUN) and not collab.verify_ticket(ticket, "run-b")


if __name__ == "__main__":
    print("```vectors")
    for vector_name, message in vector_messages().items():
        print(vector_name, codec.encode(message).hex())
    print("```")
    print("configuration digest", configuration().digest.hex())
