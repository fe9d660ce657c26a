"""The test vectors in protocols/membership.md match the membership codec, both ways.

Also checked: the signed payloads of §2.1 (what a member's signature covers) and that the
signatures in the vectors are the members' own; and that messages as a peer without signatures
encoded them still decode (the signature fields are trailing, with defaults).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaosp2p.protocols.membership.messages import (
    PROTOCOL,
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
    peek_type,
)
from chaosp2p.protocols.membership.signing import alive_payload, info_payload, left_payload, relay_payload
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message
from tests.unit.membership_claims import alive, info, left

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "membership.md"


def peer(byte: int) -> PeerID:
    """The PeerID of the Ed25519 identity whose 32-byte seed repeats ``byte``."""
    return Identity.from_seed(bytes([byte]) * 32).peer_id


A, B, C = peer(1), peer(2), peer(3)
ADDR_A = "/ip4/127.0.0.1/tcp/4001"
ALIVE_A = alive(0, 3, (ADDR_A,))  # signed by A (seed 01 = tests' peer 0)
RESOURCES_A = Resources(
    cpu_cores=8, memory_bytes=32 << 30, gpus=1, gpu_memory_bytes=24 << 30, train_samples_per_s=1234.5
)
LINKS_A = (LinkSummary(peer=B, rtt_s=0.0005, bandwidth_bytes_per_s=1.25e9, up=True),)
INFO_A = info(0, 2, RESOURCES_A, LINKS_A)
RELAY_R = "/ip4/198.18.0.1/tcp/4001/p2p/" + str(B)
RELAY_ADDR_A = f"{RELAY_R}/p2p-circuit/p2p/{A}"
INFO_A_RELAYED = info(0, 3, RESOURCES_A, (), (RELAY_ADDR_A,))  # A is private: reached through B
LEFT_C = left(2, 0)

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
    "leave": Leave(incarnation=4, signature=left(0, 4).signature),
    "gossip": Gossip(updates=(LEFT_C,)),
    "push-pull-relayed": PushPull(seq=12, join=False, members=(ALIVE_A,), infos=(INFO_A_RELAYED,)),
}

PAYLOADS: dict[str, bytes] = {
    "alive-a-3": alive_payload(A, 3, (ADDR_A,)),
    "left-a-4": left_payload(A, 4),
    "left-c-0": left_payload(C, 0),
    "info-a-2": info_payload(InfoUpdate(peer=A, version=2, resources=RESOURCES_A, links=LINKS_A)),
    "relay-a-3": relay_payload(A, 3, (RELAY_ADDR_A,)),
}
"""The bytes a member signs (§2.1), under the names of the ```payloads block."""

# The same messages as a peer without signatures encoded them (the vectors before signatures).
UNSIGNED_VECTORS = {
    "ping-gossip": (
        "960107929500c4260024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c0391"
        "b72f6970342f3132372e302e302e312f7463702f34303031c09501c4260024080112208139770ea87d175f56a35466c3"
        "4c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940590c4260024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709"
        "bf1d94121bf3748801b40f6f5c9194c4260024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3"
        "748801b40f6f5c029508cf000000080000000001cf0000000600000000cb40934a00000000009194c426002408011220"
        "8139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b394cb3f40624dd2f1a9fccb41d2a05f2000"
        "0000c3cf0123456789abcdefcf7edcba9876543210"
    ),
    "leave": "920704",
    "gossip": ("9308919503c426002408011220ed4928c628d1c2c6eae90338905995612959273a5c63f93636c14614ac8737d10090c090"),
}


def vectors(block: str = "vectors") -> dict[str, str]:
    match = re.search(rf"```{block}\n(.*?)```", SPEC.read_text(), re.S)
    assert match, f"no ```{block} block in {SPEC}"
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
    assert codec.decode(bytes.fromhex("920101"), max_bytes=64) == Ping(seq=1)


def test_signed_payloads_match_the_spec() -> None:
    assert {name: raw.hex() for name, raw in PAYLOADS.items()} == vectors("payloads")


def test_the_signatures_in_the_vectors_are_the_members_own() -> None:
    assert A.verify(ALIVE_A.signature, PAYLOADS["alive-a-3"])
    assert A.verify(INFO_A.signature, PAYLOADS["info-a-2"])
    leave = EXPECTED["leave"]
    assert isinstance(leave, Leave) and A.verify(leave.signature, PAYLOADS["left-a-4"])
    assert C.verify(LEFT_C.signature, PAYLOADS["left-c-0"])
    assert not B.verify(ALIVE_A.signature, PAYLOADS["alive-a-3"])
    assert A.verify(INFO_A_RELAYED.relay_signature, PAYLOADS["relay-a-3"])


# ``ping-gossip`` and ``push-pull`` as a peer of the version before relay addresses encoded them
# (its info records end at ``signature``): they decode to records without relay addresses.
PRE_RELAY_VECTORS = {
    "ping-gossip": (
        "960107929600c4260024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c0391"
        "b72f6970342f3132372e302e302e312f7463702f34303031c0c44098a40d42a728be7c0f03e124ac3bcdcdd0ff884c8c"
        "40a35edfb822fe597a8358ed000ed57c300ad213c8af1380cad7873074a65c21be0f671cac6b290f47d6049601c42600"
        "24080112208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b3940590c4260024080112208a"
        "88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5cc4009195c4260024080112208a88e3dd74"
        "09f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c029508cf000000080000000001cf00000006000000"
        "00cb40934a00000000009194c4260024080112208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b"
        "8fc9b394cb3f40624dd2f1a9fccb41d2a05f20000000c3c4402a435c43da69049a6aab71529ce8b551f6d7e31c41ee6c"
        "315c3cda2dbf4b34726600056c936eabc7aae50c688d1e43fbc5497e77dcbbd1fe475f828abad32706cf0123456789ab"
        "cdefcf7edcba9876543210"
    ),
    "push-pull": (
        "96050bc3919600c4260024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c03"
        "91b72f6970342f3132372e302e302e312f7463702f34303031c0c44098a40d42a728be7c0f03e124ac3bcdcdd0ff884c"
        "8c40a35edfb822fe597a8358ed000ed57c300ad213c8af1380cad7873074a65c21be0f671cac6b290f47d6049195c426"
        "0024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c029508cf000000080000"
        "000001cf0000000600000000cb40934a00000000009194c4260024080112208139770ea87d175f56a35466c34c7ecccb"
        "8d8a91b4ee37a25df60f5b8fc9b394cb3f40624dd2f1a9fccb41d2a05f20000000c3c4402a435c43da69049a6aab7152"
        "9ce8b551f6d7e31c41ee6c315c3cda2dbf4b34726600056c936eabc7aae50c688d1e43fbc5497e77dcbbd1fe475f828a"
        "bad32706c3"
    ),
}


@pytest.mark.parametrize("name", sorted(PRE_RELAY_VECTORS))
def test_info_records_of_a_peer_before_relay_addresses_still_decode(name: str) -> None:
    message = codec.decode(bytes.fromhex(PRE_RELAY_VECTORS[name]), max_bytes=1 << 20)
    assert message == EXPECTED[name]  # the same message: relay_addrs=(), relay_signature=b""
    assert all(i.relay_addrs == () for i in getattr(message, "infos", ()))


def test_an_old_peer_verifies_an_info_record_with_relay_addresses() -> None:
    # What a peer of the version before relay addresses checks: the signature over info_payload,
    # which leaves the appended fields out; it ignores those fields (extra trailing items).
    message = codec.decode(bytes.fromhex(vectors()["push-pull-relayed"]), max_bytes=1 << 20)
    assert isinstance(message, PushPull)
    [record] = message.infos
    assert record.relay_addrs == (RELAY_ADDR_A,)
    assert A.verify(record.signature, info_payload(record))


@pytest.mark.parametrize("name", sorted(UNSIGNED_VECTORS))
def test_messages_from_a_peer_without_signatures_still_decode(name: str) -> None:
    # They decode (the fields are trailing, with defaults); the machine then refuses the unsigned
    # self-claims in them, as it refuses forged ones.
    message = codec.decode(bytes.fromhex(UNSIGNED_VECTORS[name]), max_bytes=1 << 20)
    assert type(message) is type(EXPECTED[name])
    records = [*getattr(message, "updates", ()), *getattr(message, "infos", ())]
    assert all(r.signature == b"" for r in records)


def test_an_old_decoder_reads_the_new_records() -> None:
    # What a peer without signatures sees: it reads every field it knows and ignores the extra
    # trailing signature (protocols/wire.md: extra trailing items are ignored).
    raw = bytes.fromhex(vectors()["push-pull"])
    assert raw == codec.encode(EXPECTED["push-pull"])
    message = codec.decode(raw, max_bytes=1 << 20)
    assert isinstance(message, PushPull)
    record = message.members[0]
    assert (record.peer, record.incarnation, record.addrs) == (A, 3, (ADDR_A,))


def test_the_type_of_an_encoded_message_is_read_without_decoding_it() -> None:
    for message in EXPECTED.values():
        assert peek_type(codec.encode(message)) == message.TYPE
    assert peek_type(b"") is None and peek_type(b"\x01\x02") is None and peek_type(b"\x91\xcc") is None
    assert PROTOCOL == "membership"
