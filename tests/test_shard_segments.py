"""Shard segments (`open_shard(..., segment=(byte_start, byte_end))`): a byte range of a shard
read as if it were a whole shard (block random access), on the local directory store and on
SeaweedFS; and `interleave`, the seeded order of labelled blocks."""

from __future__ import annotations

import os
import random
import re
import struct
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from native_codec import encode
from shards import small_records
from syvain_training_data import _native, storage
from syvain_training_data._native import StreamCounters
from syvain_training_data.storage import StorageConfig, native_storage

ZSTF = "msgpack.zstf"
COUNT = 300


def record_offsets(data: bytes) -> list[int]:
    """The byte offset of every record of a msgpack.zstf shard (8-byte big-endian length L,
    then L bytes), and the shard's size last."""
    offsets, position = [], 0
    while position < len(data):
        offsets.append(position)
        (length,) = struct.unpack_from(">Q", data, position)
        position += 8 + length
    assert position == len(data)
    return [*offsets, position]


@pytest.fixture
def zstf_shard(store_root) -> tuple[str, StorageConfig, bytes, list[int], int]:
    """(uri, config, data, record offsets and then the size, size) of a published shard."""
    root, config = store_root
    data = encode(ZSTF, small_records(COUNT))
    uri = f"{root}/part.{ZSTF}"
    info = storage.put_object(uri, data, storage_config=config)
    assert info.size == len(data)
    return uri, config, data, record_offsets(data), info.size


def read_segment(
    uri: str,
    config: StorageConfig,
    size: int,
    segment: tuple[int, int],
    declared: int,
    start: int = 0,
    stop: int | None = None,
    data_format: str = ZSTF,
) -> list[dict[str, Any]]:
    reader = native_storage(config).open_shard(
        uri,
        data_format,
        size_bytes=size,
        records=declared,
        start=start,
        stop=stop,
        segment=segment,
    )
    out: list[dict[str, Any]] = []
    while batch := reader.next_batch(1024):
        out.extend(batch)
    assert reader.records_yielded == len(out)
    return out


# (first record, end record) of a segment: the start, the middle, the end, one record, all.
SEGMENTS = [(0, 50), (37, 121), (250, COUNT), (99, 100), (0, COUNT)]


@pytest.mark.parametrize(("first", "end"), SEGMENTS)
def test_a_segment_yields_exactly_its_records(zstf_shard, first, end):
    uri, config, _data, offsets, size = zstf_shard
    expected = small_records(COUNT)[first:end]
    segment = (offsets[first], offsets[end])
    counters = StreamCounters()
    with counters:
        got = read_segment(uri, config, size, segment, end - first)
    assert got == expected
    assert counters.streams == 1
    # Only the segment's bytes were received (read to its end: exactly those).
    assert counters.bytes == offsets[end] - offsets[first]


def test_record_ranges_inside_a_segment(zstf_shard):
    uri, config, _data, offsets, size = zstf_shard
    first, end = 40, 140
    expected = small_records(COUNT)[first:end]
    segment = (offsets[first], offsets[end])
    for start, stop in ((0, 10), (10, 60), (99, 100), (50, None), (100, None), (5, 5)):
        got = read_segment(uri, config, size, segment, end - first, start, stop)
        assert got == expected[start:stop], (start, stop)
    counters = StreamCounters()
    with counters:
        assert read_segment(uri, config, size, segment, end - first, 0, 3) == expected[:3]
    assert 0 < counters.bytes <= offsets[end] - offsets[first]


def test_segment_batches(zstf_shard):
    uri, config, _data, offsets, size = zstf_shard
    first, end = 10, 210
    reader = native_storage(config).open_shard_batches(
        uri,
        ZSTF,
        size_bytes=size,
        records=end - first,
        start=5,
        stop=150,
        columns=["i"],
        batch_size=64,
        segment=(offsets[first], offsets[end]),
    )
    table = pa.Table.from_batches([pa.record_batch(batch) for batch in reader])
    assert table.column("i").to_pylist() == list(range(first + 5, first + 150))


def test_a_segment_not_on_a_frame_boundary_is_unreadable(zstf_shard):
    uri, config, _data, offsets, size = zstf_shard
    for segment in ((offsets[3] + 1, offsets[10]), (offsets[3], offsets[10] - 1)):
        with pytest.raises(RuntimeError, match=f"Unreadable {ZSTF} shard {re.escape(uri)}"):
            read_segment(uri, config, size, segment, 7)


def test_a_segment_with_the_wrong_record_count(zstf_shard):
    uri, config, _data, offsets, size = zstf_shard
    segment = (offsets[20], offsets[30])
    with pytest.raises(
        RuntimeError, match=f"shard {re.escape(uri)}: declared 11 records but yielded 10"
    ):
        read_segment(uri, config, size, segment, 11)
    with pytest.raises(
        RuntimeError, match=f"shard {re.escape(uri)}: declared 9 records but found more"
    ):
        read_segment(uri, config, size, segment, 9)
    # A partial range that ends before the segment's end is not checked against the count.
    assert read_segment(uri, config, size, segment, 11, 0, 5) == small_records(COUNT)[20:25]


def test_the_object_size_is_still_checked(zstf_shard):
    uri, config, _data, offsets, size = zstf_shard
    segment = (offsets[20], offsets[30])
    with pytest.raises(RuntimeError, match=f"shard {re.escape(uri)}: size mismatch"):
        read_segment(uri, config, size + 1, segment, 10)


@pytest.mark.parametrize(
    "segment",
    [(10, 10), (20, 10), (-1, 10), (0, "size+1"), ("size", "size+1"), (-5, -1)],
)
def test_a_bad_segment_is_a_value_error(zstf_shard, segment):
    uri, config, _data, _offsets, size = zstf_shard
    bounds = {"size": size, "size+1": size + 1}
    byte_start, byte_end = (bounds.get(bound, bound) for bound in segment)
    with pytest.raises(ValueError, match=f"Invalid segment .* of shard {re.escape(uri)}"):
        native_storage(config).open_shard(
            uri, ZSTF, size_bytes=size, records=1, segment=(byte_start, byte_end)
        )
    with pytest.raises(ValueError, match="Invalid segment"):
        native_storage(config).open_shard_batches(
            uri, ZSTF, size_bytes=size, records=1, batch_size=8, segment=(byte_start, byte_end)
        )


def test_a_jsonl_gz_segment_of_whole_gzip_members(store_root):
    root, config = store_root
    expected = small_records(60)
    first, second = encode("jsonl.gz", expected[:25]), encode("jsonl.gz", expected[25:])
    uri = f"{root}/part.jsonl.gz"
    size = storage.put_object(uri, first + second, storage_config=config).size
    assert size == len(first) + len(second)
    segment = (len(first), size)
    got = read_segment(uri, config, size, segment, 35, data_format="jsonl.gz")
    assert got == expected[25:]
    got = read_segment(uri, config, size, (0, len(first)), 25, 3, 9, data_format="jsonl.gz")
    assert got == expected[3:9]


# readahead_bytes: how far a read may run ahead of its consumer.

KIB, MIB = 1024, 1024 * 1024
BOUND = 256 * KIB
# ~20 MB of incompressible records, small enough that the decoder's own batches (1, 4, 16, 64
# records ahead of the caller) stay far below the bounds checked here.
BIG_RECORDS = 10_000
BIG_RECORD_BYTES = 2_000


def big_records() -> list[dict[str, Any]]:
    return [
        {"i": i, "blob": random.Random(i).randbytes(BIG_RECORD_BYTES)} for i in range(BIG_RECORDS)
    ]


@pytest.fixture
def big_shard(store_root) -> tuple[str, StorageConfig, int]:
    """(uri, config, size) of a published msgpack.zstf shard of about 20 MB."""
    root, config = store_root
    data = encode(ZSTF, big_records())
    assert len(data) > 20_000_000
    uri = f"{root}/big.{ZSTF}"
    assert storage.put_object(uri, data, storage_config=config).size == len(data)
    return uri, config, len(data)


# The most a bounded local read holds ahead of its consumer: the bytes buffered for it (the
# bound), the merged piece the producer holds while it waits for room (at most the bound) and
# the file read in flight (at most the bound); plus slack for reading /proc/self/io itself (a
# few hundred bytes a check).
AHEAD = 3 * BOUND + 128 * KIB


def read_chars() -> int:
    """Bytes this process has read with read(2) and friends: a local stream's reads show here,
    whether handed to the consumer yet or only buffered ahead of it."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")
@pytest.mark.parametrize("store_root", ["file"], indirect=True)
def test_readahead_bounds_a_local_shard_read(big_shard):
    # StreamCounters count the bytes handed to the decoder, not those buffered ahead of it, so
    # the bytes read from the file are what shows the readahead.
    uri, config, size = big_shard
    client = native_storage(config)

    def read_one(**readahead: int) -> tuple[Any, int]:
        before = read_chars()
        reader = client.open_shard(uri, ZSTF, size_bytes=size, records=BIG_RECORDS, **readahead)
        assert [record["i"] for record in reader.next_batch(1)] == [0]
        return reader, before

    counters = StreamCounters()  # the bytes handed to the decoder, live
    with counters:
        bounded, before = read_one(readahead_bytes=BOUND)

    def ahead() -> int:
        """Bytes read from the file and not handed to the decoder yet: the read-ahead."""
        return read_chars() - before - counters.bytes

    # Once the read has run ahead to its bound, it stays within AHEAD at every step to the
    # shard's end. The default runs 8 MiB ahead.
    assert wait_until(lambda: ahead() >= BOUND)
    taken = 1
    while batch := bounded.next_batch(100):
        taken += len(batch)
        assert ahead() <= AHEAD, taken
    assert (taken, counters.bytes) == (BIG_RECORDS, size)
    del bounded
    default, before = read_one()
    assert wait_until(lambda: read_chars() - before > 4 * MIB)
    del default


def test_readahead_bounds_a_stream(big_shard):
    uri, config, size = big_shard
    client = native_storage(config)
    local = uri.startswith("file://")
    before = read_chars() if local else 0
    with client.open_stream(uri, size, readahead_bytes=BOUND) as stream:
        got = [stream.read_chunk()]
        # The read runs ahead of the chunks taken (once it has started), never further than
        # the bound: buffered bytes, and for a local file the bytes read from it, checked
        # after every chunk to the end.
        assert wait_until(lambda: (stream.buffered_bytes or 0) > 0)
        while got[-1] is not None:
            buffered = stream.buffered_bytes
            assert buffered is not None and buffered <= BOUND
            if local:
                taken = sum(len(chunk) for chunk in got if chunk is not None)
                assert read_chars() - before <= taken + AHEAD, taken
            got.append(stream.read_chunk())
    assert all(len(chunk) <= BOUND for chunk in got if chunk is not None)
    assert sum(len(chunk) for chunk in got if chunk is not None) == size
    with client.open_stream(uri, size) as stream:
        assert stream.read_chunk()
        assert wait_until(lambda: (stream.buffered_bytes or 0) > 4 * MIB)


def test_a_bounded_shard_read_yields_every_record(big_shard):
    # Chunks larger than the bound (a local file's pieces, an S3 body's) pass in pieces.
    uri, config, size = big_shard
    client = native_storage(config)
    expected = big_records()
    counters = StreamCounters()
    with counters:
        reader = client.open_shard(
            uri, ZSTF, size_bytes=size, records=BIG_RECORDS, readahead_bytes=64 * KIB
        )
        got: list[dict[str, Any]] = []
        while batch := reader.next_batch(1000):
            got.extend(batch)
    assert got == expected
    assert (counters.streams, counters.bytes) == (1, size)
    batches = client.open_shard_batches(
        uri,
        ZSTF,
        size_bytes=size,
        records=BIG_RECORDS,
        columns=["i"],
        batch_size=4096,
        readahead_bytes=BOUND,
    )
    table = pa.Table.from_batches([pa.record_batch(batch) for batch in batches])
    assert table.column("i").to_pylist() == list(range(BIG_RECORDS))


@pytest.mark.parametrize("readahead_bytes", [1000, 2**40, 0, -1, 64 * KIB - 1, 8 * MIB + 1])
def test_a_readahead_out_of_range_is_a_value_error(zstf_shard, readahead_bytes):
    uri, config, _data, _offsets, size = zstf_shard
    client = native_storage(config)
    message = f"Invalid readahead_bytes {readahead_bytes}; expected 65536"
    with pytest.raises(ValueError, match=re.escape(message)):
        client.open_shard(
            uri, ZSTF, size_bytes=size, records=COUNT, readahead_bytes=readahead_bytes
        )
    with pytest.raises(ValueError, match=re.escape(message)):
        client.open_shard_batches(
            uri, ZSTF, size_bytes=size, records=COUNT, batch_size=8, readahead_bytes=readahead_bytes
        )
    with pytest.raises(ValueError, match=re.escape(message)):
        client.open_stream(uri, size, readahead_bytes=readahead_bytes)
    # The ends of the range are allowed.
    for bound in (64 * KIB, 8 * MIB):
        reader = client.open_shard(uri, ZSTF, size_bytes=size, records=COUNT, readahead_bytes=bound)
        got: list[dict[str, Any]] = []
        while batch := reader.next_batch(COUNT):
            got.extend(batch)
        assert got == small_records(COUNT)


# interleave: a seeded order of labelled blocks.


def labels(counts: list[int], seed: int) -> list[int]:
    out = _native.interleave(counts, seed)
    assert isinstance(out, bytes) and len(out) == 2 * sum(counts)
    return [label for (label,) in struct.iter_unpack("<H", out)]


def test_interleave_keeps_the_counts_and_is_pinned():
    counts = [5, 0, 17, 1, 300, 2]
    order = labels(counts, 1)
    assert Counter(order) == {k: c for k, c in enumerate(counts) if c}
    assert labels(counts, 1) == order
    assert labels(counts, 2) != order
    assert labels(list(range(10)), 3) != labels(list(range(10)), 4)
    # The same order forever (checkpoints store an epoch by its seed): pinned values.
    assert labels([2, 1, 3], 7) == [2, 2, 0, 2, 0, 1]
    assert labels([3, 2, 4, 1], 12345) == [0, 2, 1, 2, 2, 1, 2, 0, 3, 0]
    assert _native.interleave([], 0) == b""
    assert _native.interleave((0, 0), 5) == b""
    assert labels([0, 3], 2**64 - 1) == [1, 1, 1]
    # 65536 labels fit in u16.
    wide = labels([1] * 65536, 9)
    assert sorted(wide) == list(range(65536)) and wide != list(range(65536))


def test_interleave_is_uniform_enough():
    # Each of the 3 positions of [0, 0, 1] holds the 1 about a third of the time.
    seen = Counter(labels([2, 1], seed).index(1) for seed in range(3000))
    assert all(800 < seen[position] < 1200 for position in range(3)), seen


def test_interleave_refuses_bad_counts():
    with pytest.raises(ValueError, match="counts must be >= 0"):
        _native.interleave([3, -1], 0)
    with pytest.raises(ValueError, match="at most 65536"):
        _native.interleave([0] * 65537, 0)
    with pytest.raises(ValueError, match="2\\*\\*28"):
        _native.interleave([2**27, 2**27, 1], 0)
    with pytest.raises(ValueError, match="2\\*\\*28"):
        _native.interleave([2**62, 2**62], 0)
    with pytest.raises((OverflowError, TypeError)):
        _native.interleave([1], -1)
