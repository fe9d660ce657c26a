"""Averaging rounds, ``/chaos/average/1``: the pure pieces (no I/O).

A round averages one flat float32 buffer among the members of an agreed configuration as a
butterfly: the buffer is cut into one shard per member (:mod:`.plan`), every member sends each
owner its slice of that owner's shard (a :class:`Contribution` header and raw bytes,
:mod:`.messages`), each owner averages what it received with a fixed order of operations
(:mod:`.shard_reduce`) and sends the same bytes back to everyone (a :class:`Result`).
:mod:`.contributions` counts, per member, the rounds in a row whose contribution failed this
owner's own checks (the evidence behind an EVICT); :mod:`.weights` says how much each member's
contribution may weigh, from the agreed configuration (never from what the contributor states).

The driver that moves the bytes is :mod:`chaosp2p.training.averager`; ``protocols/averaging.md``
is the normative description, with test vectors.
"""

from __future__ import annotations

from chaosp2p.protocols.averaging.contributions import InvalidStreaks
from chaosp2p.protocols.averaging.messages import (
    PROTOCOL,
    PROTOCOL_ID,
    WIRE_MAX_DETAIL_CHARS,
    WIRE_MAX_DIGEST_BYTES,
    WIRE_MAX_ELEMENTS,
    WIRE_MAX_MEMBERS,
    WIRE_MAX_RUN_CHARS,
    WIRE_MAX_U64,
    AverageMessageType,
    Contribution,
    Exclusion,
    Result,
    ResultStatus,
    RoundPhase,
    RoundTag,
    WireDtype,
    codec,
)
from chaosp2p.protocols.averaging.plan import DEFAULT_ALIGN_ELEMENTS, ReducePlan, Shard, plan_shards
from chaosp2p.protocols.averaging.shard_reduce import (
    BLOCK_ELEMENTS,
    Part,
    ShardReducer,
    all_finite,
    decode,
    encode,
    storage_dtype,
)
from chaosp2p.protocols.averaging.weights import weight_allowances

__all__ = [
    "BLOCK_ELEMENTS",
    "DEFAULT_ALIGN_ELEMENTS",
    "PROTOCOL",
    "PROTOCOL_ID",
    "WIRE_MAX_DETAIL_CHARS",
    "WIRE_MAX_DIGEST_BYTES",
    "WIRE_MAX_ELEMENTS",
    "WIRE_MAX_MEMBERS",
    "WIRE_MAX_RUN_CHARS",
    "WIRE_MAX_U64",
    "AverageMessageType",
    "Contribution",
    "Exclusion",
    "InvalidStreaks",
    "Part",
    "ReducePlan",
    "Result",
    "ResultStatus",
    "RoundPhase",
    "RoundTag",
    "Shard",
    "ShardReducer",
    "WireDtype",
    "all_finite",
    "codec",
    "decode",
    "encode",
    "plan_shards",
    "storage_dtype",
    "weight_allowances",
]
