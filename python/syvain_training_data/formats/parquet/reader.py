"""The Parquet shard reader: the shard read in place by the native arrow-rs reader (the
footer, then only the pages of the rows and columns read: row groups outside the range are
never fetched, and inside one only the pages the range falls in where the file has an offset
index), batches decoded ahead in a helper thread, dictionaries expanded in bounded pieces,
rows built in Rust (the rules are in :mod:`syvain_training_data.formats.parquet`)."""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import stat
import threading
from collections.abc import Generator, Iterator
from typing import Any, Final

from syvain_training_data import _native, storage
from syvain_training_data.errors import ObjectChangedError, ShardDataError, StorageError
from syvain_training_data.formats.parquet import bounds
from syvain_training_data.formats.parquet.extra import pyarrow_modules
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import FILE_PREFIX, file_path, portable_etag

__all__ = ["iter_parquet_batches", "iter_parquet_shard"]

#: Rows per conversion to Python.
BATCH_ROWS: Final = 1024
#: Batches decoded ahead of the rows handed out (each about 1 MiB of the file's column data,
#: sized by the native reader from the footer).
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
    pa, _ = pyarrow_modules()
    local_etag = _check_local(shard, storage_config)
    position = start
    # Up to the declared end, every row group is read: rows past it are an error.
    last = None if stop == shard.records else stop
    batches = _arrow_batches(pa, shard, storage_config, start, last, batch_rows, columns)
    try:
        for batch in batches:
            room = stop - position
            if batch.num_rows > room:
                if room:
                    yield _select(pa, batch.slice(0, room), columns)
                position = stop
                if stop == shard.records:
                    raise _unreadable(shard.uri, f"declared {shard.records} records but found more")
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


# The store's failures keep their types (and words).
_STORE_ERRORS = (StorageError, FileNotFoundError, PermissionError, ShardDataError)


def _unreadable(uri: str, reason: object) -> ShardDataError:
    return ShardDataError.of("parquet", uri, reason)


def _check_local(
    shard: ManifestShard, storage_config: StorageConfig | None, etag: str | None = None
) -> str | None:
    """For a file:// shard, which is read in place rather than copied: checks its size and
    returns its etag (compared with ``etag``, the one seen when the read began); None for a
    stored object. The check is repeated after the last row, so a file changed while it was
    read fails closed like a changed object in the store. A file:// etag in the manifest is
    not enforced (SPEC section 4: it does not survive a copy)."""
    if not shard.uri.startswith(FILE_PREFIX):
        return None
    _check_regular_file(shard.uri)
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


def _check_regular_file(uri: str) -> None:
    """OSError naming a file:// shard that is not a regular file (a FIFO would block the
    reader, a directory is no shard), before anything opens it."""
    path = file_path(uri)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # the store reports the missing object
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
        error_type = IsADirectoryError if stat.S_ISDIR(mode) else OSError
        raise error_type(
            errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
            f"Parquet shard {uri} is not a regular file (it is {kind})",
            path,
        )


def open_native(
    shard: ManifestShard,
    storage_config: StorageConfig | None,
    start: int,
    stop: int | None,
    batch_rows: int | None,
    columns: list[str] | None,
    etag: str | None = None,
) -> Any:
    """The native reader of rows ``[start, stop)`` (``stop`` None: to the file's end) of
    ``shard``, its footer read (``syvain_core::codec::parquet_read``): only the pages of
    those rows and ``columns`` are fetched. Every read is held to ``etag`` when given (a HEAD
    the caller made), else to the manifest's, else to the first response's."""
    return storage.open_parquet(
        shard.uri,
        storage_config,
        size_bytes=shard.size_bytes,
        etag=etag or portable_etag(shard.uri, shard.etag) or None,
        start=start,
        stop=stop,
        columns=columns,
        batch_rows=batch_rows,
        max_batch_values=bounds.PIECE_BYTES // bounds.NESTED_VALUE_BYTES,
    )


def _arrow_batches(
    pa: Any,
    shard: ManifestShard,
    storage_config: StorageConfig | None,
    start: int,
    stop: int | None,
    batch_rows: int | None,
    columns: list[str] | None,
) -> Generator[Any]:
    """Arrow batches of rows ``[start, stop)`` (``stop`` None: to the file's end) of the
    file's columns among ``columns`` (None: all), of ``batch_rows`` rows (None: about 1 MiB of
    column data), decoded ahead in a helper thread and expanded in bounded pieces."""
    import pyarrow.compute as pc

    uri = shard.uri
    try:
        native = open_native(shard, storage_config, start, stop, batch_rows, columns)
        plain_schema = pa.schema(native.plain_schema)
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

    batches = _prefetch(pa.record_batch(batch) for batch in native)
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
            yield from bounds.bounded_pieces(pa, pc, batch, plain_schema, oversized)


def _prefetch(batches: Iterator[Any]) -> Generator[Any]:
    """``batches`` advanced in a helper thread, at most PREFETCH_BATCHES ahead: the native
    reader fetches and decodes with the GIL released, so decoding the next batch overlaps
    building the rows of this one. Closing the generator (or its end, or an error) stops the
    thread and waits for it."""
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
