"""The test vectors in protocols/membership.md match the membership codec, both ways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaosp2p.protocols.membership.messages import (
    Ack,
    Gossip,
    InfoUpdate,
    Leave,
    LinkSummary,
    MemberUpdate,
    Nack,
    Ping,
    PingReq,
    PushPull,
    PushPullReply,
    Resources,
    UpdateKind,
    codec,
)
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "membership.md"


def peer(byte: int) -> PeerID:
    """The PeerID of the Ed25519 identity whose 32-byte seed repeats ``byte``."""
    return Identity.from_seed(bytes([byte]) * 32).peer_id


A, B, C = peer(1), peer(2), peer(3)
ADDR_A = "/ip4/127.0.0.1/tcp/4001"
ALIVE_A = MemberUpdate(kind=UpdateKind.ALIVE, peer=A, incarnation=3, addrs=(ADDR_A,))
INFO_A = InfoUpdate(
    peer=A,
    version=2,
    resources=Resources(
        cpu_cores=8, memory_bytes=32 << 30, gpus=1, gpu_memory_bytes=24 << 30, train_samples_per_s=1234.5
    ),
    links=(LinkSummary(peer=B, rtt_s=0.0005, bandwidth_bytes_per_s=1.25e9, up=True),),
)

EXPECTED: dict[str, Message] = {
    "ping": Ping(seq=1),
    "ping-gossip": Ping(
        seq=7,
        updates=(ALIVE_A, MemberUpdate(kind=UpdateKind.SUSPECT, peer=B, incarnation=5, origin=A)),
        infos=(INFO_A,),
        digest=0x0123456789ABCDEF,
        info_digest=0x7EDCBA9876543210,
    ),
    "ack": Ack(seq=7),
    "ping-req": PingReq(seq=9, target=B),
    "nack": Nack(seq=9),
    "push-pull": PushPull(seq=11, join=True, members=(ALIVE_A,), infos=(INFO_A,)),
    "push-pull-reply": PushPullReply(
        seq=11, members=(ALIVE_A, MemberUpdate(kind=UpdateKind.DEAD, peer=B, incarnation=5, origin=A))
    ),
    "leave": Leave(incarnation=4),
    "gossip": Gossip(updates=(MemberUpdate(kind=UpdateKind.LEFT, peer=C, incarnation=0),)),
}


def vectors() -> dict[str, str]:
    match = re.search(r"```vectors\n(.*?)```", SPEC.read_text(), re.S)
    assert match, f"no ```vectors block in {SPEC}"
    lines = [line.split() for line in match.group(1).splitlines() if line.strip()]
    assert all(len(parts) == 2 for parts in lines), "each vector line is `Name hex`"
    return {name: hex_text for name, hex_text in lines}


def test_every_vector_has_an_expected_message_and_back() -> None:
    assert set(vectors()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vector_encodes_and_decodes(name: str) -> None:
    raw = bytes.fromhex(vectors()[name])
    assert codec.encode(EXPECTED[name]) == raw
    assert codec.decode(raw, max_bytes=1 << 20) == EXPECTED[name]


def test_trailing_fields_may_be_omitted() -> None:
    # A PING from a peer that predates the digest field (or sends no piggyback) is still valid.
    assert codec.decode(bytes.fromhex("9201" "01"), max_bytes=64) == Ping(seq=1)
