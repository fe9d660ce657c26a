"""Model parameters and gradients as one flat float32 buffer, and back.

Averaging moves one contiguous array per round: every trainable parameter's gradient is copied into
its slice of a preallocated float32 buffer (in ``model.parameters()`` order, which is the same on
every member running the same architecture), averaged in place, and copied back into ``.grad``.
Tensors on a CUDA device are staged through page-locked host memory (:meth:`FlatParameters.host_array`)
with asynchronous copies and one synchronisation per copy direction, so the averaging code only ever
sees host memory and a model of many small tensors does not pay one blocking transfer per tensor.

``layout_digest`` names the architecture (parameter names, shapes, dtypes): members compare it
when a newcomer joins, so a model of a different shape is refused before any bytes are averaged.
``parameter_digest`` hashes the parameter values (xxh3-128): equal on every member in synchronous
mode, which the examples print per step and the tests compare.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from chaosp2p.errors import ConfigError

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("training needs torch (pip install torch)") from None
    return torch


class FlatParameters:
    """The trainable parameters of a model mapped onto one float32 buffer.

    ``force_staging`` takes the accelerator path (asynchronous copies, one synchronisation) for
    CPU tensors too, so that path is tested on machines without a GPU.
    """

    def __init__(self, parameters: Sequence[Any], *, force_staging: bool = False) -> None:
        torch = _torch()
        self.parameters = [p for p in parameters if p.requires_grad]
        if not self.parameters:
            raise ConfigError("the model has no trainable parameters")
        for p in self.parameters:
            if not torch.is_floating_point(p):
                raise ConfigError(f"cannot average a {p.dtype} parameter (floating point only)")
        self.sizes = [int(p.numel()) for p in self.parameters]
        self.offsets = np.cumsum([0, *self.sizes]).tolist()
        self.numel = int(self.offsets[-1])
        self._force_staging = force_staging
        # Synchronising a device waits only for that device: remember every one the model uses.
        self._devices = sorted({p.device for p in self.parameters if p.is_cuda}, key=str)
        self.buffer = self.host_array()
        self._host = torch.from_numpy(self.buffer)

    @property
    def staged(self) -> bool:
        """Whether copies to and from the parameters go through the asynchronous staging path."""
        return self._force_staging or bool(self._devices)

    def host_array(self) -> np.ndarray:
        """A new flat float32 array of zeros for this model's gradients or values: page-locked
        when the parameters live on a CUDA device, so copies to and from it run asynchronously."""
        torch = _torch()
        pinned = bool(self._devices) and torch.cuda.is_available()
        tensor = torch.zeros(self.numel, dtype=torch.float32, pin_memory=pinned)
        array: np.ndarray = tensor.numpy()  # the array keeps the tensor (and its pinned memory) alive
        return array

    def _copy(self, destination: Any, source: Any) -> None:
        destination.copy_(source, non_blocking=self.staged)

    def _finish(self) -> None:
        """Wait for the asynchronous copies: the host memory may be read or reused right after."""
        if self._devices:
            torch = _torch()
            for device in self._devices:
                torch.cuda.synchronize(device)

    def _slices(self) -> list[tuple[Any, Any]]:
        return [
            (p, self._host[self.offsets[i] : self.offsets[i + 1]].view(p.shape)) for i, p in enumerate(self.parameters)
        ]

    def gather_grads(self, out: np.ndarray | None = None) -> np.ndarray:
        """Copy every ``.grad`` (zeros where a parameter got none) into the buffer (or ``out``)."""
        torch = _torch()
        target = self._host if out is None else torch.from_numpy(out)
        with torch.no_grad():
            for i, p in enumerate(self.parameters):
                view = target[self.offsets[i] : self.offsets[i + 1]].view(p.shape)
                if p.grad is None:
                    view.zero_()
                else:
                    self._copy(view, p.grad)
        self._finish()
        return self.buffer if out is None else out

    def scatter_grads(self, source: np.ndarray) -> None:
        """Write ``source`` (a flat float32 array) into every ``.grad``."""
        torch = _torch()
        flat = torch.from_numpy(source)
        with torch.no_grad():
            for i, p in enumerate(self.parameters):
                view = flat[self.offsets[i] : self.offsets[i + 1]].view(p.shape)
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                self._copy(p.grad, view)
        self._finish()

    def gather_values(self, out: np.ndarray) -> np.ndarray:
        """Copy the parameter values into ``out`` (flat float32)."""
        torch = _torch()
        flat = torch.from_numpy(out)
        with torch.no_grad():
            for i, p in enumerate(self.parameters):
                self._copy(flat[self.offsets[i] : self.offsets[i + 1]].view(p.shape), p)
        self._finish()
        return out

    def scatter_values(self, source: np.ndarray) -> None:
        """Overwrite the parameter values with ``source`` (flat float32)."""
        torch = _torch()
        flat = torch.from_numpy(source)
        with torch.no_grad():
            for i, p in enumerate(self.parameters):
                self._copy(p, flat[self.offsets[i] : self.offsets[i + 1]].view(p.shape))
        self._finish()


def layout_digest(model: Any) -> bytes:
    """A 16-byte name for the model's architecture: parameter names, shapes and dtypes."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:{int(p.requires_grad)};".encode())
    return h.digest()[:16]


def parameter_digest(model: Any) -> str:
    """xxh3-128 of every parameter's bytes, in order (hex): equal iff the parameters are equal."""
    torch = _torch()
    h = xxhash.xxh3_128()
    with torch.no_grad():
        for p in model.parameters():
            h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
