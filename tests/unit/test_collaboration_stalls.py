"""A member whose round waited its bounded wait without a byte from a member signs a STALL of it.

Issue 19, deliverable 4 (see chaosp2p/training/stalls.py): first-hand evidence only -- members the
averager saw send nothing at all, in a round that waited at least half its timeout -- and never a
member admitted for this very step (it may still be loading the state) nor this peer itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.errors import LocalProtocolError, RoundAborted, RoundMismatch  # noqa: E402
from chaosp2p.protocols.negotiation.run_configuration import LinkEntry  # noqa: E402
from tests.unit.fake_port import RUN, AverageCall, Rig, configuration, identities, rig  # noqa: E402

pytestmark = pytest.mark.anyio


def _fill(value: float) -> Any:
    def fill(buffer: np.ndarray, _call: AverageCall) -> None:
        buffer.fill(value)

    return fill


async def _three_members_at_step_2(r: Rig) -> tuple[Any, Any]:
    """Two solo steps, then a configuration of this peer, an old member and one admitted at step 2."""
    await r.collab.start(found=True)
    r.averager.then(_fill(1.0), _fill(1.0))
    for _ in range(2):
        await r.collab.step(4)
    old, newcomer = (i.peer_id for i in identities(2, base=230))
    peers = [r.port.peer_id, old, newcomer]
    r.gates.install(configuration(peers, epoch=1, activation_step=2, since_steps=[0, 0, 2]))
    return old, newcomer


def _silent_then_abort(r: Rig, silent: set[Any], waited_fraction: float, error: type[Exception] = RoundAborted) -> Any:
    def abort(_buffer: np.ndarray, call: AverageCall) -> None:
        r.averager.silent[call.tag] = (frozenset(silent), waited_fraction * call.timeout_s)
        raise error("timed out")

    return abort


async def test_members_that_sent_nothing_for_the_rounds_wait_are_signed_against() -> None:
    r = rig(*_model(), max_round_attempts=5)
    old, newcomer = await _three_members_at_step_2(r)
    r.averager.then(_silent_then_abort(r, {old, newcomer, r.port.peer_id}, 1.0), _fill(2.0))
    stats = await r.collab.step(4)
    assert stats.step == 2 and stats.attempts == 2
    # The old member; not the newcomer admitted for this step, not this peer.
    assert r.gates.stalls == [(RUN, old)]


async def test_a_newcomer_that_never_steps_is_signed_against_from_the_second_round_on() -> None:
    r = rig(*_model(), max_round_attempts=5)
    old, newcomer = await _three_members_at_step_2(r)
    silent = {old, newcomer}
    r.averager.then(_silent_then_abort(r, silent, 1.0), _silent_then_abort(r, silent, 1.0), _fill(2.0))
    await r.collab.step(4)
    first, *second = r.gates.stalls  # the fake signs every time it is asked
    assert first == (RUN, old)
    assert sorted(second, key=lambda e: e[1].raw) == sorted([(RUN, old), (RUN, newcomer)], key=lambda e: e[1].raw)


async def test_a_member_stopped_mid_send_is_signed_against_in_the_same_attempt() -> None:
    # Part of its contribution arrived, so it is not silent; it does not answer a ping (the
    # averager's ``stopped_in``): signed against now, not one more round timeout later.
    r = rig(*_model(), max_round_attempts=5)
    old, _ = await _three_members_at_step_2(r)

    def abort(_buffer: np.ndarray, call: AverageCall) -> None:
        r.averager.silent[call.tag] = (frozenset(), call.timeout_s)
        r.averager.stopped[call.tag] = frozenset({old})
        raise RoundAborted("timed out")

    r.averager.then(abort, _fill(2.0))
    stats = await r.collab.step(4)
    assert stats.attempts == 2 and r.gates.stalls == [(RUN, old)]


@pytest.mark.parametrize(("fraction", "error"), [(0.2, RoundAborted), (1.0, RoundMismatch)])
async def test_no_stall_without_a_long_enough_wait_or_for_a_mismatch(fraction: float, error: type[Exception]) -> None:
    r = rig(*_model(), max_round_attempts=5)
    old, _ = await _three_members_at_step_2(r)
    r.averager.then(_silent_then_abort(r, {old}, fraction, error), _fill(2.0))
    await r.collab.step(4)
    assert r.gates.stalls == []


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


async def test_a_member_removed_while_it_did_not_step_gets_a_provisional_slice_until_it_rejoins() -> None:
    # A script asks for its batch slice before step(); a stalled member was removed meanwhile and
    # only step() rejoins it. It used to get LocalProtocolError ("not a member") there.
    r = rig(*_model(), max_round_attempts=5)
    old, newcomer = await _three_members_at_step_2(r)
    r.gates.install(configuration([old, newcomer], epoch=2, activation_step=2, since_steps=[0, 2]))
    r.gates.remove(RUN, "stalled", 2)
    assert r.collab.batch_slice() == (0, 12 // 3)
    r.gates.removed.clear()
    with pytest.raises(LocalProtocolError, match="not a member"):
        r.collab.batch_slice()  # not removed, just not a member: still an error


async def test_a_member_reached_through_a_relay_is_not_signed_against_on_its_silence() -> None:
    # The agreed link between this member and ``old`` is down, so their exchanges go through a relay
    # (the third member). A relay that breaks (or closes the circuit at its caps) silences ``old``
    # here though it is alive: this member is no witness. The directly linked ``newcomer``'s silence
    # still counts (a plain stall, nothing relayed). It was signed against: stalls.py only excluded
    # the peers a round could not reach, and a relayed pair is never named unreachable.
    r = rig(*_model(), max_round_attempts=5)
    old, newcomer = await _three_members_at_step_2(r)
    me = r.port.peer_id
    a, b = sorted([me, old], key=lambda p: p.raw)
    links = [LinkEntry(a=a, b=b, up=False)]
    r.gates.install(configuration([me, old, newcomer], epoch=2, activation_step=2, since_steps=[0, 0, 0], links=links))
    r.averager.then(_silent_then_abort(r, {old, newcomer}, 1.0), _fill(2.0))
    await r.collab.step(4)
    assert r.gates.stalls == [(RUN, newcomer)]
