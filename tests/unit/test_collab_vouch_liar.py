"""Why a plain majority is enough for vouches against one dishonest member (``protocols/collab.md``
§5.4), pinned exhaustively: whatever one liar signs, and whichever honest members happen to answer,
a newcomer never accepts a state the honest members did not vouch for.

Negotiation needs quorums that share two members (2q - n >= 2) because different members learn a
decision from different certificates, so a liar's signature counts in two of them. A newcomer is
one observer that sees every vouch it counts and counts each member once, so two states would need
two disjoint majorities of the same members; and honest members all sign the one state they hold.
"""

from __future__ import annotations

import hashlib
import itertools

import pytest

from chaosp2p.protocols.collab.vouch import StateNotVouched, Vouch, choose_vouched_state, sign_vouch
from chaosp2p.protocols.negotiation import Configuration

from .test_collab_vouch import GOOD, RUN, STEP, config, ids

OTHER = hashlib.sha256(b"the liar's second state").digest()


def vouches_of(identities: list, digest: bytes, held: Configuration) -> list[Vouch]:  # type: ignore[type-arg]
    return [sign_vouch(i, run=RUN, step=STEP, state_digest=digest, config_digest=held.digest) for i in identities]


@pytest.mark.parametrize("n", range(2, 8))
def test_one_liar_vouching_for_other_states_never_makes_a_newcomer_load_one(n: int) -> None:
    members = ids(n)
    liar, honest = members[0], members[1:]
    anchor = config(members)
    # A configuration the liar makes up (governing the step), whose other members are identities it
    # holds the keys of: it can sign as all of them. The newcomer decodes it from the liar's reply.
    puppets = ids(n, base=100)
    forged = config([liar, *puppets], epoch=4, activation_step=11)
    strategies: dict[str, list[Vouch]] = {
        "silent": [],
        "vouches for the members' state": vouches_of([liar], GOOD, anchor),
        "another state": vouches_of([liar], OTHER, anchor),
        "two states": vouches_of([liar], OTHER, anchor) + vouches_of([liar], GOOD, anchor),
        "another state under a made-up configuration": vouches_of([liar, *puppets], OTHER, forged),
        "both, under both": vouches_of([liar], GOOD, anchor) + vouches_of([liar, *puppets], OTHER, forged),
    }
    for answered in range(len(honest) + 1):
        for subset in itertools.combinations(honest, answered):
            for name, lies in strategies.items():
                for order in (
                    lies + vouches_of(list(subset), GOOD, anchor),
                    vouches_of(list(subset), GOOD, anchor) + lies,
                ):
                    try:
                        chosen = choose_vouched_state(
                            order, run=RUN, step=STEP, anchor=anchor, configurations={forged.digest: forged}
                        )
                    except StateNotVouched:
                        # Only for want of honest answers: a majority of the members' honest vouches
                        # always decides, whatever the liar did.
                        assert answered < n // 2 + 1, (n, answered, name)
                        continue
                    assert chosen.state_digest == GOOD, (n, answered, name)
                    assert chosen.configuration is anchor
