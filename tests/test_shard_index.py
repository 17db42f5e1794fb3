"""The record offset index object (``formats.shard_index``): built from frames, parsed back,
hostile bytes refused with ValueError only, segments that cover exactly the asked records."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syvain_training_data.formats.shard_index import (
    FrameOffsets,
    ShardIndex,
    block_records,
    index_every,
)


def frames_of(lengths: list[int]) -> bytes:
    return b"".join(struct.pack(">Q", n) + b"z" * n for n in lengths)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=400), cut=st.integers(1, 50))
def test_an_index_built_from_chunks_points_at_every_kth_frame(lengths, cut):
    body = frames_of(lengths)
    frames = FrameOffsets()
    # The encoder hands out runs of whole frames.
    position = 0
    for first in range(0, len(lengths), cut):
        chunk_lengths = lengths[first : first + cut]
        chunk = frames_of(chunk_lengths)
        frames.add(chunk, position)
        position += len(chunk)
    index = frames.index(len(body))
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + 8 + n)
    assert list(index.offsets) == starts[:: index.every]
    assert ShardIndex.parse(index.to_bytes(), len(lengths), len(body)) == index
    for start in range(len(lengths)):
        for stop in (start + 1, len(lengths)):
            (first_byte, end_byte), records, a, b = index.segment(start, stop)
            first_record = start - a
            assert first_byte == starts[first_record]
            assert end_byte == (
                starts[first_record + records]
                if first_record + records < len(lengths)
                else len(body)
            )
            assert 0 <= a < b <= records and b - a == stop - start


def test_frames_kept_stay_bounded_for_any_record_count(monkeypatch):
    monkeypatch.setattr(FrameOffsets, "MAX_KEPT", 64)
    frames = FrameOffsets()
    frames.add(frames_of([1] * 10_000), 0)
    assert len(frames.kept) <= 65 and frames.records == 10_000
    index = frames.index(10_000 * 9)
    assert index.every % frames.step == 0
    assert list(index.offsets) == [i * 9 for i in range(0, 10_000, index.every)]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_hostile_index_bytes_are_a_value_error(data):
    with pytest.raises(ValueError):
        ShardIndex.parse(data, 100, 10_000)


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(-3, 120),
    deltas=st.lists(st.integers(-5, 20_000) | st.just(True) | st.floats(), max_size=12),
    records=st.integers(1, 1000),
    size=st.integers(1, 50_000),
)
def test_indexes_that_do_not_fit_the_shard_are_refused(every, deltas, records, size):
    document = {
        "deltas": deltas,
        "every": every,
        "records": records,
        "schema": "syvain-training-data-shard-index-v1",
        "size_bytes": size,
    }
    try:
        index = ShardIndex.parse(json.dumps(document).encode(), records, size)
    except ValueError:
        return
    # Whatever is accepted stays inside the shard, ascending, one entry per `every` records.
    offsets = list(index.offsets)
    assert offsets[0] == 0 and offsets == sorted(set(offsets)) and offsets[-1] < size
    assert len(offsets) == -(-records // index.every)


def test_an_index_of_another_shard_is_refused():
    index = FrameOffsets()
    index.add(frames_of([10] * 20), 0)
    data = index.index(360).to_bytes()
    with pytest.raises(ValueError, match="another shard"):
        ShardIndex.parse(data, 21, 360)
    with pytest.raises(ValueError, match="another shard"):
        ShardIndex.parse(data, 20, 361)


@given(records=st.integers(1, 2**62), size=st.integers(1, 2**62))
def test_blocks_start_at_index_entries_and_stay_few(records, size):
    every, block = index_every(records, size), block_records(records, size)
    assert 1 <= every <= block <= records
    assert block % every == 0 or block == records
    assert -(-records // block) <= 1 << 16
