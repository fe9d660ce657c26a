"""Who a member serves: members of the run, and newcomers a member sponsors (tickets).

Theory of operation
-------------------
The collaboration protocol hands out what a run holds dear: ``FetchUpdate`` and the observe stream
carry averaged gradients, and a ``SnapshotRequest`` makes a member snapshot its model and optimizer
and serve it. So a member answers them only for peers with a reason to ask:

* **Members** of the run's configuration (the newest one this member holds, or the one governing
  its next step) may fetch updates and ask for snapshots.
* **A newcomer** is not a member yet, and it asks every member for a snapshot *before* it asks to
  be admitted (``protocols/collab.md`` §1). It gets a **ticket** from its **sponsor**, the member
  it observes: the sponsor accepts the observe stream (at most ``max_newcomers`` at a time) and
  signs, with its identity key, the msgpack array ::

      ["chaosp2p/collab/ticket/1", run, sponsor, newcomer, until_step]

  (PeerIDs as their bytes; ``until_step`` is the sponsor's completed step plus ``ticket_steps``).
  The newcomer attaches the ticket to its snapshot requests. A member accepts one only if it names
  the asker (the channel authenticated its PeerID), the sponsor is a member of the run's
  configuration, the step asked for is at most ``until_step``, and the signature verifies --
  checked in that order, cheapest first, so a forged ticket costs at most one signature check.

Steps, not clocks, bound a ticket: members agree on steps, and their clocks may differ. A ticket
lets its newcomer make a member snapshot steps up to ``until_step`` only; once the run is past
that step, the ticket can only ask about snapshots already published. Independently of tickets, a
member serves no snapshot of a step more than ``ticket_steps`` beyond the newest it completed.

An open run still admits whoever a member agrees to sponsor: what the tickets defend is that no
peer outside the run gets a snapshot made, or an update, unless a member chose to sponsor it, and
that each member sponsors a bounded number of newcomers at once. Who may sponsor whom is the
member's choice (a closed swarm uses a swarm key or an allowlist at the transport).
"""

from __future__ import annotations

from chaosp2p.protocols.collab.messages import SnapshotRequest, Ticket
from chaosp2p.protocols.negotiation import Configuration
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID

TICKET_DOMAIN = "chaosp2p/collab/ticket/1"
"""First item of every signed ticket, so its signature means nothing in another protocol."""

NOT_A_MEMBER = "this member serves members of the run and newcomers with a member's ticket only"
"""Why a request without a usable ticket from outside the run is refused."""


def ticket_statement(run: str, sponsor: PeerID, newcomer: PeerID, until_step: int) -> bytes:
    """The bytes a ticket signs (see the module docstring)."""
    return pack([TICKET_DOMAIN, run, sponsor.raw, newcomer.raw, until_step])


def issue_ticket(identity: Identity, *, run: str, newcomer: PeerID, until_step: int) -> Ticket:
    """``identity``'s ticket letting ``newcomer`` ask ``run``'s members for snapshots up to ``until_step``."""
    signature = identity.sign(ticket_statement(run, identity.peer_id, newcomer, until_step))
    return Ticket(sponsor=identity.peer_id, newcomer=newcomer, until_step=until_step, signature=signature)


def verify_ticket(ticket: Ticket, run: str) -> bool:
    """Whether ``ticket`` is its sponsor's signature over its statement for ``run``."""
    return ticket.sponsor.verify(
        ticket.signature, ticket_statement(run, ticket.sponsor, ticket.newcomer, ticket.until_step)
    )


def is_member(peer: PeerID, configurations: tuple[Configuration | None, ...]) -> bool:
    """Whether ``peer`` is a member of any of ``configurations`` (None entries are skipped)."""
    return any(config is not None and config.member(peer) is not None for config in configurations)


def snapshot_refusal(
    request: SnapshotRequest,
    *,
    asker: PeerID,
    configurations: tuple[Configuration | None, ...],
    completed: int,
    ticket_steps: int,
) -> str | None:
    """Why a member refuses ``request`` from ``asker``, or None to serve it.

    ``configurations`` are the run's configurations that make a peer a member here (the newest,
    the one governing the next step); ``completed`` is the newest step this member completed.
    Cheap checks come first; the signature is verified last, once everything else holds.
    """
    if request.step > completed + ticket_steps:
        return f"step {request.step} is more than {ticket_steps} steps ahead of this member"
    if is_member(asker, configurations):
        return None
    ticket = request.ticket
    if ticket is None:
        return NOT_A_MEMBER
    if ticket.newcomer != asker:
        return "the ticket names another peer"
    if ticket.sponsor == asker or not is_member(ticket.sponsor, configurations):
        return "the ticket's sponsor is not a member of the run"
    if request.step > ticket.until_step:
        return f"the ticket covers steps up to {ticket.until_step}"
    if not verify_ticket(ticket, request.run):
        return "the ticket's signature does not verify"
    return None
