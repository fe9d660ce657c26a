"""protocols/averaging.md section 1.4: the weight each member's contribution may carry comes from the
agreed configuration (issue 20, finding 4), checked against the spec's ``weight-vectors``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaosp2p.protocols.averaging import weight_allowances
from chaosp2p.protocols.negotiation.run_configuration import (
    Configuration,
    DepartedEntry,
    RunParams,
    make_configuration,
)
from tests.spec_blocks import named_lines
from tests.unit.test_averaging_vectors import NAMES, PEERS, SPEC


def weight_cases() -> dict[str, dict[str, Any]]:
    """The allowance vectors of the spec, parsed (members are named A, B, C)."""
    return {name: json.loads(rest) for name, rest in named_lines(SPEC, "weight-vectors").items()}


def configurations(case: dict[str, Any]) -> tuple[Configuration, Configuration | None]:
    """The configuration governing the round (epoch 3) and, if the case removes members later, the
    newest one known (epoch 4, the removed members in ``departed``)."""
    members = sorted(case["members"], key=lambda name: PEERS[name])
    params = RunParams(global_batch=case["global_batch"], mode=case["mode"], local_steps=case["local_steps"])
    config = make_configuration(
        run="run-a",
        epoch=3,
        activation_step=0,
        peers=[PEERS[m] for m in members],
        incarnations=[1] * len(members),
        throughputs=[case["members"][m]["throughput"] for m in members],
        since_steps=[case["members"][m]["since"] for m in members],
        links=(),
        params=params,
        seed=7,
    )
    removed = case["removed_later"]
    if not removed:
        return config, None
    staying = [m for m in members if m not in removed]
    newest = make_configuration(
        run="run-a",
        epoch=4,
        activation_step=case["step"] + 2,
        peers=[PEERS[m] for m in staying],
        incarnations=[1] * len(staying),
        throughputs=[case["members"][m]["throughput"] for m in staying],
        links=(),
        params=params,
        seed=8,
        departed=[
            DepartedEntry(peer_id=PEERS[m], incarnation=1, epoch=4, activation_step=case["step"] + 2)
            for m in sorted(removed, key=lambda name: PEERS[name])
        ],
    )
    return config, newest


@pytest.mark.parametrize("name", sorted(weight_cases()))
def test_weight_vector(name: str) -> None:
    """issue 20, finding 4: every member computes the same allowances from the configuration."""
    case = weight_cases()[name]
    config, newest = configurations(case)
    allowances = weight_allowances(config, case["step"], newest=newest)
    assert {NAMES[p]: w for p, w in allowances.items()} == case["allowances"]


def test_the_vectors_cover_both_modes_a_newcomer_and_a_removal() -> None:
    cases = weight_cases().values()
    assert {c["mode"] for c in cases} == {"sync", "diloco"}
    assert any(c["removed_later"] for c in cases)
    assert any(m["since"] > c["step"] for c in cases for m in c["members"].values())


def test_an_older_or_equal_configuration_changes_nothing() -> None:
    """Only a *later* configuration's removals count: the governing one passed as ``newest`` is a no-op."""
    case = weight_cases()["sync"]
    config, _ = configurations(case)
    assert weight_allowances(config, case["step"], newest=config) == weight_allowances(config, case["step"])
