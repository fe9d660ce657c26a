"""A collaboration's lifecycle against a fake port: founding, refusals, events, leaving.

No sockets and no peers: the port's gates hold configurations built here, the averager is a fake
that records every round (``tests/unit/fake_port.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.errors import (  # noqa: E402
    ConfigError,
    ContributionRefused,
    LocalProtocolError,
)
from chaosp2p.protocols.collab.messages import PROTOCOL_ID  # noqa: E402
from chaosp2p.protocols.negotiation import (  # noqa: E402
    ConfigurationCommitted,
    OperationCommitted,
    OpKind,
    RunParams,
)
from chaosp2p.training.collaboration import AsyncCollaboration  # noqa: E402
from chaosp2p.training.config import CollaborationConfig  # noqa: E402
from chaosp2p.training.flat import FlatParameters  # noqa: E402
from tests.events import committed_operation  # noqa: E402
from tests.unit.fake_port import RUN, FakePort, Rig, configuration, identities, rig  # noqa: E402

pytestmark = pytest.mark.anyio


def _model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def _rig(**config: Any) -> Rig:
    model, optimizer = _model()
    return rig(model, optimizer, **config)


async def _founded(**config: Any) -> Rig:
    r = _rig(**config)
    await r.collab.start(found=True)
    return r


def _assert_freed(r: Rig) -> None:
    """The service no longer routes to the collaboration, and the averager forgot its run."""
    assert r.service.collaborations() == []
    assert r.averager.forgotten == [RUN]


def _values(model: Any) -> np.ndarray:
    flat = FlatParameters(list(model.parameters()))
    return flat.gather_values(np.empty(flat.numel, dtype=np.float32))


def _fill(value: float) -> Any:
    def fill(buffer: np.ndarray, _call: Any) -> None:
        buffer.fill(value)

    return fill


# ---------------------------------------------------------------------------------- founding
async def test_founding_creates_the_run_with_the_configs_global_batch_and_mode() -> None:
    r = _rig(global_batch=8, mode="sync", local_steps=5)
    assert await r.collab.start(found=True) == 0
    assert r.gates.created == [(RUN, RunParams(global_batch=8, mode="sync", local_steps=5))]
    assert r.collab.step_index == 0
    assert r.collab.configuration.peers == (r.port.peer_id,)
    assert r.service.collaborations() == [r.collab]
    assert len(r.port.subscriptions) == 1  # take_events reads this subscription


async def test_founding_a_diloco_run_carries_its_mode_and_local_steps() -> None:
    r = _rig(global_batch=6, mode="diloco", local_steps=3)
    await r.collab.start(found=True)
    assert r.gates.created == [(RUN, RunParams(global_batch=6, mode="diloco", local_steps=3))]


async def test_founding_without_a_global_batch_is_refused() -> None:
    r = _rig(global_batch=0)
    with pytest.raises(ConfigError, match="global_batch"):
        await r.collab.start(found=True)
    assert r.gates.created == []
    assert r.gates.configuration(RUN) is None


async def test_starting_twice_is_refused() -> None:
    r = await _founded()
    with pytest.raises(LocalProtocolError, match="already started"):
        await r.collab.start(found=True)
    assert len(r.gates.created) == 1


async def test_stepping_before_start_is_refused_and_runs_no_round() -> None:
    r = _rig()
    with pytest.raises(LocalProtocolError, match="start"):
        await r.collab.step(4)
    assert r.averager.calls == []


async def test_negative_samples_are_refused_and_run_no_round() -> None:
    r = await _founded()
    with pytest.raises(ConfigError, match="samples"):
        await r.collab.step(-1)
    assert r.averager.calls == []
    assert r.collab.step_index == 0


@pytest.mark.parametrize("run", ["", "r" * 257])
def test_a_run_id_outside_1_to_256_characters_is_refused(run: str) -> None:
    model, optimizer = _model()
    with pytest.raises(ConfigError, match="run id"):
        rig(model, optimizer, run=run)


async def test_a_peer_trains_one_collaboration_per_run() -> None:
    first = _rig()
    await first.collab.start(found=True)
    model, optimizer = _model()
    second = AsyncCollaboration(
        first.port,
        first.service,
        run=RUN,
        model=model,
        optimizer=optimizer,
        config=CollaborationConfig.local(global_batch=4),
    )
    with pytest.raises(LocalProtocolError, match="already trains"):
        await second.start(found=True)
    assert first.service.collaborations() == [first.collab]


async def test_a_start_that_fails_leaves_nothing_registered_and_may_be_repeated() -> None:
    refused = _rig(global_batch=0)
    with pytest.raises(ConfigError, match="global_batch"):
        await refused.collab.start(found=True)
    assert refused.service.collaborations() == []
    # A join that cannot succeed (no peer knows the run on the fake) gives up and unregisters too.
    joiner = _rig()
    with pytest.raises(TimeoutError):
        await joiner.collab.start(found=False, timeout_s=0.3)
    assert joiner.service.collaborations() == []
    # The same object may start again (here: found the run instead), and a corrected one may register.
    assert await joiner.collab.start(found=True) == 0
    assert joiner.service.collaborations() == [joiner.collab]


def test_the_service_serves_the_collab_protocol_with_no_idle_timeout() -> None:
    r = _rig()
    assert [(protocol, timeout) for protocol, _, timeout in r.port.handlers] == [(str(PROTOCOL_ID), None)]


# ---------------------------------------------------------------------------------- events
def _committed(run: str, kind: OpKind, subject: Any, origin: Any) -> OperationCommitted:
    return committed_operation(run=run, kind=kind, subject=subject, origin=origin)


async def test_take_events_turns_this_runs_committed_operations_into_records_once() -> None:
    r = await _founded()
    subject, origin = identities(2, base=40)
    ours = _committed(RUN, OpKind.JOIN, subject.peer_id, origin.peer_id)
    theirs = _committed("another-run", OpKind.FAIL, subject.peer_id, origin.peer_id)
    other_kind = ConfigurationCommitted(run=RUN, configuration=r.collab.configuration, committed_at=11.0)
    r.port.publish(theirs, ours, other_kind)
    assert r.collab.take_events() == [
        {
            "event": "operation",
            "kind": "join",
            "subject": str(subject.peer_id),
            "other": None,  # a link op names its other endpoint here
            "origin": str(origin.peer_id),
            "epoch": 4,
            "detected_at": 10.0,
            "proposed_at": 10.5,
            "committed_at": 10.625,
            "activation_step": 7,
            "decision_ms": 125.0,
        }
    ]
    assert r.collab.take_events() == []  # drained
    r.port.publish(_committed(RUN, OpKind.LEAVE, subject.peer_id, origin.peer_id))
    assert [record["kind"] for record in r.collab.take_events()] == ["leave"]


def test_take_events_before_start_is_empty() -> None:
    r = _rig()
    r.port.publish(_committed(RUN, OpKind.JOIN, r.port.peer_id, r.port.peer_id))
    assert r.collab.take_events() == []


# ---------------------------------------------------------------------------------- leaving
async def test_leave_serves_zero_weight_rounds_until_removed_then_frees_the_run() -> None:
    r = await _founded()
    FlatParameters(list(r.collab.model.parameters())).scatter_grads(np.ones(8, dtype=np.float32))
    await r.collab.step(4)  # a real step: contributes its gradient
    assert r.averager.calls[0].weight == 4.0
    assert r.averager.calls[0].contribution.all()
    before = _values(r.collab.model)
    (other,) = identities(1)
    pair = r.gates.install(configuration([r.port.peer_id, other.peer_id], epoch=1, activation_step=1))
    r.gates.leave_takes_effect_at = 3  # the run commits the leave at step 3: steps 1 and 2 still count us
    r.averager.then(_fill(5.0), _fill(5.0))  # the other's average: never applied by a leaver
    await r.collab.leave()
    assert r.gates.announced == [RUN]
    leaving = r.averager.calls[1:]
    assert [call.tag.step for call in leaving] == [1, 2]
    assert all(call.weight == 0.0 for call in leaving)
    assert all(not call.contribution.any() for call in leaving)  # contributes nothing...
    assert all(call.members == [m.peer_id for m in pair.members] for call in leaving)  # ...but does its part
    assert ("completed", 2) in r.gates.reported
    np.testing.assert_array_equal(_values(r.collab.model), before)  # and applies nothing
    assert r.collab.step_index == 3
    _assert_freed(r)


async def test_a_leaver_serves_nothing_once_every_other_members_removal_is_agreed() -> None:
    # The other member leaves too (the newest configuration holds this peer alone): it serves with
    # weight 0 as well, so a round would average nothing. A lone founder leaving is the same case.
    r = await _founded()
    await r.collab.step(4)
    (other,) = identities(1)
    r.gates.install(configuration([r.port.peer_id, other.peer_id], epoch=1, activation_step=1))
    r.gates.install(configuration([r.port.peer_id], epoch=2, activation_step=4))  # the other's LEAVE
    r.gates.leave_takes_effect_at = 3
    await r.collab.leave()
    served = [call.tag.step for call in r.averager.calls[1:]]
    assert served in ([], [1])  # at most the round under way when the watch first looked
    _assert_freed(r)


async def test_after_leave_steps_are_refused_and_leaving_again_does_nothing() -> None:
    r = await _founded()
    r.gates.leave_takes_effect_at = 0
    await r.collab.leave()
    with pytest.raises(LocalProtocolError):
        await r.collab.step(4)
    await r.collab.leave()
    assert r.gates.announced == [RUN]
    assert r.averager.calls == []
    assert r.averager.forgotten == [RUN]


async def test_leaving_a_run_that_no_longer_counts_us_runs_no_round_but_still_unregisters() -> None:
    r = await _founded()
    r.gates.leave_accepted = False
    await r.collab.leave()
    assert r.gates.announced == [RUN]
    assert r.averager.calls == []
    _assert_freed(r)


async def test_leaving_before_start_does_nothing() -> None:
    r = _rig()
    await r.collab.leave()
    assert r.gates.announced == []
    assert r.averager.forgotten == []


async def test_a_failing_round_ends_the_leave_early_and_the_run_is_still_freed() -> None:
    r = await _founded()
    r.gates.leave_takes_effect_at = 10
    r.averager.then(ContributionRefused("refused"))
    await r.collab.leave()
    assert len(r.averager.calls) == 1
    assert r.collab.step_index == 0
    _assert_freed(r)


async def test_leave_unregisters_even_when_the_averager_still_holds_a_round_of_the_run() -> None:
    r = await _founded()
    r.gates.leave_accepted = False
    r.averager.busy_runs.add(RUN)  # forget_run refuses: logged, not raised
    await r.collab.leave()
    assert r.service.collaborations() == []
    assert r.averager.forgotten == []


async def test_the_service_unregisters_only_the_collaboration_it_routes_to() -> None:
    r = await _founded()
    model, optimizer = _model()
    stranger = AsyncCollaboration(
        FakePort(), r.service, run=RUN, model=model, optimizer=optimizer, config=CollaborationConfig.local()
    )
    r.service.unregister(stranger)  # type: ignore[arg-type]
    assert r.service.collaborations() == [r.collab]
    assert r.averager.forgotten == []


async def test_a_new_collaboration_forgets_a_removal_from_an_earlier_membership_of_the_run() -> None:
    """A peer that left a run and starts a new collaboration for it (the hivemind drop-in's
    ``load_state_dict`` does) must not be held to the old removal: it would rejoin forever."""
    r = _rig()
    r.gates.remove(RUN, "left", 3)
    assert await r.collab.start(found=True) == 0
    assert r.gates.forgotten_removals == [RUN]
    await r.collab.step(4)  # the removal from step 3 would raise RunRemoved here, then rejoin
    assert r.collab.step_index == 1
