"""The Noise XXpsk0 handshake machine, run between two instances over in-memory byte pipes."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.errors import (
    AdmissionDenied,
    ConnectionClosed,
    LocalProtocolError,
    PeerIdMismatch,
    RemoteProtocolError,
)
from chaosp2p.protocols.channel.handshake import OPEN_SWARM_PSK, HandshakeState, NoiseHandshake, psk_for
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
    initiator = NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(key_a))
    responder = NoiseHandshake(initiator=False, identity=BOB, psk=psk_for(key_b))
    with pytest.raises(AdmissionDenied, match="not in this swarm"):
        responder.receive_data(initiator.data_to_send())
    assert responder.data_to_send() == b""  # the responder says nothing at all: no e, no s, no identity
    assert responder.state is HandshakeState.FAILED
    # What the dialer sees is a closed connection, which its driver reports as admission.
    error = initiator.connection_lost()
    assert isinstance(error, AdmissionDenied) and "not in this swarm" in str(error)


def test_same_swarm_key_completes() -> None:
    key = b"\x05" * 32
    initiator = NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(key))
    responder = NoiseHandshake(initiator=False, identity=BOB, psk=psk_for(key))
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


def test_a_connection_lost_mid_handshake_is_a_network_failure_not_admission() -> None:
    initiator = NoiseHandshake(initiator=True, identity=ALICE)
    responder = NoiseHandshake(initiator=False, identity=BOB)
    responder.receive_data(initiator.data_to_send())
    initiator.receive_data(responder.data_to_send()[:10])  # part of message 2, then the socket closes
    assert type(initiator.connection_lost()) is ConnectionClosed
    assert type(NoiseHandshake(initiator=False, identity=BOB).connection_lost()) is ConnectionClosed


def test_wrong_length_first_message_is_rejected() -> None:
    responder = NoiseHandshake(initiator=False, identity=BOB)
    with pytest.raises(RemoteProtocolError, match="message 1"):
        responder.receive_data(b"\x00\x05hello")


def test_a_first_message_of_an_older_version_is_rejected_with_the_reason() -> None:
    responder = NoiseHandshake(initiator=False, identity=BOB)
    with pytest.raises(RemoteProtocolError, match="older chaosp2p"):
        responder.receive_data(b"\x00\x30" + bytes(48))  # 48 bytes: message 1 before the timestamp


# ---------------------------------------------------------------------------- freshness of message 1
NOW_MS = 1_700_000_000_000


def _guarded_responder(guard: object, now_ms: int = NOW_MS) -> NoiseHandshake:
    return NoiseHandshake(
        initiator=False, identity=BOB, psk=psk_for(SWARM_KEY), wall_time_ms=now_ms, replay_guard=guard  # type: ignore[arg-type]
    )


def test_a_replayed_first_message_gets_no_answer() -> None:
    """Issue 20, finding 14: under a swarm key, a sniffed message 1 replayed on a new connection is
    refused before the responder does any Diffie-Hellman or signs anything: it answers nothing."""
    from chaosp2p.protocols.channel.replay import ReplayGuard

    guard = ReplayGuard(max_clock_skew_s=120.0, max_entries=64)
    initiator = NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(SWARM_KEY), wall_time_ms=NOW_MS)
    message_1 = initiator.data_to_send()
    genuine = _guarded_responder(guard, NOW_MS + 50)
    genuine.receive_data(message_1)
    pump(initiator, genuine)
    assert genuine.complete
    for delay_ms in (1_000, 60_000, 119_000):  # every replay inside the window
        replayed = _guarded_responder(guard, NOW_MS + delay_ms)
        with pytest.raises(AdmissionDenied, match="replayed"):
            replayed.receive_data(message_1)
        assert replayed.data_to_send() == b"" and replayed.state is HandshakeState.FAILED
    late = _guarded_responder(guard, NOW_MS + 121_000)  # and after it, the time gives it away
    with pytest.raises(AdmissionDenied, match="clock"):
        late.receive_data(message_1)
    assert late.data_to_send() == b""
    assert guard.statistics().replays_refused == 3 and guard.statistics().stale_refused == 1


@pytest.mark.parametrize("skew_ms", [-121_000, 121_000])
def test_a_first_message_far_from_our_clock_is_refused(skew_ms: int) -> None:
    from chaosp2p.protocols.channel.replay import ReplayGuard

    guard = ReplayGuard(max_clock_skew_s=120.0, max_entries=64)
    initiator = NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(SWARM_KEY), wall_time_ms=NOW_MS + skew_ms)
    responder = _guarded_responder(guard)
    with pytest.raises(AdmissionDenied, match="clock"):
        responder.receive_data(initiator.data_to_send())
    # Within the window, clocks may disagree both ways.
    for within_ms in (-119_000, 119_000):
        initiator = NoiseHandshake(
            initiator=True, identity=ALICE, psk=psk_for(SWARM_KEY), wall_time_ms=NOW_MS + within_ms
        )
        responder = _guarded_responder(guard)
        pump(initiator, responder)
        assert responder.complete


def test_a_full_replay_cache_refuses_what_it_had_to_forget() -> None:
    """Eviction raises a floor, so an evicted ephemeral can never be replayed inside the window."""
    from chaosp2p.protocols.channel.replay import ReplayGuard

    guard = ReplayGuard(max_clock_skew_s=120.0, max_entries=2)
    firsts = [
        NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(SWARM_KEY), wall_time_ms=NOW_MS + n).data_to_send()
        for n in range(3)
    ]
    for message_1 in firsts:  # the third evicts the first (the oldest time)
        _guarded_responder(guard).receive_data(message_1)
    assert guard.statistics().remembered == 2
    with pytest.raises(AdmissionDenied):
        _guarded_responder(guard).receive_data(firsts[0])
    newer = NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(SWARM_KEY), wall_time_ms=NOW_MS + 10)
    _guarded_responder(guard).receive_data(newer.data_to_send())


def test_only_a_responder_checks_freshness_and_the_time_must_fit() -> None:
    from chaosp2p.protocols.channel.replay import ReplayGuard

    with pytest.raises(LocalProtocolError):
        NoiseHandshake(initiator=True, identity=ALICE, replay_guard=ReplayGuard(max_clock_skew_s=1.0, max_entries=1))
    with pytest.raises(LocalProtocolError):
        NoiseHandshake(initiator=True, identity=ALICE, wall_time_ms=-1)


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


# ---------------------------------------------------------------------------- the swarm key hides identities
SWARM_KEY = b"\x07" * 32


def _gcm_keystream_decrypt(key: bytes, counter: int, ciphertext_with_tag: bytes) -> bytes:
    """Decrypt AES-GCM ciphertext *ignoring its tag*: GCM is CTR mode from counter block 2."""
    nonce = b"\0\0\0\0" + counter.to_bytes(8, "big")
    body = ciphertext_with_tag[:-16]
    decryptor = Cipher(algorithms.AES(key), modes.CTR(nonce + (2).to_bytes(4, "big"))).decryptor()
    return decryptor.update(body) + decryptor.finalize()


def _hkdf(ck: bytes, ikm: bytes, n: int) -> list[bytes]:
    temp = hmac.new(ck, ikm, hashlib.sha256).digest()
    out = [hmac.new(temp, b"\x01", hashlib.sha256).digest()]
    for i in range(2, n + 1):
        out.append(hmac.new(temp, out[-1] + bytes([i]), hashlib.sha256).digest())
    return out


def _attacker_reads_message_2(ephemeral: X25519PrivateKey, message_2: bytes, psk: bytes | None) -> tuple[bytes, bytes]:
    """What a party that knows the initiator's ephemeral key but not the swarm key recovers.

    It follows the handshake with its best guess of the PSK (``None``: the old, PSK-free key
    schedule where message 2's key came from ``ee`` alone) and decrypts without checking tags.
    Returns (the responder's static key as decoded, the payload as decoded).
    """
    ck = b"Noise_XX_25519_AESGCM_SHA256".ljust(32, b"\0") if psk is None else b"Noise_XXpsk0_25519_AESGCM_SHA256"
    if psk is not None:
        ck, _, _ = _hkdf(ck, psk, 3)
        ck, _ = _hkdf(ck, ephemeral.public_key().public_bytes_raw(), 2)  # e token, psk mode
    body = message_2[2:]
    remote_e = body[:32]
    if psk is not None:
        ck, _ = _hkdf(ck, remote_e, 2)
    ck, key = _hkdf(ck, ephemeral.exchange(X25519PublicKey.from_public_bytes(remote_e)), 2)
    static = _gcm_keystream_decrypt(key, 0, body[32 : 32 + 48])
    ck, key = _hkdf(ck, ephemeral.exchange(X25519PublicKey.from_public_bytes(static)), 2)
    return static, _gcm_keystream_decrypt(key, 0, body[32 + 48 :])


@pytest.mark.parametrize("guess", [None, OPEN_SWARM_PSK, psk_for(b"\x08" * 32)])
def test_without_the_swarm_key_message_2_reveals_no_identity(guess: bytes | None) -> None:
    """A keyless party decoding message 2 (tags ignored) gets neither the static key nor the PeerID.

    A keyless dialer never even receives message 2 (see above); this covers a party that sees one
    anyway -- here, even one that knows the initiator's ephemeral private key.
    """
    ephemeral = X25519PrivateKey.generate()
    responder_static = X25519PrivateKey.generate()
    initiator = NoiseHandshake(initiator=True, identity=ALICE, psk=psk_for(SWARM_KEY), ephemeral_key=ephemeral)
    responder = NoiseHandshake(initiator=False, identity=BOB, psk=psk_for(SWARM_KEY), static_key=responder_static)
    responder.receive_data(initiator.data_to_send())
    message_2 = responder.data_to_send()
    static, payload = _attacker_reads_message_2(ephemeral, message_2, guess)
    assert static != responder_static.public_key().public_bytes_raw()
    assert BOB.peer_id.public_bytes not in payload
    # The same decoder does recover both when it has the key: the check above is not vacuous.
    static, payload = _attacker_reads_message_2(ephemeral, message_2, psk_for(SWARM_KEY))
    assert static == responder_static.public_key().public_bytes_raw()
    assert BOB.peer_id.public_bytes in payload
