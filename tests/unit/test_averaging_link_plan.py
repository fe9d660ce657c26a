"""The reduce plan on the agreed link graph (protocols/averaging.md section 5.1): its vectors, and the
properties that make a cut link harmless: no exchange the plan needs runs over a link that is down
whenever some participant is linked to all the others, and a member's own link claims cannot take a
shard from two honest members linked to each other.

Run ``python tests/unit/test_averaging_link_plan.py`` to print the block for the spec.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from chaosp2p.protocols.averaging.link_plan import (
    fully_linked,
    link_bandwidths,
    link_owners,
    plan_on_links,
    relay_routes,
)
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry
from chaosp2p.wire.identity import Identity, PeerID
from tests.spec_blocks import named_lines

SPEC = "averaging.md"
PEERS = {name: Identity.from_seed(bytes([n]) * 32).peer_id for n, name in enumerate("ABCD", start=1)}
NAMES = {peer: name for name, peer in PEERS.items()}


def _entry(a: PeerID, b: PeerID, *, up: bool, bandwidth: float = 0.0) -> LinkEntry:
    if a.raw > b.raw:
        a, b = b, a
    return LinkEntry(a=a, b=b, up=up, bandwidth_bytes_per_s=bandwidth)


def _links(case: dict[str, Any]) -> list[LinkEntry]:
    return [
        _entry(PEERS[link["a"]], PEERS[link["b"]], up=link["up"], bandwidth=link.get("bandwidth", 0.0))
        for link in case["links"]
    ]


def compute(case: dict[str, Any]) -> dict[str, Any]:
    """What ``plan_on_links`` makes of a vector's inputs, in the vector's terms."""
    members = [PEERS[m] for m in case["members"]]
    links = _links(case)
    plan = plan_on_links(members, case["length"], links, align_elements=case["align"])
    relays = {}
    for me in members:
        for peer, through in relay_routes(members, links, me).items():
            if me.raw < peer.raw:  # each down pair once; its two ends get the same list
                assert relay_routes(members, links, peer)[me] == through
                pair = "~".join(sorted((NAMES[me], NAMES[peer])))
                relays[pair] = [NAMES[p] for p in through]
    return {
        "owners": sorted(NAMES[p] for p in link_owners(members, links)),
        "shards": [[s.start, s.stop] for s in plan.shards],
        "relays": dict(sorted(relays.items())),
    }


CASES: dict[str, dict[str, Any]] = {
    "mesh": {"members": ["B", "A", "C", "D"], "length": 1000, "align": 64, "links": []},
    "one-cut": {
        "members": ["B", "A", "C", "D"],
        "length": 1000,
        "align": 64,
        "links": [{"a": "A", "b": "B", "up": False}],
    },
    "bandwidth": {
        "members": ["A", "B", "C", "D"],
        "length": 25600,
        "align": 64,
        "links": [
            {"a": "A", "b": "B", "up": False, "bandwidth": 5e9},
            {"a": "A", "b": "C", "up": True, "bandwidth": 1e9},
            {"a": "C", "b": "D", "up": True, "bandwidth": 3e9},
            {"a": "B", "b": "D", "up": True, "bandwidth": 3e9},
        ],
    },
    "liar": {
        "members": ["A", "B", "C", "D"],
        "length": 1000,
        "align": 64,
        "links": [{"a": "A", "b": other, "up": False} for other in "BCD"],
    },
    "no-hub": {
        "members": ["A", "B", "C", "D"],
        "length": 1000,
        "align": 64,
        "links": [{"a": "A", "b": "B", "up": False}, {"a": "C", "b": "D", "up": False}],
    },
}


def spec_cases() -> dict[str, dict[str, Any]]:
    """The link-plan vectors of the spec, parsed."""
    return {name: json.loads(rest) for name, rest in named_lines(SPEC, "link-plan-vectors").items()}


def test_the_spec_lists_exactly_the_known_vectors() -> None:
    assert sorted(spec_cases()) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_link_plan_vector(name: str) -> None:
    case = spec_cases()[name]
    inputs = {k: case[k] for k in ("members", "length", "align", "links")}
    assert inputs == CASES[name]
    assert compute(case) == {"owners": case["owners"], "shards": case["shards"], "relays": case["relays"]}


def test_a_cut_link_leaves_its_two_ends_without_a_shard_and_the_others_with_all_of_it() -> None:
    members = [PEERS[m] for m in "ABCD"]
    links = [_entry(PEERS["A"], PEERS["B"], up=False)]
    plan = plan_on_links(members, 10_000, links)
    assert plan.shard_of(PEERS["A"]).size == 0 and plan.shard_of(PEERS["B"]).size == 0
    assert plan.shard_of(PEERS["C"]).size + plan.shard_of(PEERS["D"]).size == 10_000


def _random_graph(rng: random.Random, members: list[PeerID]) -> list[LinkEntry]:
    links = []
    for a, b in itertools.combinations(members, 2):
        roll = rng.random()
        if roll < 0.3:
            links.append(_entry(a, b, up=False, bandwidth=rng.choice([0.0, 1e8])))
        elif roll < 0.6:
            links.append(_entry(a, b, up=True, bandwidth=rng.choice([0.0, 1e8, 1e9, 2.5e9])))
        # else: never reported (usable)
    return links


@pytest.mark.parametrize("seed", range(200))
def test_with_a_hub_no_exchange_of_the_plan_crosses_a_down_link_and_the_plan_is_the_same_in_any_link_order(
    seed: int,
) -> None:
    rng = random.Random(seed)
    members = [Identity.from_seed(bytes([seed % 256, i]) * 16).peer_id for i in range(rng.randint(1, 8))]
    links = _random_graph(rng, members)
    plan = plan_on_links(members, rng.randint(0, 5000), links)
    shuffled = list(links)
    rng.shuffle(shuffled)
    assert plan == plan_on_links(members, plan.length, shuffled)  # a pure function of the snapshot
    assert link_bandwidths(members, links) == link_bandwidths(members, shuffled)
    down = {frozenset((link.a, link.b)) for link in links if not link.up}
    owners = link_owners(members, links)
    assert owners  # somebody always owns the buffer
    if fully_linked(members, links):
        # Exchanges run between every participant and every owner (never between two non-owners).
        needed = {frozenset((p, o)) for p in members for o in owners if p != o}
        assert not needed & down


def test_a_member_declaring_all_its_links_down_only_loses_its_own_shard() -> None:
    members = [PEERS[m] for m in "ABCD"]
    liar = PEERS["A"]
    links = [_entry(liar, other, up=False) for other in members if other != liar]
    assert link_owners(members, links) == frozenset(members) - {liar}


if __name__ == "__main__":
    print("```link-plan-vectors")
    for name, case in CASES.items():
        print(name, json.dumps({**case, **compute(case)}))
    print("```")
