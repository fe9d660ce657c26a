"""The collaboration protocol, ``/chaos/collab/1``: how a newcomer catches up with a training run
(the pure pieces, no I/O).

:mod:`.messages` is the wire format: observe a member's averaged updates, ask the members to
snapshot a step, fetch the update a member applied at a step. :mod:`.ticket` is who a member serves
(members, and newcomers showing a member's signed ticket). :mod:`.vouch` is the rule by which a
newcomer accepts a snapshot only if a quorum of the run's configuration signed its digest.

The drivers are :mod:`chaosp2p.training.service` (member side), :mod:`chaosp2p.training.feed`,
:mod:`chaosp2p.training.catchup` and :mod:`chaosp2p.training.collaboration`; ``protocols/collab.md``
is the normative description, with test vectors.
"""

from __future__ import annotations

from chaosp2p.protocols.collab.messages import (
    LAYOUT_BYTES,
    MAX_CONFIGURATION_BYTES,
    MAX_DIGEST_BYTES,
    MAX_REASON_CHARS,
    MAX_RUN_CHARS,
    MAX_STEP,
    PROTOCOL,
    PROTOCOL_ID,
    VOUCH_DIGEST_BYTES,
    VOUCH_SIGNATURE_BYTES,
    CollabMessageType,
    FetchUpdate,
    ObserveAccepted,
    ObserveRequest,
    Refused,
    SnapshotReply,
    SnapshotRequest,
    Ticket,
    UpdateHeader,
    codec,
)
from chaosp2p.protocols.collab.ticket import (
    TICKET_DOMAIN,
    issue_ticket,
    snapshot_refusal,
    ticket_statement,
    verify_ticket,
)
from chaosp2p.protocols.collab.vouch import (
    MAX_CONFIGURATIONS,
    VOUCH_DOMAIN,
    StateNotVouched,
    Vouch,
    VouchedState,
    choose_vouched_state,
    read_vouches,
    sign_vouch,
    vouch_statement,
    vouched_reply,
)

__all__ = [
    "LAYOUT_BYTES",
    "MAX_CONFIGURATIONS",
    "MAX_CONFIGURATION_BYTES",
    "MAX_DIGEST_BYTES",
    "MAX_REASON_CHARS",
    "MAX_RUN_CHARS",
    "MAX_STEP",
    "PROTOCOL",
    "PROTOCOL_ID",
    "TICKET_DOMAIN",
    "VOUCH_DIGEST_BYTES",
    "VOUCH_DOMAIN",
    "VOUCH_SIGNATURE_BYTES",
    "CollabMessageType",
    "FetchUpdate",
    "ObserveAccepted",
    "ObserveRequest",
    "Refused",
    "SnapshotReply",
    "SnapshotRequest",
    "StateNotVouched",
    "Ticket",
    "UpdateHeader",
    "Vouch",
    "VouchedState",
    "choose_vouched_state",
    "codec",
    "issue_ticket",
    "read_vouches",
    "sign_vouch",
    "snapshot_refusal",
    "ticket_statement",
    "verify_ticket",
    "vouch_statement",
    "vouched_reply",
]
