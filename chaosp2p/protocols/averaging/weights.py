"""How much a member's contribution may weigh in a round: read from the agreed configuration, never
from the contributor.

Theory of operation
-------------------
An owner averages ``sum w_p x_p / sum w_p`` with the weight ``w_p`` each contributor states in its
``Contribution`` header. Taken at its word, one contributor would set the average: a weight of
1e30 against honest weights of a few samples makes every member's result that contributor's
values, and nothing is excluded (issue 20, finding 4). So every owner bounds each stated weight by
the member's **allowance**, a pure function of the configuration governing the round (the one the
round tag names), which every member holds bit for bit:

* sync mode: the member's batch share (samples of the global batch it computes per step);
* DiLoCo: batch share x ``local_steps`` (an outer step averages ``local_steps`` inner steps);
* a member whose removal a later configuration known here already agreed on (a leave committed for
  a future step; it still takes part until then, with weight 0): 0.

A header above its sender's allowance is refused (``protocols/averaging.md`` section 4.2); a
weight below it is the member's own business (a short batch, an observer at 0). A member can
therefore pull the average by at most its agreed share of the global batch -- what it would weigh
if honest. Owners that know different "later" configurations may disagree about a leaver's
allowance; a refusal is reported to every member in the owner's answer (section 4.3), so members
still agree on who was left out.
"""

from __future__ import annotations

from chaosp2p.protocols.negotiation.run_configuration import Configuration
from chaosp2p.wire.identity import PeerID


def weight_allowances(config: Configuration, step: int, *, newest: Configuration | None = None) -> dict[PeerID, float]:
    """Per member taking part in ``step`` under ``config``: the largest weight its contribution may carry.

    ``newest`` is the newest configuration of the run known here: a member it removed (an entry of
    its ``departed`` from an epoch after ``config``'s) is allowed 0.
    """
    factor = config.params.local_steps if config.params.mode == "diloco" else 1
    if max(config.since_steps, default=0) <= step:  # the usual case: everyone takes part
        allowances = {peer: float(share * factor) for peer, share in zip(config.peers, config.shares, strict=True)}
    else:
        allowances = {
            peer: float(share * factor)
            for peer, share, since in zip(config.peers, config.shares, config.since_steps, strict=True)
            if since <= step
        }
    if newest is not None and newest.epoch > config.epoch:
        # Only the (few) departures recorded after ``config`` can lower an allowance.
        for departed in newest.departed:
            peer = departed.peer_id
            if departed.epoch > config.epoch and peer in allowances and not newest.has_member(peer):
                allowances[peer] = 0.0
    return allowances


__all__ = ["weight_allowances"]
