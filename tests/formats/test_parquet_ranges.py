"""The Parquet reader's row ranges (row groups before the range skipped undecoded, the count
rules of a partial read), reading an object in place (only the footer and the column chunks
decoded are fetched), what it refuses before reading (special files); a killed reader leaves
no temporary file."""

from __future__ import annotations

import io
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parquet_helpers import encode, local_shard, parquet_records
from seaweed import config_for
from shards import publish
from syvain_training_data import ManifestShard
from syvain_training_data.formats.parquet import iter_parquet_shard

RANGE_ROWS = 1000


GROUP_ROWS = 100  # ten row groups of 100 rows


def grouped_parquet() -> tuple[list[dict[str, Any]], bytes]:
    records = [{"id": index, "text": f"row {index}"} for index in range(RANGE_ROWS)]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink, row_group_size=GROUP_ROWS)
    return records, sink.getvalue()


@pytest.mark.parametrize(
    ("start", "stop"),
    [
        (0, RANGE_ROWS),
        (0, 0),
        (0, 1),
        (100, 300),  # row-group boundaries
        (150, 420),  # inside groups
        (99, 101),
        (250, 250),
        (999, 1000),
        (1000, 1000),
        (830, None),
    ],
)
def test_row_ranges(store_root, start, stop):
    root, config = store_root
    records, data = grouped_parquet()
    shard = publish(f"{root}/ranges.parquet", data, config, RANGE_ROWS)
    rows = list(iter_parquet_shard(shard, storage_config=config, start=start, stop=stop))
    assert rows == records[start:stop]


def test_row_groups_before_start_are_not_decoded(tmp_path):
    records, data = grouped_parquet()
    corrupt = bytearray(data)
    metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    for group in range(3):  # garble every page of the first three row groups
        for index in range(metadata.num_columns):
            column = metadata.row_group(group).column(index)
            first = column.dictionary_page_offset or column.data_page_offset
            corrupt[first : first + column.total_compressed_size] = bytes(
                column.total_compressed_size
            )
    shard = local_shard(tmp_path, bytes(corrupt), RANGE_ROWS)
    with pytest.raises(RuntimeError, match="Unreadable parquet shard"):
        list(iter_parquet_shard(shard))
    assert list(iter_parquet_shard(shard, start=300)) == records[300:]
    assert list(iter_parquet_shard(shard, start=310, stop=320)) == records[310:320]


def test_counts_with_ranges(store_root):
    root, config = store_root
    records, data = grouped_parquet()
    # The manifest claims more rows than the file holds: a range inside what it holds reads.
    more = publish(f"{root}/more.parquet", data, config, RANGE_ROWS + 200)
    assert list(iter_parquet_shard(more, storage_config=config, stop=500)) == records[:500]
    with pytest.raises(RuntimeError, match=f"declared {RANGE_ROWS + 200} records but yielded"):
        list(iter_parquet_shard(more, storage_config=config, start=900, stop=1100))
    with pytest.raises(RuntimeError, match="but yielded 1000"):
        list(iter_parquet_shard(more, storage_config=config, start=900))
    # It claims fewer: the full count check applies when stop is the declared count.
    fewer = publish(f"{root}/fewer.parquet", data, config, 800)
    assert list(iter_parquet_shard(fewer, storage_config=config, stop=799)) == records[:799]
    rows: list[Any] = []
    with pytest.raises(RuntimeError, match="declared 800 records but found more"):
        rows.extend(iter_parquet_shard(fewer, storage_config=config, start=750))
    assert rows == records[750:800]


@pytest.mark.parametrize(
    ("start", "stop"), [(-1, None), (0, RANGE_ROWS + 1), (5, 4), (True, None), (0, 2.0)]
)
def test_bad_ranges_are_value_errors_at_once(tmp_path, start, stop):
    shard = ManifestShard(uri=f"file://{tmp_path}/none.parquet", records=RANGE_ROWS, size_bytes=1)
    with pytest.raises(ValueError, match="none.parquet"):
        iter_parquet_shard(shard, start=start, stop=stop)


# --- special files and temporary space --------------------------------------------------------


def test_a_fifo_or_device_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null"), Path("/dev/zero")):
        shard = ManifestShard(uri=f"file://{path}", records=1, size_bytes=100)
        with pytest.raises(OSError, match="not a regular file") as info:
            next(iter_parquet_shard(shard))
        assert str(path) in str(info.value)
    directory = ManifestShard(uri=f"file://{tmp_path}", records=1, size_bytes=100)
    with pytest.raises(IsADirectoryError, match="not a regular file"):
        next(iter_parquet_shard(directory))


def served_and_tracked(
    seaweed: Any, key: str, text_bytes: int, seed: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, list[dict[str, Any]], bytes, ManifestShard, list[Any]]:
    """(config, records, bytes, shard) of a Parquet shard of RANGE_ROWS rows in row groups of
    GROUP_ROWS on SeaweedFS at ``key``, and the native readers opened from then on (each
    counts the requests and bytes it fetched: ``fetched``)."""
    from syvain_training_data.formats.parquet import reader

    config = config_for(seaweed)
    rng = random.Random(seed)
    records = [{"id": i, "text": rng.randbytes(text_bytes).hex()} for i in range(RANGE_ROWS)]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records), sink, row_group_size=GROUP_ROWS)
    data = sink.getvalue()
    shard = publish(key, data, config, RANGE_ROWS)
    opened: list[Any] = []
    real = reader.open_native

    def tracked(*args: Any) -> Any:
        native = real(*args)
        opened.append(native)
        return native

    monkeypatch.setattr(reader, "open_native", tracked)
    return config, records, data, shard, opened


def test_an_s3_shard_is_read_in_place_fetching_only_what_is_decoded(
    seaweed, s3_bucket, unique_prefix, monkeypatch
):
    """No temporary file and no whole download: the footer, then the column chunks of the row
    groups the range needs (and only the columns selected)."""
    from syvain_training_data.formats.parquet import iter_parquet_batches

    key = f"s3://{s3_bucket}/{unique_prefix}/r.parquet"
    config, records, data, shard, opened = served_and_tracked(seaweed, key, 500, 0, monkeypatch)
    monkeypatch.setattr(tempfile, "TemporaryFile", None)  # nothing may spool to disk
    rows = list(iter_parquet_shard(shard, storage_config=config, start=905, stop=915))
    assert rows == records[905:915]
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    group = metadata.row_group(9)
    group_bytes = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
    assert opened[-1].fetched[1] <= group_bytes + 64 * 1024 + 8, (opened[-1].fetched[1], len(data))
    assert opened[-1].fetched[1] < len(data) / 4
    batches = list(
        iter_parquet_batches(shard, storage_config=config, columns=["id"], start=0, stop=RANGE_ROWS)
    )
    assert [i for b in batches for i in b.column("id").to_pylist()] == list(range(RANGE_ROWS))
    ids = sum(
        metadata.row_group(g).column(0).total_compressed_size
        for g in range(metadata.num_row_groups)
    )
    assert opened[-1].fetched[1] <= ids + 64 * 1024 + 8, (opened[-1].fetched[1], ids, len(data))


def test_a_whole_read_fetches_each_byte_once_and_a_range_stops_at_its_row_groups(
    seaweed, s3_bucket, unique_prefix, monkeypatch
):
    """The footer read is kept, so the column chunks it covers are not fetched again (a small
    shard was 1.07x its bytes); a range read fetches no row group past its end, however far
    the decoder reads ahead."""
    key = f"s3://{s3_bucket}/{unique_prefix}/w.parquet"
    config, records, data, shard, opened = served_and_tracked(seaweed, key, 200, 1, monkeypatch)
    assert list(iter_parquet_shard(shard, storage_config=config)) == records
    assert opened[-1].fetched[1] <= len(data), (opened[-1].fetched[1], len(data))
    assert list(iter_parquet_shard(shard, storage_config=config, start=0, stop=15)) == records[:15]
    second = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(1)
    chunks = [second.column(c) for c in range(second.num_columns)]
    group_0_end = min(c.dictionary_page_offset or c.data_page_offset for c in chunks)
    footer = 64 * 1024 + 8
    assert opened[-1].fetched[1] <= group_0_end + footer, (opened[-1].fetched[1], group_0_end)


_KILLED_READER = """
import sys
from syvain_training_data import ManifestShard, SyvainTrainingData
from syvain_training_data.formats.parquet import iter_parquet_shard
shard = ManifestShard.model_validate_json(sys.argv[1])
rows = iter_parquet_shard(shard, storage_config=SyvainTrainingData.from_env().storage_config)
next(rows)
print("reading", flush=True)
sys.stdin.read()
"""


def test_a_killed_reader_leaves_no_temporary_file(seaweed, s3_bucket, unique_prefix, tmp_path):
    import signal
    import subprocess

    config = config_for(seaweed)
    shard = publish(
        f"s3://{s3_bucket}/{unique_prefix}/k.parquet", encode(parquet_records(3000)), config, 3000
    )
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, **seaweed.env(), "TMPDIR": str(temp)}
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED_READER, shard.model_dump_json()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"reading\n"
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGKILL
    assert list(temp.iterdir()) == []
