"""The msgpack test vectors in protocols/dht.md must match the codec, both ways.

Run ``python tests/unit/test_dht_vectors.py`` to print the vectors block for the spec. The
messages as a peer of the version before relay addresses encoded them still decode, to the same
messages (``PRE_RELAY_VECTORS``); what such a peer reads of the new ones is checked too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chaosp2p.dht.keys import id_to_bytes, key_id, signed_key
from chaosp2p.dht.messages import (
    DHT_CODEC,
    AddProvider,
    Contact,
    FindNode,
    FindValue,
    GetProviders,
    Nodes,
    Ping,
    Pong,
    Providers,
    Store,
    Stored,
    StoreStatus,
    Value,
)
from chaosp2p.dht.records import (
    make_provider_record,
    make_record,
    provider_relay_payload,
    provider_signing_payload,
    record_signing_payload,
)
from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.messages import Message

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "dht.md"
ALICE = Identity.from_seed(bytes([1]) * 32)
BOB = Identity.from_seed(bytes([2]) * 32)
ALICE_ADDR = "/ip4/127.0.0.1/tcp/4001"
BOB_ADDR = "/ip4/127.0.0.1/tcp/4002"
ISSUED_AT_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
ALICE_VIA_BOB = f"{BOB_ADDR}/p2p/{BOB.peer_id}/p2p-circuit/p2p/{ALICE.peer_id}"
"""Alice, private, reached through Bob's relay."""


def vector_objects() -> dict[str, Message | bytes]:
    """Every vector by name: a message, or raw bytes (signature payloads)."""
    signed = make_record(
        signed_key(ALICE.peer_id, "cfg"), b"v1", version=1, ttl_ms=60_000, issued_at_ms=ISSUED_AT_MS, identity=ALICE
    )
    served = Value(
        request_id=4,
        record=signed.__class__(**{**_fields(signed), "remaining_ms": 59_500}),
        closer=(Contact(peer_id=BOB.peer_id, addrs=(BOB_ADDR,)),),
    )
    plain = make_record(b"plain-key", b"hello", version=ISSUED_AT_MS, ttl_ms=3_600_000, issued_at_ms=ISSUED_AT_MS)
    provider = make_provider_record(
        ALICE, b"/prov/state/run1/7", (ALICE_ADDR,), seq=0, ttl_ms=600_000, issued_at_ms=ISSUED_AT_MS
    )
    relayed = make_provider_record(
        ALICE,
        b"/prov/state/run1/7",
        (ALICE_ADDR,),
        seq=0,
        ttl_ms=600_000,
        issued_at_ms=ISSUED_AT_MS,
        relay_addrs=(ALICE_VIA_BOB,),
    )
    alice_relayed = Contact(peer_id=ALICE.peer_id, addrs=(ALICE_ADDR,), relay_addrs=(ALICE_VIA_BOB,))
    return {
        "Ping": Ping(request_id=1, sender_addrs=(ALICE_ADDR,)),
        "Pong": Pong(request_id=1),
        "FindNode": FindNode(request_id=2, sender_addrs=(ALICE_ADDR,), target=id_to_bytes(key_id(b"target"))),
        "Nodes": Nodes(request_id=2, closer=(Contact(peer_id=BOB.peer_id, addrs=(BOB_ADDR,)),)),
        "FindValue": FindValue(request_id=4, sender_addrs=(), key=signed.key),
        "Value": served,
        "ValueEmpty": Value(request_id=5, record=None, closer=()),
        "Store": Store(request_id=6, sender_addrs=(ALICE_ADDR,), record=plain),
        "StoredOk": Stored(request_id=6, accepted=True, reason=StoreStatus.OK),
        "StoredStale": Stored(request_id=7, accepted=False, reason=StoreStatus.STALE, current_version=3),
        "AddProvider": AddProvider(request_id=8, sender_addrs=(ALICE_ADDR,), provider=provider),
        "GetProviders": GetProviders(request_id=9, sender_addrs=(), key=provider.key),
        "Providers": Providers(request_id=9, providers=(provider,), closer=()),
        "PingRelayed": Ping(request_id=10, sender_addrs=(ALICE_ADDR,), sender_relay_addrs=(ALICE_VIA_BOB,)),
        "NodesRelayed": Nodes(request_id=11, closer=(alice_relayed,)),
        "ProvidersRelayed": Providers(request_id=12, providers=(relayed,), closer=()),
        "record-signing-payload": record_signing_payload(
            signed.key, signed.value, signed.version, signed.ttl_ms, signed.issued_at_ms
        ),
        "provider-signing-payload": provider_signing_payload(
            provider.key, provider.provider, provider.addrs, provider.seq, provider.ttl_ms, provider.issued_at_ms
        ),
        "provider-relay-signing-payload": provider_relay_payload(
            relayed.key, relayed.provider, relayed.seq, relayed.ttl_ms, relayed.issued_at_ms, relayed.relay_addrs
        ),
    }


def _fields(obj: object) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]


def encode(obj: Message | bytes) -> bytes:
    return obj if isinstance(obj, bytes) else DHT_CODEC.encode(obj)


def spec_vectors() -> dict[str, str]:
    text = SPEC.read_text(encoding="utf-8")
    blocks = re.findall(r"^```vectors\n(.*?)^```", text, flags=re.M | re.S)
    assert len(blocks) == 1, "protocols/dht.md must hold exactly one ```vectors block"
    out: dict[str, str] = {}
    for line in blocks[0].splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, hexdata = line.split()
        assert name not in out, f"duplicate vector {name}"
        out[name] = hexdata
    return out


def test_spec_lists_exactly_the_known_vectors() -> None:
    assert set(spec_vectors()) == set(vector_objects())


def test_every_message_type_has_a_vector() -> None:
    covered = {type(v).TYPE for v in vector_objects().values() if isinstance(v, Message)}
    assert covered == set(DHT_CODEC.message_classes())


@pytest.mark.parametrize("name", sorted(vector_objects()))
def test_vector_encodes_and_decodes(name: str) -> None:
    expected = vector_objects()[name]
    data = bytes.fromhex(spec_vectors()[name])
    assert encode(expected) == data
    if isinstance(expected, Message):
        assert DHT_CODEC.decode(data, max_bytes=1 << 20) == expected


def test_signatures_in_vectors_verify() -> None:
    objects = vector_objects()
    value = objects["Value"]
    assert isinstance(value, Value) and value.record is not None and value.record.publisher is not None
    assert value.record.publisher.verify(value.record.signature, encode(objects["record-signing-payload"]))
    add = objects["AddProvider"]
    assert isinstance(add, AddProvider)
    assert add.provider.provider.verify(add.provider.signature, encode(objects["provider-signing-payload"]))
    providers = objects["ProvidersRelayed"]
    assert isinstance(providers, Providers)
    [relayed] = providers.providers
    assert relayed.signature == add.provider.signature  # the relay part leaves the main signature alone
    assert relayed.provider.verify(relayed.relay_signature, encode(objects["provider-relay-signing-payload"]))


def test_decoder_refuses_a_truncated_vector() -> None:
    data = bytes.fromhex(spec_vectors()["Store"])
    with pytest.raises(RemoteProtocolError):
        DHT_CODEC.decode(data[:-3], max_bytes=1 << 20)


def test_decoder_refuses_remaining_beyond_ttl() -> None:
    obj = DHT_CODEC.to_obj(vector_objects()["Store"])  # type: ignore[arg-type]
    obj[3][4] = obj[3][3] + 1  # record.remaining_ms > record.ttl_ms
    from chaosp2p.wire.framing import pack

    with pytest.raises(RemoteProtocolError):
        DHT_CODEC.decode(pack(obj), max_bytes=1 << 20)


# The messages as a peer of the version before relay addresses encoded them (each ends where the
# relay fields now start; ``protocols/dht.md`` §10): they decode to the same messages, with none.
PRE_RELAY_VECTORS = {
    "Ping": ("93010191b72f6970342f3132372e302e302e312f7463702f34303031"),
    "FindNode": (
        "94030291b72f6970342f3132372e302e302e312f7463702f34303031c42034a04005bcaf206eec990bd9637d9fdb6725"
        "e0a0c0d4aebf003f17f4c956eb5c"
    ),
    "Nodes": (
        "9304029192c4260024080112208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39491b72f"
        "6970342f3132372e302e302e312f7463702f34303032"
    ),
    "FindValue": (
        "94050490c43c2f706b2f313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572"
        "394633563366794b53554b5048352f636667"
    ),
    "Value": (
        "94060498c43c2f706b2f313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572"
        "394633563366794b53554b5048352f636667c402763101cdea60cde86cc4260024080112208a88e3dd7409f195fd52db"
        "2d3cba5d72ca6709bf1d94121bf3748801b40f6f5cc440d2bd89337bd859da73cf625af7bf3d780e0dd2fbac9942d99f"
        "f789c88749f6939848b8a5cd262e1ea24d663201ab4f9c2eeb30a952a5a526c4777109f3399905cf0000018bcfe56800"
        "9192c4260024080112208139770ea87d175f56a35466c34c7ecccb8d8a91b4ee37a25df60f5b8fc9b39491b72f697034"
        "2f3132372e302e302e312f7463702f34303032"
    ),
    "Store": (
        "94070691b72f6970342f3132372e302e302e312f7463702f3430303198c409706c61696e2d6b6579c40568656c6c6fcf"
        "0000018bcfe56800ce0036ee80ce0036ee80c0c400cf0000018bcfe56800"
    ),
    "AddProvider": (
        "94090891b72f6970342f3132372e302e302e312f7463702f3430303198c4122f70726f762f73746174652f72756e312f"
        "37c4260024080112208a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c91b72f6970342f"
        "3132372e302e302e312f7463702f3430303100ce000927c0ce000927c0c440f18691e6d801b1b524252e823c2533e958"
        "ae02fb58ddeeed8e993748c6015fe8a368a97002e5d23dbeb056867905cc9245f548be082b539717ba0ba58908360ecf"
        "0000018bcfe56800"
    ),
    "GetProviders": ("940a0990c4122f70726f762f73746174652f72756e312f37"),
    "Providers": (
        "940b099198c4122f70726f762f73746174652f72756e312f37c4260024080112208a88e3dd7409f195fd52db2d3cba5d"
        "72ca6709bf1d94121bf3748801b40f6f5c91b72f6970342f3132372e302e302e312f7463702f3430303100ce000927c0"
        "ce000927c0c440f18691e6d801b1b524252e823c2533e958ae02fb58ddeeed8e993748c6015fe8a368a97002e5d23dbe"
        "b056867905cc9245f548be082b539717ba0ba58908360ecf0000018bcfe5680090"
    ),
}


@pytest.mark.parametrize("name", sorted(PRE_RELAY_VECTORS))
def test_messages_of_a_peer_before_relay_addresses_still_decode(name: str) -> None:
    assert DHT_CODEC.decode(bytes.fromhex(PRE_RELAY_VECTORS[name]), max_bytes=1 << 20) == vector_objects()[name]


# What a peer of the version before relay addresses decodes: the fields it knows, in their order
# (extra trailing items are ignored, ``protocols/wire.md``). Its Contact is ``[peer_id, addrs]``.
OLD_FIELDS = {"Contact": 2, "Ping": 2, "ProviderRecord": 8}


def test_a_peer_before_relay_addresses_reads_the_new_messages_without_them() -> None:
    from chaosp2p.wire.framing import unpack

    objects = vector_objects()
    ping = unpack(bytes.fromhex(spec_vectors()["PingRelayed"]), max_bytes=1 << 20)
    assert ping[1 : 1 + OLD_FIELDS["Ping"]] == [10, [ALICE_ADDR]]  # no relay address among its addresses
    nodes = unpack(bytes.fromhex(spec_vectors()["NodesRelayed"]), max_bytes=1 << 20)
    [contact] = nodes[2]
    assert contact[: OLD_FIELDS["Contact"]] == [ALICE.peer_id.raw, [ALICE_ADDR]]
    providers = unpack(bytes.fromhex(spec_vectors()["ProvidersRelayed"]), max_bytes=1 << 20)
    [record] = providers[2]
    old = record[: OLD_FIELDS["ProviderRecord"]]
    payload = provider_signing_payload(
        old[0], ALICE.peer_id, tuple(old[2]), old[3], old[4], old[7]
    )  # what it verifies: the main signature, over the plain addresses
    assert ALICE.peer_id.verify(old[6], payload)
    assert isinstance(objects["ProvidersRelayed"], Providers)


if __name__ == "__main__":
    print("```vectors")
    for vector_name, vector in vector_objects().items():
        print(vector_name, encode(vector).hex())
    print("```")
