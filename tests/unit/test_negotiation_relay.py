"""ACCEPT and COMMIT are copied once per relay group: the copy must keep every other field."""

from __future__ import annotations

import dataclasses

from chaosp2p.protocols.negotiation.messages import Accept, Ballot, Commit, Value
from chaosp2p.wire.identity import Identity

PEERS = [Identity.from_seed(bytes([i + 7]) * 32).peer_id for i in range(4)]
VALUE = Value(ops=(), activation_step=9, proposed_at=1.5)


def test_relayed_copies_keep_every_field() -> None:
    accept = Accept(run="r", epoch=3, ballot=Ballot(round=2, proposer=PEERS[0]), value=VALUE, adopted=True)
    commit = Commit(run="r", epoch=3, value=VALUE, digest=bytes(range(32)), configuration=b"cfg")
    for message in (accept, commit):
        names = [f.name for f in dataclasses.fields(message)]
        assert "relay_to" in names
        copy = message.relayed(tuple(PEERS[1:]))
        assert type(copy) is type(message)
        assert copy == dataclasses.replace(message, relay_to=tuple(PEERS[1:]))
        assert copy.relayed(()) == message
