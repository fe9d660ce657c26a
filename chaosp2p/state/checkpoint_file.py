"""Checkpoint files for ``chaosp2p state serve`` / ``state pull``: numpy ``.npz`` and PyTorch ``.pt``.

A checkpoint becomes a :class:`FlatState` of named arrays plus one small structure record, and is
written back from one, so a file seeded on one peer arrives byte-identical in its tensors on
another:

* ``.npz``: every array by name. Dtypes numpy cannot represent (bfloat16, float8) travel as their
  storage integers and are named in a ``__chaosp2p_dtypes__`` record.
* ``.pt`` / ``.pth``: loaded with ``torch.load(weights_only=True)`` (never unpickling code). Nested
  dicts and lists are walked; every tensor becomes an array named by its path, and everything else
  (ints, floats, strings, the shape of the nesting) is kept in a msgpack structure record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from chaosp2p.atomic_file import write_atomically
from chaosp2p.errors import ConfigError
from chaosp2p.state.manifest import FlatState, dtype_name_of, storage_dtype
from chaosp2p.wire.framing import pack, unpack

DTYPES_RECORD = "__chaosp2p_dtypes__"
STRUCTURE_RECORD = "__chaosp2p_structure__"
_TENSOR = "__tensor__"
MAX_STRUCTURE_BYTES = 64 << 20


def read_checkpoint(path: str | os.PathLike[str]) -> FlatState:
    """Load a ``.npz`` or ``.pt`` checkpoint as named arrays."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"checkpoint {file} does not exist")
    suffix = file.suffix.lower()
    if suffix == ".npz":
        return _read_npz(file)
    if suffix in (".pt", ".pth"):
        return _read_torch(file)
    raise ConfigError(f"unsupported checkpoint format {suffix!r} (use .npz, .pt or .pth)")


def write_checkpoint(path: str | os.PathLike[str], state: FlatState) -> None:
    """Write ``state`` as ``.npz`` or ``.pt`` (chosen by the file name), atomically.

    The bytes go to ``path + ".partial"`` first, which is refused (:class:`ConfigError`) if a
    symbolic link sits there, then are renamed over ``path``.
    """
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".npz", ".pt", ".pth"):
        raise ConfigError(f"unsupported checkpoint format {suffix!r} (use .npz, .pt or .pth)")
    # Through FILE.partial, created without following a link planted there (see atomic_file).
    write_atomically(file, lambda handle: (_write_npz if suffix == ".npz" else _write_torch)(handle, state))


# ---------------------------------------------------------------------------------------- numpy
def _read_npz(file: Path) -> FlatState:
    try:
        with np.load(file, allow_pickle=False) as archive:
            arrays = {name: np.asarray(archive[name], order="C") for name in archive.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}") from None
    dtypes: dict[str, str] = {}
    if DTYPES_RECORD in arrays:
        try:
            dtypes = json.loads(arrays.pop(DTYPES_RECORD).tobytes())
        except ValueError:
            raise ConfigError(f"{file}: unreadable {DTYPES_RECORD} record") from None
    return FlatState(arrays, {name: dtypes.get(name) or dtype_name_of(a) for name, a in arrays.items()})


def _write_npz(handle: Any, state: FlatState) -> None:
    arrays: dict[str, Any] = dict(state.arrays)
    special = {name: state.dtype(name) for name in arrays if state.dtype(name) != arrays[name].dtype.name}
    if special:
        arrays[DTYPES_RECORD] = np.frombuffer(json.dumps(special).encode(), dtype=np.uint8)
    np.savez(handle, **arrays)


# ---------------------------------------------------------------------------------------- torch
def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(".pt checkpoints need torch (pip install torch), or use .npz") from None
    return torch


def _read_torch(file: Path) -> FlatState:
    torch = _torch()
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad or unsafe file
        raise ConfigError(f"cannot read {file} as a weights-only PyTorch checkpoint: {exc}") from None
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            name = path or "tensor"
            tensor = value.detach().contiguous()
            dtype = str(tensor.dtype).removeprefix("torch.")
            flat = tensor.reshape(-1).view(torch.uint8) if tensor.numel() else tensor.reshape(-1).to(torch.uint8)
            arrays[name] = flat.numpy().view(storage_dtype(dtype)).reshape(tuple(tensor.shape))
            dtypes[name] = dtype
            return {_TENSOR: name}
        if isinstance(value, dict):
            if not all(isinstance(k, (str, int)) for k in value):
                raise ConfigError(f"{file}: only str/int dictionary keys are supported")
            return {"__dict__": [[k, walk(v, f"{path}/{k}" if path else str(k))] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            return {
                "__list__": [walk(v, f"{path}/{i}") for i, v in enumerate(value)],
                "tuple": isinstance(value, tuple),
            }
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        raise ConfigError(f"{file}: cannot carry a {type(value).__name__} at {path or 'the top level'}")

    structure = pack(walk(obj, ""))
    arrays[STRUCTURE_RECORD] = np.frombuffer(structure, dtype=np.uint8)
    dtypes[STRUCTURE_RECORD] = "uint8"
    return FlatState(arrays, dtypes)


def _write_torch(handle: Any, state: FlatState) -> None:
    torch = _torch()
    if STRUCTURE_RECORD not in state.arrays:
        # A state that did not come from a .pt file: save a flat name -> tensor dict.
        tensors = {name: _tensor(torch, state, name) for name in state.arrays}
        torch.save(tensors, handle)
        return
    structure = unpack(np.asarray(state.arrays[STRUCTURE_RECORD]).tobytes(), max_bytes=MAX_STRUCTURE_BYTES)

    def build(node: Any) -> Any:
        if isinstance(node, dict) and _TENSOR in node:
            return _tensor(torch, state, node[_TENSOR])
        if isinstance(node, dict) and "__dict__" in node:
            return {key: build(value) for key, value in node["__dict__"]}
        if isinstance(node, dict) and "__list__" in node:
            items = [build(v) for v in node["__list__"]]
            return tuple(items) if node.get("tuple") else items
        return node

    torch.save(build(structure), handle)


def _tensor(torch: Any, state: FlatState, name: str) -> Any:
    if name not in state.arrays:
        raise ConfigError(f"the structure record names a tensor {name!r} the state does not have")
    array = np.asarray(state.arrays[name], order="C")
    dtype = getattr(torch, state.dtype(name))
    raw = torch.from_numpy(array.reshape(-1).view(np.uint8).copy())
    return raw.view(dtype).reshape(tuple(array.shape))
