"""The msgpack test vectors in protocols/dht.md must match the codec, both ways.

Run ``python tests/unit/test_dht_vectors.py`` to print the vectors block for the spec.
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
        "record-signing-payload": record_signing_payload(
            signed.key, signed.value, signed.version, signed.ttl_ms, signed.issued_at_ms
        ),
        "provider-signing-payload": provider_signing_payload(
            provider.key, provider.provider, provider.addrs, provider.seq, provider.ttl_ms, provider.issued_at_ms
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


if __name__ == "__main__":
    print("```vectors")
    for vector_name, vector in vector_objects().items():
        print(vector_name, encode(vector).hex())
    print("```")
