"""How a DataLoader worker's batches reach the training process.

torch hands every tensor a worker sends through shared memory: a segment, a file descriptor
and a mapping per tensor, a fixed cost that dominates for the batches of a training step (8 x
2048 tokens: 128 KiB). Up to BY_VALUE_BYTES a tensor is cheaper to copy through the
DataLoader's pipe (about 3x for 128 KiB on these machines, even near 1 MiB;
benchmarks/tokens_loader.py), so a worker wraps such tensors to be pickled by value; they are
plain tensors again, writable and of their own memory, once unpickled.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
from torch.utils.data import get_worker_info

__all__ = ["BY_VALUE_BYTES", "for_transfer"]

BY_VALUE_BYTES = 512 << 10


class _ByValue:
    """A tensor that pickles as its bytes, dtype and shape."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor.contiguous()

    def __reduce__(self) -> tuple[Any, ...]:
        tensor = self.tensor
        data = ctypes.string_at(tensor.data_ptr(), tensor.nbytes) if tensor.nbytes else b""
        return (_rebuild, (data, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)))


def _rebuild(data: bytes, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


def for_transfer(batch: Any) -> Any:
    """``batch`` (a tensor, or a dict, list or tuple holding tensors) with its small CPU tensors
    wrapped to be sent by value, in a DataLoader worker; unchanged in the main process."""
    if get_worker_info() is None:
        return batch
    return _wrap(batch)


def _wrap(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        small = value.device.type == "cpu" and value.nbytes <= BY_VALUE_BYTES
        return _ByValue(value) if small and not value.is_sparse else value
    if isinstance(value, dict):
        return {key: _wrap(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_wrap(item) for item in value)
    return value
