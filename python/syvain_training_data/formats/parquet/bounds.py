"""Decoded-size bounds for untrusted Parquet shards.

A few bytes of Parquet can decode to gigabytes: a dictionary page holding one large value that
thousands of rows reference (each reference costs a few bits of RLE), or repetition levels that
make long lists. So the reader

- keeps top-level byte-array columns dictionary-encoded while pyarrow decodes them
  (``read_dictionary``): a referenced value is held once, whatever the number of rows;
- sizes pyarrow's batches from the values the metadata declares per row;
- cuts every decoded batch into pieces of at most ``PIECE_BYTES`` of values before it expands
  the dictionaries, and refuses a row whose values exceed ``MAX_ROW_BYTES`` (the record limit
  of the other formats) with an error naming the shard.

The expanded pieces have exactly the column types the file gives without ``read_dictionary``.
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


def dictionary_columns(parquet: Any) -> list[str]:
    """The top-level byte-array columns, which pyarrow can hand over dictionary-encoded."""
    schema = parquet.schema
    names = []
    for index in range(len(schema)):
        column = schema.column(index)
        top_level = column.max_repetition_level == 0 and "." not in column.path
        if column.physical_type == "BYTE_ARRAY" and top_level:
            names.append(column.path)
    return names


def values_per_row(metadata: Any) -> int:
    """The most values any column declares per row in any row group (long lists show here
    before they are decoded).

    Read from the footer's Thrift bytes, not through pyarrow's column chunk metadata: pyarrow
    validates a column chunk's metadata when Python first asks for it, outside any C++
    exception handler, so a hostile footer (e.g. a level histogram of the wrong size) aborts
    the process there (pyarrow 26; found by tests/formats/test_parquet_mutations.py).
    ValueError for a footer that does not parse."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    metadata.write_metadata_file(sink)  # "PAR1", the footer's Thrift bytes, length, "PAR1"
    footer = sink.getvalue().to_pybytes()[4:-8]
    most = 1
    for rows, values in _declared_values(footer):
        for declared in values:
            most = max(most, -(-declared // max(1, rows)))
    return most


# Thrift compact protocol types (the Parquet footer's encoding).
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = range(9)
_LIST, _SET, _MAP, _STRUCT, _UUID = 9, 10, 11, 12, 13
_MAX_DEPTH = 64


class _Thrift:
    """A reader of Thrift compact protocol bytes that checks every length against the data
    (ValueError on anything malformed): the fields the caller wants, the rest skipped."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("Parquet footer ends early")
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 70:
                raise ValueError("Parquet footer varint too long")

    def integer(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def take(self, count: int) -> None:
        if count < 0 or self.at + count > len(self.data):
            raise ValueError("Parquet footer ends early")
        self.at += count

    def fields(self) -> Iterator[tuple[int, int]]:
        """A struct's (field id, type) in turn; the caller reads or skips each value."""
        field = 0
        while True:
            header = self.byte()
            kind = header & 0x0F
            if kind == _STOP:
                return
            delta = header >> 4
            field = field + delta if delta else self.integer()
            yield field, kind

    def list_header(self) -> tuple[int, int]:
        header = self.byte()
        size = header >> 4
        if size == 15:
            size = self.varint()
        if size > len(self.data):  # every element takes at least one byte (or none: bounded)
            raise ValueError("Parquet footer list longer than the footer")
        return size, header & 0x0F

    def struct_list(self, what: str) -> int:
        """The length of a list of structs; ValueError naming ``what`` for a list of others."""
        size, element = self.list_header()
        if element != _STRUCT:
            raise ValueError(f"Parquet footer {what} are not structs")
        return size

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise ValueError("Parquet footer nested too deep")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.take(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.take(8)
        elif kind == _UUID:
            self.take(16)
        elif kind == _BINARY:
            self.take(self.varint())
        elif kind in (_LIST, _SET):
            size, element = self.list_header()
            for _ in range(size):
                if element in (_TRUE, _FALSE):
                    self.take(1)  # a list's booleans take a byte each
                else:
                    self.skip(element, depth + 1)
        elif kind == _MAP:
            size = self.varint()
            if size > len(self.data):
                raise ValueError("Parquet footer map longer than the footer")
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            for _, field_kind in self.fields():
                self.skip(field_kind, depth + 1)
        else:
            raise ValueError(f"Parquet footer has a value of unknown type {kind}")


def _declared_values(footer: bytes) -> list[tuple[int, list[int]]]:
    """(rows, each column chunk's declared values) of each row group of a FileMetaData."""
    reader = _Thrift(footer)
    groups: list[tuple[int, list[int]]] = []
    for field, kind in reader.fields():
        if field == 4 and kind == _LIST:  # row_groups: list<RowGroup>
            for _ in range(reader.struct_list("row groups")):
                groups.append(_row_group(reader))
        else:
            reader.skip(kind)
    return groups


def _row_group(reader: _Thrift) -> tuple[int, list[int]]:
    rows, values = 0, []
    for field, kind in reader.fields():
        if field == 1 and kind == _LIST:  # columns: list<ColumnChunk>
            for _ in range(reader.struct_list("column chunks")):
                values.append(_column_chunk(reader))
        elif field == 3 and kind == _I64:  # num_rows
            rows = reader.integer()
        else:
            reader.skip(kind)
    return rows, values


def _column_chunk(reader: _Thrift) -> int:
    declared = 0
    for field, kind in reader.fields():
        if field == 3 and kind == _STRUCT:  # meta_data: ColumnMetaData
            for inner, inner_kind in reader.fields():
                if inner == 5 and inner_kind == _I64:  # num_values
                    declared = max(declared, reader.integer())
                else:
                    reader.skip(inner_kind, 1)
        else:
            reader.skip(kind)
    return declared


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
