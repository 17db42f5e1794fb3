"""Tensor batches: ``SplitDataLoader.load(..., columns=[...])``.

The records hold only the chosen columns, read from the native decoders' Arrow batches
(``iter_shard_batches``): a list-of-ints column arrives as an int64 tensor per record, a slice
of the batch's values, so no Python int is made per item. The batch is built where the records
are read (in the DataLoader worker), and travels to the training process as tensors, through
the loader's batch ring when they fit its slots, in bundles of batches (one DataLoader item per
bundle) handed out in the order a DataLoader gives batches sent one by one.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import get_worker_info

from syvain_training_data import _native
from syvain_training_data._native import ShardBatch
from syvain_training_data.loading.bundles import BUNDLE_BATCHES, Bundle, as_is, bundled, in_turn
from syvain_training_data.loading.dataloader import RecordDataLoader
from syvain_training_data.loading.dataset import ShardDataset
from syvain_training_data.loading.list_columns import int_lists
from syvain_training_data.loading.reader import ShardRange
from syvain_training_data.loading.shard_indexes import ShardIndexes
from syvain_training_data.loading.transfer import BatchRing, for_transfer

__all__ = [
    "ColumnDataLoader",
    "ColumnDataset",
    "TensorCollate",
    "batch_records",
    "lengths_key",
    "python_columns",
]

# Slots of a column loader's batch ring: a batch tensor up to this size travels through it (a
# larger one through torch's shared memory, as fast as the pipe from about this size on). Only
# the pages batches write are used.
RING_SLOT_BYTES = 512 << 10


class ColumnDataset(ShardDataset):
    """A :class:`ShardDataset` whose consumers yield bundles of tensor batches: ``batch_size``
    records at a time (the last smaller one dropped with ``drop_last``, as a DataLoader would),
    each a dict of ``collate``'s columns. Records are read as Arrow batches: list-of-ints
    columns as int64 tensors, the others as Python values; a null (a record without the key)
    leaves the key out."""

    def __init__(self, *args: Any, collate: TensorCollate, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collate = collate
        self.columns = collate.columns
        # Set by the loader before it starts workers: how their batches reach it.
        self.ring: BatchRing | None = None

    def __iter__(self) -> Iterator[Bundle]:
        info = get_worker_info()
        worker, size = (0, 1) if info is None else (info.id, BUNDLE_BATCHES)
        records = super().__iter__()
        batches = _collated(records, self.collate, self.batch_size, self.drop_last)
        send = functools.partial(for_transfer, ring=self.ring)
        return map(send, bundled(batches, worker, size, _tensor_bytes))

    def new_ring(self, workers: int, batches_in_flight: int) -> BatchRing | None:
        """A batch ring for workers about to start, kept for them: a slot for each tensor (at
        most two per column) of the batches each worker may have in flight."""
        tensors = 2 * len(self.columns)
        self.ring = BatchRing.for_batches(workers, batches_in_flight * tensors, RING_SLOT_BYTES)
        return self.ring

    def _open(
        self, shard_range: ShardRange, indexes: ShardIndexes | None
    ) -> Iterator[dict[str, Any]]:
        table_index, start, stop = shard_range
        shard = self.table.shard(table_index)
        batches = self.column_batches(shard, start, stop, indexes, self.columns)
        for batch in batches:
            yield from batch_records(batch, self.columns)


class ColumnDataLoader(RecordDataLoader):
    """The DataLoader ``load(columns=)`` returns: its workers send bundles of tensor batches
    (through a batch ring), which it hands out in the order of batches sent one by one."""

    dataset: ColumnDataset

    def __init__(
        self, dataset: ColumnDataset, *, log_stats_every: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(
            dataset, log_stats_every=log_stats_every, batch_size=None, collate_fn=as_is, **kwargs
        )

    def _batches(self) -> Iterator[Any]:
        workers = self.num_workers
        if self._starts_workers():
            self.dataset.new_ring(workers, self._batches_in_flight(BUNDLE_BATCHES))
        return _holding(in_turn(super()._batches(), max(workers, 1)), self.dataset.ring)


def _holding(batches: Iterator[Any], ring: BatchRing | None) -> Iterator[Any]:
    # ``ring`` stays referenced while its batches arrive.
    yield from batches


def _collated(
    records: Iterator[Any], collate: TensorCollate, batch_size: int, drop_last: bool
) -> Iterator[dict[str, Any]]:
    while True:
        batch = list(itertools.islice(records, batch_size))
        if not batch or (drop_last and len(batch) < batch_size):
            return
        yield collate(batch)


def _tensor_bytes(batch: Mapping[str, Any]) -> int:
    return sum(v.nbytes for v in batch.values() if isinstance(v, torch.Tensor))


def batch_records(batch: Any, columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """The records of a decoded batch as dicts of ``columns``: a list-of-ints column as an
    int64 tensor (a slice of the batch's values), the others as Python values; a null (a
    record without the key) leaves the key out."""
    by_column: dict[str, list[Any]] = {}
    others = []
    for column in columns:
        try:
            offsets, values = int_lists(batch, column)
        except (KeyError, ValueError, TypeError):
            others.append(column)
            continue
        bounds = offsets.tolist()
        by_column[column] = [values[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    if others:
        by_column.update(python_columns(batch, others))
    for row in range(batch.num_rows):
        record = {}
        for column in columns:
            value = by_column[column][row]
            if value is not None:
                record[column] = value
        yield record


def python_columns(batch: Any, columns: Sequence[str]) -> dict[str, list[Any]]:
    """``columns`` of a native or pyarrow batch as Python values, a list per column (None for a
    null, a record without the key)."""
    if not isinstance(batch, ShardBatch):  # pyarrow's own (Parquet)
        return {column: batch.column(column).to_pylist() for column in columns}

    def with_pyarrow(index: int) -> list[Any]:
        import pyarrow as pa

        values: list[Any] = pa.record_batch(batch).column(index).to_pylist()
        return values

    schema, array = batch.__arrow_c_array__()
    rows = _native.rows_from_arrow(schema, array, with_pyarrow)
    return {column: [row.get(column) for row in rows] for column in columns}


def lengths_key(column: str) -> str:
    """The batch entry holding the lengths of a list column's rows."""
    return f"{column}_lengths"


#: Values a padded list column of one batch may hold (B x longest): 1 GiB of int32.
MAX_PADDED_VALUES = 1 << 28


class _TooLong(ValueError):
    """A row or a padded batch over the collate's bounds (raised as it is, not rewrapped)."""


class TensorCollate:
    """Records -> ``{column: tensor}`` for the chosen columns.

    Rules (the README lists them): ints -> int64 (B,), floats (or ints mixed with floats) ->
    float32 (B,), bools -> bool (B,); a list of numbers -> a (B, longest) tensor right-padded
    with ``pad_value``, and its row lengths as int64 (B,) under ``{column}_lengths``; strings
    and bytes stay a list of B values. A missing column, a null, or a value of another kind is
    a ValueError naming the column.

    One long row would make every row of its batch that long: a row longer than
    ``max_length`` is cut to it when ``truncate`` (its length then says ``max_length``), else
    a ValueError naming the column and the length; and a padded batch may hold at most
    ``MAX_PADDED_VALUES`` values (B x longest), else a ValueError suggesting ``max_length``."""

    def __init__(
        self,
        columns: Sequence[str],
        pad_value: int | float = 0,
        *,
        max_length: int | None = None,
        truncate: bool = False,
    ) -> None:
        if max_length is not None and (
            type(max_length) is not int or not 0 < max_length <= MAX_PADDED_VALUES
        ):
            raise ValueError(f"max_length must be an int in [1, {MAX_PADDED_VALUES}]")
        if truncate and max_length is None:
            raise ValueError("truncate=True needs a max_length")
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
        self.max_length = max_length
        self.truncate = truncate

    def _fitted(self, column: str, values: list[Any]) -> list[Any]:
        """The rows of a list column cut to ``max_length`` (or the error), and the padded
        size checked."""
        lengths = [len(v) for v in values]
        longest = max(lengths)
        if self.max_length is not None and longest > self.max_length:
            if not self.truncate:
                raise _TooLong(
                    f"Column {column!r} has a row of {longest} values, over max_length="
                    f"{self.max_length} (pass truncate=True to cut rows to it)"
                )
            values = [v[: self.max_length] for v in values]
            longest = self.max_length
        if longest * len(values) > MAX_PADDED_VALUES:
            raise _TooLong(
                f"Column {column!r} would pad {len(values)} rows to {longest} values "
                f"({len(values) * longest} values, over {MAX_PADDED_VALUES}): pass max_length "
                "(and truncate=True) or a smaller batch_size"
            )
        return values

    def __call__(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for column in self.columns:
            try:
                values = [record[column] for record in records]
            except KeyError:
                raise ValueError(f"A record of the batch has no column {column!r}") from None
            first = values[0]
            if isinstance(first, torch.Tensor | list | tuple):
                values = self._fitted(column, values)
            try:
                if isinstance(first, torch.Tensor):  # int lists read from Arrow arrays
                    if not all(isinstance(v, torch.Tensor) for v in values):
                        raise TypeError("mixed kinds")
                    batch[column] = pad_sequence(
                        values, batch_first=True, padding_value=self.pad_value
                    )
                    batch[lengths_key(column)] = torch.tensor([len(v) for v in values])
                elif isinstance(first, list | tuple):
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
            except _TooLong:
                raise
            except (TypeError, ValueError, RuntimeError, OverflowError) as error:
                raise ValueError(
                    f"Column {column!r} cannot become a tensor batch ({error}): numbers, "
                    "lists of numbers, strings or bytes, without nulls"
                ) from None
        return batch
