"""The Parquet reader (SPEC section 3) over real stores (SeaweedFS and the local directory
store): record counts, corrupt, changed and missing files, temporary files, the checks of a
local file read in place, and the decoding thread."""

from __future__ import annotations

import datetime
import io
import os
import queue
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parquet_helpers import encode, local_shard, parquet_records
from seaweed import config_for
from shards import publish
from syvain_training_data import ManifestShard, ObjectChangedError, storage
from syvain_training_data.formats.parquet import (
    iter_parquet_shard,
    reader,
    write_parquet_shard,
    writer,
)
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig


def test_round_trip_through_iter_shard(store_root):
    root, config = store_root
    records = parquet_records(3000)
    shard = publish(f"{root}/part.parquet", encode(records), config, len(records))
    rows = list(iter_shard("parquet", shard, storage_config=config))
    assert rows == records
    assert [list(row) for row in rows[:2]] == [list(records[0]), list(records[1])]


def test_declared_more_records_than_the_file_holds(store_root):
    root, config = store_root
    shard = publish(f"{root}/p.parquet", encode(parquet_records(10)), config, 12)
    rows = []
    with pytest.raises(RuntimeError) as info:
        rows.extend(iter_shard("parquet", shard, storage_config=config))
    assert str(info.value) == (
        f"Unreadable parquet shard {shard.uri}: declared 12 records but yielded 10"
    )
    assert len(rows) == 10


def test_declared_fewer_records_yields_exactly_those(store_root):
    root, config = store_root
    records = parquet_records(2000)
    shard = publish(f"{root}/p.parquet", encode(records), config, 1500)
    rows = []
    with pytest.raises(RuntimeError) as info:
        rows.extend(iter_shard("parquet", shard, storage_config=config))
    assert str(info.value) == (
        f"Unreadable parquet shard {shard.uri}: declared 1500 records but found more"
    )
    assert rows == records[:1500]


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: b"not a parquet file at all" * 10,
        lambda data: data[: len(data) // 2],
        lambda data: data[:100] + bytes(200) + data[300:],
    ],
    ids=["not-parquet", "truncated", "zeroed-pages"],
)
def test_corrupt_file_is_unreadable_with_the_decoders_reason(tmp_path, temp_dir, corrupt):
    data = corrupt(encode(parquet_records(500)))
    shard = local_shard(tmp_path, data, 500)
    with pytest.raises(RuntimeError) as info:
        list(iter_shard("parquet", shard, storage_config=StorageConfig()))
    prefix = f"Unreadable parquet shard {shard.uri}: "
    assert str(info.value).startswith(prefix)
    assert len(str(info.value)) > len(prefix) + 10  # the decoder's words
    assert list(temp_dir.iterdir()) == []


@pytest.mark.parametrize("delta", [-1, 1])
def test_size_mismatch_is_unreadable(store_root, temp_dir, delta):
    root, config = store_root
    data = encode(parquet_records(20))
    info = storage.put_object(f"{root}/p.parquet", data, storage_config=config)
    shard = ManifestShard(uri=info.uri, records=20, size_bytes=len(data) + delta)
    with pytest.raises(RuntimeError) as error:
        list(iter_shard("parquet", shard, storage_config=config))
    assert str(error.value).startswith(f"Unreadable parquet shard {shard.uri}: size mismatch")
    assert list(temp_dir.iterdir()) == []


def test_missing_object_is_file_not_found(tmp_path, temp_dir):
    shard = ManifestShard(uri=f"file://{tmp_path}/missing.parquet", records=1, size_bytes=10)
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        list(iter_shard("parquet", shard))
    assert list(temp_dir.iterdir()) == []


def test_changed_object_fails_closed(seaweed, s3_bucket, unique_prefix):
    config = config_for(seaweed)
    data = encode(parquet_records(5))
    shard = publish(f"s3://{s3_bucket}/{unique_prefix}/p.parquet", data, config, 5)
    stale = shard.model_copy(update={"etag": '"0123456789abcdef0123456789abcdef"'})
    with pytest.raises(ObjectChangedError):
        list(iter_shard("parquet", stale, storage_config=config))


def test_temporary_file_removed_after_read_early_close_and_error(store_root, temp_dir):
    root, config = store_root
    records = parquet_records(3000)
    shard = publish(f"{root}/t.parquet", encode(records), config, len(records))
    # An s3:// shard is downloaded to an unlinked temporary file; a file:// one read in place.

    assert list(iter_parquet_shard(shard, storage_config=config)) == records
    assert list(temp_dir.iterdir()) == []

    rows = iter_parquet_shard(shard, storage_config=config)
    assert next(rows) == records[0]
    assert list(temp_dir.iterdir()) == []
    rows.close()
    assert list(temp_dir.iterdir()) == []

    rows = iter_parquet_shard(shard, storage_config=config)
    next(rows)
    with pytest.raises(KeyError):
        rows.throw(KeyError("consumer failed"))
    assert list(temp_dir.iterdir()) == []

    wrong = shard.model_copy(update={"records": 10})
    with pytest.raises(RuntimeError, match="found more"):
        list(iter_parquet_shard(wrong, storage_config=config))
    assert list(temp_dir.iterdir()) == []


def test_local_shard_read_in_place_is_checked_before_and_after(tmp_path):
    records = parquet_records(3000)
    data = encode(records)
    shard = local_shard(tmp_path, data, len(records))
    path = Path(shard.uri[len("file://") :])

    short = shard.model_copy(update={"size_bytes": len(data) + 1})
    with pytest.raises(RuntimeError, match=r"Unreadable parquet shard .*size mismatch"):
        next(iter_parquet_shard(short))
    # SPEC 4: a local etag in the manifest is not enforced (it does not survive a copy).
    stale = shard.model_copy(update={"etag": "not-the-etag"})
    assert list(iter_parquet_shard(stale)) == records

    # The file is rewritten (same size, new mtime) while its rows are read: fails closed.
    rows = iter_parquet_shard(shard)
    assert next(rows) == records[0]
    path.write_bytes(data)
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    with pytest.raises(ObjectChangedError, match="s.parquet"):
        list(rows)


def test_rows_are_fresh_dicts_with_shared_keys(tmp_path):
    shard = local_shard(tmp_path, encode([{"key": i} for i in range(3000)]), 3000)
    rows = list(iter_parquet_shard(shard))
    assert rows == [{"key": i} for i in range(3000)]
    assert all(type(row) is dict for row in rows)
    keys = {id(next(iter(row))) for row in rows}
    assert len(keys) == 1
    rows[0]["key"] = "mutated"
    assert rows[1]["key"] == 1


def test_foreign_file_with_large_row_groups_and_fallback_types(tmp_path):
    # A file written by another tool: one big row group, types the Rust path leaves to pyarrow.
    count = 20_000
    source = pa.table(
        {
            "i": pa.array(range(count), pa.int32()),
            "when": pa.array(
                [
                    datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i)
                    for i in range(count)
                ],
                pa.timestamp("us"),
            ),
            "cat": pa.array([["x", "y", "z"][i % 3] for i in range(count)]).dictionary_encode(),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(source, buffer, row_group_size=count)
    shard = local_shard(tmp_path, buffer.getvalue(), count)
    assert list(iter_parquet_shard(shard)) == source.to_pylist()


def test_missing_pyarrow_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    hint = "pip install 'syvain-training-data[parquet]'"
    with pytest.raises(ModuleNotFoundError, match="'parquet' extra") as info:
        write_parquet_shard([{"a": 1}], tmp_path / "x.parquet")
    assert hint in str(info.value)
    shard = ManifestShard(uri=f"file://{tmp_path}/x.parquet", records=1, size_bytes=1)
    with pytest.raises(ModuleNotFoundError, match="'parquet' extra") as info:
        next(iter_shard("parquet", shard))
    assert hint in str(info.value)


# --- the decoding thread -----------------------------------------------------------------


def decode_threads() -> int:
    return sum(thread.name == "syvain-parquet-decode" for thread in threading.enumerate())


def decode_batches_of(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes the native reader decode batches of ``rows`` rows (by default about 1 MiB)."""
    real = reader.open_native

    def small(shard, config, start, stop, batch_rows, columns):  # type: ignore[no-untyped-def]
        return real(shard, config, start, stop, batch_rows or rows, columns)

    monkeypatch.setattr(reader, "open_native", small)


def test_decode_thread_stops_on_early_close_and_at_the_end(tmp_path, monkeypatch):
    decode_batches_of(reader.BATCH_ROWS, monkeypatch)
    full = threading.Event()

    class WatchedQueue(queue.Queue):
        """The helper's handoff queue, which tells when the helper finds it full."""

        def put(self, item, block=True, timeout=None):
            if self.full():
                full.set()
            super().put(item, block, timeout)

    monkeypatch.setattr(
        reader, "queue", SimpleNamespace(Queue=WatchedQueue, Full=queue.Full, Empty=queue.Empty)
    )
    records = parquet_records(8000)
    shard = local_shard(tmp_path, encode(records), len(records))
    rows = iter_parquet_shard(shard)
    assert next(rows) == records[0]
    # The helper fills its handoff queue and waits (a hang guard only, never a measure).
    assert full.wait(60), "the decode helper never filled its queue"
    assert decode_threads() == 1
    rows.close()
    assert decode_threads() == 0
    assert list(iter_parquet_shard(shard)) == records
    assert decode_threads() == 0


def test_decode_error_mid_file_is_unreadable(tmp_path, temp_dir, monkeypatch):
    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", 1024)
    decode_batches_of(reader.BATCH_ROWS, monkeypatch)
    records = parquet_records(6000)
    data = bytearray(encode(records))
    metadata = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    column = metadata.row_group(4).column(1)  # the text pages of the fifth row group
    start = column.data_page_offset + 64
    data[start : start + 256] = bytes(range(256))
    shard = local_shard(tmp_path, bytes(data), len(records))
    rows = []
    with pytest.raises(RuntimeError) as info:
        rows.extend(iter_parquet_shard(shard))
    assert str(info.value).startswith(f"Unreadable parquet shard {shard.uri}: ")
    assert rows == records[: len(rows)] and 0 < len(rows) <= 4 * 1024
    assert decode_threads() == 0
    assert list(temp_dir.iterdir()) == []


@pytest.mark.parametrize("delta", [-1, 1])
def test_size_mismatch_with_a_known_etag_is_unreadable(store_root, temp_dir, delta):
    """With the manifest's etag no HEAD is made: the first read's response checks the size."""
    root, config = store_root
    data = encode(parquet_records(20))
    info = storage.put_object(f"{root}/pinned.parquet", data, storage_config=config)
    shard = ManifestShard(
        uri=info.uri, records=20, size_bytes=len(data) + delta, etag=info.etag or "x"
    )
    with pytest.raises(RuntimeError) as error:
        list(iter_shard("parquet", shard, storage_config=config))
    assert str(error.value).startswith(f"Unreadable parquet shard {shard.uri}: size mismatch")
