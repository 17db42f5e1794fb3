"""A list-of-ints column of a decoded batch (native or pyarrow) as two tensors, (offsets, int64
values), with no Python int per item: what the ``columns=`` loader pads and the token loader
packs."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from syvain_training_data._native import ShardBatch

__all__ = ["int_lists"]


def int_lists(batch: Any, column: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, int64 values) of a list-of-ints column of a native or pyarrow batch, without a
    copy of the native buffers. Raises KeyError for a missing column, ValueError or TypeError
    for one that is not a list of ints without nulls."""
    if isinstance(batch, ShardBatch):
        offsets, values = batch.int_list_buffers(column)
        return _tensor(offsets, torch.int32), _tensor(values, torch.int64)
    return _arrow_int_lists(batch.column(column))


def _tensor(buffer: Any, dtype: torch.dtype) -> torch.Tensor:
    if len(buffer) == 0:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        # The buffer is read-only and so is the view: whoever yields it copies it first.
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buffer, dtype=dtype)


def _arrow_int_lists(column: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A pyarrow list-of-integers array (from a Parquet shard) as (offsets, int64 values)."""
    import pyarrow as pa

    if not pa.types.is_list(column.type) or column.null_count:
        raise TypeError(f"{column.type} with {column.null_count} nulls")
    values = column.values
    if not (pa.types.is_integer(values.type) or pa.types.is_null(values.type)):
        raise TypeError(str(column.type))
    if values.null_count and not pa.types.is_null(values.type):
        raise TypeError(f"{column.type} with null items")
    offsets = torch.from_numpy(column.offsets.to_numpy().astype("int64"))
    flat = values.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return offsets, torch.from_numpy(flat.astype("int64", copy=True))
