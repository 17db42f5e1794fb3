"""Record-range reads (`start=`/`stop=`): the records [start, stop) of a shard, earlier ones
skipped without being decoded, reading stopped after the range, and the count rules of a
partial read."""

from __future__ import annotations

import gzip
import io
import logging
import struct
from typing import Any

import msgspec
import pytest
import zstandard

from native_codec import URI, encode, unreadable
from shards import NATIVE_FORMATS, publish, small_records
from syvain_training_data import _native
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig

COUNT = 40
# (start, stop): from the start / the middle / the end, to the middle / the end, and empty.
RANGES = [(0, 20), (0, COUNT), (13, 20), (13, COUNT), (COUNT, COUNT), (7, 7), (0, 0), (39, 40)]


def read(
    data_format: str,
    data: bytes,
    declared: int,
    start: int = 0,
    stop: int | None = None,
    chunk_size: int | None = None,
) -> list[dict[str, Any]]:
    reader = _native.shard_reader_from_bytes(
        data_format, URI, data, declared, chunk_size, start=start, stop=stop
    )
    out: list[dict[str, Any]] = []
    while batch := reader.next_batch(5):
        out.extend(batch)
    assert reader.records_yielded == len(out)
    return out


def read_error(data_format: str, data: bytes, declared: int, start: int, stop: int | None) -> str:
    with pytest.raises(RuntimeError) as info:
        read(data_format, data, declared, start, stop)
    return str(info.value)


def zstd_record(payload: bytes) -> bytes:
    frame = zstandard.ZstdCompressor(level=3).compress(payload)
    return struct.pack(">Q", len(frame)) + frame


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
@pytest.mark.parametrize(("start", "stop"), RANGES)
@pytest.mark.parametrize("chunk_size", [None, 3, 1000])
def test_range_yields_exactly_its_records(data_format, start, stop, chunk_size):
    expected = small_records(COUNT)
    data = encode(data_format, expected)
    got = read(data_format, data, COUNT, start, stop, chunk_size)
    assert got == expected[start:stop]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_stop_defaults_to_the_declared_count(data_format):
    expected = small_records(COUNT)
    assert read(data_format, encode(data_format, expected), COUNT, 25) == expected[25:]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
@pytest.mark.parametrize(("start", "stop"), [(-1, 3), (5, 4), (0, COUNT + 1), (COUNT + 1, None)])
def test_invalid_ranges_are_value_errors(data_format, start, stop):
    data = encode(data_format, small_records(COUNT))
    with pytest.raises(ValueError, match="Invalid record range"):
        _native.shard_reader_from_bytes(data_format, URI, data, COUNT, start=start, stop=stop)


def test_skipped_msgpack_frames_are_not_decompressed():
    # Frames 1 and 2 are not Zstandard, frame 3 is Zstandard around invalid MessagePack.
    good = [zstd_record(msgspec.msgpack.encode({"i": i})) for i in range(6)]
    bad = [struct.pack(">Q", 8) + b"notzstd!", struct.pack(">Q", 3) + b"abc"]
    data = good[0] + bad[0] + bad[1] + zstd_record(b"\x93\x01\x02\x03") + b"".join(good[4:])
    assert read("msgpack.zstf", data, 6, 4) == [{"i": 4}, {"i": 5}]
    assert read("msgpack.zstf", data, 6, 4, 5) == [{"i": 4}]
    assert read_error("msgpack.zstf", data, 6, 0, None) == unreadable(
        "msgpack.zstf", "invalid Zstandard frame"
    )


def test_skipped_jsonl_lines_are_not_built_nor_logged(caplog):
    # Records: 0 {"i":0}, 1 {"i":1}, 2 {"i":3}, 3 {"i":4}; "not json" and "[1]" are skipped
    # lines, never records, and before the range they are validated, not built or logged.
    body = b'{"i":0}\nnot json\n{"i":1}\n\n  \n[1]\n{"i":3}\n{"i":4}\n'
    data = gzip.compress(body)
    with caplog.at_level(logging.ERROR, logger="syvain_training_data"):
        assert read("jsonl.gz", data, 4, 3) == [{"i": 4}]
    assert caplog.records == []


def test_jsonl_range_indices_count_records_as_the_whole_read_does(caplog):
    # Records (JSON objects): 0 {"i":0}, 1 {"i":2}, 2 {"i":3}; "oops" is skipped by the reader,
    # so it is not a record in a range read either (it once was: a range then started a
    # record early). The range that reads past it logs it.
    body = b'{"i":0}\n\noops\n   \n{"i":2}\n{"i":3}\n'
    data = gzip.compress(body)
    with caplog.at_level(logging.ERROR, logger="syvain_training_data"):
        assert read("jsonl.gz", data, 3, 1, 2) == [{"i": 2}]
        assert read("jsonl.gz", data, 3, 2) == [{"i": 3}]
        assert read("jsonl.gz", data, 3, 0, 1) == [{"i": 0}]
    assert [r.getMessage() for r in caplog.records] == [f"Skipping invalid JSON record in {URI}:3"]
    with caplog.at_level(logging.CRITICAL, logger="syvain_training_data"):
        assert read("jsonl.gz", data, 3) == [{"i": 0}, {"i": 2}, {"i": 3}]
        for start, stop in [(0, 3), (1, 3), (0, 2), (2, 3)]:
            assert read("jsonl.gz", data, 3, start, stop) == read("jsonl.gz", data, 3)[start:stop]


def test_corrupt_length_headers_in_the_skipped_part_are_errors():
    good = zstd_record(msgspec.msgpack.encode({"i": 1}))
    cases = [
        (struct.pack(">Q", 0) + good, "invalid frame length"),
        (struct.pack(">Q", (256 << 20) + 1) + good, "invalid frame length"),
        (struct.pack(">Q", 10_000) + good, "truncated compressed frame"),
        (good[:5], "truncated 8-byte frame header"),
    ]
    for data, reason in cases:
        assert read_error("msgpack.zstf", data, 2, 1, 2) == unreadable("msgpack.zstf", reason)


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_shard_ending_before_stop_is_the_count_error(data_format):
    data = encode(data_format, small_records(10))
    for start, stop in ((3, 12), (11, 12), (0, 15), (12, 15)):
        assert read_error(data_format, data, 15, start, stop) == unreadable(
            data_format, "declared 15 records but yielded 10"
        )
    # The shard holds at least `stop` records: enough for a range ending before its end.
    assert read(data_format, data, 15, 3, 10) == small_records(10)[3:10]


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_end_checks_apply_only_when_the_range_reaches_the_end(data_format):
    data = encode(data_format, small_records(10))
    assert read_error(data_format, data, 9, 4, None) == unreadable(
        data_format, "declared 9 records but found more"
    )
    assert read(data_format, data, 12, 4, 9) == small_records(10)[4:9]
    garbage = data + b"junk"
    assert read(data_format, garbage, 10, 2, 9) == small_records(10)[2:9]
    with pytest.raises(RuntimeError, match=f"Unreadable {data_format} shard"):
        read(data_format, garbage, 10, 2, 10)


# Through a real store: SeaweedFS and the local directory store.


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_iter_shard_ranges_through_the_store(store_root, data_format):
    root, config = store_root
    expected = small_records(3000)
    shard = publish(f"{root}/part.{data_format}", encode(data_format, expected), config, 3000)
    for start, stop in ((0, 1000), (1500, None), (2999, 3000), (3000, None), (100, 100)):
        got = list(iter_shard(data_format, shard, storage_config=config, start=start, stop=stop))
        assert got == expected[start:stop], (start, stop)
    with pytest.raises(ValueError, match="Invalid record range"):
        list(iter_shard(data_format, shard, storage_config=config, start=10, stop=5))


@pytest.mark.parametrize("data_format", NATIVE_FORMATS)
def test_iter_shard_range_on_a_truncated_shard(store_root, data_format):
    root, config = store_root
    data = encode(data_format, small_records(50))
    shard = publish(f"{root}/short.{data_format}", data, config, 80)
    assert list(iter_shard(data_format, shard, storage_config=config, stop=50)) == small_records(50)
    with pytest.raises(RuntimeError, match="declared 80 records but yielded 50"):
        list(iter_shard(data_format, shard, storage_config=config, start=40, stop=60))


def test_parquet_range(tmp_path):
    from syvain_training_data.formats.parquet import write_parquet_shard

    rows = [{"i": i, "s": str(i)} for i in range(30)]
    buffer = io.BytesIO()
    write_parquet_shard(rows, buffer)
    data = buffer.getvalue()
    shard = publish(f"file://{tmp_path}/part.parquet", data, StorageConfig(), 30)
    assert list(iter_shard("parquet", shard, start=10, stop=20)) == rows[10:20]
    with pytest.raises(ValueError, match="Invalid record range"):
        list(iter_shard("parquet", shard, start=31))
