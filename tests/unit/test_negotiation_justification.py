"""The pure rules of justified ballots (``justification.py``, spec section 4b): which value a
quorum of promises forces, and when a forced value may be skipped as dead with one liar about."""

from __future__ import annotations

from chaosp2p.protocols.negotiation import RunParams
from chaosp2p.protocols.negotiation.justification import WAIT, Claim, dead, forced
from chaosp2p.protocols.negotiation.messages import Ballot, Value
from chaosp2p.protocols.negotiation.run_configuration import Configuration, make_configuration, quorum_of
from chaosp2p.wire.identity import Identity

IDS = [Identity.from_seed(bytes([i + 1]) * 32).peer_id for i in range(9)]
V, W = b"v" * 32, b"w" * 32


def config_of(n: int) -> Configuration:
    peers = sorted(IDS[:n], key=lambda p: p.raw)
    return make_configuration(
        run="r",
        epoch=1,
        activation_step=0,
        peers=peers,
        incarnations=[0] * n,
        throughputs=[1.0] * n,
        links=(),
        params=RunParams(global_batch=64),
        seed=1,
    )


def claim(i: int, ballot: Ballot | None = None, digest: bytes = b"", completed: int = -1) -> Claim:
    """Member i (of ``config_of(4)``) claims ``digest`` at ``ballot`` (backed), or nothing."""
    return Claim(config_of(4).peers[i].raw, ballot, digest if ballot else b"", completed, digest)


def test_quorums_of_odd_runs_of_five_or_more_share_two_members() -> None:
    assert [quorum_of(n) for n in range(1, 10)] == [1, 2, 2, 3, 4, 4, 5, 5, 6]
    assert all(2 * quorum_of(n) - n >= 2 for n in range(4, 200))


def test_the_highest_backed_claim_is_forced_and_nothing_is_free() -> None:
    config = config_of(4)
    liar = config.peers[3]
    low, high = Ballot(round=1, proposer=config.peers[0]), Ballot(round=2, proposer=liar)
    assert forced([claim(0), claim(1), claim(2)], config) is None
    assert forced([claim(0, low, V), claim(1, high, W), claim(2)], config) == (high, W)


def test_an_equivocated_highest_ballot_waits_for_every_other_member_then_takes_the_most_reported() -> None:
    config = config_of(4)
    liar = config.peers[3]
    top = Ballot(round=0, proposer=liar)
    # Two honest members report w and v at the liar's ballot: no telling which one a quorum chose.
    some = [claim(0, top, V), claim(1, top, W), claim(3, top, W)]
    assert forced(some, config) == WAIT
    # Every other member promised: v has two honest reporters, w one (the liar's own is left out).
    assert forced([*some, claim(2, top, V)], config) == (top, V)


def test_a_forced_value_is_dead_only_with_one_refusal_more_than_a_liar_can_add() -> None:
    config = config_of(4)  # q = 3: n - q + 1 = 2 refusals used to suffice; with a liar, 3
    value = Value(ops=(), activation_step=10)
    past = [claim(i, completed=20) for i in range(2)]
    assert not dead(value, V, [*past, claim(2), claim(3)], config)
    assert dead(value, V, [*past, claim(2, completed=20), claim(3)], config)
    # A member that says it accepted v, even without backing, does not count as refusing it.
    unbacked = Claim(config.peers[2].raw, None, b"", 20, V)
    assert not dead(value, V, [*past, unbacked, claim(3)], config)
