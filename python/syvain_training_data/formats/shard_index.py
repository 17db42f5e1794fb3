"""Record offset index of a msgpack.zstf shard: the optional object ``{shard_uri}.index.json``
(SPEC section 6, seeded order) that lets a reader fetch any block of records with one ranged
GET.

A msgpack.zstf record is a self-delimiting frame (8-byte length, then the frame), so the byte
offset of every ``every``-th record is all a reader needs to start anywhere. The index is
written by the saver after the data object and before the completion descriptor; other
implementations neither write nor read it. It is never trusted for bounds: a reader checks it
against the manifest's record count and size, and reads a segment of the shard as a shard of
its own, so every frame and count check of SPEC section 3 still applies.

Bytes: canonical JSON (sorted keys, separators ``,`` and ``:``, plus ``"\\n"``)::

    {"deltas": [o_K - 0, o_2K - o_K, ...], "every": K, "records": N,
     "schema": "syvain-training-data-shard-index-v1", "size_bytes": S}

where o_i is the byte offset of record i (record 0 is at byte 0; deltas keep the index small,
as a consumer fetches it with the ranges it reads).
"""

from __future__ import annotations

import json
import math
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "BLOCK_BYTES",
    "INDEX_SUFFIX",
    "MAX_INDEX_BYTES",
    "FrameOffsets",
    "ShardIndex",
    "block_records",
    "index_every",
]

INDEX_SUFFIX: Final = ".index.json"
SCHEMA: Final = "syvain-training-data-shard-index-v1"
# One index entry per about 1/256 of a shard, and per 512 B to 64 KiB: a range read that starts
# or ends inside a block fetches at most one stride before and after its records, so cutting
# a small shard stays cheap too, and the index stays about 0.2 % of its shard at most.
MIN_STRIDE_BYTES: Final = 512
MAX_STRIDE_BYTES: Final = 64 * 1024
# A block (the unit the seeded order permutes) spans about this many shard bytes: one ranged
# GET each, about 1,000 per GB.
BLOCK_BYTES: Final = 1024 * 1024
# Blocks per shard at most (a 64 GiB shard has this many of 1 MiB).
MAX_SHARD_BLOCKS: Final = 1 << 16
# An index of a shard under 5 GiB holds about 80,000 entries (under 1 MiB of JSON).
MAX_INDEX_BYTES: Final = 16 * 1024 * 1024


def stride_bytes(size_bytes: int) -> int:
    """Shard bytes between two index entries, about."""
    return min(MAX_STRIDE_BYTES, max(MIN_STRIDE_BYTES, size_bytes // 256))


def index_every(records: int, size_bytes: int) -> int:
    """Records between two index entries of a shard of ``records`` records in ``size_bytes``
    bytes: about ``stride_bytes`` worth, at least 1."""
    share = records * stride_bytes(size_bytes) / max(size_bytes, 1)
    return max(1, min(records, round(share)))


def block_records(records: int, size_bytes: int) -> int:
    """Records per block of an indexed shard: a whole number of index strides of about
    ``BLOCK_BYTES`` together, so every block starts at an index entry, and no more than
    ``MAX_SHARD_BLOCKS`` blocks per shard (the order plans a shard's blocks at once)."""
    every = index_every(records, size_bytes)
    strides = max(
        BLOCK_BYTES // stride_bytes(size_bytes), -(-records // (every * MAX_SHARD_BLOCKS))
    )
    return min(records, every * strides)


class FrameOffsets:
    """The byte offsets of a msgpack.zstf shard's records as the encoder writes them, kept
    every ``step``-th record; ``step`` doubles whenever more than ``MAX_KEPT`` are held, so
    the memory stays bounded whatever the shard's record count."""

    MAX_KEPT: Final = 1 << 20

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
        if len(self.kept) > self.MAX_KEPT:
            self.kept = self.kept[::2]
            self.step *= 2

    def index(self, size_bytes: int) -> ShardIndex:
        """The shard's index: an entry every ``index_every`` records, rounded up to what was
        kept."""
        every = -(-index_every(self.records, size_bytes) // self.step) * self.step
        kept = self.kept[:: every // self.step]
        return ShardIndex(self.records, size_bytes, every, kept)


@dataclass(frozen=True)
class ShardIndex:
    """Byte offsets of records 0, ``every``, 2 x ``every``, ... of a shard."""

    records: int
    size_bytes: int
    every: int
    offsets: Sequence[int]

    def to_bytes(self) -> bytes:
        offsets = self.offsets
        document = {
            "deltas": [offsets[i] - offsets[i - 1] for i in range(1, len(offsets))],
            "every": self.every,
            "records": self.records,
            "schema": SCHEMA,
            "size_bytes": self.size_bytes,
        }
        return (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, records: int, size_bytes: int) -> ShardIndex:
        """The index in ``data`` for a shard the manifest says holds ``records`` records in
        ``size_bytes`` bytes; ValueError saying what is wrong with anything else."""
        if len(data) > MAX_INDEX_BYTES:
            raise ValueError(f"it holds {len(data)} bytes, more than {MAX_INDEX_BYTES}")
        try:
            document: Any = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise ValueError("it is not JSON") from None
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            raise ValueError(f"it is not a {SCHEMA} document")
        if document.get("records") != records or document.get("size_bytes") != size_bytes:
            raise ValueError("it describes another shard (records or size_bytes differ)")
        every, deltas = document.get("every"), document.get("deltas")
        if type(every) is not int or not 1 <= every <= records:
            raise ValueError("'every' is not an int in [1, records]")
        if not isinstance(deltas, list) or len(deltas) != math.ceil(records / every) - 1:
            raise ValueError("'deltas' does not hold one entry per 'every' records")
        offsets = array("q", [0])
        for delta in deltas:
            # A record takes at least 9 bytes (its length, then a frame).
            if type(delta) is not int or not 9 * every <= delta < size_bytes - offsets[-1]:
                raise ValueError("'deltas' do not step forward inside the shard's bytes")
            offsets.append(offsets[-1] + delta)
        return cls(records, size_bytes, every, offsets)

    def segment(self, start: int, stop: int) -> tuple[tuple[int, int], int, int, int]:
        """How to read records ``[start, stop)`` (``start < stop``) with one ranged GET:
        ((first byte, end byte), records in that segment, and ``start`` and ``stop`` counted
        from the segment's first record)."""
        first_entry = start // self.every
        end_entry = -(-stop // self.every)
        first = first_entry * self.every
        if end_entry < len(self.offsets):
            end_byte, end_record = self.offsets[end_entry], end_entry * self.every
        else:
            end_byte, end_record = self.size_bytes, self.records
        span = (self.offsets[first_entry], end_byte)
        return span, end_record - first, start - first, stop - first
