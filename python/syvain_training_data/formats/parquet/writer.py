"""The Parquet shard writer: records to Arrow batches spooled on disk, one unified schema,
zstd row groups (the rules are in :mod:`syvain_training_data.formats.parquet`)."""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final

from syvain_training_data.formats.parquet.extra import pyarrow_modules

__all__ = ["ParquetWriteResult", "write_parquet_shard"]

#: Records per Arrow record batch, each batch's column types inferred on their own.
BATCH_ROWS: Final = 1024
#: A row group is written once it holds this many rows or this many bytes of Arrow data.
ROW_GROUP_ROWS: Final = 64 * 1024
ROW_GROUP_BYTES: Final = 64 * 1024 * 1024
#: Uncompressed bytes per data page, and rows per write batch (a page ends between batches).
#: 256 KiB pages of text are about 3 % larger than 1 MiB ones once compressed; 64 KiB ones,
#: 25 %.
PAGE_BYTES: Final = 256 * 1024
PAGE_WRITE_ROWS: Final = 128


@dataclass(frozen=True)
class ParquetWriteResult:
    """What :func:`write_parquet_shard` wrote: the record count, the file's size in bytes and
    the lowercase hex sha256 of its bytes."""

    records: int
    size_bytes: int
    sha256: str


def write_parquet_shard(
    records: Iterable[Mapping[str, Any]],
    destination: IO[bytes] | str | os.PathLike[str],
) -> ParquetWriteResult:
    """Writes ``records`` as one Parquet shard to ``destination`` (a path, created or
    truncated, or a binary file object, written from its position and left open).

    Raises:
        ValueError: a record that is not a mapping or has a non-string key (naming the record
            index), a value Arrow cannot convert, columns whose types cannot be promoted into
            one (naming the column), no records ("Cannot save an empty record shard"), or
            records without any key (no columns). All of these but one are raised before
            anything is written: a promotion that fails value by value while writing (an int a
            double cannot hold exactly) leaves partial bytes in ``destination``.
        ModuleNotFoundError: pyarrow is not installed (the ``parquet`` extra).
    """
    pa, pq = pyarrow_modules()
    with tempfile.TemporaryDirectory(prefix="syvain-parquet-") as spool_dir:
        spool = _BatchSpool(pa, spool_dir)
        try:
            columns, count, leading_empty = _spool_records(pa, records, spool)
        finally:
            spool.close()
        if count == 0:
            raise ValueError("Cannot save an empty record shard")
        if not columns:
            raise ValueError(
                f"Cannot write a parquet shard with no columns: all {count} records are empty"
            )
        schema = _unified_schema(pa, spool.schemas, columns)
        if isinstance(destination, str | os.PathLike):
            with open(destination, "wb") as file:
                size, digest = _write_parquet(pa, pq, file, schema, spool, leading_empty)
        else:
            size, digest = _write_parquet(pa, pq, destination, schema, spool, leading_empty)
    return ParquetWriteResult(records=count, size_bytes=size, sha256=digest)


def _spool_records(
    pa: Any, records: Iterable[Mapping[str, Any]], spool: _BatchSpool
) -> tuple[list[str], int, int]:
    """Converts the records to batches in the spool: (column names in first-seen order, record
    count, leading records seen before any key, which become all-null rows)."""
    columns: dict[str, None] = {}
    count = 0
    leading_empty = 0
    seen = columns.keys()
    for chunk in itertools.batched(records, BATCH_ROWS):
        for index, record in enumerate(chunk, start=count):
            if type(record) is not dict and not isinstance(record, Mapping):
                raise ValueError(
                    f"Parquet record {index} is not a mapping (got {type(record).__name__})"
                )
            if record.keys() <= seen:  # the common case: no new key (all of them str)
                continue
            for key in record:
                if key not in columns:
                    if not isinstance(key, str):
                        raise ValueError(
                            f"Parquet record {index} has a non-string key {key!r} "
                            f"({type(key).__name__})"
                        )
                    columns[key] = None
        if columns:
            spool.append(_record_batch(pa, chunk, list(columns), count))
        else:
            leading_empty += len(chunk)
        count += len(chunk)
    return list(columns), count, leading_empty


def _record_batch(
    pa: Any, chunk: tuple[Mapping[str, Any], ...], names: list[str], first: int
) -> Any:
    return pa.RecordBatch.from_arrays(
        [_column_array(pa, chunk, name, first) for name in names], names=names
    )


def _column_array(pa: Any, chunk: tuple[Mapping[str, Any], ...], name: str, first: int) -> Any:
    """One column of a chunk as an Arrow array of the type pyarrow infers.

    Nested mappings must have str keys at every depth, like the records: pyarrow would take a
    bytes key as a field name (and drop values when str and bytes keys mix), so a column that
    holds structs is walked once to refuse them. Mappings that are not dicts (which pyarrow
    cannot infer) are converted to dicts.
    """
    values = [record.get(name) for record in chunk]
    try:
        array = pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        plain = [_plain(value, first + offset, name) for offset, value in enumerate(values)]
        try:
            return pa.array(plain)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            raise ValueError(
                f"Parquet column {name!r} of records {first}..{first + len(chunk) - 1} cannot "
                f"be converted to Arrow: {error}"
            ) from error
    if _has_struct(pa, array.type):
        for offset, value in enumerate(values):
            _plain(value, first + offset, name)
    return array


def _plain(value: Any, index: int, column: str) -> Any:
    """``value`` with every nested mapping as a dict; ValueError for a non-str key."""
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"Parquet record {index} has a non-string key {key!r} "
                    f"({type(key).__name__}) inside column {column!r}"
                )
            plain[key] = _plain(item, index, column)
        return plain
    if isinstance(value, list | tuple):
        return [_plain(item, index, column) for item in value]
    return value


def _has_struct(pa: Any, data_type: Any) -> bool:
    types = pa.types
    if types.is_struct(data_type):
        return True
    if types.is_map(data_type):
        return _has_struct(pa, data_type.key_type) or _has_struct(pa, data_type.item_type)
    if types.is_list(data_type) or types.is_large_list(data_type):
        return _has_struct(pa, data_type.value_type)
    return False


def _unified_schema(pa: Any, schemas: list[Any], columns: list[str]) -> Any:
    """The permissive union of the batch schemas, its fields in first-seen column order."""
    try:
        unified = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowException, TypeError, ValueError) as error:
        for name in columns:  # name the first column that cannot be unified
            fields = [pa.schema([s.field(name)]) for s in schemas if name in s.names]
            try:
                pa.unify_schemas(fields, promote_options="permissive")
            except (pa.ArrowException, TypeError, ValueError):
                types = ", ".join(dict.fromkeys(str(f.field(0).type) for f in fields))
                raise ValueError(
                    f"Parquet column {name!r} has types that cannot be promoted into one "
                    f"({types}): {error}"
                ) from error
        raise ValueError(f"Parquet columns have types that cannot be promoted: {error}") from error
    return pa.schema([unified.field(name) for name in columns])


def _conform(pa: Any, batch: Any, schema: Any) -> Any:
    """The batch with the schema's columns, in its order: missing ones null, others promoted."""
    arrays = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        try:
            arrays.append(_promote(pa, column, field.type))
        except (pa.ArrowException, TypeError, ValueError) as error:
            raise ValueError(
                f"Parquet column {field.name!r} cannot be promoted from {column.type} to "
                f"{field.type}: {error}"
            ) from error
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _promote(pa: Any, array: Any, target: Any) -> Any:
    """``array`` as ``target``, a permissive promotion of its type: struct fields the array
    lacks become null and lists are rebuilt around promoted values (older pyarrow cannot cast
    a struct to one with more fields); anything else is a safe cast, so an int that a double
    cannot hold exactly is an error, as it is within one batch."""
    types = pa.types
    if array.type.equals(target):
        return array
    if len(array) == 0:
        return pa.array([], type=target)
    mask = array.is_null() if array.null_count else None
    if types.is_struct(target) and types.is_struct(array.type):
        names = [array.type.field(i).name for i in range(array.type.num_fields)]
        children = dict(zip(names, array.flatten(), strict=True))
        return pa.StructArray.from_arrays(
            [
                _promote(pa, children[field.name], field.type)
                if field.name in children
                else pa.nulls(len(array), field.type)
                for field in target
            ],
            fields=list(target),
            mask=mask,
        )
    same_list = (types.is_list(target) and types.is_list(array.type)) or (
        types.is_large_list(target) and types.is_large_list(array.type)
    )
    if same_list:
        offsets = array.offsets  # into array.values, from this (maybe sliced) array's start
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        values = _promote(pa, array.values.slice(first, last - first), target.value_type)
        rebased = pa.compute.subtract(offsets, pa.scalar(first, offsets.type))
        list_class = pa.ListArray if types.is_list(target) else pa.LargeListArray
        return list_class.from_arrays(rebased, values, type=target, mask=mask)
    return array.cast(target)


def _write_parquet(
    pa: Any,
    pq: Any,
    target: IO[bytes],
    schema: Any,
    spool: _BatchSpool,
    leading_empty: int,
) -> tuple[int, str]:
    """Writes the spooled batches as Parquet to ``target``; returns (size, sha256 hex)."""
    sink = _HashingSink(target)
    # The page index lets a reader of a slice of a row group fetch only its pages, so pages
    # are kept small: about PAGE_BYTES of values (pyarrow cuts a page only between its write
    # batches, hence their size). A page's CRC-32 lets a reader find a corrupt page (Parquet
    # has no other checksum: a changed compressed page can decode to other values silently).
    # No dictionary pages: every reader of a column's pages needs its dictionary page, up to
    # 1 MiB of distinct texts before pyarrow falls back to plain values, which zstd compresses
    # as well.
    writer = pq.ParquetWriter(
        sink,
        schema,
        compression="zstd",
        use_dictionary=False,
        data_page_size=PAGE_BYTES,
        write_batch_size=PAGE_WRITE_ROWS,
        write_page_index=True,
        write_page_checksum=True,
    )
    try:
        group: list[Any] = []
        rows = nbytes = 0
        empty = (
            pa.RecordBatch.from_arrays(
                [pa.nulls(min(BATCH_ROWS, leading_empty - start), f.type) for f in schema],
                schema=schema,
            )
            for start in range(0, leading_empty, BATCH_ROWS)
        )
        for batch in itertools.chain(empty, (_conform(pa, b, schema) for b in spool.batches())):
            group.append(batch)
            rows += batch.num_rows
            nbytes += batch.nbytes
            if rows >= ROW_GROUP_ROWS or nbytes >= ROW_GROUP_BYTES:
                writer.write_table(pa.Table.from_batches(group, schema), row_group_size=rows)
                group, rows, nbytes = [], 0, 0
        if group:
            writer.write_table(pa.Table.from_batches(group, schema), row_group_size=rows)
    finally:
        writer.close()
    target.flush()
    return sink.size, sink.hexdigest()


class _BatchSpool:
    """Record batches on disk as Arrow IPC streams, one file per run of equal schemas."""

    def __init__(self, pa: Any, directory: str) -> None:
        self._pa = pa
        self._directory = directory
        self._paths: list[str] = []
        self.schemas: list[Any] = []
        self._sink: Any = None
        self._writer: Any = None

    def append(self, batch: Any) -> None:
        if self._writer is None or not batch.schema.equals(self.schemas[-1]):
            self.close()
            path = os.path.join(self._directory, f"batches-{len(self._paths):06d}.arrows")
            self._sink = self._pa.OSFile(path, "wb")
            self._writer = self._pa.ipc.new_stream(self._sink, batch.schema)
            self._paths.append(path)
            self.schemas.append(batch.schema)
        self._writer.write_batch(batch)

    def close(self) -> None:
        """Finishes the current stream (appending after this starts a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def batches(self) -> Iterator[Any]:
        """Every spooled batch, in order, one in memory at a time."""
        for path in self._paths:
            with self._pa.OSFile(path, "rb") as source:
                yield from self._pa.ipc.open_stream(source)


class _HashingSink:
    """A write-only file object for pyarrow that forwards to ``target`` and hashes the bytes."""

    closed = False

    def __init__(self, target: IO[bytes]) -> None:
        self._target = target
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._target.write(view)
        self._digest.update(view)
        self.size += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._target.flush()

    def hexdigest(self) -> str:
        return self._digest.hexdigest()
