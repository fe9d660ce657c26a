"""The Noise XX handshake machine, run between two instances over in-memory byte pipes."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import AdmissionDenied, LocalProtocolError, PeerIdMismatch, RemoteProtocolError
from chaosp2p.protocols.noise import HandshakeState, NoiseHandshake, prologue_for
from chaosp2p.wire.identity import Identity

ALICE = Identity.from_seed(b"\x01" * 32)
BOB = Identity.from_seed(b"\x02" * 32)
MALLORY = Identity.from_seed(b"\x03" * 32)


def pump(initiator: NoiseHandshake, responder: NoiseHandshake) -> None:
    """Carry bytes both ways until neither side has anything to send."""
    while True:
        a, b = initiator.data_to_send(), responder.data_to_send()
        if not a and not b:
            return
        if a:
            responder.receive_data(a)
        if b:
            initiator.receive_data(b)


def test_handshake_authenticates_both_sides_and_agrees_on_keys() -> None:
    initiator = NoiseHandshake(initiator=True, identity=ALICE, expected_peer=BOB.peer_id)
    responder = NoiseHandshake(initiator=False, identity=BOB)
    pump(initiator, responder)
    assert initiator.complete and responder.complete
    i, r = initiator.session(), responder.session()
    assert i.remote_peer_id == BOB.peer_id and r.remote_peer_id == ALICE.peer_id
    assert i.send_key == r.receive_key and i.receive_key == r.send_key
    assert i.send_key != i.receive_key
    assert i.handshake_hash == r.handshake_hash


def test_dialing_the_wrong_peer_fails_before_revealing_our_identity() -> None:
    initiator = NoiseHandshake(initiator=True, identity=ALICE, expected_peer=BOB.peer_id)
    impostor = NoiseHandshake(initiator=False, identity=MALLORY)
    impostor.receive_data(initiator.data_to_send())
    with pytest.raises(PeerIdMismatch, match=str(MALLORY.peer_id)):
        initiator.receive_data(impostor.data_to_send())
    assert initiator.data_to_send() == b""  # message 3 (our identity) never produced
    assert initiator.state is HandshakeState.FAILED


@pytest.mark.parametrize(("key_a", "key_b"), [(b"\x01" * 32, b"\x02" * 32), (b"\x01" * 32, None), (None, b"\x02" * 32)])
def test_different_swarm_keys_never_complete(key_a: bytes | None, key_b: bytes | None) -> None:
    initiator = NoiseHandshake(initiator=True, identity=ALICE, prologue=prologue_for(key_a))
    responder = NoiseHandshake(initiator=False, identity=BOB, prologue=prologue_for(key_b))
    responder.receive_data(initiator.data_to_send())
    with pytest.raises(AdmissionDenied, match="not in this swarm"):
        initiator.receive_data(responder.data_to_send())
    assert not responder.complete


def test_same_swarm_key_completes() -> None:
    key = b"\x05" * 32
    initiator = NoiseHandshake(initiator=True, identity=ALICE, prologue=prologue_for(key))
    responder = NoiseHandshake(initiator=False, identity=BOB, prologue=prologue_for(key))
    pump(initiator, responder)
    assert initiator.complete and responder.complete


def test_tampered_message_is_rejected() -> None:
    initiator = NoiseHandshake(initiator=True, identity=ALICE)
    responder = NoiseHandshake(initiator=False, identity=BOB)
    responder.receive_data(initiator.data_to_send())
    message = bytearray(responder.data_to_send())
    message[50] ^= 0x01
    with pytest.raises(AdmissionDenied):
        initiator.receive_data(bytes(message))


def test_forged_identity_signature_is_rejected() -> None:
    """A responder that signs someone else's static key is caught by the signature check."""

    class Forger(NoiseHandshake):
        def _payload(self) -> bytes:
            from chaosp2p.wire.framing import pack

            other_static = X25519PrivateKey.generate().public_key().public_bytes_raw()
            return pack([BOB.peer_id.public_bytes, BOB.sign(b"chaosp2p-noise-static-key:" + other_static)])

    initiator = NoiseHandshake(initiator=True, identity=ALICE)
    forger = Forger(initiator=False, identity=MALLORY)
    forger.receive_data(initiator.data_to_send())
    with pytest.raises(RemoteProtocolError, match="signature"):
        initiator.receive_data(forger.data_to_send())


def test_oversized_handshake_message_is_rejected_from_its_length() -> None:
    responder = NoiseHandshake(initiator=False, identity=BOB)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        responder.receive_data(b"\xff\xff")


def test_wrong_length_first_message_is_rejected() -> None:
    responder = NoiseHandshake(initiator=False, identity=BOB)
    with pytest.raises(RemoteProtocolError, match="message 1"):
        responder.receive_data(b"\x00\x05hello")


def test_session_before_completion_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        NoiseHandshake(initiator=True, identity=ALICE).session()
    with pytest.raises(LocalProtocolError):
        NoiseHandshake(initiator=False, identity=BOB, expected_peer=ALICE.peer_id)


def test_bytes_after_the_last_message_are_kept_for_the_channel() -> None:
    initiator = NoiseHandshake(initiator=True, identity=ALICE)
    responder = NoiseHandshake(initiator=False, identity=BOB)
    responder.receive_data(initiator.data_to_send())
    initiator.receive_data(responder.data_to_send())
    responder.receive_data(initiator.data_to_send() + b"first record")
    assert responder.complete
    assert responder.leftover() == b"first record"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_garbage_gives_only_protocol_or_admission_errors(data: bytes, as_initiator: bool) -> None:
    machine = NoiseHandshake(initiator=as_initiator, identity=ALICE)
    machine.data_to_send()
    try:
        machine.receive_data(data)
    except (RemoteProtocolError, AdmissionDenied):
        assert machine.state is HandshakeState.FAILED
    else:
        assert not machine.complete
