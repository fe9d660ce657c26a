"""Who a member serves (protocols/collab.md §4.4): members, and newcomers with a member's ticket.

The rule is a pure function of the request, the authenticated asker, the run's configurations and
the member's completed step; each refusal is checked here in the order the spec gives, and the
ticket statement against its vector.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.collab import (
    SnapshotRequest,
    codec,
    issue_ticket,
    snapshot_refusal,
    ticket_statement,
    verify_ticket,
)
from chaosp2p.protocols.collab.ticket import NOT_A_MEMBER
from chaosp2p.wire.identity import Identity
from tests.unit.fake_port import RUN, configuration, identities

SPEC = Path(__file__).resolve().parents[2] / "protocols" / "collab.md"
SPONSOR, OTHER_MEMBER, NEWCOMER, OUTSIDER = identities(4, base=40)
CONFIG = configuration([SPONSOR.peer_id, OTHER_MEMBER.peer_id])
COMPLETED = 10
TICKET_STEPS = 16


def _request(step: int = 12, **changes: object) -> SnapshotRequest:
    ticket = issue_ticket(SPONSOR, run=RUN, newcomer=NEWCOMER.peer_id, until_step=COMPLETED + TICKET_STEPS)
    return dataclasses.replace(
        SnapshotRequest(run=RUN, step=step, layout=b"l" * 16, config_digest=CONFIG.digest, ticket=ticket), **changes
    )


def _refusal(request: SnapshotRequest, asker: Identity = NEWCOMER) -> str | None:
    return snapshot_refusal(
        request, asker=asker.peer_id, configurations=(CONFIG, None), completed=COMPLETED, ticket_steps=TICKET_STEPS
    )


def test_members_are_served_without_a_ticket_and_a_ticketed_newcomer_with_one() -> None:
    assert _refusal(_request(ticket=None), asker=OTHER_MEMBER) is None
    assert _refusal(_request()) is None
    assert _refusal(_request(step=COMPLETED + TICKET_STEPS)) is None  # the last step the ticket covers


def test_outsiders_without_a_valid_ticket_are_refused_with_the_first_rule_they_break() -> None:
    """Issue 20, finding 11: a snapshot request from outside the run made any member snapshot and serve."""
    request = _request()
    ticket = request.ticket
    assert ticket is not None
    assert _refusal(_request(ticket=None)) == NOT_A_MEMBER
    assert _refusal(request, asker=OUTSIDER) == "the ticket names another peer"
    outsiders_ticket = issue_ticket(OUTSIDER, run=RUN, newcomer=NEWCOMER.peer_id, until_step=30)
    assert _refusal(_request(ticket=outsiders_ticket)) == "the ticket's sponsor is not a member of the run"
    own_ticket = issue_ticket(OTHER_MEMBER, run=RUN, newcomer=OTHER_MEMBER.peer_id, until_step=30)
    assert _refusal(_request(ticket=own_ticket), asker=OTHER_MEMBER) is None  # a member needs none anyway
    short = issue_ticket(SPONSOR, run=RUN, newcomer=NEWCOMER.peer_id, until_step=11)
    assert _refusal(_request(ticket=short)) == "the ticket covers steps up to 11"
    stretched = dataclasses.replace(ticket, until_step=ticket.until_step + 1)  # not what the sponsor signed
    assert _refusal(_request(ticket=stretched)) == "the ticket's signature does not verify"
    other_run = issue_ticket(SPONSOR, run="another-run", newcomer=NEWCOMER.peer_id, until_step=26)
    assert _refusal(_request(ticket=other_run)) == "the ticket's signature does not verify"


def test_no_one_makes_a_member_snapshot_a_step_far_ahead() -> None:
    far = COMPLETED + TICKET_STEPS + 1
    assert _refusal(_request(step=far)) == f"step {far} is more than 16 steps ahead of this member"
    assert _refusal(_request(step=far, ticket=None), asker=SPONSOR) == _refusal(_request(step=far))


def test_cheap_checks_come_before_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    verified: list[object] = []
    from chaosp2p.protocols.collab import ticket as ticket_module

    monkeypatch.setattr(ticket_module, "verify_ticket", lambda ticket, run: verified.append(ticket) or True)
    for request, asker in (
        (_request(ticket=None), NEWCOMER),
        (_request(), OUTSIDER),
        (_request(step=COMPLETED + TICKET_STEPS + 1), NEWCOMER),
        (_request(ticket=issue_ticket(OUTSIDER, run=RUN, newcomer=NEWCOMER.peer_id, until_step=26)), NEWCOMER),
    ):
        assert _refusal(request, asker) is not None
    assert verified == []


def test_a_ticket_has_a_64_byte_signature_on_the_wire() -> None:
    request = _request()
    assert request.ticket is not None
    bad = dataclasses.replace(request, ticket=dataclasses.replace(request.ticket, signature=b"s" * 63))
    with pytest.raises(RemoteProtocolError, match="ticket signature"):
        codec.decode(codec.encode(bad), max_bytes=1 << 16)
    assert codec.decode(codec.encode(request), max_bytes=1 << 16) == request


def test_the_ticket_statement_matches_the_spec_vector() -> None:
    match = re.search(r"```ticket-vector\n(\S+) ([0-9a-f]+)\n```", SPEC.read_text())
    assert match, "protocols/collab.md has no ticket-vector block"
    a, b = (Identity.from_seed(bytes([n]) * 32) for n in (1, 2))
    assert match.group(1) == "TicketStatement"
    assert ticket_statement("run-a", a.peer_id, b.peer_id, 56).hex() == match.group(2)
    ticket = issue_ticket(a, run="run-a", newcomer=b.peer_id, until_step=56)
    assert verify_ticket(ticket, "run-a")
    assert not verify_ticket(dataclasses.replace(ticket, sponsor=b.peer_id), "run-a")
