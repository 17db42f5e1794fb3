"""Tensor batches: ``SplitDataLoader.load(..., columns=[...])``.

The batch is built where the records are read (in the DataLoader worker), so it travels to the
training process through shared memory as tensors instead of being pickled record by record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["TensorCollate", "lengths_key"]


def lengths_key(column: str) -> str:
    """The batch entry holding the lengths of a list column's rows."""
    return f"{column}_lengths"


class TensorCollate:
    """Records -> ``{column: tensor}`` for the chosen columns.

    Rules (the README lists them): ints -> int64 (B,), floats (or ints mixed with floats) ->
    float32 (B,), bools -> bool (B,); a list of numbers -> a (B, longest) tensor right-padded
    with ``pad_value``, and its row lengths as int64 (B,) under ``{column}_lengths``; strings
    and bytes stay a list of B values. A missing column, a null, or a value of another kind is
    a ValueError naming the column."""

    def __init__(self, columns: Sequence[str], pad_value: int | float = 0) -> None:
        if isinstance(columns, str) or not columns:
            raise ValueError("columns must be a non-empty sequence of column names")
        names = list(columns)
        repeated = sorted({c for c in names if names.count(c) > 1})
        if repeated:
            raise ValueError(f"Duplicate columns: {', '.join(repeated)}")
        clashes = [c for c in names if lengths_key(c) in names]
        if clashes:
            raise ValueError(
                f"Column {lengths_key(clashes[0])!r} would collide with the lengths of "
                f"{clashes[0]!r}"
            )
        self.columns = names
        self.pad_value = pad_value

    def __call__(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for column in self.columns:
            try:
                values = [record[column] for record in records]
            except KeyError:
                raise ValueError(f"A record of the batch has no column {column!r}") from None
            first = values[0]
            try:
                if isinstance(first, list | tuple):
                    # Padded in Python, then one conversion: far cheaper than a tensor per row.
                    lengths = [len(v) for v in values]
                    longest = max(lengths)
                    pad = [self.pad_value]
                    rows = [
                        [*v, *pad * (longest - n)] for v, n in zip(values, lengths, strict=True)
                    ]
                    batch[column] = (
                        torch.tensor(rows)
                        if longest
                        else torch.zeros((len(values), 0), dtype=torch.int64)
                    )
                    if batch[column].dim() != 2:
                        raise TypeError("nested lists")
                    if batch[column].dtype == torch.float64:
                        batch[column] = batch[column].float()
                    batch[lengths_key(column)] = torch.tensor(lengths)
                elif isinstance(first, str | bytes):
                    if not all(isinstance(v, type(first)) for v in values):
                        raise TypeError("mixed kinds")
                    batch[column] = values
                elif isinstance(first, bool | int | float):
                    batch[column] = torch.tensor(values)
                    if batch[column].dtype == torch.float64:
                        batch[column] = batch[column].float()
                else:
                    raise TypeError(type(first).__name__)
            except (TypeError, ValueError, RuntimeError, OverflowError) as error:
                raise ValueError(
                    f"Column {column!r} cannot become a tensor batch ({error}): numbers, "
                    "lists of numbers, strings or bytes, without nulls"
                ) from None
        return batch
