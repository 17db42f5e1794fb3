"""Access point index of a jsonl.gz shard: the optional object ``{shard_uri}.index`` (SPEC
section 6, seeded order and indexes, v4) that lets a reader enter the gzip stream at any block
with one ranged GET, the way ``formats.shard_index`` does for msgpack.zstf.

A deflate stream can be entered at a deflate block boundary given its bit offset and the 32 KiB
of text before it (zlib's zran.c). The index holds an access point every ``step`` records
(about every 512 KiB of the shard, and at most a block of the seeded order apart: functions of
the manifest alone): the last deflate boundary (or gzip member start) at or before the step's
first record, with the window there (deflate-compressed), the text to skip to the next line,
the records and lines before that line, and the byte by which the step's last record can be
decoded. A range read then fetches from the access point at or before its first record to the
end of its last step (less than a step and a deflate block more than its own bytes), plus one
slot of the index (a compressed window: about 13 KiB for text). The shard's own bytes do not
change: other implementations read it as before and ignore the index.

Trust, as for msgpack.zstf: an index names the shard version it indexes (records, size, version
tag); a stale or foreign one is not used. Nothing pins its entries: an index that names the
right shard but holds wrong entries is trusted as much as the folder it sits in (the reader
checks that they fit the shard and the range), and ``syvain-data verify --deep`` rebuilds every
index from its shard and compares the bytes.

Bytes (little-endian)::

    b"SYVGZX01", records: u64, size_bytes: u64, version tag: 8 bytes, step: u64,
    window room: u32, 4 zero bytes,
    then one slot per step: start_bit u64, skip u64, first_record u64, first_line u64,
    end_byte u64, window length u32, member_start u8, 3 zero bytes, then the window (raw
    deflate of at most 32 KiB of text, zero-padded to the room: the longest window's length).
"""

from __future__ import annotations

import dataclasses
import math
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from syvain_training_data import _native
from syvain_training_data.formats.shard_index import Segment, block_records

__all__ = ["MAGIC", "AccessPoint", "GzipIndexLayout", "build_gzip_index"]

MAGIC: Final = b"SYVGZX01"
HEADER: Final = struct.Struct("<8sQQ8sQI4x")
ENTRY: Final = struct.Struct("<QQQQQIB3x")
WINDOW_BYTES: Final = 32 << 10
# Shard bytes between two access points, about: a range read fetches less than this before its
# first record, and the index costs a compressed window (about 2 % of the shard for text).
SPAN_BYTES: Final = 512 << 10
# A compressed window takes at most this much (deflate's stored blocks add 5 bytes per 64 KiB).
MAX_ROOM: Final = WINDOW_BYTES + 64


@dataclass(frozen=True)
class AccessPoint:
    """Where a read enters the shard (see the module docstring); ``window`` is the text."""

    start_bit: int
    member_start: bool
    skip: int
    first_record: int
    first_line: int
    end_byte: int
    window: bytes

    def to_bytes(self, compressed_window: bytes, room: int) -> bytes:
        fixed = ENTRY.pack(
            self.start_bit,
            self.skip,
            self.first_record,
            self.first_line,
            self.end_byte,
            len(compressed_window),
            int(self.member_start),
        )
        return fixed + compressed_window + bytes(room - len(compressed_window))


def compress_window(window: bytes) -> bytes:
    if not window:
        return b""
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return packer.compress(window) + packer.flush()


def decompress_window(data: bytes) -> bytes:
    """The window in ``data``; ValueError unless it is one raw deflate stream of at most 32 KiB
    of text (bounded whatever it declares)."""
    if not data:
        return b""
    unpacker = zlib.decompressobj(-15)
    try:
        window = unpacker.decompress(data, WINDOW_BYTES + 1)
    except zlib.error as error:
        raise ValueError(f"its window is not deflate data ({error})") from None
    if len(window) > WINDOW_BYTES or not unpacker.eof or unpacker.unused_data:
        raise ValueError("its window is not one deflate stream of at most 32 KiB")
    return window


@dataclass(frozen=True)
class GzipIndexLayout:
    """Where the slots of the index of a jsonl.gz shard of ``records`` records in
    ``size_bytes`` bytes lie; ``room`` (a slot's window room) comes from the index's header."""

    records: int
    size_bytes: int
    room: int = 0

    @property
    def block(self) -> int:
        """Records per block of the seeded order: steps restart at each, so every block
        starts at an access point."""
        return max(1, block_records(self.records, self.size_bytes))

    @property
    def step(self) -> int:
        """Records between two access points inside a block: the block cut into equal steps
        of about SPAN_BYTES of the shard."""
        per_span = max(1, math.ceil(self.records * SPAN_BYTES / max(self.size_bytes, 1)))
        return math.ceil(self.block / math.ceil(self.block / per_span))

    @property
    def entries(self) -> int:
        full, rest = divmod(self.records, self.block)
        per_block = math.ceil(self.block / self.step)
        return max(1, full * per_block + math.ceil(rest / self.step))

    def entry_of(self, record: int) -> int:
        """The access point at or before ``record``."""
        block, inside = divmod(record, self.block)
        return block * math.ceil(self.block / self.step) + inside // self.step

    @property
    def slot(self) -> int:
        return ENTRY.size + self.room

    @property
    def object_size(self) -> int:
        return HEADER.size + self.entries * self.slot

    @property
    def header_size(self) -> int:
        """Bytes of the index object's header."""
        return HEADER.size

    def header(self, version: bytes) -> bytes:
        return HEADER.pack(MAGIC, self.records, self.size_bytes, version, self.step, self.room)

    def header_problem(self, header: bytes, version: bytes | None) -> str | None:
        """What makes ``header`` (an index object's first bytes) an index of something other
        than this shard at ``version`` (None: any version), or None."""
        if len(header) < HEADER.size:
            return "it is not a jsonl.gz access point index"
        magic, records, size_bytes, found, step, room = HEADER.unpack_from(header)
        if magic != MAGIC:
            return "it is not a jsonl.gz access point index"
        if (records, size_bytes) != (self.records, self.size_bytes):
            return (
                f"it indexes a shard of {records} records in {size_bytes} bytes, not the "
                f"manifest's {self.records} records in {self.size_bytes} bytes"
            )
        if step != self.step:
            return f"it has access points every {step} records, not {self.step}"
        if room != self.room:
            return f"its slots have {room} bytes of window room, not {self.room}"
        if version is not None and found != version:
            return "it indexes another version of the shard (stale, or another shard's)"
        return None

    def with_header(self, header: bytes) -> GzipIndexLayout:
        """This layout with the window room ``header`` (checked by ``header_problem``) names."""
        return dataclasses.replace(self, room=HEADER.unpack_from(header)[5])

    def with_object_size(self, size: int) -> GzipIndexLayout:
        """This layout for an index object of ``size`` bytes (its slots' window room follows);
        ValueError when no room fits it."""
        room, rest = divmod(size - HEADER.size, self.entries)
        room -= ENTRY.size
        if rest or not 0 <= room <= MAX_ROOM:
            raise ValueError(
                f"it holds {size} bytes, not {self.entries} access points of this shard"
            )
        return dataclasses.replace(self, room=room)

    def slot_range(self, k: int, *, window: bool) -> tuple[int, int]:
        """Bytes [start, end) of access point ``k``'s slot in the index object (its fixed part
        only, unless ``window``)."""
        start = HEADER.size + k * self.slot
        return start, start + (self.slot if window else ENTRY.size)

    def entry(self, data: bytes) -> AccessPoint:
        """The entry in a slot's bytes; ValueError when it does not fit the shard."""
        start_bit, skip, first_record, first_line, end_byte, window_len, member = ENTRY.unpack_from(
            data
        )
        start = start_bit // 8
        if not (
            start < self.size_bytes
            and start < end_byte <= self.size_bytes
            and member in (0, 1)
            and (not member or start_bit % 8 == 0)
            and window_len <= self.room
            and first_record <= self.records
        ):
            raise ValueError("its entry does not fit the shard")
        window = b""
        if len(data) > ENTRY.size:
            window = decompress_window(data[ENTRY.size : ENTRY.size + window_len])
        member_start = bool(member)
        return AccessPoint(
            start_bit, member_start, skip, first_record, first_line, end_byte, window
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
    Holds the compressed windows until the end (about 2 % of the shard for text).

    Raises ShardDataError (naming the shard) when the bytes are not a valid jsonl.gz stream of
    ``records`` records in ``size_bytes`` bytes."""
    from syvain_training_data.errors import ShardDataError

    layout = GzipIndexLayout(records, size_bytes)
    points = _native.GzipAccessPoints(uri, layout.block, layout.step)
    found: list[tuple[AccessPoint, bytes]] = []
    fed = 0
    for chunk in chunks:
        points.feed(chunk)
        fed += len(chunk)
        found += _taken(points)
    points.finish()
    found += _taken(points)
    if fed != size_bytes:
        raise ShardDataError.of("jsonl.gz", uri, f"{fed} bytes, not the manifest's {size_bytes}")
    if points.records != records:
        found_count = f"declared {records} records but found {points.records}"
        raise ShardDataError.of("jsonl.gz", uri, found_count)
    if len(found) != layout.entries:
        raise ShardDataError.of("jsonl.gz", uri, "its access points do not match its records")
    room = max(len(window) for _, window in found)
    layout = dataclasses.replace(layout, room=room)
    return [layout.header(version)] + [point.to_bytes(w, room) for point, w in found]


def _taken(points: _native.GzipAccessPoints) -> list[tuple[AccessPoint, bytes]]:
    taken = [AccessPoint(*entry) for entry in points.take_entries()]
    return [(point, compress_window(point.window)) for point in taken]
