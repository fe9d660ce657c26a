"""The CUDA paths of state snapshots and flat gradients, on a real device.

Skipped on machines without a CUDA device (CI has none): ``benchmarks/cuda_check.py`` runs them on
a GPU machine. On CPU the same code paths are exercised through ``force_staging`` (see
``test_torch_adapter.py`` and ``test_training_flat.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from chaosp2p.state import SnapshotStore  # noqa: E402
from chaosp2p.state.torch_adapter import flatten_torch, load_torch, pinned_allocator, publish_torch  # noqa: E402
from chaosp2p.training.flat import FlatParameters, parameter_digest  # noqa: E402
from tests.unit.test_torch_adapter import assert_same, fresh, load_from_store, make_model  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/cuda_check.py)"),
]


def _on_gpu(model: Any, lr: float = 1e-3) -> tuple[Any, Any]:
    model = model.cuda()
    return model, torch.optim.Adam(model.parameters(), lr=lr, betas=(0.8, 0.95), weight_decay=0.01)


def _train_on_gpu(model: Any, optimizer: Any, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator).cuda()
        y = torch.randn(32, 4, generator=generator).cuda()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def test_staging_memory_is_page_locked() -> None:
    assert torch.from_numpy(pinned_allocator(1 << 20)).is_pinned()


def test_a_gpu_model_publishes_the_same_snapshot_as_its_cpu_copy() -> None:
    model, optimizer = _on_gpu(make_model(0))
    _train_on_gpu(model, optimizer, 3, seed=7)
    from_gpu, from_cpu = SnapshotStore(), SnapshotStore()
    publish_torch(from_gpu, "run", 3, model, optimizer)
    cpu_model = make_model(0)
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    cpu_optimizer = torch.optim.Adam(cpu_model.parameters(), lr=1e-3, betas=(0.8, 0.95), weight_decay=0.01)
    cpu_optimizer.load_state_dict(_to_cpu(optimizer.state_dict()))
    publish_torch(from_cpu, "run", 3, cpu_model, cpu_optimizer)
    assert from_gpu.latest("run").digest == from_cpu.latest("run").digest  # type: ignore[union-attr]
    staged, published = flatten_torch(model, optimizer).arrays, load_from_store(from_cpu).arrays
    assert staged.keys() == published.keys()
    assert all(np.array_equal(staged[name], published[name]) for name in staged)


def test_a_snapshot_loads_into_gpu_tensors_and_training_continues_bit_exact() -> None:
    model_a, opt_a = _on_gpu(make_model(0))
    _train_on_gpu(model_a, opt_a, 3, seed=7)
    store = SnapshotStore()
    publish_torch(store, "run", 3, model_a, opt_a)
    cpu_model, _ = fresh()
    model_b, opt_b = cpu_model.cuda(), torch.optim.Adam(cpu_model.parameters(), lr=0.5)
    load_torch(load_from_store(store), model_b, opt_b)
    assert all(t.is_cuda for t in model_b.state_dict().values())
    assert all(v.is_cuda for s in opt_b.state.values() for k, v in s.items() if k != "step")
    assert_same(model_a, opt_a, model_b, opt_b)
    _train_on_gpu(model_a, opt_a, 3, seed=11)
    _train_on_gpu(model_b, opt_b, 3, seed=11)
    assert_same(model_a, opt_a, model_b, opt_b)


def test_flat_gradients_round_trip_through_pinned_memory() -> None:
    model = make_model(0).cuda()
    model(torch.randn(32, 8).cuda()).sum().backward()
    flat = FlatParameters(list(model.parameters()))
    assert flat.staged and torch.from_numpy(flat.buffer).is_pinned()
    gathered = flat.gather_grads(flat.host_array())
    expected = np.concatenate([p.grad.cpu().reshape(-1).numpy() for p in model.parameters() if p.requires_grad])
    assert np.array_equal(gathered, expected)
    source = flat.host_array()
    source[:] = np.arange(flat.numel, dtype=np.float32)
    flat.scatter_grads(source)
    source[:] = -1.0  # reused at once: the copies must have finished
    flat_grads = np.concatenate([p.grad.cpu().reshape(-1).numpy() for p in model.parameters() if p.requires_grad])
    assert np.array_equal(flat_grads, np.arange(flat.numel, dtype=np.float32))
    values = flat.gather_values(flat.host_array())
    digest = parameter_digest(model)
    flat.scatter_values(values)
    assert parameter_digest(model) == digest


def _to_cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_cpu(v) for v in state]
    return state
