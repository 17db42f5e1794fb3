"""The record offset index object (``formats.shard_index``): built from frames, parsed back,
hostile bytes refused with ValueError only, segments that cover exactly the asked records, the
shard version it names."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syvain_training_data.formats import shard_index
from syvain_training_data.formats.shard_index import (
    EARLIER_MAGIC,
    HEADER,
    MAGIC,
    FrameOffsets,
    ShardIndex,
    block_records,
    index_every,
    kept_step,
    version_tag,
)

VERSION = version_tag("s3://b/k", '"0123abcd"')


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
    index = frames.index(len(body), VERSION)
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + 8 + n)
    assert list(index.offsets) == starts[:: index.layout.every]
    assert ShardIndex.parse(index.to_bytes(), len(lengths), len(body), VERSION) == index
    assert (
        FrameOffsets.of_chunks([body[i : i + cut] for i in range(0, len(body), cut)]).index(
            len(body), VERSION
        )
        == index
    )
    for start in range(len(lengths)):
        for stop in (start + 1, len(lengths)):
            segment = index.segment(start, stop)
            assert segment.byte_start == starts[segment.first]
            end = segment.first + segment.records
            assert segment.byte_end == (starts[end] if end < len(lengths) else len(body))
            assert segment.first <= start < stop <= end


def test_frames_kept_stay_bounded_for_any_record_count(monkeypatch):
    monkeypatch.setattr(shard_index, "MAX_KEPT", 64)
    frames = FrameOffsets()
    frames.add(frames_of([1] * 10_000), 0)
    assert len(frames.kept) <= 65 and frames.records == 10_000
    index = frames.index(10_000 * 9, VERSION)
    every = index.layout.every
    assert every % frames.step == 0 and frames.step == kept_step(10_000)
    assert list(index.offsets) == [i * 9 for i in range(0, 10_000, every)]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300))
def test_hostile_index_bytes_are_a_value_error(data):
    with pytest.raises(ValueError):
        ShardIndex.parse(data, 100, 10_000)


@settings(max_examples=300, deadline=None)
@given(
    records=st.integers(1, 300),
    size=st.integers(1, 50_000),
    offsets=st.lists(st.integers(-5, 60_000), max_size=40),
    magic=st.sampled_from([MAGIC, EARLIER_MAGIC, b"SYVIDX03"]),
    version=st.sampled_from([VERSION, VERSION, b"\0" * 8]),
)
def test_indexes_that_do_not_fit_the_shard_are_refused(records, size, offsets, magic, version):
    data = HEADER.pack(magic, records, size, version) + b"".join(
        struct.pack("<q", o) for o in offsets
    )
    try:
        index = ShardIndex.parse(data, records, size, VERSION)
    except ValueError:
        return
    # Whatever is accepted stays inside the shard, ascending, one entry per `every` records.
    found = list(index.offsets)
    assert found[0] == 0 and found == sorted(set(found)) and found[-1] < size
    assert len(found) == -(-records // index.layout.every)


def test_an_index_of_another_shard_or_version_is_refused():
    frames = FrameOffsets()
    frames.add(frames_of([10] * 20), 0)
    data = frames.index(360, VERSION).to_bytes()
    with pytest.raises(ValueError, match="20 records in 360 bytes"):
        ShardIndex.parse(data, 21, 360)
    with pytest.raises(ValueError, match="20 records in 360 bytes"):
        ShardIndex.parse(data, 20, 361)
    with pytest.raises(ValueError, match="another version of the shard"):
        ShardIndex.parse(data, 20, 360, version_tag("s3://b/k", "0123abce"))
    earlier = EARLIER_MAGIC + data[len(EARLIER_MAGIC) :]
    with pytest.raises(ValueError, match="earlier release"):
        ShardIndex.parse(earlier, 20, 360)


def test_a_version_tag_is_the_etag_or_a_local_files_mtime_and_size():
    assert version_tag("s3://b/k", '"abc"') == version_tag("s3://b/k", "abc")
    assert version_tag("s3://b/k", "abc") != version_tag("s3://b/k", "abd")
    # The local store's etag is inode-mtime-size: a copy that keeps the mtime keeps the tag.
    assert version_tag("file:///a", "11-5f-20") == version_tag("file:///b", "99-5f-20")
    assert version_tag("file:///a", "11-5f-20") != version_tag("file:///a", "11-60-20")


def test_frames_streamed_in_chunks_must_end_at_a_frame_boundary():
    body = frames_of([3, 5, 1])
    with pytest.raises(ValueError, match="frame boundary"):
        FrameOffsets.of_chunks([body[:-1]])
    with pytest.raises(ValueError, match="frame boundary"):
        FrameOffsets.of_chunks([body, b"\0\0"])
    assert list(FrameOffsets.of_chunks([body[i : i + 1] for i in range(len(body))]).kept) == [
        0,
        11,
        24,
    ]


@given(records=st.integers(1, 2**62), size=st.integers(1, 2**62))
def test_blocks_start_at_index_entries_and_stay_few(records, size):
    every, block = index_every(records, size), block_records(records, size)
    assert every >= 1 and 1 <= block <= records
    assert block % every == 0 or block == records
    assert -(-records // block) <= 1 << 16


@given(records=st.integers(1, 5000), kept=st.integers(1, 40))
def test_the_step_a_writer_keeps_follows_from_the_record_count(records, kept):
    """Readers compute `every` from the manifest alone: the writer's thinning must end on the
    step kept_step predicts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shard_index, "MAX_KEPT", kept)
        frames = FrameOffsets()
        for offset in range(0, records * 9, 9):
            frames._frame(offset)
        assert frames.step == kept_step(records)
        assert list(frames.kept) == list(range(0, records * 9, 9 * frames.step))
