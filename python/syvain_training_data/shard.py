"""`iter_shard` and `iter_shard_batches`: stream one shard's records (as dicts, or as Arrow
record batches), lazily, with the size and record-count checks.

msgpack.zstf and jsonl.gz are decoded in Rust straight from the resumable stream (records cross
into Python in batches, or are built into Arrow arrays in Rust); Parquet goes through pyarrow
(the ``parquet`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Protocol

from syvain_training_data.argument_checks import manifest_shard, storage_config_or_none
from syvain_training_data.formats import FORMATS, shard_format
from syvain_training_data.formats.shard_index import Segment, ShardIndex
from syvain_training_data.manifest import DataManifestDataFormat, ManifestShard
from syvain_training_data.storage import StorageConfig, open_shard, open_shard_batches
from syvain_training_data.uris import portable_etag

__all__ = ["ArrowRecordBatch", "iter_shard", "iter_shard_batches"]

BATCH_RECORDS = 1024
#: Default rows per batch of `iter_shard_batches`.
BATCH_ROWS = 8192


class ArrowRecordBatch(Protocol):
    """What `iter_shard_batches` yields: a record batch behind the Arrow PyCapsule interface
    (``pyarrow.record_batch(b)``, ``polars.DataFrame(b)``, ``arro3``, ``nanoarrow``)."""

    @property
    def num_rows(self) -> int: ...
    @property
    def column_names(self) -> list[str]: ...
    def __arrow_c_schema__(self) -> object: ...
    def __arrow_c_array__(
        self, requested_schema: object | None = None
    ) -> tuple[object, object]: ...


def iter_shard(
    data_format: DataManifestDataFormat,
    shard: ManifestShard,
    *,
    storage_config: StorageConfig | None = None,
    start: int = 0,
    stop: int | None = None,
    index: ShardIndex | Segment | None = None,
    readahead_bytes: int | None = None,
) -> Generator[Mapping[str, Any]]:
    """Yields the records of ``shard`` in order, never more than ``shard.records``.

    ``start`` and ``stop`` select the records with indices in ``[start, stop)`` (``stop``
    defaults to ``shard.records``; ValueError unless ``0 <= start <= stop <= shard.records``).
    Records before ``start`` are skipped without being decoded (msgpack.zstf frames are hopped
    by their length headers, jsonl.gz lines found by their "\\n"); a read that stops before the
    end only checks that the shard holds at least ``stop`` records. In jsonl.gz a record is a
    line holding a JSON object (other lines are logged and skipped, SPEC section 3).

    ``index`` (a msgpack.zstf shard's :class:`~syvain_training_data.formats.shard_index.ShardIndex`,
    read from ``{shard.uri}.index``) makes a range read one ranged GET from the index entry at
    or before ``start`` to the one at or after ``stop``: the bytes before and after the range
    are not fetched (or pass the :class:`~syvain_training_data.formats.shard_index.Segment` of
    it that holds the range). The segment is read as a shard of its own (every frame and count
    check applies to it), so a wrong index is an error, never wrong records. A jsonl.gz shard's
    index (``formats.gzip_index``, read by the loader) gives a
    :class:`~syvain_training_data.formats.shard_index.Segment` that enters the gzip stream at
    an access point; such an index is trusted as much as the folder it sits in (``syvain-data
    verify --deep`` checks it against its shard).

    ``readahead_bytes`` bounds the bytes fetched ahead of the decoder (64 KiB to 8 MiB, default
    8 MiB; msgpack.zstf and jsonl.gz), for many reads at once.

    The generator's ``close()`` (or leaving it to the garbage collector) stops the stream of a
    shard that is not read to its end.

    The bytes received are checked against ``shard.size_bytes`` and, at the end, the number of
    records against ``shard.records``. Errors: ShardDataError (a RuntimeError) "Unreadable
    {format} shard {uri}: {reason}" for bad data or counts; FileNotFoundError,
    PermissionError, ObjectChangedError and StorageRetryExhaustedError from the store;
    ValueError for an unknown format or an invalid range; TypeError, at the call, for a
    ``shard`` that is not a ManifestShard or a ``storage_config`` that is not a StorageConfig.
    """
    codec = shard_format(data_format).codec
    checked = manifest_shard(shard)
    config = storage_config_or_none(storage_config)
    if codec == "arrow":
        from syvain_training_data.formats.parquet import iter_parquet_shard

        return _lazily(
            lambda: iter_parquet_shard(checked, storage_config=config, start=start, stop=stop)
        )
    return _lazily(
        lambda: read_records(
            data_format,
            checked,
            config,
            start,
            stop,
            _segment(data_format, checked, start, stop, index),
            readahead_bytes=readahead_bytes,
        )
    )


def _lazily[T](start: Callable[[], Iterator[T]]) -> Generator[T]:
    """The items of ``start()``, called at the first ``next``: nothing is opened before."""
    yield from start()


def _segment(
    data_format: str,
    shard: ManifestShard,
    start: int,
    stop: int | None,
    index: ShardIndex | Segment | None,
) -> Segment | None:
    """The index's segment around a valid range (an invalid one is left for the native
    reader's ValueError)."""
    if isinstance(index, Segment):
        return index
    end = shard.records if stop is None else stop
    if (
        index is None
        or FORMATS[data_format].index != "frame_offsets"
        or not (type(start) is int and type(end) is int and 0 <= start < end <= shard.records)
    ):
        return None
    return index.segment(start, end)


def _open_args(
    shard: ManifestShard, start: int, stop: int | None, segment: Segment | None
) -> dict[str, Any]:
    """open_shard's arguments that pin the object (its size and etag) and say which records
    and bytes to read: the whole shard, or a segment of it read as a shard of its own."""
    pinned = {"size_bytes": shard.size_bytes, "etag": portable_etag(shard.uri, shard.etag) or None}
    if segment is None:
        return {**pinned, "records": shard.records, "start": start, "stop": stop}
    if segment.entry is not None:  # entered mid-stream: records count in the whole shard
        return {
            **pinned,
            "records": shard.records,
            "start": start,
            "stop": stop,
            "segment": (segment.byte_start, segment.byte_end),
            "entry": segment.entry,
        }
    end = shard.records if stop is None else stop
    return {
        **pinned,
        "records": segment.records,
        "start": start - segment.first,
        "stop": end - segment.first,
        "segment": (segment.byte_start, segment.byte_end),
    }


def read_records(
    data_format: DataManifestDataFormat,
    shard: ManifestShard,
    storage_config: StorageConfig | None,
    start: int,
    stop: int | None,
    segment: Segment | None,
    batch_records: int = BATCH_RECORDS,
    readahead_bytes: int | None = None,
) -> Generator[Mapping[str, Any]]:
    """`iter_shard` of a msgpack.zstf or jsonl.gz shard, decoding ``batch_records`` records at
    a time (the loader reads many ranges at once with small batches); with ``segment``, only
    its bytes are requested."""
    reader = open_shard(
        shard.uri,
        data_format,
        storage_config=storage_config,
        readahead_bytes=readahead_bytes,
        **_open_args(shard, start, stop, segment),
    )
    while batch := reader.next_batch(batch_records):
        yield from batch


def iter_shard_batches(
    data_format: DataManifestDataFormat,
    shard: ManifestShard,
    *,
    columns: Sequence[str] | None = None,
    storage_config: StorageConfig | None = None,
    batch_size: int = BATCH_ROWS,
    start: int = 0,
    stop: int | None = None,
    index: ShardIndex | Segment | None = None,
    readahead_bytes: int | None = None,
) -> Generator[ArrowRecordBatch]:
    """Yields the records ``[start, stop)`` of ``shard`` as Arrow record batches of at most
    ``batch_size`` rows (fewer once a batch's values take about 16 MiB), in order.

    msgpack.zstf and jsonl.gz records are built into Arrow arrays in Rust, off the GIL, under
    the schema rules of README "Columnar batches"; the batches implement the Arrow PyCapsule
    interface (no pyarrow needed), and ``int_list_buffers(column)`` hands a list-of-integers
    column to ``torch.frombuffer`` / ``numpy.frombuffer`` without a copy. Parquet shards yield
    pyarrow's own record batches (the ``parquet`` extra).

    ``columns`` builds only those top-level keys, in that order (a key no record holds is a
    column of nulls); the other values are skipped without being built. ``start``, ``stop``,
    ``index``, ``readahead_bytes``, the size and count checks and the errors are those of
    `iter_shard`; besides, a
    value the columns cannot hold (a str in an int column, an int beyond int64) is a RuntimeError
    "Unreadable {format} shard {uri}: column 'name' mixes int and str values".

    Like `iter_shard`, nothing is opened before the first batch is asked for, and ``close()``
    stops the stream of a shard not read to its end.
    """
    codec = shard_format(data_format).codec
    checked = manifest_shard(shard)
    config = storage_config_or_none(storage_config)
    if type(batch_size) is not int or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of column names, not a str")
    selected = None if columns is None else list(columns)
    if codec == "arrow":
        from syvain_training_data.formats.parquet import iter_parquet_batches

        return _lazily(
            lambda: iter_parquet_batches(
                checked,
                storage_config=config,
                columns=selected,
                batch_size=batch_size,
                start=start,
                stop=stop,
            )
        )
    return _lazily(
        lambda: open_shard_batches(
            checked.uri,
            data_format,
            storage_config=config,
            columns=selected,
            batch_size=batch_size,
            readahead_bytes=readahead_bytes,
            **_open_args(checked, start, stop, _segment(data_format, checked, start, stop, index)),
        )
    )
