"""Record offset index of a msgpack.zstf shard: the optional object ``{shard_uri}.index``
(SPEC section 6, seeded order) that lets a reader fetch any run of records with one ranged GET.

A msgpack.zstf record is a self-delimiting frame (8-byte length, then the frame), so the byte
offset of every ``every``-th record is all a reader needs to start anywhere. The index is
written by the saver after the data object and before the completion descriptor (and by
``cp --with-shards`` from the verified bytes); other implementations neither write nor read it.
It is never trusted for bounds: a reader checks what it reads of it against the manifest's
record count and size, and reads a segment of the shard as a shard of its own, so every frame
and count check of SPEC section 3 still applies and a wrong index is an error, never other
records.

Bytes (little-endian)::

    b"SYVIDX01", records: u64, size_bytes: u64, every: u64,
    then one u64 per ``every`` records: the byte offset of records 0, every, 2 x every, ...

``every`` follows from (records, size_bytes) alone (:func:`index_every`), so a reader that
knows the shard from the manifest computes where any entry lies and reads only the entries
around the records it wants: a few bytes per block, whatever the shard's size.
"""

from __future__ import annotations

import math
import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BLOCK_BYTES",
    "INDEX_SUFFIX",
    "FrameOffsets",
    "IndexLayout",
    "Segment",
    "ShardIndex",
    "block_records",
    "index_every",
]

INDEX_SUFFIX: Final = ".index"
MAGIC: Final = b"SYVIDX01"
HEADER: Final = struct.Struct("<8sQQQ")
ENTRY_BYTES: Final = 8
# One entry per about 1/1024 of a shard, and per 256 B to 2 KiB of it: a range that starts or
# ends inside a block fetches at most one stride around its records, and the entries a block
# read needs are about 4 KiB per MiB.
MIN_STRIDE_BYTES: Final = 256
MAX_STRIDE_BYTES: Final = 2048
# A block (the unit the seeded order permutes) spans about this many shard bytes: one ranged
# GET each (and one for its index entries), about 250 of each per GB. Smaller blocks mix no
# better (a batch draws from a window's 64 blocks whatever their size) and cost requests: over
# SeaweedFS, 4 MiB blocks load much closer to the unseeded rate than 1 MiB ones
# (benchmarks/shuffle.py, seeded over unseeded).
BLOCK_BYTES: Final = 4 * 1024 * 1024
# Blocks per shard at most (a 256 GiB shard has this many of 4 MiB).
MAX_SHARD_BLOCKS: Final = 1 << 16
# Offsets a writer holds while encoding (8 bytes each); beyond, it keeps every other one.
MAX_KEPT: Final = 1 << 20


def stride_bytes(size_bytes: int) -> int:
    """Shard bytes between two index entries, about."""
    return min(MAX_STRIDE_BYTES, max(MIN_STRIDE_BYTES, size_bytes // 1024))


def kept_step(records: int) -> int:
    """The step :class:`FrameOffsets` ends with for ``records`` records: the smallest power
    of two that keeps at most ``MAX_KEPT`` offsets."""
    step = 1
    while -(-records // step) > MAX_KEPT:
        step *= 2
    return step


def index_every(records: int, size_bytes: int) -> int:
    """Records between two index entries of a shard of ``records`` records in ``size_bytes``
    bytes: about ``stride_bytes`` worth, a multiple of what its writer kept."""
    share = round(records * stride_bytes(size_bytes) / max(size_bytes, 1))
    step = kept_step(records)
    return -(-max(1, min(records, share)) // step) * step


def block_records(records: int, size_bytes: int) -> int:
    """Records per block of an indexed shard: a whole number of index strides of about
    ``BLOCK_BYTES`` together, so every block starts at an index entry, and no more than
    ``MAX_SHARD_BLOCKS`` blocks per shard (the order plans a shard's blocks at once)."""
    every = index_every(records, size_bytes)
    strides = max(
        BLOCK_BYTES // stride_bytes(size_bytes), -(-records // (every * MAX_SHARD_BLOCKS))
    )
    return min(records, every * strides)


@dataclass(frozen=True)
class Segment:
    """Records ``[first, first + records)`` of a shard, at bytes ``[byte_start, byte_end)``:
    read as a shard of its own."""

    byte_start: int
    byte_end: int
    first: int
    records: int


@dataclass(frozen=True)
class IndexLayout:
    """Where the entries of the index of a shard of ``records`` records in ``size_bytes``
    bytes lie."""

    records: int
    size_bytes: int

    @property
    def every(self) -> int:
        return index_every(self.records, self.size_bytes)

    @property
    def entries(self) -> int:
        return math.ceil(self.records / self.every)

    @property
    def header(self) -> bytes:
        """The index object's first bytes."""
        return HEADER.pack(MAGIC, self.records, self.size_bytes, self.every)

    @property
    def object_size(self) -> int:
        return HEADER.size + ENTRY_BYTES * self.entries

    def entries_for(self, start: int, stop: int) -> tuple[int, int]:
        """[first, end) of the entries a read of records [start, stop) (start < stop) needs:
        the one at or before ``start``, through the one at or after ``stop`` (none when
        ``stop`` is past the last entry: the segment then ends with the shard)."""
        every = self.every
        return start // every, min(-(-stop // every) + 1, self.entries)

    def byte_range(self, first: int, end: int) -> tuple[int, int]:
        return HEADER.size + ENTRY_BYTES * first, HEADER.size + ENTRY_BYTES * end

    def segment(self, first: int, offsets: Sequence[int], start: int, stop: int) -> Segment:
        """The segment for records [start, stop), from ``offsets``, the entries from
        ``first`` on that ``entries_for`` named; ValueError when they do not fit the shard."""
        every, size = self.every, self.size_bytes
        previous = -1
        for k, offset in enumerate(offsets):
            low = 0 if previous < 0 else previous + 9 * every
            if not low <= offset < size or (first + k == 0 and offset != 0):
                raise ValueError("its offsets do not step forward inside the shard's bytes")
            previous = offset
        end_entry = -(-stop // every)
        first_record = first * every
        if end_entry < self.entries:
            end_byte, end_record = offsets[end_entry - first], end_entry * every
        else:
            end_byte, end_record = size, self.records
        return Segment(offsets[0], end_byte, first_record, end_record - first_record)


class FrameOffsets:
    """The byte offsets of a msgpack.zstf shard's records as the encoder writes them, kept
    every ``step``-th record; ``step`` doubles whenever more than ``MAX_KEPT`` are held, so
    the memory stays bounded whatever the shard's record count."""

    def __init__(self) -> None:
        self.kept: array[int] = array("q")
        self.step = 1
        self.records = 0

    def add(self, chunk: bytes | memoryview, base: int) -> None:
        """Notes the frames of ``chunk``, a run of whole frames starting at byte ``base``."""
        view = memoryview(chunk)
        position, end = 0, len(view)
        while position < end:
            self._frame(base + position)
            position += 8 + int.from_bytes(view[position : position + 8], "big")
        if position != end:
            raise ValueError("An encoded msgpack.zstf chunk does not end at a frame boundary")

    @classmethod
    def of_file(cls, path: str) -> FrameOffsets:
        """The frames of a whole msgpack.zstf shard in a local file (its records already
        checked), found by their length headers."""
        frames = cls()
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            position = 0
            while position < size:
                frames._frame(position)
                file.seek(position)
                position += 8 + int.from_bytes(file.read(8), "big")
        if position != size:
            raise ValueError(f"{path} does not end at a msgpack.zstf frame boundary")
        return frames

    def _frame(self, offset: int) -> None:
        if self.records % self.step == 0:
            self.kept.append(offset)
        self.records += 1
        if len(self.kept) > MAX_KEPT:
            self.kept = self.kept[::2]
            self.step *= 2

    def index(self, size_bytes: int) -> ShardIndex:
        """The shard's index: an entry every ``index_every`` records."""
        every = index_every(self.records, size_bytes)
        return ShardIndex(self.records, size_bytes, self.kept[:: every // self.step])


@dataclass(frozen=True)
class ShardIndex:
    """A whole index: the byte offsets of records 0, ``every``, 2 x ``every``, ... of a shard
    of ``records`` records in ``size_bytes`` bytes."""

    records: int
    size_bytes: int
    offsets: Sequence[int]

    @property
    def layout(self) -> IndexLayout:
        return IndexLayout(self.records, self.size_bytes)

    def to_bytes(self) -> bytes:
        return self.layout.header + array("q", self.offsets).tobytes()

    @classmethod
    def parse(cls, data: bytes, records: int, size_bytes: int) -> ShardIndex:
        """The index in ``data`` for a shard the manifest says holds ``records`` records in
        ``size_bytes`` bytes; ValueError saying what is wrong with anything else."""
        layout = IndexLayout(records, size_bytes)
        if len(data) != layout.object_size:
            raise ValueError(f"it holds {len(data)} bytes, not the {layout.object_size} expected")
        magic, found_records, found_size, every = HEADER.unpack_from(data)
        if magic != MAGIC:
            raise ValueError("it is not a syvain-training-data shard index")
        if (found_records, found_size, every) != (records, size_bytes, layout.every):
            raise ValueError("it describes another shard (records, size_bytes or every differ)")
        offsets = array("q", data[HEADER.size :])
        layout.segment(0, offsets, 0, 1)  # checks every offset
        return cls(records, size_bytes, offsets)

    def segment(self, start: int, stop: int) -> Segment:
        """The segment that holds records [start, stop) (start < stop)."""
        first, end = self.layout.entries_for(start, stop)
        return self.layout.segment(first, self.offsets[first:end], start, stop)
