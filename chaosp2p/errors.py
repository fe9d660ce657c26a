"""The one error tree of chaosp2p.

Everything chaosp2p raises on purpose derives from :class:`ChaosError`, so an application can catch
the whole family in one place and tell "the network misbehaved" apart from bugs. Anything a remote
peer sent that we cannot accept becomes a :class:`RemoteProtocolError`; misuse of our own API (an
illegal state-machine event, a call in the wrong state) is a :class:`LocalProtocolError`.
"""

from __future__ import annotations


class ChaosError(Exception):
    """Root of every error chaosp2p raises deliberately."""


class ConfigError(ChaosError, ValueError):
    """A configuration value, profile file, key file or argument is invalid."""


class ProtocolError(ChaosError):
    """A protocol rule was broken, by us or by the remote peer."""


class LocalProtocolError(ProtocolError):
    """Our own code asked a protocol machine for something its current state does not allow."""


class RemoteProtocolError(ProtocolError):
    """A remote peer sent something malformed, oversized, out of order or otherwise unacceptable.

    The connection (or stream) it arrived on is closed; the local peer keeps running.
    """


class ProtocolNotSupported(ProtocolError):
    """No common version of a protocol exists between us and the remote peer."""


class StreamReset(ProtocolError):
    """The remote peer (or the connection's failure) aborted a stream before it finished."""


class PeerUnreachable(ChaosError):
    """A peer could not be reached, or stopped answering, or its connection closed."""


class ConnectionClosed(PeerUnreachable):
    """The connection to a peer closed while we were using it."""


class RequestTimeout(PeerUnreachable, TimeoutError):
    """A request got no answer within its deadline."""


class AdmissionDenied(ChaosError):
    """The remote peer is not who we expected, or is not allowed into this swarm."""


class PeerIdMismatch(AdmissionDenied):
    """We dialed ``/p2p/<id>`` but the peer that answered proved a different identity."""


class TransferError(ChaosError):
    """A state transfer failed or could not be completed from the available sources."""


class ChecksumMismatch(TransferError):
    """Bytes received for a chunk do not match the hash the manifest promised."""


__all__ = [
    "AdmissionDenied",
    "ChaosError",
    "ChecksumMismatch",
    "ConfigError",
    "ConnectionClosed",
    "LocalProtocolError",
    "PeerIdMismatch",
    "PeerUnreachable",
    "ProtocolError",
    "ProtocolNotSupported",
    "RemoteProtocolError",
    "RequestTimeout",
    "StreamReset",
    "TransferError",
]
