"""Wire format of ``/chaos/average/1``: the round tag, contribution headers and shard results.

One stream per (contributor, owner) pair and round, opened by the contributor::

    contributor -> owner   Contribution (msgpack frame), then ``payload_bytes`` raw bytes: the
                           contributor's slice of the owner's shard in ``wire_dtype``
                           (nothing when its weight is 0: an observer contributes no values)
    owner -> contributor   Result (msgpack frame), then ``payload_bytes`` raw bytes: the averaged
                           shard, the same bytes for every contributor (nothing unless status OK)
    owner -> contributor   only if some owner excluded a peer whose values are in this shard:
                           Result(revision=1) and the shard averaged again without them

Every Contribution carries the :class:`RoundTag`; an owner that is not in that round answers
``MISMATCH`` and the contributor raises :class:`~chaosp2p.errors.RoundMismatch`. ``REFUSED`` means
the header itself was unacceptable (length, range, dtype, weight); ``ABORTED`` carries the members
the owner found missing, so every member names the same culprits. ``validate()`` checks only
configuration-independent wire limits; the owner checks lengths against its own buffer.
``protocols/averaging.md`` is the normative description, with test vectors.

A contribution excluded by any owner is excluded from the whole round: every member learns all
exclusions from the first answers (each lists the peers whose values it ``included``), so every
member knows, identically, which owners must send a second answer without them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.protocol_ids import ProtocolId

PROTOCOL = "average"
"""Protocol name (streams are opened with ``connection.open_stream(PROTOCOL)``)."""
PROTOCOL_ID = ProtocolId(PROTOCOL, 1)
"""``/chaos/average/1``."""

WIRE_MAX_U64 = (1 << 64) - 1
"""Largest epoch, step, attempt and ``payload_bytes``."""
WIRE_MAX_RUN_CHARS = 256
"""A run id has 1 to this many characters."""
WIRE_MAX_DIGEST_BYTES = 64
"""Longest configuration digest in a :class:`RoundTag`."""
WIRE_MAX_DETAIL_CHARS = 1024
"""Longest ``Result.detail`` and ``Exclusion.reason``."""
WIRE_MAX_MEMBERS = 1024
"""Most entries in each of ``Result.excluded``, ``missing`` and ``included``."""
WIRE_MAX_ELEMENTS = 1 << 40
"""No buffer has more elements than this (4 TiB of float32): a hard bound before any local check."""


class AverageMessageType(enum.IntEnum):
    """Message type numbers. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    CONTRIBUTION = 1
    RESULT = 2


class RoundPhase(enum.IntEnum):
    """What a round averages within one training step. ONLY APPEND TO THIS LIST."""

    GRADIENTS = 0
    PARAMETERS = 1
    OUTER = 2
    """DiLoCo outer step: pseudo-gradients."""
    STATE = 3
    """Anything else a collaboration keeps identical (e.g. buffers, statistics)."""


class WireDtype(enum.IntEnum):
    """Element type of the raw payloads. ONLY APPEND TO THIS LIST."""

    FLOAT32 = 1
    FLOAT16 = 2
    BFLOAT16 = 3

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire."""
        return 4 if self is WireDtype.FLOAT32 else 2

    @classmethod
    def from_name(cls, name: str) -> WireDtype:
        """``"float32"``, ``"float16"`` or ``"bfloat16"`` (``ValueError`` for anything else)."""
        try:
            return _BY_NAME[name]
        except KeyError:
            raise ValueError(f"wire_dtype must be one of {sorted(_BY_NAME)} (got {name!r})") from None


_BY_NAME = {"float32": WireDtype.FLOAT32, "float16": WireDtype.FLOAT16, "bfloat16": WireDtype.BFLOAT16}


class ResultStatus(enum.IntEnum):
    """How an owner answered a contribution. ONLY APPEND TO THIS LIST."""

    OK = 0
    REFUSED = 1
    """The contribution's header was unacceptable (length, range, dtype, weight): it was excluded."""
    MISMATCH = 2
    """The owner is not in this round (other run, epoch, configuration, step or phase, or not a member)."""
    ABORTED = 3
    """The round failed; ``missing`` names the members the owner found missing."""


codec = MessageCodec(PROTOCOL, AverageMessageType)
"""Encoder/decoder for every averaging message."""


def _reject(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"{PROTOCOL}: {message}")


def _check_u64(value: int, what: str) -> None:
    if not 0 <= value <= WIRE_MAX_U64:
        raise _reject(f"{what} out of range: {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundTag:
    """Which averaging round a message belongs to; members must agree on all of it.

    ``config_digest`` is the digest of the configuration that governs ``step`` (so members that
    disagree about membership never mix their averages); ``phase`` tells apart several rounds in
    one step.
    """

    run: str
    epoch: int
    config_digest: bytes
    step: int
    phase: RoundPhase = RoundPhase.GRADIENTS
    attempt: int = 0
    """Rounds of the same step under the same configuration that failed before this one (a round
    that failed is final; members that retry it without a configuration change count up)."""

    def __post_init__(self) -> None:
        if not isinstance(self.phase, RoundPhase):  # a plain int from a caller
            object.__setattr__(self, "phase", RoundPhase(self.phase))

    def validate(self) -> None:
        """Wire limits."""
        if not 1 <= len(self.run) <= WIRE_MAX_RUN_CHARS:
            raise _reject(f"run id must have 1..{WIRE_MAX_RUN_CHARS} characters")
        if len(self.config_digest) > WIRE_MAX_DIGEST_BYTES:
            raise _reject(f"config digest longer than {WIRE_MAX_DIGEST_BYTES} bytes")
        _check_u64(self.epoch, "epoch")
        _check_u64(self.step, "step")
        _check_u64(self.attempt, "attempt")

    @property
    def order(self) -> tuple[int, int, int, int]:
        """Position of the round within its run: later rounds compare greater."""
        return (self.epoch, self.step, int(self.phase), self.attempt)

    def __str__(self) -> str:
        retry = f"/a{self.attempt}" if self.attempt else ""
        return f"{self.run}@e{self.epoch}/s{self.step}/{self.phase.name.lower()}{retry}/{self.config_digest.hex()[:8]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Exclusion:
    """A contribution an owner left out of its average, and why."""

    peer: PeerID
    reason: str

    def validate(self) -> None:
        """Wire limits."""
        if len(self.reason) > WIRE_MAX_DETAIL_CHARS:
            raise _reject("exclusion reason too long")


@codec.register(AverageMessageType.CONTRIBUTION)
@dataclass(frozen=True, slots=True, kw_only=True)
class Contribution(Message):
    """Header of a contributor's slice of one shard; ``payload_bytes`` raw bytes follow."""

    tag: RoundTag
    total_elements: int
    """Length of the contributor's whole buffer."""
    start: int
    stop: int
    """The shard (elements ``start .. stop``) as the contributor's plan has it."""
    wire_dtype: WireDtype
    weight: float
    payload_bytes: int

    def validate(self) -> None:
        """Wire limits (the owner checks the values against its own plan)."""
        if not 0 <= self.start <= self.stop <= self.total_elements <= WIRE_MAX_ELEMENTS:
            raise _reject(f"bad shard range {self.start}..{self.stop} of {self.total_elements}")
        _check_u64(self.payload_bytes, "payload_bytes")


@codec.register(AverageMessageType.RESULT)
@dataclass(frozen=True, slots=True, kw_only=True)
class Result(Message):
    """An owner's answer: on OK, ``payload_bytes`` raw bytes of the averaged shard follow."""

    status: ResultStatus
    detail: str = ""
    start: int = 0
    stop: int = 0
    wire_dtype: WireDtype = WireDtype.FLOAT32
    payload_bytes: int = 0
    total_weight: float = 0.0
    excluded: tuple[Exclusion, ...] = ()
    """Contributions this owner left out of the shard."""
    missing: tuple[PeerID, ...] = ()
    """ABORTED: the members the owner found missing."""
    included: tuple[PeerID, ...] = ()
    """Peers whose values are in this shard (a member excluded anywhere is then removed everywhere)."""
    revision: int = 0
    """0 for the first answer; 1 for the shard redone without contributions other owners excluded."""

    def validate(self) -> None:
        """Wire limits."""
        if len(self.detail) > WIRE_MAX_DETAIL_CHARS:
            raise _reject("result detail too long")
        if not 0 <= self.start <= self.stop <= WIRE_MAX_ELEMENTS:
            raise _reject(f"bad shard range {self.start}..{self.stop}")
        _check_u64(self.payload_bytes, "payload_bytes")
        if max(len(self.excluded), len(self.missing), len(self.included)) > WIRE_MAX_MEMBERS:
            raise _reject(f"more than {WIRE_MAX_MEMBERS} excluded, missing or included members")
        if self.revision not in (0, 1):
            raise _reject(f"revision must be 0 or 1 (got {self.revision})")
        if self.status is not ResultStatus.OK and self.payload_bytes:
            raise _reject("only an OK result carries a payload")
