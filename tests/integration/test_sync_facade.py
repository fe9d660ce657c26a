"""The blocking facade from a plain (non-async) training script: two peers, torch model + Adam."""

from __future__ import annotations

import numpy as np
import pytest

import chaosp2p
from chaosp2p.errors import LocalProtocolError

torch = pytest.importorskip("torch")
LOCAL = chaosp2p.PeerConfig.local()  # the default (lan) listens on every interface; tests stay on loopback


def make_model(seed: int) -> tuple[object, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model: object, optimizer: object, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=generator)
        y = torch.randint(0, 4, (16,), generator=generator)
        optimizer.zero_grad()  # type: ignore[attr-defined]
        loss = torch.nn.functional.cross_entropy(model(x), y)  # type: ignore[operator]
        loss.backward()
        optimizer.step()  # type: ignore[attr-defined]


def test_newcomer_loads_model_and_adam_and_continues_identically() -> None:
    with chaosp2p.Peer(run="sync-demo", config=LOCAL) as veteran:
        model, optimizer = make_model(seed=1)
        train(model, optimizer, steps=3, seed=10)
        veteran.publish_state(model, optimizer, step=3)
        with chaosp2p.Peer(initial_peers=veteran.addrs, run="sync-demo", config=LOCAL) as newcomer:
            fresh_model, fresh_optimizer = make_model(seed=2)  # different weights until loaded
            step = newcomer.load_state_from_peers(fresh_model, fresh_optimizer, timeout=60)
            assert step == 3
            for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values(), strict=True):
                assert torch.equal(a, b)
            train(model, optimizer, steps=3, seed=20)
            train(fresh_model, fresh_optimizer, steps=3, seed=20)
            for a, b in zip(model.parameters(), fresh_model.parameters(), strict=True):
                assert torch.equal(a, b)
            assert {m.peer_id for m in newcomer.members()} >= {veteran.async_peer.peer_id}


def test_numpy_state_without_torch_and_errors_after_shutdown() -> None:
    arrays = {"w": np.arange(1000, dtype=np.float32), "b": np.ones(3)}
    with chaosp2p.Peer(run="arrays", config=LOCAL) as source:
        source.publish_arrays(arrays, step=7)
        with chaosp2p.Peer(initial_peers=source.addrs, run="arrays", config=LOCAL) as newcomer:
            loaded = newcomer.load_arrays_from_peers(timeout=60)
            assert loaded.step == 7
            assert all(np.array_equal(loaded.arrays[k], v) for k, v in arrays.items())
    with pytest.raises(LocalProtocolError, match="not running"):
        source.members()
