"""Access point index of a jsonl.gz shard: the optional object ``{shard_uri}.index`` (SPEC
section 6, seeded order and indexes, v4) that lets a reader enter the gzip stream at any block
with one ranged GET, the way ``formats.shard_index`` does for msgpack.zstf.

A deflate stream can be entered at a deflate block boundary given its bit offset and the 32 KiB
of text before it (zlib's zran.c). The index holds one entry per block of the seeded order
(``block_records`` records, a function of the manifest alone): the last deflate boundary (or
gzip member start) at or before the block's first record, with the window there, the text to
skip to the next line, the records and lines before that line, and the byte by which the
block's last record can be decoded. A block read then fetches its own compressed bytes, a
little before (less than one deflate block) and after, plus the entry (about 32 KiB). The
shard's own bytes do not change: other implementations read it as before and ignore the index.

Trust, as for msgpack.zstf: an index names the shard version it indexes (records, size, version
tag); a stale or foreign one is not used. Nothing pins its entries: an index that names the
right shard but holds wrong entries is trusted as much as the folder it sits in (the reader
checks that they fit the shard and the range), and ``syvain-data verify --deep`` rebuilds every
index from its shard and compares the bytes.

Bytes (little-endian)::

    b"SYVGZX01", records: u64, size_bytes: u64, version tag: 8 bytes, block: u64,
    then one slot per block: start_bit u64, skip u64, first_record u64, first_line u64,
    end_byte u64, window length u32, member_start u8, 3 zero bytes, then the window
    (32 KiB, zero-padded; no window room at all when the shard is one block).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from syvain_training_data import _native
from syvain_training_data.formats.shard_index import Segment, block_records

__all__ = ["MAGIC", "AccessPoint", "GzipIndexLayout", "build_gzip_index"]

MAGIC: Final = b"SYVGZX01"
HEADER: Final = struct.Struct("<8sQQ8sQ")
ENTRY: Final = struct.Struct("<QQQQQIB3x")
WINDOW_BYTES: Final = 32 << 10


@dataclass(frozen=True)
class AccessPoint:
    """Where a read of a block enters the shard (see the module docstring)."""

    start_bit: int
    member_start: bool
    skip: int
    first_record: int
    first_line: int
    end_byte: int
    window: bytes

    def to_bytes(self, window_room: int) -> bytes:
        fixed = ENTRY.pack(
            self.start_bit,
            self.skip,
            self.first_record,
            self.first_line,
            self.end_byte,
            len(self.window),
            int(self.member_start),
        )
        return fixed + self.window + bytes(window_room - len(self.window))


@dataclass(frozen=True)
class GzipIndexLayout:
    """Where the slots of the index of a jsonl.gz shard of ``records`` records in
    ``size_bytes`` bytes lie."""

    records: int
    size_bytes: int

    @property
    def block(self) -> int:
        return max(1, block_records(self.records, self.size_bytes))

    @property
    def blocks(self) -> int:
        return max(1, math.ceil(self.records / self.block))

    @property
    def window_room(self) -> int:
        return WINDOW_BYTES if self.blocks > 1 else 0

    @property
    def slot(self) -> int:
        return ENTRY.size + self.window_room

    @property
    def object_size(self) -> int:
        return HEADER.size + self.blocks * self.slot

    def header(self, version: bytes) -> bytes:
        return HEADER.pack(MAGIC, self.records, self.size_bytes, version, self.block)

    def header_problem(self, header: bytes, version: bytes | None) -> str | None:
        """What makes ``header`` (an index object's first bytes) an index of something other
        than this shard at ``version`` (None: any version), or None."""
        if len(header) < HEADER.size:
            return "it is not a jsonl.gz access point index"
        magic, records, size_bytes, found, block = HEADER.unpack_from(header)
        if magic != MAGIC:
            return "it is not a jsonl.gz access point index"
        if (records, size_bytes) != (self.records, self.size_bytes):
            return (
                f"it indexes a shard of {records} records in {size_bytes} bytes, not the "
                f"manifest's {self.records} records in {self.size_bytes} bytes"
            )
        if block != self.block:
            return f"it has blocks of {block} records, not {self.block}"
        if version is not None and found != version:
            return "it indexes another version of the shard (stale, or another shard's)"
        return None

    def slot_range(self, k: int, *, window: bool) -> tuple[int, int]:
        """Bytes [start, end) of block ``k``'s slot in the index object (its fixed part only,
        unless ``window``)."""
        start = HEADER.size + k * self.slot
        return start, start + (self.slot if window else ENTRY.size)

    def entry(self, data: bytes) -> AccessPoint:
        """The entry in a slot's bytes; ValueError when it does not fit the shard."""
        start_bit, skip, first_record, first_line, end_byte, window_len, member = ENTRY.unpack_from(
            data
        )
        window = data[ENTRY.size : ENTRY.size + window_len] if len(data) > ENTRY.size else b""
        start = start_bit // 8
        if not (
            start < self.size_bytes
            and start < end_byte <= self.size_bytes
            and member in (0, 1)
            and (not member or start_bit % 8 == 0)
            and window_len <= self.window_room
            and first_record <= self.records
        ):
            raise ValueError("its entry does not fit the shard")
        return AccessPoint(
            start_bit, bool(member), skip, first_record, first_line, end_byte, window
        )

    def segment(self, first: AccessPoint, end_byte: int) -> Segment:
        """The segment a read entering at ``first`` reads, through byte ``end_byte``."""
        unused_bits = (8 - first.start_bit % 8) % 8
        return Segment(
            byte_start=first.start_bit // 8,
            byte_end=max(end_byte, first.start_bit // 8 + 1),
            first=first.first_record,
            records=self.records - first.first_record,
            entry=(
                first.member_start,
                unused_bits,
                first.window,
                first.skip,
                first.first_record,
                first.first_line,
            ),
        )


def build_gzip_index(
    uri: str, chunks: Iterable[bytes | memoryview], records: int, size_bytes: int, version: bytes
) -> list[bytes]:
    """The index object (as chunks) of the jsonl.gz shard at ``uri`` streamed as ``chunks``,
    for the manifest's ``records`` and ``size_bytes`` at the version tagged ``version``.
    Holds about 32 KiB per block (under 1 % of the shard).

    Raises ShardDataError (naming the shard) when the bytes are not a valid jsonl.gz stream of
    ``records`` records in ``size_bytes`` bytes."""
    from syvain_training_data.errors import ShardDataError

    layout = GzipIndexLayout(records, size_bytes)
    points = _native.GzipAccessPoints(uri, layout.block)
    out = [layout.header(version)]
    fed = 0
    for chunk in chunks:
        points.feed(chunk)
        fed += len(chunk)
        out.extend(_slots(points, layout))
    points.finish()
    out.extend(_slots(points, layout))
    if fed != size_bytes:
        raise ShardDataError.of("jsonl.gz", uri, f"{fed} bytes, not the manifest's {size_bytes}")
    if points.records != records:
        found = f"declared {records} records but found {points.records}"
        raise ShardDataError.of("jsonl.gz", uri, found)
    if len(out) != 1 + layout.blocks:
        raise ShardDataError.of("jsonl.gz", uri, "its blocks do not match its record count")
    return out


def _slots(points: _native.GzipAccessPoints, layout: GzipIndexLayout) -> list[bytes]:
    return [AccessPoint(*entry).to_bytes(layout.window_room) for entry in points.take_entries()]
