"""Sample protocol events for tests that turn events into records, JSON or dashboard messages."""

from __future__ import annotations

from typing import Any

from chaosp2p.protocols.negotiation.events import OperationCommitted
from chaosp2p.protocols.negotiation.operations import OpKind


def committed_operation(*, run: str, kind: OpKind, subject: Any, origin: Any, **changes: Any) -> OperationCommitted:
    """An ``OperationCommitted`` of epoch 4 at step 7, detected at 10.0 and committed at 10.625."""
    fields: dict[str, Any] = {
        "epoch": 4,
        "other": None,
        "detected_at": 10.0,
        "proposed_at": 10.5,
        "committed_at": 10.625,
        "activation_step": 7,
        "applied": True,
        **changes,
    }
    return OperationCommitted(run=run, kind=kind, subject=subject, origin=origin, **fields)
