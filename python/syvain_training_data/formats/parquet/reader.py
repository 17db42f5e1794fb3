"""The Parquet shard reader: the shard read in place (a local file, or ranged reads of the
footer and of the column chunks decoded, :mod:`.ranged_file`), row groups before the range
skipped unfetched, batches decoded ahead in a helper thread, rows built in Rust (the rules are
in :mod:`syvain_training_data.formats.parquet`)."""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import stat
import threading
from collections.abc import Generator, Iterator
from typing import IO, Any, Final

from syvain_training_data import _native, storage
from syvain_training_data.errors import ObjectChangedError, ShardDataError, StorageError
from syvain_training_data.formats.parquet import bounds
from syvain_training_data.formats.parquet.extra import pyarrow_modules
from syvain_training_data.formats.parquet.ranged_file import RangedFile
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import FILE_PREFIX, file_path

__all__ = ["iter_parquet_batches", "iter_parquet_shard"]

#: Rows per conversion to Python (and the step of the decoded batch sizes).
BATCH_ROWS: Final = 1024
#: pyarrow decodes batches of about this much column data (at most MAX_DECODE_ROWS rows),
#: PREFETCH_BATCHES ahead of the rows handed out.
DECODE_BATCH_BYTES: Final = 1024 * 1024
MAX_DECODE_ROWS: Final = 64 * 1024
PREFETCH_BATCHES: Final = 2


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
            naming it, before it is read.
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
    pa, pq = pyarrow_modules()
    with _open_source(shard, storage_config) as source:
        local_etag = _check_local(shard, storage_config)
        position = start
        # Up to the declared end, every row group is read: rows past it are an error.
        last = None if stop == shard.records else stop
        batches = _arrow_batches(pq, source, shard.uri, start, last, batch_rows, columns)
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


# Raised by a ranged read of the object (through pyarrow, which passes them on unchanged).
# The store's failures, and a RangedFile's own data errors, keep their types (and words).
_STORE_ERRORS = (StorageError, FileNotFoundError, PermissionError, ShardDataError)


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
    """The shard's bytes as an open binary file, read in place: a file:// shard's file, or an
    object store's object through ranged reads (nothing is downloaded whole or written)."""
    file: IO[bytes]
    if shard.uri.startswith(FILE_PREFIX):
        file = _open_local(shard.uri)
    else:
        file = RangedFile(shard, storage_config)  # type: ignore[assignment]
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


def _arrow_batches(
    pq: Any,
    source: Any,
    uri: str,
    start: int,
    stop: int | None,
    batch_rows: int | None,
    columns: list[str] | None,
) -> Generator[Any]:
    """Arrow batches of a Parquet file (a path or a pyarrow readable) from row ``start``, of
    ``batch_rows`` rows (None: about DECODE_BATCH_BYTES each), decoding only the file's
    columns among ``columns`` (None: all): whole row groups before ``start``, and from
    ``stop`` on (None: none), are skipped from the metadata, never fetched nor decoded;
    pyarrow errors become RuntimeError."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        parquet = pq.ParquetFile(source)
        plain_schema = parquet.schema_arrow
        encoded = bounds.dictionary_columns(parquet)
        if encoded:  # opened again, its byte-array columns kept dictionary-encoded
            parquet.close()
            parquet = pq.ParquetFile(source, metadata=parquet.metadata, read_dictionary=encoded)
    except _STORE_ERRORS:  # the store's own failures keep their types
        raise
    except Exception as error:
        raise _unreadable(uri, error) from error

    def oversized(row: int, size: int) -> ShardDataError:
        return _unreadable(
            uri,
            f"a row decodes to {size} bytes, over the limit of "
            f"{bounds.MAX_ROW_BYTES} bytes per record",
        )

    with contextlib.closing(parquet):
        try:
            groups, skip = _row_groups_within(parquet.metadata, start, stop)
            if not groups:
                return
            rows = batch_rows or _decode_batch_rows(parquet)
            # Declared list values bound a batch too: a long list costs a few bits of levels.
            nested = bounds.values_per_row(parquet.metadata)
            rows = max(
                1,
                min(rows, bounds.PIECE_BYTES // bounds.NESTED_VALUE_BYTES // nested),
            )
            if columns is not None:
                columns = [name for name in columns if name in parquet.schema_arrow.names]
            batches = _prefetch(
                parquet.iter_batches(batch_size=rows, row_groups=groups, columns=columns)
            )
        except _STORE_ERRORS:  # the store's own failures keep their types
            raise
        except Exception as error:
            raise _unreadable(uri, error) from error
        with contextlib.closing(batches):
            while True:
                try:
                    batch = next(batches, None)
                except _STORE_ERRORS:  # the store's own failures keep their types
                    raise
                except Exception as error:
                    raise _unreadable(uri, error) from error
                if batch is None:
                    return
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                batch = batch.slice(skip) if skip else batch
                skip = 0
                yield from bounds.bounded_pieces(pa, pc, batch, plain_schema, oversized)


def _row_groups_within(metadata: Any, start: int, stop: int | None) -> tuple[list[int], int]:
    """The row groups holding rows ``[start, stop)`` (``stop`` None: to the file's end), and
    how many rows of the first of them come before ``start``. A range read stops before the
    next row group, so the decoder's read-ahead never fetches one it does not need."""
    groups: list[int] = []
    skip = first_row = 0
    for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        if stop is not None and first_row >= stop:
            break
        if first_row + rows > start:
            if not groups:
                skip = start - first_row
            groups.append(index)
        first_row += rows
    return groups, skip


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
