"""Noise XXpsk0 handshake: mutual authentication bound to Ed25519 PeerIDs, gated by the swarm key.

Theory of operation
-------------------
We speak ``Noise_XXpsk0_25519_AESGCM_SHA256`` from the Noise Protocol Framework (revision 34)::

    -> psk, e
    <- e, ee, s, es
    -> s, se

Both sides hold a long-term Ed25519 *identity* (their PeerID) and a per-process X25519 *static*
Noise key. As in libp2p's Noise spec, each side's handshake payload carries its Ed25519 public key
and a signature over ``"chaosp2p-noise-static-key:" + static X25519 public key``, which binds the
Noise static key to the PeerID. The responder's identity arrives in message 2, so a dialer that
expects ``/p2p/<id>`` learns that it reached someone else before it reveals anything of its own.

Swarm admission: the pre-shared key (PSK) is mixed into the chaining key *before* the first
message (the ``psk0`` modifier), so every handshake key -- including the one that encrypts the
responder's static key and signed identity in message 2 -- depends on it, and message 1 itself
carries an AEAD tag under a PSK-derived key. A responder therefore rejects a dialer without the key
at message 1, before it has sent a single byte: such a dialer learns nothing beyond a closed
connection, and a passive observer without the key cannot decrypt either side's identity. An open
swarm uses the public all-zero PSK, which makes the handshake exactly as strong as plain XX. The
key itself never crosses the wire.

Freshness: message 1's payload is the dialer's wall-clock time (8 bytes, Unix milliseconds),
encrypted and authenticated under the PSK-derived key. A responder given a
:class:`~chaosp2p.protocols.channel.replay.ReplayGuard` (the transport gives one under a swarm key)
answers message 1 only if that time is within the guard's window of its own clock and the dialer's
ephemeral key is new to it, so a sniffed message 1 replayed on a new connection gets no answer: no
Diffie-Hellman, no signature, nothing that tells the replayer this address is in the swarm. The
checks come after the tag (so only key holders can fill the cache) and before any DH.

Handshake messages are framed with a 2-byte big-endian length, as libp2p does. This machine is
sans-I/O: feed it received bytes with :meth:`receive_data`, send what :meth:`data_to_send` returns;
when :attr:`complete` is true, :meth:`session` gives the two AEAD directions. If the socket closes
first, :meth:`connection_lost` says what that means. A remote deviation of any kind is a
:class:`RemoteProtocolError` (or :class:`PeerIdMismatch`/:class:`AdmissionDenied`).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from chaosp2p.errors import (
    AdmissionDenied,
    ChaosError,
    ConnectionClosed,
    LocalProtocolError,
    PeerIdMismatch,
    RemoteProtocolError,
)
from chaosp2p.protocols.channel.replay import ReplayGuard
from chaosp2p.wire.framing import pack, unpack
from chaosp2p.wire.identity import Identity, PeerID

PROTOCOL_NAME = b"Noise_XXpsk0_25519_AESGCM_SHA256"
SIGNATURE_PREFIX = b"chaosp2p-noise-static-key:"
PROLOGUE = b"/chaos/noise/2"
OPEN_SWARM_PSK = bytes(32)
"""The PSK of an open swarm: public, so it admits everyone (the handshake is then plain XX's strength)."""
MAX_HANDSHAKE_MESSAGE_BYTES = 1024  # three small messages; anything larger is hostile
TIMESTAMP = struct.Struct(">Q")
"""Message 1's payload: the dialer's wall clock, Unix milliseconds."""
MESSAGE_1_BYTES = 32 + 8 + 16
"""Message 1 is the ephemeral key, the encrypted time, and the tag (a PSK-derived key is set)."""
OLD_MESSAGE_1_BYTES = 32 + 16
"""Message 1 of chaosp2p before the timestamp (an empty payload): refused with a clear reason."""
_LENGTH = struct.Struct(">H")
_DHLEN = 32
_TAGLEN = 16


def psk_for(swarm_key: bytes | None) -> bytes:
    """The 32-byte Noise PSK for an open swarm (``None``) or a swarm guarded by ``swarm_key``.

    The swarm key is hashed with a label so that the same key file used by another protocol (it is
    libp2p's PSK format) never yields the same Noise PSK there and here.
    """
    if swarm_key is None:
        return OPEN_SWARM_PSK
    return hashlib.sha256(b"chaosp2p swarm key\0" + swarm_key).digest()


def _hkdf(chaining_key: bytes, ikm: bytes, outputs: int) -> list[bytes]:
    temp = hmac.new(chaining_key, ikm, hashlib.sha256).digest()
    out = [hmac.new(temp, b"\x01", hashlib.sha256).digest()]
    for index in range(2, outputs + 1):
        out.append(hmac.new(temp, out[-1] + bytes([index]), hashlib.sha256).digest())
    return out


def _hkdf2(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    out1, out2 = _hkdf(chaining_key, ikm, 2)
    return out1, out2


def _nonce(counter: int) -> bytes:
    return b"\0\0\0\0" + counter.to_bytes(8, "big")


def _x25519_public(raw: bytes) -> X25519PublicKey:
    return X25519PublicKey.from_public_bytes(raw)


def _raw_public(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class _SymmetricState:
    """Noise's SymmetricState (chaining key, handshake hash, and the current CipherState)."""

    def __init__(self, prologue: bytes) -> None:
        self.h = PROTOCOL_NAME.ljust(32, b"\0")
        self.ck = self.h
        self.key: AESGCM | None = None
        self.n = 0
        self.mix_hash(prologue)

    def mix_hash(self, data: bytes) -> None:
        self.h = hashlib.sha256(self.h + data).digest()

    def mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = _hkdf2(self.ck, ikm)
        self.key = AESGCM(temp_k)
        self.n = 0

    def mix_key_and_hash(self, ikm: bytes) -> None:
        """The ``psk`` token: the PSK enters the chaining key, the hash, and a new cipher key."""
        self.ck, temp_h, temp_k = _hkdf(self.ck, ikm, 3)
        self.mix_hash(temp_h)
        self.key = AESGCM(temp_k)
        self.n = 0

    def mix_ephemeral(self, public: bytes) -> None:
        """The ``e`` token in a PSK handshake: hash the key, and mix it into the cipher key too."""
        self.mix_hash(public)
        self.mix_key(public)

    def encrypt_and_hash(self, plaintext: bytes) -> bytes:
        if self.key is None:
            ciphertext = plaintext
        else:
            ciphertext = self.key.encrypt(_nonce(self.n), plaintext, self.h)
            self.n += 1
        self.mix_hash(ciphertext)
        return ciphertext

    def decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        if self.key is None:
            plaintext = ciphertext
        else:
            plaintext = self.key.decrypt(_nonce(self.n), ciphertext, self.h)  # raises InvalidTag
            self.n += 1
        self.mix_hash(ciphertext)
        return plaintext

    def split(self) -> tuple[bytes, bytes]:
        return _hkdf2(self.ck, b"")


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The result of a completed handshake: one key per direction and who the remote is."""

    send_key: bytes
    receive_key: bytes
    remote_peer_id: PeerID
    handshake_hash: bytes


class HandshakeState(enum.Enum):
    """Where the handshake stands; each state names what this side does next."""

    SEND_MESSAGE_1 = "send psk, e"
    AWAIT_MESSAGE_1 = "await psk, e"
    SEND_MESSAGE_2 = "send e, ee, s, es"
    AWAIT_MESSAGE_2 = "await e, ee, s, es"
    SEND_MESSAGE_3 = "send s, se"
    AWAIT_MESSAGE_3 = "await s, se"
    COMPLETE = "complete"
    FAILED = "failed"


# The single source of truth for progress: state -> state after this side's step succeeds.
_NEXT: dict[HandshakeState, HandshakeState] = {
    HandshakeState.SEND_MESSAGE_1: HandshakeState.AWAIT_MESSAGE_2,
    HandshakeState.AWAIT_MESSAGE_2: HandshakeState.SEND_MESSAGE_3,
    HandshakeState.SEND_MESSAGE_3: HandshakeState.COMPLETE,
    HandshakeState.AWAIT_MESSAGE_1: HandshakeState.SEND_MESSAGE_2,
    HandshakeState.SEND_MESSAGE_2: HandshakeState.AWAIT_MESSAGE_3,
    HandshakeState.AWAIT_MESSAGE_3: HandshakeState.COMPLETE,
}
_SENDING = {HandshakeState.SEND_MESSAGE_1, HandshakeState.SEND_MESSAGE_2, HandshakeState.SEND_MESSAGE_3}
_AWAITING = {HandshakeState.AWAIT_MESSAGE_1, HandshakeState.AWAIT_MESSAGE_2, HandshakeState.AWAIT_MESSAGE_3}


class NoiseHandshake:
    """One side of a Noise XXpsk0 handshake (sans-I/O).

    ``psk`` is :func:`psk_for` of the swarm key (the default admits an open swarm only).
    ``wall_time_ms`` is the caller's wall clock (Unix milliseconds) when the handshake starts: an
    initiator sends it in message 1, a responder with a ``replay_guard`` judges message 1's time
    against it (a machine reads no clock). Without a guard a responder ignores the time.
    """

    def __init__(
        self,
        *,
        initiator: bool,
        identity: Identity,
        psk: bytes = OPEN_SWARM_PSK,
        prologue: bytes = PROLOGUE,
        expected_peer: PeerID | None = None,
        static_key: X25519PrivateKey | None = None,
        ephemeral_key: X25519PrivateKey | None = None,
        wall_time_ms: int = 0,
        replay_guard: ReplayGuard | None = None,
    ) -> None:
        if expected_peer is not None and not initiator:
            raise LocalProtocolError("only the dialing side can expect a particular PeerID")
        if len(psk) != 32:
            raise LocalProtocolError("the Noise PSK must be 32 bytes (use psk_for)")
        if replay_guard is not None and initiator:
            raise LocalProtocolError("only the answering side checks message 1's freshness")
        if not 0 <= wall_time_ms < 1 << 64:
            raise LocalProtocolError("wall_time_ms must fit in 64 unsigned bits")
        self.initiator = initiator
        self.state = HandshakeState.SEND_MESSAGE_1 if initiator else HandshakeState.AWAIT_MESSAGE_1
        self._identity = identity
        self._expected = expected_peer
        self._wall_time_ms = wall_time_ms
        self._replay_guard = replay_guard
        self._s = static_key or X25519PrivateKey.generate()
        self._e = ephemeral_key or X25519PrivateKey.generate()
        self._re: X25519PublicKey | None = None
        self._rs: X25519PublicKey | None = None
        self._symmetric = _SymmetricState(prologue)
        self._symmetric.mix_key_and_hash(psk)  # psk0: before anything else of message 1
        self._received_any = False
        self._inbox = bytearray()
        self._outbox = bytearray()
        self.remote_peer_id: PeerID | None = None
        if initiator:
            self._write_message_1()

    # ------------------------------------------------------------------ driver interface
    @property
    def complete(self) -> bool:
        """True once both sides are authenticated and :meth:`session` is available."""
        return self.state is HandshakeState.COMPLETE

    def data_to_send(self) -> bytes:
        """Bytes the driver must write to the socket now (possibly empty)."""
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def receive_data(self, data: bytes) -> None:
        """Feed bytes read from the socket; processes every whole handshake message in them."""
        if self.state is HandshakeState.FAILED:
            raise LocalProtocolError("handshake already failed")
        self._inbox += data
        self._received_any = self._received_any or bool(data)
        while self.state in _AWAITING:
            message = self._take_message()
            if message is None:
                # Only what is still waiting to be a handshake message is bounded here: bytes after
                # the final message belong to the secure channel (a dialer may pipeline records).
                if len(self._inbox) > MAX_HANDSHAKE_MESSAGE_BYTES + _LENGTH.size:
                    self._fail()
                    raise RemoteProtocolError("handshake: peer sent more data than a handshake message can hold")
                return
            try:
                self._read(message)
            except InvalidTag:
                self._fail()
                raise AdmissionDenied(
                    "handshake rejected: the remote peer is not in this swarm (different swarm key) "
                    "or the handshake was tampered with"
                ) from None
            except (RemoteProtocolError, AdmissionDenied):
                self._fail()
                raise
            except ValueError as exc:  # malformed X25519 points and similar
                self._fail()
                raise RemoteProtocolError(f"handshake: malformed message: {exc}") from None

    def connection_lost(self) -> ChaosError:
        """What it means that the socket closed before the handshake completed (the driver raises it).

        A responder that does not share our swarm key closes the connection on our message 1
        without a word (it must not tell a stranger anything), so an initiator that hears nothing
        at all back reports admission, not a network failure.
        """
        state, self.state = self.state, HandshakeState.FAILED
        if self.initiator and state is HandshakeState.AWAIT_MESSAGE_2 and not self._received_any:
            return AdmissionDenied(
                "handshake refused: the peer closed the connection on our first message; we are not in "
                "this swarm (it has a different swarm key, or none), our clocks disagree by more than its "
                "handshake window, or it is refusing connections"
            )
        return ConnectionClosed(f"the connection closed during the handshake ({state.value})")

    def session(self) -> SessionKeys:
        """Transport keys after completion (initiator's send key is the responder's receive key)."""
        if not self.complete or self.remote_peer_id is None:
            raise LocalProtocolError(f"handshake not complete (state: {self.state.value})")
        k1, k2 = self._symmetric.split()
        send, receive = (k1, k2) if self.initiator else (k2, k1)
        return SessionKeys(send, receive, self.remote_peer_id, self._symmetric.h)

    def leftover(self) -> bytes:
        """Bytes received after the final handshake message (the start of the secure channel)."""
        out = bytes(self._inbox)
        self._inbox.clear()
        return out

    # ------------------------------------------------------------------ message processing
    def _advance(self, expected: HandshakeState) -> None:
        if self.state is not expected:
            raise LocalProtocolError(f"handshake step {expected.value!r} in state {self.state.value!r}")
        self.state = _NEXT[self.state]

    def _fail(self) -> None:
        self.state = HandshakeState.FAILED

    def _take_message(self) -> bytes | None:
        if len(self._inbox) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(self._inbox)
        if length > MAX_HANDSHAKE_MESSAGE_BYTES:
            self._fail()
            raise RemoteProtocolError(f"handshake message of {length} bytes exceeds {MAX_HANDSHAKE_MESSAGE_BYTES}")
        if len(self._inbox) < _LENGTH.size + length:
            return None
        message = bytes(self._inbox[_LENGTH.size : _LENGTH.size + length])
        del self._inbox[: _LENGTH.size + length]
        return message

    def _emit(self, message: bytes) -> None:
        self._outbox += _LENGTH.pack(len(message)) + message

    def _payload(self) -> bytes:
        static_public = _raw_public(self._s)
        return pack([self._identity.peer_id.public_bytes, self._identity.sign(SIGNATURE_PREFIX + static_public)])

    def _check_payload(self, payload: bytes) -> PeerID:
        obj = unpack(payload, max_bytes=MAX_HANDSHAKE_MESSAGE_BYTES)
        if (
            not isinstance(obj, list)
            or len(obj) < 2
            or type(obj[0]) is not bytes
            or type(obj[1]) is not bytes
            or len(obj[0]) != 32
        ):
            raise RemoteProtocolError("handshake: payload must be [ed25519 public key, signature]")
        peer = PeerID.from_public_bytes(obj[0])
        assert self._rs is not None
        remote_static = self._rs.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        if not peer.verify(obj[1], SIGNATURE_PREFIX + remote_static):
            raise RemoteProtocolError("handshake: identity signature over the Noise static key is invalid")
        return peer

    def _write_message_1(self) -> None:
        self._advance(HandshakeState.SEND_MESSAGE_1)
        e_pub = _raw_public(self._e)
        self._symmetric.mix_ephemeral(e_pub)
        self._emit(e_pub + self._symmetric.encrypt_and_hash(TIMESTAMP.pack(self._wall_time_ms)))

    def _write_message_2(self) -> None:
        self._advance(HandshakeState.SEND_MESSAGE_2)
        assert self._re is not None
        sym = self._symmetric
        e_pub = _raw_public(self._e)
        sym.mix_ephemeral(e_pub)
        sym.mix_key(self._e.exchange(self._re))
        encrypted_s = sym.encrypt_and_hash(_raw_public(self._s))
        sym.mix_key(self._s.exchange(self._re))
        self._emit(e_pub + encrypted_s + sym.encrypt_and_hash(self._payload()))

    def _write_message_3(self) -> None:
        self._advance(HandshakeState.SEND_MESSAGE_3)
        assert self._re is not None
        sym = self._symmetric
        encrypted_s = sym.encrypt_and_hash(_raw_public(self._s))
        sym.mix_key(self._s.exchange(self._re))
        self._emit(encrypted_s + sym.encrypt_and_hash(self._payload()))

    def _read(self, message: bytes) -> None:
        sym = self._symmetric
        if self.state is HandshakeState.AWAIT_MESSAGE_1:
            if len(message) == OLD_MESSAGE_1_BYTES:
                raise RemoteProtocolError(
                    "handshake message 1 without a timestamp: the dialer runs an older chaosp2p (upgrade it)"
                )
            if len(message) != MESSAGE_1_BYTES:
                raise RemoteProtocolError(f"handshake message 1 must be {MESSAGE_1_BYTES} bytes, got {len(message)}")
            self._re = _x25519_public(message[:_DHLEN])
            sym.mix_ephemeral(message[:_DHLEN])
            # InvalidTag: the dialer lacks our swarm key. Only then is the time worth reading.
            (sent_at_ms,) = TIMESTAMP.unpack(sym.decrypt_and_hash(message[_DHLEN:]))
            if self._replay_guard is not None:  # before any DH or signature of ours
                self._replay_guard.admit(message[:_DHLEN], sent_at_ms, self._wall_time_ms)
            self._advance(HandshakeState.AWAIT_MESSAGE_1)
            self._write_message_2()
        elif self.state is HandshakeState.AWAIT_MESSAGE_2:
            if len(message) < _DHLEN + _DHLEN + _TAGLEN + _TAGLEN:
                raise RemoteProtocolError("handshake message 2 too short")
            self._re = _x25519_public(message[:_DHLEN])
            sym.mix_ephemeral(message[:_DHLEN])
            sym.mix_key(self._e.exchange(self._re))
            split = _DHLEN + _DHLEN + _TAGLEN
            self._rs = _x25519_public(sym.decrypt_and_hash(message[_DHLEN:split]))
            sym.mix_key(self._e.exchange(self._rs))
            peer = self._check_payload(sym.decrypt_and_hash(message[split:]))
            if self._expected is not None and peer != self._expected:
                raise PeerIdMismatch(f"dialed {self._expected} but the peer at that address is {peer}")
            self.remote_peer_id = peer
            self._advance(HandshakeState.AWAIT_MESSAGE_2)
            self._write_message_3()
        elif self.state is HandshakeState.AWAIT_MESSAGE_3:
            if len(message) < _DHLEN + _TAGLEN + _TAGLEN:
                raise RemoteProtocolError("handshake message 3 too short")
            split = _DHLEN + _TAGLEN
            self._rs = _x25519_public(sym.decrypt_and_hash(message[:split]))
            sym.mix_key(self._e.exchange(self._rs))
            self.remote_peer_id = self._check_payload(sym.decrypt_and_hash(message[split:]))
            self._advance(HandshakeState.AWAIT_MESSAGE_3)
