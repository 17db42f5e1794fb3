"""`iter_shard`: stream one shard's records, lazily, with the size and record-count checks.

msgpack.zstf and jsonl.gz are decoded in Rust straight from the resumable stream (records cross
into Python in batches); Parquet goes through pyarrow (the ``parquet`` extra).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from syvain_training_data.manifest import DATA_FORMATS, DataManifestDataFormat, ManifestShard
from syvain_training_data.storage import StorageConfig, native_storage

__all__ = ["iter_shard"]

NATIVE_FORMATS = ("msgpack.zstf", "jsonl.gz")
BATCH_RECORDS = 1024


def iter_shard(
    data_format: DataManifestDataFormat,
    shard: ManifestShard,
    *,
    storage_config: StorageConfig | None = None,
    start: int = 0,
    stop: int | None = None,
) -> Generator[Mapping[str, Any]]:
    """Yields the records of ``shard`` in order, never more than ``shard.records``.

    ``start`` and ``stop`` select the records with indices in ``[start, stop)`` (``stop``
    defaults to ``shard.records``; ValueError unless ``0 <= start <= stop <= shard.records``).
    Records before ``start`` are skipped without being decoded (msgpack.zstf frames are hopped
    by their length headers, jsonl.gz lines found by their "\\n"); a read that stops before the
    end only checks that the shard holds at least ``stop`` records. In a jsonl.gz range read a
    record index counts the non-blank lines, invalid ones included.

    The generator's ``close()`` (or leaving it to the garbage collector) stops the stream of a
    shard that is not read to its end.

    The bytes received are checked against ``shard.size_bytes`` and, at the end, the number of
    records against ``shard.records``. Errors: ShardDataError (a RuntimeError) "Unreadable
    {format} shard {uri}: {reason}" for bad data or counts; FileNotFoundError,
    PermissionError, ObjectChangedError and StorageRetryExhaustedError from the store;
    ValueError for an unknown format or an invalid range.
    """
    if data_format not in DATA_FORMATS:
        raise ValueError(
            f"Unknown data format {data_format!r}; expected one of {', '.join(DATA_FORMATS)}"
        )
    if data_format == "parquet":
        from syvain_training_data.formats.parquet import iter_parquet_shard

        yield from iter_parquet_shard(shard, storage_config=storage_config, start=start, stop=stop)
        return
    reader = native_storage(storage_config or StorageConfig()).open_shard(
        shard.uri,
        data_format,
        size_bytes=shard.size_bytes,
        records=shard.records,
        etag=shard.etag or None,
        start=start,
        stop=stop,
    )
    while batch := reader.next_batch(BATCH_RECORDS):
        yield from batch
