"""Parquet shards through pyarrow (SPEC section 3; needs the ``parquet`` extra).

Writer (:func:`write_parquet_shard`)
    Records become Arrow record batches of 1024 rows. Columns are the records' keys in the order
    they are first seen across the whole shard; a key a record lacks is null. Arrow infers each
    batch's column types, and the schemas of all batches are unified with permissive promotion
    (``pa.unify_schemas(..., promote_options="permissive")``: int64 then double gives double,
    null then string gives string, struct fields are merged). A Parquet writer needs its schema
    before the first row, so the batches are first spooled to Arrow IPC streams in a temporary
    directory (a new stream whenever the batch schema changes); once every record has been seen,
    the unified schema is known and the spooled batches are read back one at a time, promoted to
    it and written as zstd-compressed row groups, each closed at 64 Ki rows or 64 MiB of Arrow
    data, whichever comes first. Memory stays bounded by one row group whatever the shard size
    (the spool takes about the shard's uncompressed Arrow size on disk, in the temp directory:
    set ``TMPDIR`` to move it); the spool is removed however the call ends. Identical records
    give identical bytes (the file holds no timestamp; ``created_by`` names the pyarrow
    version).

Reader (:func:`iter_parquet_shard`)
    An s3:// object is streamed (size-checked, resumable, etag-pinned) into an unlinked
    temporary file in ``TMPDIR`` (Parquet needs its footer before any row): it has no name, so
    nothing is left behind however the reader ends, SIGKILL included, and a shard larger than
    the free space there fails at once. A file:// shard is read in place, if it is a regular
    file (a FIFO or device is an OSError, never a hang): its size is checked before the first
    row and its size and etag again after the last. Rows ``[start, stop)`` skip the row
    groups before ``start`` without decoding them. pyarrow then decodes batches of
    about 1 MiB of column data (1 Ki to 64 Ki rows) in a helper thread, at most two ahead, while
    the reading thread turns the current one into rows 1024 at a time; the rows are built in
    Rust from the Arrow buffers (``_native.rows_from_arrow``) with exactly the values
    ``pyarrow.Table.to_pylist`` gives, in file order, never more than the manifest's
    ``records``. Memory stays bounded by a few decoded batches plus pyarrow's buffers for one
    row group, whatever the file declares: top-level byte-array columns stay dictionary-encoded
    while pyarrow decodes, and each batch is handed on in pieces of at most 64 MiB of values
    (a row over 1 GiB is an error), so a few KiB of dictionary references cannot expand to
    gigabytes at once (:mod:`syvain_training_data.formats.parquet_bounds`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import queue
import shutil
import stat
import tempfile
import threading
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final

from syvain_training_data import _native, storage
from syvain_training_data.errors import ObjectChangedError, ObjectDataError, ShardDataError
from syvain_training_data.formats import parquet_bounds
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import FILE_PREFIX, file_path, portable_etag

__all__ = [
    "ParquetWriteResult",
    "iter_parquet_batches",
    "iter_parquet_shard",
    "write_parquet_shard",
]

#: Records per Arrow record batch when writing, and rows per conversion to Python when reading.
BATCH_ROWS: Final = 1024
#: When reading, pyarrow decodes batches of about this much column data (at most
#: MAX_DECODE_ROWS rows), PREFETCH_BATCHES ahead of the rows handed out.
DECODE_BATCH_BYTES: Final = 1024 * 1024
MAX_DECODE_ROWS: Final = 64 * 1024
PREFETCH_BATCHES: Final = 2
#: A row group is written once it holds this many rows or this many bytes of Arrow data.
ROW_GROUP_ROWS: Final = 64 * 1024
ROW_GROUP_BYTES: Final = 64 * 1024 * 1024

_INSTALL_HINT: Final = (
    "Parquet shards need pyarrow, which the 'parquet' extra installs: "
    'pip install "syvain-training-data[parquet]"'
)


def _pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or ModuleNotFoundError naming the extra to install."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(_INSTALL_HINT, name="pyarrow") from error
    return pyarrow, pyarrow.parquet


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


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
    pa, pq = _pyarrow()
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
    writer = pq.ParquetWriter(sink, schema, compression="zstd")
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


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------


def iter_parquet_shard(
    shard: ManifestShard,
    *,
    storage_config: StorageConfig | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Yields rows ``[start, stop)`` (default: all) of a Parquet shard as dicts, in file order,
    never more than ``shard.records``.

    Whole row groups before ``start`` are skipped from the Parquet metadata without being
    decoded, and reading stops after row ``stop - 1``. The record count is checked in full
    (exactly ``shard.records`` rows) when ``stop`` is ``shard.records``; otherwise the shard
    must hold at least ``stop`` rows.

    Raises:
        ValueError: at once, unless ``0 <= start <= stop <= shard.records``.
        ShardDataError (a RuntimeError): "Unreadable parquet shard {uri}: {reason}" when
            the bytes disagree with ``shard.size_bytes``, the file is not readable Parquet
            (chained to pyarrow's error), or the row count is wrong ("declared N records but
            yielded M", "declared N records but found more").
        OSError: a file:// shard that is not a regular file (a FIFO, a device, a directory),
            naming it, before it is read; not enough free space in the temporary directory to
            download an s3:// shard (ENOSPC, naming the shard, its size and the directory).
        FileNotFoundError, PermissionError, ObjectChangedError, StorageRetryExhaustedError:
            from the store, as :func:`syvain_training_data.storage.open_stream` raises them.
        ModuleNotFoundError: pyarrow is not installed (the ``parquet`` extra).
    """
    stop = _checked_stop(shard, start, stop)
    return _iter_rows(shard, storage_config, start, stop)


def iter_parquet_batches(
    shard: ManifestShard,
    *,
    storage_config: StorageConfig | None = None,
    columns: list[str] | None = None,
    batch_size: int = 8192,
    start: int = 0,
    stop: int | None = None,
) -> Iterator[Any]:
    """Yields rows ``[start, stop)`` of a Parquet shard as pyarrow record batches of at most
    ``batch_size`` rows, with the reads, checks and errors of :func:`iter_parquet_shard`.

    ``columns`` reads only those columns, in that order (one the file lacks is a column of
    nulls)."""
    stop = _checked_stop(shard, start, stop)
    return _iter_batches(shard, storage_config, start, stop, batch_size, columns)


def _checked_stop(shard: ManifestShard, start: int, stop: int | None) -> int:
    stop = shard.records if stop is None else stop
    if not (type(start) is int and type(stop) is int and 0 <= start <= stop <= shard.records):
        # The native readers' message, with the shard named.
        raise ValueError(
            f"Parquet shard {shard.uri}: Invalid record range start={start!r}, stop={stop!r} "
            f"for a shard of {shard.records} records; "
            f"expected 0 <= start <= stop <= {shard.records}"
        )
    return stop


def _iter_rows(
    shard: ManifestShard, storage_config: StorageConfig | None, start: int, stop: int
) -> Generator[dict[str, Any]]:
    batches = _iter_batches(shard, storage_config, start, stop, None, None)
    with contextlib.closing(batches):
        for batch in batches:
            for first in range(0, batch.num_rows, BATCH_ROWS):
                try:
                    rows = _rows(batch.slice(first, BATCH_ROWS))
                except Exception as error:
                    raise _unreadable(shard.uri, error) from error
                yield from rows


def _iter_batches(
    shard: ManifestShard,
    storage_config: StorageConfig | None,
    start: int,
    stop: int,
    batch_rows: int | None,
    columns: list[str] | None,
) -> Generator[Any]:
    """Arrow batches of the rows ``[start, stop)``, with the count and local-file checks."""
    pa, pq = _pyarrow()
    with _open_source(shard, storage_config) as source:
        local_etag = _check_local(shard, storage_config)
        position = start
        batches = _arrow_batches(pq, source, shard.uri, start, batch_rows, columns)
        try:
            for batch in batches:
                room = stop - position
                if batch.num_rows > room:
                    if room:
                        yield _select(pa, batch.slice(0, room), columns)
                    position = stop
                    if stop == shard.records:
                        raise _unreadable(
                            shard.uri, f"declared {shard.records} records but found more"
                        )
                    break
                position += batch.num_rows
                yield _select(pa, batch, columns)
                if position == stop < shard.records:
                    break
        finally:
            batches.close()
        if local_etag is not None:
            _check_local(shard, storage_config, local_etag)
        if position < stop:
            raise _unreadable(shard.uri, f"declared {shard.records} records but yielded {position}")


def _select(pa: Any, batch: Any, columns: list[str] | None) -> Any:
    """The ``columns`` of ``batch`` in that order, nulls for those it lacks."""
    if columns is None:
        return batch
    names = batch.schema.names
    arrays = [batch.column(name) if name in names else pa.nulls(batch.num_rows) for name in columns]
    return pa.RecordBatch.from_arrays(arrays, names=columns)


def _unreadable(uri: str, reason: object) -> ShardDataError:
    return ShardDataError.of("parquet", uri, reason)


def _check_local(
    shard: ManifestShard, storage_config: StorageConfig | None, etag: str | None = None
) -> str | None:
    """For a file:// shard, which is read in place rather than copied: checks its size and
    returns its etag (compared with ``etag``, the one seen when the read began); None for an
    s3:// shard. The check is repeated after the last row, so a file changed while it was read
    fails closed like a changed object in the store. A file:// etag in the manifest is not
    enforced (SPEC section 4: it does not survive a copy)."""
    if not shard.uri.startswith(FILE_PREFIX):
        return None
    info = storage.head_object(shard.uri, storage_config=storage_config)
    if info.size != shard.size_bytes:
        raise _unreadable(
            shard.uri,
            f"size mismatch: the object has {info.size} bytes but size_bytes is {shard.size_bytes}",
        )
    if etag is not None and info.etag != etag:
        raise ObjectChangedError(
            f"Object changed while reading {shard.uri} (etag {etag!r} no longer matches)"
        )
    return info.etag


@contextlib.contextmanager
def _open_source(shard: ManifestShard, storage_config: StorageConfig | None) -> Iterator[IO[bytes]]:
    """The shard's bytes as an open binary file: a file:// shard in place, an s3:// one
    downloaded into an unlinked temporary file (nothing to remove, even after a SIGKILL)."""
    if shard.uri.startswith(FILE_PREFIX):
        file = _open_local(shard.uri)
    else:
        file = _download(shard, storage_config)
    with file:
        yield file


def _open_local(uri: str) -> IO[bytes]:
    """Opens a file:// shard for reading; OSError naming it unless it is a regular file.

    Opened without blocking, then checked on the descriptor: a FIFO never hangs the reader and
    a path swapped after a check cannot slip through."""
    path = file_path(uri)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
            error_type = IsADirectoryError if stat.S_ISDIR(mode) else OSError
            raise error_type(
                errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
                f"Parquet shard {uri} is not a regular file (it is {kind})",
                path,
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _download(shard: ManifestShard, storage_config: StorageConfig | None) -> IO[bytes]:
    """Streams the shard into a new unlinked temporary file, returned rewound.

    Raises OSError (ENOSPC) at once when the temporary directory has less free space than the
    shard's size."""
    directory = tempfile.gettempdir()
    free = shutil.disk_usage(directory).free
    if free < shard.size_bytes:
        raise OSError(
            errno.ENOSPC,
            f"Not enough space to download parquet shard {shard.uri} ({shard.size_bytes} bytes) "
            f"into {directory} ({free} bytes free): free space there or set TMPDIR",
        )
    # Unlinked from the start (closed by the caller): a killed reader leaves nothing behind.
    file = tempfile.TemporaryFile(prefix="syvain-shard-", suffix=".parquet")  # noqa: SIM115
    try:
        try:
            with storage.open_stream(
                shard.uri,
                size_bytes=shard.size_bytes,
                etag=portable_etag(shard.uri, shard.etag) or None,
                storage_config=storage_config,
            ) as stream:
                for chunk in stream:
                    file.write(chunk)
        except ObjectDataError as error:
            # The stream's own data errors (size mismatch) are this shard's; store failures
            # (retry budget, changed object, ...) keep their types.
            raise _unreadable(shard.uri, error.reason) from error
        file.flush()
        file.seek(0)
    except BaseException:
        file.close()
        raise
    return file


def _arrow_batches(
    pq: Any,
    source: Any,
    uri: str,
    start: int,
    batch_rows: int | None,
    columns: list[str] | None,
) -> Generator[Any]:
    """Arrow batches of a Parquet file (a path or a pyarrow readable) from row ``start``, of
    ``batch_rows`` rows (None: about DECODE_BATCH_BYTES each), decoding only the file's
    columns among ``columns`` (None: all): whole row groups before ``start`` are skipped from
    the metadata, undecoded; pyarrow errors become RuntimeError."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        parquet = pq.ParquetFile(source)
        plain_schema = parquet.schema_arrow
        encoded = parquet_bounds.dictionary_columns(parquet)
        if encoded:  # opened again, its byte-array columns kept dictionary-encoded
            parquet.close()
            parquet = pq.ParquetFile(source, read_dictionary=encoded)
    except Exception as error:
        raise _unreadable(uri, error) from error

    def oversized(row: int, size: int) -> ShardDataError:
        return _unreadable(
            uri,
            f"a row decodes to {size} bytes, over the limit of "
            f"{parquet_bounds.MAX_ROW_BYTES} bytes per record",
        )

    with contextlib.closing(parquet):
        try:
            groups, skip = _row_groups_from(parquet.metadata, start)
            if not groups:
                return
            rows = batch_rows or _decode_batch_rows(parquet)
            # Declared list values bound a batch too: a long list costs a few bits of levels.
            nested = parquet_bounds.values_per_row(parquet.metadata)
            rows = max(
                1,
                min(
                    rows, parquet_bounds.PIECE_BYTES // parquet_bounds.NESTED_VALUE_BYTES // nested
                ),
            )
            if columns is not None:
                columns = [name for name in columns if name in parquet.schema_arrow.names]
            batches = _prefetch(
                parquet.iter_batches(batch_size=rows, row_groups=groups, columns=columns)
            )
        except Exception as error:
            raise _unreadable(uri, error) from error
        with contextlib.closing(batches):
            while True:
                try:
                    batch = next(batches, None)
                except Exception as error:
                    raise _unreadable(uri, error) from error
                if batch is None:
                    return
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                batch = batch.slice(skip) if skip else batch
                skip = 0
                yield from parquet_bounds.bounded_pieces(pa, pc, batch, plain_schema, oversized)


def _row_groups_from(metadata: Any, start: int) -> tuple[list[int], int]:
    """The row groups holding row ``start`` and after, and how many rows of the first of them
    come before ``start``."""
    first_row = 0
    for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        if first_row + rows > start:
            return list(range(index, metadata.num_row_groups)), start - first_row
        first_row += rows
    return [], 0


def _decode_batch_rows(parquet: Any) -> int:
    """Rows per decoded batch: about DECODE_BATCH_BYTES of the file's uncompressed column data,
    a multiple of BATCH_ROWS from BATCH_ROWS to MAX_DECODE_ROWS (small rows decode faster in
    bigger batches, big rows convert faster from batches that stay in the CPU caches)."""
    metadata = parquet.metadata
    groups = [metadata.row_group(index) for index in range(metadata.num_row_groups)]
    rows = sum(group.num_rows for group in groups)
    size = sum(group.total_byte_size for group in groups)
    per_row = max(1, size // max(1, rows))
    batch = DECODE_BATCH_BYTES // per_row // BATCH_ROWS * BATCH_ROWS
    return int(min(MAX_DECODE_ROWS, max(BATCH_ROWS, batch)))


def _prefetch(batches: Iterator[Any]) -> Generator[Any]:
    """``batches`` advanced in a helper thread, at most PREFETCH_BATCHES ahead: pyarrow decodes
    with the GIL released, so decoding the next batch overlaps building the rows of this one.
    Closing the generator (or its end, or an error) stops the thread and waits for it."""
    handoff: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=PREFETCH_BATCHES)
    stop = threading.Event()

    def offer(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.05)
            except queue.Full:
                continue
            return not stop.is_set()
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer(("batch", batch)):
                    return
            offer(("end", None))
        except BaseException as error:  # handed to the reading thread, raised there
            offer(("error", error))

    thread = threading.Thread(target=produce, name="syvain-parquet-decode", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = handoff.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                handoff.get_nowait()
        thread.join()


def _rows(batch: Any) -> list[dict[str, Any]]:
    """``batch.to_pylist()``, built in Rust; columns of types it leaves alone via pyarrow."""
    schema, array = batch.__arrow_c_array__()
    return _native.rows_from_arrow(schema, array, lambda index: batch.column(index).to_pylist())
