"""PyTorch adapter: bit-exact model + Adam round trip through a real pull, staging path, bad input."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from chaosp2p.errors import ConfigError, TransferError
from chaosp2p.protocols.transfer import SourceSession
from chaosp2p.state.manifest import FlatState, array_views
from chaosp2p.state.snapshot import SnapshotStore


def test_package_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import chaosp2p.state, chaosp2p.state.torch_adapter as t, chaosp2p.protocols.transfer\n"
        "from chaosp2p.errors import ConfigError\n"
        "try:\n    t.collect_state(None)\nexcept ConfigError as e:\n    print('needs torch:', e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "needs torch" in result.stdout


def test_metadata_codec_keeps_tuples_and_rejects_garbage() -> None:
    from chaosp2p.state.torch_adapter import decode_meta, encode_meta

    value = {"betas": (0.9, 0.999), "nested": [(1, (2, 3))], 3: None, "flag": True, "lr": 1e-3}
    assert decode_meta(encode_meta(value)) == value
    assert isinstance(decode_meta(encode_meta(value))["betas"], tuple)
    with pytest.raises(ConfigError):
        encode_meta({"x": object()})
    import msgpack

    for bad in (b"\xc1", msgpack.packb(msgpack.ExtType(7, b"x")), msgpack.packb(msgpack.ExtType(1, b"\xc1")), b"\x91"):
        with pytest.raises(TransferError):
            decode_meta(bad)


# ----------------------------------------------------------------------------------- with torch
torch_only = pytest.mark.torch


def torch_mod() -> Any:
    return pytest.importorskip("torch")


def make_model(seed: int) -> Any:
    torch = torch_mod()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 4),
    )
    model.register_buffer("halfbuf", torch.randn(5).to(torch.bfloat16))
    model.register_buffer("codes", torch.arange(6, dtype=torch.int32).reshape(2, 3))
    model.register_buffer("strided", torch.randn(3, 4).t())  # not contiguous
    return model


def train(model: Any, optimizer: Any, steps: int, seed: int) -> None:
    torch = torch_mod()
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator)
        y = torch.randn(32, 4, generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()


def assert_same(model_a: Any, opt_a: Any, model_b: Any, opt_b: Any) -> None:
    torch = torch_mod()
    sa, sb = model_a.state_dict(), model_b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key
    oa, ob = opt_a.state_dict(), opt_b.state_dict()
    assert oa["param_groups"] == ob["param_groups"]
    assert oa["state"].keys() == ob["state"].keys()
    for index in oa["state"]:
        for key, value in oa["state"][index].items():
            other = ob["state"][index][key]
            if isinstance(value, torch.Tensor):
                assert value.dtype == other.dtype and torch.equal(value, other), (index, key)
            else:
                assert value == other


def publish_trained(store: SnapshotStore, run: str = "run", **kwargs: Any) -> tuple[Any, Any]:
    from chaosp2p.state.torch_adapter import publish_torch

    torch = torch_mod()
    model = make_model(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.95), weight_decay=0.01)
    train(model, optimizer, 3, seed=7)
    publish_torch(store, run, 3, model, optimizer, **kwargs)
    return model, optimizer


def fresh() -> tuple[Any, Any]:
    torch = torch_mod()
    model = make_model(1)  # different initial weights
    return model, torch.optim.Adam(model.parameters(), lr=0.5)  # different hyperparameters


@torch_only
def test_model_and_adam_continue_bit_exact_after_a_multi_source_pull() -> None:
    torch_mod()
    from chaosp2p.state.torch_adapter import load_torch
    from tests.unit.test_transfer_pull import CONFIG, RUN, FakeNet, FakeSource, assert_bit_exact, make_machine, peer

    config = dataclasses.replace(CONFIG, chunk_bytes=1024)  # the model is only a few KiB
    sources = []
    originals = []
    for i in range(3):
        store = SnapshotStore(config)
        originals.append(publish_trained(store, RUN))
        sources.append(FakeSource(peer(i), store, SourceSession(store, config), rate=1e5))
    net = FakeNet(sources, make_machine(sources, config=config))
    net.run()
    flat = net.staging.commit(net.completed)  # type: ignore[union-attr,arg-type]
    assert net.completed is not None and len([b for _, b in net.completed.bytes_by_source if b]) == 3
    model_a, opt_a = originals[0]
    model_b, opt_b = fresh()
    load_torch(flat, model_b, opt_b)
    assert_same(model_a, opt_a, model_b, opt_b)
    assert opt_b.param_groups[0]["betas"] == (0.8, 0.95) and isinstance(opt_b.param_groups[0]["betas"], tuple)
    train(model_a, opt_a, 3, seed=11)
    train(model_b, opt_b, 3, seed=11)
    assert_same(model_a, opt_a, model_b, opt_b)
    # the loaded optimizer owns its state: it does not alias the staging buffer
    staged = np.asarray(flat.arrays["optimizer/state/0/exp_avg"])
    assert not np.shares_memory(staged, opt_b.state_dict()["state"][0]["exp_avg"].numpy())
    assert_bit_exact({k: v for k, v in flat.arrays.items() if k.startswith("model/0.")}, {
        "model/0.weight": originals[1][0].state_dict()["0.weight"].numpy(),
        "model/0.bias": originals[1][0].state_dict()["0.bias"].numpy(),
    })  # fmt: skip


def load_from_store(store: SnapshotStore, step: int = 3) -> FlatState:
    lease = store.lease("run", step)
    assert lease is not None
    arrays = array_views(lease.manifest, np.frombuffer(lease.data, dtype=np.uint8))
    return FlatState(arrays, {s.name: s.dtype for s in lease.manifest.buffers})


@torch_only
def test_forced_staging_path_publishes_and_loads_identically() -> None:
    from chaosp2p.state.torch_adapter import load_torch

    plain, staged = SnapshotStore(), SnapshotStore()
    model_a, opt_a = publish_trained(plain)
    publish_trained(staged, force_staging=True)
    assert plain.latest("run").digest == staged.latest("run").digest  # type: ignore[union-attr]
    model_b, opt_b = fresh()
    load_torch(load_from_store(staged), model_b, opt_b, force_staging=True)
    assert_same(model_a, opt_a, model_b, opt_b)


@torch_only
def test_flatten_and_publish_agree() -> None:
    from chaosp2p.state.torch_adapter import flatten_torch

    direct = SnapshotStore()
    model, optimizer = publish_trained(direct)
    for force in (False, True):
        via_flat = SnapshotStore()
        flat = flatten_torch(model, optimizer, force_staging=force)
        assert flat.dtype("model/halfbuf") == "bfloat16"
        via_flat.publish("run", 3, flat)
        assert via_flat.latest("run").digest == direct.latest("run").digest  # type: ignore[union-attr]


@torch_only
def test_snapshot_is_immune_to_further_training() -> None:
    from chaosp2p.state.torch_adapter import load_torch

    torch = torch_mod()
    store = SnapshotStore()
    model, optimizer = publish_trained(store)
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, optimizer, 2, seed=3)  # the source keeps training while serving
    loaded, _ = fresh()
    load_torch(load_from_store(store), loaded, None)
    for key, value in frozen.items():
        assert torch.equal(loaded.state_dict()[key], value), key


@torch_only
def test_mismatched_model_is_rejected_and_left_untouched() -> None:
    from chaosp2p.state.torch_adapter import load_torch

    torch = torch_mod()
    store = SnapshotStore()
    publish_trained(store)
    flat = load_from_store(store)
    other = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 5)
    )
    other.register_buffer("halfbuf", torch.zeros(5, dtype=torch.bfloat16))
    other.register_buffer("codes", torch.zeros(2, 3, dtype=torch.int32))
    other.register_buffer("strided", torch.zeros(4, 3))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(TransferError, match=r"3\.(weight|bias)"):
        load_torch(flat, other)
    for key, value in before.items():
        assert torch.equal(other.state_dict()[key], value), key
    smaller = torch.nn.Sequential(torch.nn.Linear(8, 16))
    with pytest.raises(TransferError, match="does not match"):
        load_torch(flat, smaller)
    load_torch(flat, smaller, strict=False)  # only the common tensors
    assert torch.equal(smaller.state_dict()["0.weight"], torch.from_numpy(flat.arrays["model/0.weight"]))
    with pytest.raises(TransferError, match="metadata"):
        load_torch(FlatState({k: v for k, v in flat.arrays.items() if "meta" not in k}, flat.dtypes), smaller)


@torch_only
def test_optimizer_mismatch_is_rejected() -> None:
    from chaosp2p.state.torch_adapter import load_torch

    torch = torch_mod()
    store = SnapshotStore()
    publish_trained(store)
    model, _ = fresh()
    two_groups = torch.optim.Adam([{"params": [model[0].weight]}, {"params": [model[0].bias]}])
    with pytest.raises(TransferError, match="groups"):
        load_torch(load_from_store(store), model, two_groups)
    no_optimizer = SnapshotStore()
    no_optimizer.publish("run", 3, {})  # a snapshot without torch metadata
    with pytest.raises(TransferError):
        load_torch(load_from_store(no_optimizer), model)


@torch_only
def test_model_only_snapshot_and_unsupported_dtypes() -> None:
    from chaosp2p.state.torch_adapter import load_torch, publish_torch

    torch = torch_mod()
    store = SnapshotStore()
    model = make_model(0)
    publish_torch(store, "run", 3, model)
    loaded = make_model(2)
    load_torch(load_from_store(store), loaded)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    with pytest.raises(TransferError, match="no optimizer"):
        load_torch(load_from_store(store), loaded, torch.optim.SGD(loaded.parameters(), lr=0.1))
    weird = torch.nn.Module()
    weird.register_buffer("q", torch.zeros(2, dtype=torch.float8_e4m3fnuz))
    with pytest.raises(ConfigError, match="cannot be put"):
        publish_torch(store, "run", 4, weird)
    assert store.latest("run").step == 3  # type: ignore[union-attr]
