"""Record offset index of a msgpack.zstf shard: the optional object ``{shard_uri}.index``
(SPEC section 6, seeded order and indexes, v4) that lets a reader fetch any run of records with
one ranged GET.

A msgpack.zstf record is a self-delimiting frame (8-byte length, then the frame), so the byte
offset of every ``every``-th record is all a reader needs to start anywhere. The index is
written by the saver after the data object and before the completion descriptor (and by
``cp --with-shards`` from the verified bytes); other implementations neither write nor read it.

Trust. An index names the version of the shard it indexes: its record count, its size and a
tag of its version as the store gives it (:func:`version_tag`: the etag; for a ``file://``
shard its mtime and size). A reader compares them with the manifest and the shard before it
reads a record through the index, so an index of another shard, or a stale one left beside a
rewritten shard, is not used (the shard is then read from its start). Nothing pins an index's
entries: an index that names the right shard but whose entries point at other records (a
buggy or hostile writer) is trusted as much as the folder it sits in; the reader checks only
that they fit the shard, and ``syvain-data verify --deep`` checks every entry against the shard.

Bytes (little-endian)::

    b"SYVIDX02", records: u64, size_bytes: u64, version tag: 8 bytes,
    then one u64 per ``every`` records: the byte offset of records 0, every, 2 x every, ...

``every`` follows from (records, size_bytes) alone (:func:`index_every`), so a reader that
knows the shard from the manifest computes where any entry lies and reads only the entries
around the records it wants: a few bytes per block, whatever the shard's size. An earlier
release's index (``SYVIDX01``, ``every`` where the tag now is) names no version and is not used.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from syvain_training_data.uris import FILE_PREFIX, plain_etag

__all__ = [
    "BLOCK_BYTES",
    "INDEX_SUFFIX",
    "FrameOffsets",
    "IndexLayout",
    "Segment",
    "ShardIndex",
    "block_records",
    "index_every",
    "index_uri",
    "version_tag",
]

INDEX_SUFFIX: Final = ".index"
MAGIC: Final = b"SYVIDX02"
EARLIER_MAGIC: Final = b"SYVIDX01"
HEADER: Final = struct.Struct("<8sQQ8s")
CONTENT_TYPE: Final = "application/octet-stream"
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


def index_uri(shard_uri: str, index_root: str | None = None) -> str:
    """Where the index of the shard at ``shard_uri`` is: beside it (``{shard_uri}.index``), or
    under ``index_root`` (a prefix the reader names, for shards in a bucket it cannot write),
    at ``{index_root}/{scheme}/{bucket}/{key}.index`` (``{index_root}/file/{path}.index`` for a
    ``file://`` shard)."""
    if index_root is None:
        return shard_uri + INDEX_SUFFIX
    scheme, rest = shard_uri.split("://", 1)
    return f"{index_root.rstrip('/')}/{scheme}/{rest.lstrip('/')}{INDEX_SUFFIX}"


def version_tag(uri: str, etag: str) -> bytes:
    """What an index names of its shard's version: the first 8 bytes of the SHA-256 of the
    shard's etag as its store gives it (quotes stripped), or for a ``file://`` shard of its
    mtime and size only (the local store's etag also holds the inode, which no copy keeps,
    while ``cp -p`` and ``rsync -a`` keep the mtime)."""
    etag = plain_etag(etag)
    if uri.startswith(FILE_PREFIX):
        etag = etag.split("-", 1)[-1]
    return hashlib.sha256(b"syvain-shard-version\0" + etag.encode()).digest()[:8]


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
    read as a shard of its own.

    With ``entry`` (a jsonl.gz access point, ``formats.gzip_index``: member_start, unused bits,
    window, skip, first record, first line), the bytes start inside the gzip stream and the
    read counts records in the whole shard instead; it stops after its last record."""

    byte_start: int
    byte_end: int
    first: int
    records: int
    entry: tuple[bool, int, bytes, int, int, int] | None = None


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
    def header_size(self) -> int:
        """Bytes of the index object's header."""
        return HEADER.size

    def header(self, version: bytes) -> bytes:
        """The index object's first bytes, for the shard version tagged ``version``."""
        return HEADER.pack(MAGIC, self.records, self.size_bytes, version)

    def header_problem(self, header: bytes, version: bytes | None) -> str | None:
        """What makes ``header`` (an index object's first bytes) an index of something other
        than this shard at ``version`` (None: any version), or None."""
        magic, records, size_bytes, found = HEADER.unpack_from(header)
        if magic == EARLIER_MAGIC:
            return "it was written by an earlier release and names no shard version"
        if magic != MAGIC:
            return "it is not a syvain-training-data shard index"
        if (records, size_bytes) != (self.records, self.size_bytes):
            return (
                f"it indexes a shard of {records} records in {size_bytes} bytes, not the "
                f"manifest's {self.records} records in {self.size_bytes} bytes"
            )
        if version is not None and found != version:
            return "it indexes another version of the shard (stale, or another shard's)"
        return None

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

    @classmethod
    def of_chunks(cls, chunks: Iterable[bytes | memoryview]) -> FrameOffsets:
        """The frames of a msgpack.zstf shard streamed as ``chunks`` of any sizes, found by
        their length headers (a header may straddle chunks); ValueError when the bytes do not
        end at a frame boundary."""
        frames = cls()
        position = 0  # the stream offset after the chunks seen so far
        frame = 0  # where the frame whose header is being read starts
        header = bytearray()
        for chunk in chunks:
            view = memoryview(chunk)
            base, position = position, position + len(view)
            while frame + len(header) < position:
                at = frame + len(header) - base
                header += view[at : at + 8 - len(header)]
                if len(header) == 8:
                    frames._frame(frame)
                    frame += 8 + int.from_bytes(header, "big")
                    header.clear()
        if header or frame != position:
            raise ValueError("the shard does not end at a msgpack.zstf frame boundary")
        return frames

    def index(self, size_bytes: int, version: bytes) -> ShardIndex:
        """The shard's index, for the shard version tagged ``version``: an entry every
        ``index_every`` records."""
        every = index_every(self.records, size_bytes)
        return ShardIndex(self.records, size_bytes, version, self.kept[:: every // self.step])


@dataclass(frozen=True)
class ShardIndex:
    """A whole index: the byte offsets of records 0, ``every``, 2 x ``every``, ... of a shard
    of ``records`` records in ``size_bytes`` bytes, at the version tagged ``version``."""

    records: int
    size_bytes: int
    version: bytes
    offsets: Sequence[int]

    @property
    def layout(self) -> IndexLayout:
        return IndexLayout(self.records, self.size_bytes)

    def to_bytes(self) -> bytes:
        return self.layout.header(self.version) + array("q", self.offsets).tobytes()

    @classmethod
    def parse(
        cls, data: bytes, records: int, size_bytes: int, version: bytes | None = None
    ) -> ShardIndex:
        """The index in ``data`` for a shard the manifest says holds ``records`` records in
        ``size_bytes`` bytes (at the version tagged ``version``, when given); ValueError saying
        what is wrong with anything else."""
        layout = IndexLayout(records, size_bytes)
        if len(data) != layout.object_size:
            raise ValueError(f"it holds {len(data)} bytes, not the {layout.object_size} expected")
        problem = layout.header_problem(data[: HEADER.size], version)
        if problem is not None:
            raise ValueError(problem)
        offsets = array("q", data[HEADER.size :])
        layout.segment(0, offsets, 0, 1)  # checks every offset
        return cls(records, size_bytes, data[HEADER.size - 8 : HEADER.size], offsets)

    def segment(self, start: int, stop: int) -> Segment:
        """The segment that holds records [start, stop) (start < stop)."""
        first, end = self.layout.entries_for(start, stop)
        return self.layout.segment(first, self.offsets[first:end], start, stop)
