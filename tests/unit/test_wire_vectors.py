"""The test vectors in protocols/wire.md match the implementation, both ways."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from chaosp2p.protocols.channel.handshake import NoiseHandshake, psk_for
from chaosp2p.protocols.channel.hello import HELLO_CODEC
from chaosp2p.protocols.channel.record_layer import RecordHeader, parse_header
from chaosp2p.runtime.status import STATUS_CODEC
from chaosp2p.wire.framing import FrameDecoder, unpack
from chaosp2p.wire.identity import Identity

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "wire.md"
CODECS = {"hello": HELLO_CODEC, "status": STATUS_CODEC}


def block(kind: str) -> list[str]:
    match = re.search(rf"```{kind}\n(.*?)```", SPEC.read_text(), re.S)
    assert match, f"no ```{kind} block in {SPEC}"
    return [line for line in match.group(1).splitlines() if line.strip()]


def from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, list):
        return [from_json(v) for v in value]
    if isinstance(value, dict):
        return {k: from_json(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("line", block("vectors"))
def test_message_vectors(line: str) -> None:
    codec_name, hex_text, json_text = line.split(" ", 2)
    raw = bytes.fromhex(hex_text)
    assert unpack(raw, max_bytes=1 << 20) == from_json(json.loads(json_text))
    codec = CODECS[codec_name]
    assert codec.encode(codec.decode(raw, max_bytes=1 << 20)) == raw


def test_frame_and_header_vectors() -> None:
    lines = {line.split()[0]: line.split()[1] for line in block("frame-vectors")}
    decoder = FrameDecoder()
    decoder.feed(bytes.fromhex(lines["frame"]))
    assert decoder.next_frame() == [1, "x"]
    header = parse_header(bytes.fromhex(lines["header"]), max_record_bytes=1 << 20)
    assert (header.length, header.type.name, int(header.flags), header.stream_id, header.value) == (5, "DATA", 3, 3, 2)
    assert RecordHeader(5, header.type, header.flags, 3, 2).pack().hex() == lines["header"]


def noise_vectors() -> list[dict[str, str]]:
    blocks = re.findall(r"```noise-vector\n(.*?)```", SPEC.read_text(), re.S)
    assert len(blocks) >= 2, "expected an open-swarm and a swarm-key handshake vector"
    return [dict(line.split(" ", 1) for line in text.splitlines() if line.strip()) for text in blocks]


@pytest.mark.parametrize("v", noise_vectors(), ids=lambda v: v["swarm_key"])
def test_noise_handshake_vector(v: dict[str, str]) -> None:
    psk = psk_for(None if v["swarm_key"] == "none" else bytes.fromhex(v["swarm_key"]) * 32)
    assert psk.hex() == v["psk"]

    def x25519(name: str) -> X25519PrivateKey:
        return X25519PrivateKey.from_private_bytes(bytes.fromhex(v[name]) * 32)

    alice = Identity.from_seed(bytes.fromhex(v["initiator_identity_seed"]) * 32)
    bob = Identity.from_seed(bytes.fromhex(v["responder_identity_seed"]) * 32)
    assert str(alice.peer_id) == v["initiator_peer_id"] and str(bob.peer_id) == v["responder_peer_id"]
    initiator = NoiseHandshake(
        initiator=True,
        identity=alice,
        psk=psk,
        static_key=x25519("initiator_static"),
        ephemeral_key=x25519("initiator_ephemeral"),
        wall_time_ms=int(v["initiator_time_ms"]),
    )
    responder = NoiseHandshake(
        initiator=False,
        identity=bob,
        psk=psk,
        static_key=x25519("responder_static"),
        ephemeral_key=x25519("responder_ephemeral"),
    )
    message_1 = initiator.data_to_send()
    assert message_1.hex() == v["message_1"]
    responder.receive_data(message_1)
    message_2 = responder.data_to_send()
    assert message_2.hex() == v["message_2"]
    initiator.receive_data(message_2)
    message_3 = initiator.data_to_send()
    assert message_3.hex() == v["message_3"]
    responder.receive_data(message_3)
    assert initiator.session().send_key.hex() == v["initiator_send_key"]
    assert responder.session().send_key.hex() == v["responder_send_key"]


def test_a_status_report_of_a_peer_without_relays_still_decodes() -> None:
    # Before relays a ConnectionInfo had 5 elements; such a report decodes with relayed false.
    old = bytes.fromhex(
        "9902d934313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e4153757191d9502f6970342f3132372e302e302e312f7463702f343030312f7032702f313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e41537571ae6368616f737032702f302e312e30cb40290000000000009195d934313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572394633563366794b53554b504835b82f6970342f3132372e302e302e312f7463702f3530303030a7696e626f756e64cb3fd0000000000000019194d934313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572394633563366794b53554b504835a5616c69766503909194d934313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572394633563366794b53554b504835a27570cb3fc999999999999acb41d0642ac000000090"
    )
    report = CODECS["status"].decode(old, max_bytes=1 << 20)
    [connection] = report.connections  # type: ignore[attr-defined]
    assert connection.relayed is False and connection.open_streams == 1


def test_a_status_report_of_a_peer_without_reachability_still_decodes() -> None:
    # Before dial-back checks a report had 9 elements; such a report decodes with reachability None.
    old = bytes.fromhex(
        "9902d934313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e4153757191d9502f6970342f3132372e302e302e312f7463702f343030312f7032702f313244334b6f6f574a576f61715a6844616f454673684637526831627059396f68696846687a6357366436394c72324e41537571ae6368616f737032702f302e312e30cb40290000000000009196d934313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572394633563366794b53554b504835b82f6970342f3132372e302e302e312f7463702f3530303030a7696e626f756e64cb3fd000000000000001c29194d934313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572394633563366794b53554b504835a5616c69766503909194d934313244334b6f6f574b3939566f56784e4537587a79427758457a573778684b37477076383572394633563366794b53554b504835a27570cb3fc999999999999acb41d0642ac000000090"
    )
    report = CODECS["status"].decode(old, max_bytes=1 << 20)
    assert report.reachability is None  # type: ignore[attr-defined]
    assert report.to_json()["reachability"] is None  # type: ignore[attr-defined]
