"""Decoded-size bounds for untrusted Parquet shards.

A few bytes of Parquet can decode to gigabytes: a dictionary page holding one large value that
thousands of rows reference (each reference costs a few bits of RLE), or repetition levels that
make long lists. So the reader

- keeps top-level byte-array columns dictionary-encoded while the native reader decodes them:
  a referenced value is held once, whatever the number of rows;
- sizes the decoded batches from the values the footer declares per row (at most
  ``PIECE_BYTES // NESTED_VALUE_BYTES`` declared values a batch);
- cuts every decoded batch into pieces of at most ``PIECE_BYTES`` of values before it expands
  the dictionaries, and refuses a row whose values exceed ``MAX_ROW_BYTES`` (the record limit
  of the other formats) with an error naming the shard.

The expanded pieces have exactly the column types the file gives without dictionaries.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from typing import Any, Final

#: Values of the rows handed on at once, dictionaries expanded (one row may exceed it alone).
PIECE_BYTES: Final = 64 * 1024 * 1024
#: A row's values may not expand beyond this (msgpack.zstf's decompressed record limit).
MAX_ROW_BYTES: Final = 1024 * 1024 * 1024
#: The least a declared value of a nested column takes once decoded (offsets and validity).
NESTED_VALUE_BYTES: Final = 8


def bounded_pieces(
    pa: Any, pc: Any, batch: Any, plain_schema: Any, describe_row: Any
) -> Iterator[Any]:
    """``batch`` (with dictionary-encoded columns) as batches of at most PIECE_BYTES of
    dictionary values each, expanded to the types of ``plain_schema``.

    Raises the error ``describe_row(row, size)`` returns for a row over MAX_ROW_BYTES."""
    encoded = [
        index for index, field in enumerate(batch.schema) if pa.types.is_dictionary(field.type)
    ]
    if not encoded:
        yield batch
        return
    sizes = _row_sizes(pa, pc, batch, encoded)
    for row, size in enumerate(sizes):
        if size > MAX_ROW_BYTES:
            raise describe_row(row, size)
    ends = list(itertools.accumulate(sizes))
    first = 0
    while first < batch.num_rows:
        limit = (ends[first - 1] if first else 0) + PIECE_BYTES
        # At least one row per piece, however large.
        stop = max(first + 1, bisect.bisect_right(ends, limit, lo=first))
        yield _expanded(pa, pc, batch.slice(first, stop - first), encoded, plain_schema)
        first = stop


def _row_sizes(pa: Any, pc: Any, batch: Any, encoded: list[int]) -> list[int]:
    """Per row, the bytes of its dictionary-encoded values once expanded."""
    total = None
    for index in encoded:
        column = batch.column(index)
        lengths = pc.fill_null(pc.binary_length(column.dictionary), 0).cast(pa.int64())
        per_row = pc.fill_null(pc.take(lengths, column.indices), 0)
        total = per_row if total is None else pc.add(total, per_row)
    assert total is not None
    return total.to_pylist()  # type: ignore[no-any-return]


def _expanded(pa: Any, pc: Any, piece: Any, encoded: list[int], plain_schema: Any) -> Any:
    arrays = list(piece.columns)
    fields = list(piece.schema)
    for index in encoded:
        name = fields[index].name
        plain = plain_schema.field(name).type if name in plain_schema.names else None
        decoded = arrays[index].dictionary_decode()
        arrays[index] = decoded if plain is None else pc.cast(decoded, plain)
        fields[index] = pa.field(name, arrays[index].type, fields[index].nullable)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, piece.schema.metadata))
