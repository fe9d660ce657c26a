"""Flat gradient buffers, model digests and DiLoCo's outer step (pure torch, no network)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.errors import ConfigError  # noqa: E402
from chaosp2p.training.config import CollaborationConfig  # noqa: E402
from chaosp2p.training.flat import FlatParameters, layout_digest, parameter_digest  # noqa: E402
from chaosp2p.training.outer import OuterState  # noqa: E402


def _model(seed: int = 0, hidden: int = 8) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 3))


def test_gradients_round_trip_through_the_flat_buffer() -> None:
    model = _model()
    model(torch.randn(5, 4)).sum().backward()
    flat = FlatParameters(list(model.parameters()))
    assert flat.numel == sum(p.numel() for p in model.parameters())
    grads = [p.grad.clone() for p in model.parameters()]
    buffer = flat.gather_grads().copy()
    assert np.array_equal(buffer[: grads[0].numel()], grads[0].reshape(-1).numpy())
    for p in model.parameters():
        p.grad.zero_()
    flat.scatter_grads(buffer * 2)
    for p, g in zip(model.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g * 2)


def test_a_parameter_without_gradient_contributes_zeros() -> None:
    model = _model()
    flat = FlatParameters(list(model.parameters()))
    out = np.full(flat.numel, 7.0, dtype=np.float32)
    flat.gather_grads(out)
    assert not out.any()


def test_values_round_trip() -> None:
    model = _model(1)
    flat = FlatParameters(list(model.parameters()))
    values = flat.gather_values(np.empty(flat.numel, dtype=np.float32))
    other = _model(2)
    FlatParameters(list(other.parameters())).scatter_values(values)
    assert parameter_digest(other) == parameter_digest(model)


def test_digests_tell_architectures_and_values_apart() -> None:
    assert layout_digest(_model(0)) == layout_digest(_model(1))
    assert layout_digest(_model(0)) != layout_digest(_model(0, hidden=9))
    assert parameter_digest(_model(0)) == parameter_digest(_model(0))
    assert parameter_digest(_model(0)) != parameter_digest(_model(1))


def test_models_without_trainable_float_parameters_are_refused() -> None:
    frozen = _model()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable"):
        FlatParameters(list(frozen.parameters()))


def test_outer_step_with_lr_1_and_no_momentum_is_parameter_averaging() -> None:
    start = _model(0)
    outer = OuterState(start, lr=1.0, momentum=0.0)
    live = FlatParameters(list(start.parameters()))
    base = live.gather_values(np.empty(live.numel, dtype=np.float32))
    local_a, local_b = base + 1.0, base - 3.0
    # The averaged pseudo-gradient of two members: mean(global - local).
    averaged = ((base - local_a) + (base - local_b)) / 2
    outer.apply(averaged.astype(np.float32), live)
    after = live.gather_values(np.empty(live.numel, dtype=np.float32))
    assert np.allclose(after, (local_a + local_b) / 2, atol=1e-6)


def test_outer_pseudo_gradient_is_global_minus_live() -> None:
    model = _model(0)
    outer = OuterState(model, lr=0.7, momentum=0.9)
    live = FlatParameters(list(model.parameters()))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    out = np.empty(live.numel, dtype=np.float32)
    outer.pseudo_gradient(live, out)
    assert np.allclose(out, -0.5)


def test_collaboration_config_validates() -> None:
    with pytest.raises(ConfigError):
        CollaborationConfig(mode="async")
    with pytest.raises(ConfigError):
        CollaborationConfig(wire_dtype="int8")
    assert (
        CollaborationConfig.profile_named("wan").round_timeout_min_s > CollaborationConfig.local().round_timeout_min_s
    )


def test_the_staging_path_copies_the_same_values_as_the_plain_one() -> None:
    # The accelerator path (asynchronous copies, one synchronisation per direction) taken on CPU
    # tensors: what it gathers and scatters must be exactly what the plain path does.
    model = _model(3)
    model(torch.randn(5, 4)).sum().backward()
    plain = FlatParameters(list(model.parameters()))
    staged = FlatParameters(list(model.parameters()), force_staging=True)
    assert staged.staged and not plain.staged
    assert np.array_equal(staged.gather_grads(staged.host_array()), plain.gather_grads(plain.host_array()))
    values = staged.gather_values(staged.host_array())
    assert np.array_equal(values, plain.gather_values(plain.host_array()))
    doubled = (values * 2).astype(np.float32)
    staged.scatter_values(doubled)
    staged.scatter_grads(doubled)
    for p, v in zip(model.parameters(), plain.parameters, strict=True):
        assert torch.equal(p, v)
    assert np.array_equal(plain.gather_values(plain.host_array()), doubled)
    assert np.array_equal(plain.gather_grads(plain.host_array()), doubled)


def test_host_arrays_for_cpu_parameters_are_plain_memory() -> None:
    flat = FlatParameters(list(_model().parameters()))
    array = flat.host_array()
    assert array.dtype == np.float32 and array.shape == (flat.numel,)
    assert not torch.from_numpy(array).is_pinned()
