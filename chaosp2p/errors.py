"""The one error tree of chaosp2p.

Everything chaosp2p raises on purpose derives from :class:`ChaosError`, so an application can catch
the whole family in one place and tell "the network misbehaved" apart from bugs. Anything a remote
peer sent that we cannot accept becomes a :class:`RemoteProtocolError`; misuse of our own API (an
illegal state-machine event, a call in the wrong state) is a :class:`LocalProtocolError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: the error tree sits below every other module
    from chaosp2p.wire.identity import PeerID


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


class RoundAborted(PeerUnreachable):
    """An averaging round could not complete: members in ``missing`` failed, left or did not deliver.

    Training redoes the step among the survivors (under the next configuration). ``missing`` may be
    empty when the round failed for another reason (e.g. no valid contribution for a shard).
    """

    def __init__(self, message: str, *, missing: frozenset[PeerID] = frozenset(), tag: object = None) -> None:
        super().__init__(message)
        self.missing = missing
        self.tag = tag


class RoundMismatch(RemoteProtocolError):
    """Members disagree about which averaging round this is (run, epoch, configuration, step or phase).

    Training resynchronises its configuration and step, then retries.
    """

    def __init__(self, message: str, *, tag: object = None) -> None:
        super().__init__(message)
        self.tag = tag


class ContributionRefused(RemoteProtocolError):
    """Shard owners refused this peer's contribution (wrong length, dtype or weight): it is the odd one out.

    ``by`` names the owners that refused; the other members completed the round without it.
    """

    def __init__(self, message: str, *, by: frozenset[PeerID] = frozenset(), tag: object = None) -> None:
        super().__init__(message)
        self.by = by
        self.tag = tag


class AdmissionDenied(ChaosError):
    """The remote peer is not who we expected, or is not allowed into this swarm."""


class PeerIdMismatch(AdmissionDenied):
    """We dialed ``/p2p/<id>`` but the peer that answered proved a different identity."""


class TransferError(ChaosError):
    """A state transfer failed or could not be completed from the available sources."""


class ChecksumMismatch(TransferError):
    """Bytes received for a chunk do not match the hash the manifest promised."""


class RunRemoved(ChaosError):
    """This peer is no longer a member of a training run (removed while partitioned, or it left)."""


class TrainingError(ChaosError):
    """A collaboration cannot go on (for example: joining never found a member of the run)."""


__all__ = [
    "AdmissionDenied",
    "ChaosError",
    "ChecksumMismatch",
    "ConfigError",
    "ConnectionClosed",
    "ContributionRefused",
    "LocalProtocolError",
    "PeerIdMismatch",
    "PeerUnreachable",
    "ProtocolError",
    "ProtocolNotSupported",
    "RemoteProtocolError",
    "RequestTimeout",
    "RoundAborted",
    "RoundMismatch",
    "RunRemoved",
    "StreamReset",
    "TrainingError",
    "TransferError",
]
