"""PyTorch adapter: a model's ``state_dict()`` plus optimizer state as snapshot buffers, and back.

torch is imported lazily, inside these functions, so ``chaosp2p.state`` works without it.

Flattening. Every tensor becomes one named buffer -- ``model/<state_dict key>`` and
``optimizer/state/<param index>/<key>`` (Adam's ``exp_avg``, ``exp_avg_sq``, ``step``, ...) -- with
its exact dtype and shape; ``bfloat16`` and ``float8`` travel as raw bytes with their dtype named in
the manifest. Everything that is not a tensor (``param_groups`` hyperparameters, non-tensor
per-parameter state, modules' extra state) goes into one small metadata record, msgpack with tuples
preserved, stored as the uint8 buffer :data:`META_NAME` so that it is chunk-hashed like the rest.

Loading checks every name, shape and dtype against the live model before the first byte is
copied, then copies into the live tensors in place; optimizer tensors are copied out of the staging
buffer (never aliased to it) and handed to ``optimizer.load_state_dict``. The result is bit-exact:
a model and optimizer loaded from a snapshot continue training identically to the originals.

CUDA. Device tensors are staged through pinned host memory with non-blocking copies and one
synchronisation at the end: on publish, device -> pinned snapshot buffer (a block of an earlier
snapshot that nothing observes any more, when there is one: pinning is costly); on load, pinned
staging -> device. ``force_staging=True`` takes the same code path for CPU tensors (tests use it on
machines without a GPU; pinning is then skipped because it needs an accelerator).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from chaosp2p.errors import ConfigError, TransferError
from chaosp2p.protocols.transfer.messages import DTYPE_ITEMSIZE
from chaosp2p.state.manifest import FlatState, storage_dtype
from chaosp2p.state.snapshot import SnapshotInfo, SnapshotStore

if TYPE_CHECKING:
    from torch import Tensor
    from torch import dtype as TorchDType

META_NAME = "__chaosp2p_meta__"
"""The buffer holding the non-tensor metadata record."""
MODEL_PREFIX = "model/"
OPTIMIZER_PREFIX = "optimizer/state/"
META_FORMAT = 1
_TUPLE_EXT = 1
MAX_META_BYTES = 64 << 20


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("the PyTorch adapter needs torch (pip install torch)") from None
    return torch


def _dtype_names(torch: Any) -> dict[Any, str]:
    return {getattr(torch, name): name for name in DTYPE_ITEMSIZE if hasattr(torch, name)}


def torch_dtype(name: str) -> TorchDType:
    """The torch dtype of a manifest dtype name."""
    torch = _torch()
    if name not in DTYPE_ITEMSIZE or not hasattr(torch, name):
        raise TransferError(f"dtype {name!r} has no torch equivalent")
    dtype: TorchDType = getattr(torch, name)
    return dtype


# ------------------------------------------------------------------------------ metadata codec
def _pack_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return msgpack.ExtType(_TUPLE_EXT, encode_meta(list(value)))
    raise ConfigError(f"cannot put a {type(value).__name__} into snapshot metadata (use plain values)")


def encode_meta(value: Any) -> bytes:
    """msgpack with tuples kept as tuples (an ext type), so hyperparameters round-trip exactly."""
    try:
        body: bytes = msgpack.packb(value, use_bin_type=True, strict_types=True, default=_pack_default)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"snapshot metadata is not serialisable: {exc}") from None
    return body


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _TUPLE_EXT:
        raise TransferError(f"unknown metadata ext type {code}")
    return tuple(decode_meta(data))


def decode_meta(data: bytes) -> Any:
    """Inverse of :func:`encode_meta`; anything malformed is a :class:`TransferError`."""
    if len(data) > MAX_META_BYTES:
        raise TransferError(f"metadata of {len(data)} bytes exceeds {MAX_META_BYTES}")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            use_list=True,
            ext_hook=_ext_hook,
            max_bin_len=len(data),
            max_str_len=len(data),
            max_array_len=len(data),
            max_map_len=len(data),
            max_ext_len=len(data),
        )
    except TransferError:
        raise
    except (ValueError, TypeError, RecursionError, msgpack.UnpackException) as exc:
        raise TransferError(f"malformed snapshot metadata: {type(exc).__name__}: {exc}") from None


# ---------------------------------------------------------------------------------- collecting
def collect_state(model: Any, optimizer: Any = None) -> tuple[dict[str, Tensor], bytes]:
    """Named tensors of ``model`` and ``optimizer`` plus the encoded metadata record."""
    torch = _torch()
    tensors: dict[str, Tensor] = {}
    meta: dict[str, Any] = {"format": META_FORMAT, "model_extra": {}, "optimizer": None}
    if model is not None:
        for key, value in model.state_dict().items():
            if isinstance(value, torch.Tensor):
                tensors[MODEL_PREFIX + key] = value
            else:
                meta["model_extra"][key] = value
    if optimizer is not None:
        state_dict = optimizer.state_dict()
        order: list[list[Any]] = []
        scalars: dict[int, dict[str, Any]] = {}
        for index, per_param in state_dict["state"].items():
            order.append([index, list(per_param)])
            for key, value in per_param.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"{OPTIMIZER_PREFIX}{index}/{key}"] = value
                else:
                    scalars.setdefault(index, {})[key] = value
        meta["optimizer"] = {
            "order": order,
            "scalars": scalars,
            "param_groups": state_dict["param_groups"],
        }
    return tensors, encode_meta(meta)


def _byte_view(tensor: Tensor) -> Tensor:
    """The tensor's bytes as a flat uint8 tensor (a view when already contiguous)."""
    torch = _torch()
    flat = tensor.detach().contiguous().reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _needs_staging(tensor: Tensor, force: bool) -> bool:
    return bool(tensor.is_cuda) or force


def _synchronize() -> None:
    torch = _torch()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def pinned_allocator(size: int) -> np.ndarray:
    """Host memory for staging device tensors: pinned when an accelerator is present."""
    torch = _torch()
    buffer = torch.empty(size, dtype=torch.uint8, pin_memory=bool(torch.cuda.is_available()))
    array: np.ndarray = buffer.numpy()  # the array keeps the tensor (and its memory) alive
    return array


def _entries(tensors: Mapping[str, Tensor], meta: bytes) -> list[tuple[str, str, tuple[int, ...]]]:
    torch = _torch()
    names = _dtype_names(torch)
    entries = []
    for name, tensor in tensors.items():
        dtype = names.get(tensor.dtype)
        if dtype is None:
            raise ConfigError(f"{name!r}: tensors of {tensor.dtype} cannot be put in a snapshot")
        entries.append((name, dtype, tuple(int(d) for d in tensor.shape)))
    entries.append((META_NAME, "uint8", (len(meta),)))
    return entries


# ------------------------------------------------------------------------------------ publish
def publish_torch(
    store: SnapshotStore,
    run: str,
    step: int,
    model: Any,
    optimizer: Any = None,
    *,
    force_staging: bool = False,
) -> SnapshotInfo:
    """Snapshot ``model`` (+ ``optimizer``) into ``store`` as (run, step): one copy per tensor.

    Call between training steps; training may resume as soon as this returns.
    """
    torch = _torch()
    tensors, meta = collect_state(model, optimizer)
    staged = force_staging or any(t.is_cuda for t in tensors.values())
    # Pinned memory is page-locked at every allocation: a staged snapshot reuses a freed one's block.
    builder = store.begin(
        run, step, _entries(tensors, meta), allocator=pinned_allocator if staged else None, reuse=staged
    )
    try:
        with torch.no_grad():
            for name, tensor in tensors.items():
                dest = builder.raw(name)
                if dest.size == 0:
                    continue
                if _needs_staging(tensor, force_staging):
                    torch.from_numpy(dest).copy_(_byte_view(tensor), non_blocking=True)
                else:
                    np.copyto(dest, _byte_view(tensor).numpy())
        if staged:
            _synchronize()
        builder.raw(META_NAME)[:] = np.frombuffer(meta, dtype=np.uint8)
        return builder.seal()
    except BaseException:
        builder.abort()
        raise


def flatten_torch(model: Any, optimizer: Any = None, *, force_staging: bool = False) -> FlatState:
    """Named numpy arrays of ``model`` (+ ``optimizer``): views of CPU tensors, staged copies of device ones."""
    torch = _torch()
    tensors, meta = collect_state(model, optimizer)
    names = _dtype_names(torch)
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    staged = False
    for name, tensor in tensors.items():
        dtype = names.get(tensor.dtype)
        if dtype is None:
            raise ConfigError(f"{name!r}: tensors of {tensor.dtype} cannot be put in a snapshot")
        raw = _byte_view(tensor)
        if _needs_staging(tensor, force_staging):
            host = torch.from_numpy(pinned_allocator(raw.numel()))
            host.copy_(raw, non_blocking=True)
            raw, staged = host, True
        arrays[name] = raw.numpy().view(storage_dtype(dtype)).reshape(tuple(tensor.shape))
        dtypes[name] = dtype
    if staged:
        _synchronize()
    arrays[META_NAME] = np.frombuffer(meta, dtype=np.uint8).copy()
    dtypes[META_NAME] = "uint8"
    return FlatState(arrays, dtypes)


# --------------------------------------------------------------------------------------- load
def _as_tensor(state: FlatState, name: str) -> Tensor:
    """A CPU tensor over the staged bytes of ``name`` (no copy)."""
    torch = _torch()
    dtype = torch_dtype(state.dtype(name))
    array = np.asarray(state.arrays[name], order="C")  # keeps 0-d arrays 0-d
    if array.size == 0:
        empty: Tensor = torch.empty(array.shape, dtype=dtype)
        return empty
    with warnings.catch_warnings():
        # Read-only staging memory is fine: it is only ever copied from.
        warnings.simplefilter("ignore", UserWarning)
        tensor: Tensor = torch.from_numpy(array)
    return tensor if tensor.dtype == dtype else tensor.view(dtype)


def load_torch(
    state: FlatState,
    model: Any,
    optimizer: Any = None,
    *,
    strict: bool = True,
    force_staging: bool = False,
) -> None:
    """Load a flattened state (e.g. ``StagingBuffer.commit(...)``) into ``model`` and ``optimizer``.

    Every tensor's name, shape and dtype is checked before anything is copied: on a mismatch a
    :class:`TransferError` is raised and the live model is untouched. With ``strict`` the model's
    tensor names must match the snapshot exactly.
    """
    torch = _torch()
    if META_NAME not in state.arrays:
        raise TransferError("the snapshot has no PyTorch metadata record")
    meta = decode_meta(np.asarray(state.arrays[META_NAME]).tobytes())
    if not isinstance(meta, dict) or meta.get("format") != META_FORMAT:
        raise TransferError("unsupported PyTorch metadata record")
    copies: list[tuple[Tensor, Tensor]] = []
    extras: dict[str, Any] = {}
    if model is not None:
        live = model.state_dict(keep_vars=False)
        snapshot_keys = {n[len(MODEL_PREFIX) :] for n in state.arrays if n.startswith(MODEL_PREFIX)}
        live_tensor_keys = {k for k, v in live.items() if isinstance(v, torch.Tensor)}
        if strict and snapshot_keys != live_tensor_keys:
            missing = sorted(live_tensor_keys - snapshot_keys)[:5]
            unexpected = sorted(snapshot_keys - live_tensor_keys)[:5]
            raise TransferError(f"model does not match the snapshot: missing {missing}, unexpected {unexpected}")
        for key in sorted(live_tensor_keys & snapshot_keys):
            target = live[key]
            source = _as_tensor(state, MODEL_PREFIX + key)
            if target.shape != source.shape or target.dtype != source.dtype:
                raise TransferError(
                    f"{key!r}: snapshot has {tuple(source.shape)} x {source.dtype}, "
                    f"model has {tuple(target.shape)} x {target.dtype}"
                )
            copies.append((target, source))
        model_extra = meta.get("model_extra") or {}
        extras = {k: v for k, v in model_extra.items() if k in live}
    optimizer_state = _optimizer_state(state, meta, optimizer, force_staging) if optimizer is not None else None
    staged = False
    with torch.no_grad():
        for target, source in copies:
            if _needs_staging(target, force_staging):
                target.copy_(source, non_blocking=True)
                staged = True
            else:
                target.copy_(source)
    if staged:
        _synchronize()
    if extras:
        model.load_state_dict(extras, strict=False)
    if optimizer is not None and optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)


def _optimizer_state(state: FlatState, meta: dict[str, Any], optimizer: Any, force_staging: bool) -> dict[str, Any]:
    torch = _torch()
    saved = meta.get("optimizer")
    if not isinstance(saved, dict):
        raise TransferError("the snapshot has no optimizer state")
    groups = saved.get("param_groups")
    live_groups = optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(live_groups):
        raise TransferError("optimizer parameter groups do not match the snapshot")
    params: dict[Any, Tensor] = {}
    for group, live_group in zip(groups, live_groups, strict=True):
        ids = group.get("params") if isinstance(group, dict) else None
        if not isinstance(ids, list) or len(ids) != len(live_group["params"]):
            raise TransferError("optimizer parameter groups do not match the snapshot")
        params.update(zip(ids, live_group["params"], strict=True))
    result: dict[Any, dict[str, Any]] = {}
    staged = False
    scalars = saved.get("scalars") or {}
    for index, keys in saved.get("order") or []:
        param = params.get(index)
        if param is None:
            raise TransferError(f"optimizer state for unknown parameter {index!r}")
        per_param: dict[str, Any] = {}
        for key in keys:
            name = f"{OPTIMIZER_PREFIX}{index}/{key}"
            if name in state.arrays:
                source = _as_tensor(state, name)
                if key != "step" and source.is_floating_point() and source.shape != param.shape:
                    raise TransferError(f"{name!r}: shape {tuple(source.shape)} does not match its parameter")
                if _needs_staging(param, force_staging) and key != "step":
                    copy = torch.empty(source.shape, dtype=source.dtype, device=param.device)
                    copy.copy_(source, non_blocking=True)
                    staged = True
                else:
                    copy = source.clone()  # never alias the staging buffer
                per_param[key] = copy
            else:
                try:
                    per_param[key] = scalars[index][key]
                except (KeyError, TypeError):
                    raise TransferError(f"optimizer state {name!r} is missing from the snapshot") from None
        result[index] = per_param
    if staged:
        _synchronize()
    return {"state": result, "param_groups": groups}
