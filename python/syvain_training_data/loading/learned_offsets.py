"""Record offsets a consumer learns of a msgpack.zstf shard that has no usable index, so that
reading its blocks in a seeded order costs at most about twice its bytes, never quadratic
bytes.

Without an index a reader can only find record ``n`` by walking the frames before it. Read
block by block from the shard's start, a shard of ``b`` blocks costs about ``b / 2`` times its
bytes. Instead a consumer walks the frame headers once, as far as its reads have needed
(its *frontier*), keeping the offset of every ``stride``-th record it passes: a read of
records ``[start, stop)`` then fetches exactly their bytes, after the frontier was moved past
``stop`` if need be. Each byte of the shard is fetched at most twice per pass: once by the
walk, once by the read of its own block. Only a read of at most a block walks (a seeded
window's); a longer range starts at the furthest offset known before it.

The walk fetches pieces of ``PIECE_BYTES``; when the next frame header lies beyond a piece (a
large record), the next piece starts at that header, so a record's body beyond a piece is not
fetched. At most ``MAX_POINTS`` offsets are kept per shard (512 KiB).
"""

from __future__ import annotations

import threading
from array import array
from typing import Final

from syvain_training_data.formats.shard_index import Segment, block_records, index_every
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig, open_stream
from syvain_training_data.uris import portable_etag

__all__ = ["LearnedOffsets"]

PIECE_BYTES: Final = 1024 * 1024
MAX_POINTS: Final = 1 << 16
# SPEC section 3: a msgpack.zstf frame is at most 256 MiB.
MAX_FRAME_BYTES: Final = 256 * 1024 * 1024


class LearnedOffsets:
    """What one consumer has learned of one shard's frames; thread-safe (a window reads
    several blocks of a shard at once, and one walk serves them in turn)."""

    def __init__(self, shard: ManifestShard, storage_config: StorageConfig | None) -> None:
        self.shard = shard
        self.storage_config = storage_config
        records, size = shard.records, shard.size_bytes
        self.stride = max(index_every(records, size), -(-records // MAX_POINTS))
        self.block = block_records(records, size)
        self.points = array("q", [0])  # the offsets of records 0, stride, 2 x stride, ...
        self.frontier = (0, 0)  # (record, offset) of the furthest frame start known
        self.failed = False  # the walk found bytes that are not frames: read from the start
        self._lock = threading.Lock()

    def segment(self, start: int, stop: int) -> Segment | None:
        """The bytes that hold exactly records [start, stop) (start < stop), walking the frames
        up to ``stop`` first where they are not known yet; None when the shard's bytes are not
        frames (then the reader reads it from its start and reports what is wrong)."""
        with self._lock:
            if stop - start > self.block:  # not a block of a seeded window: no walk
                k = min(start // self.stride, len(self.points) - 1)
                first = k * self.stride
                return Segment(
                    self.points[k], self.shard.size_bytes, first, self.shard.records - first
                )
            if not self.failed and self.frontier[0] < stop:
                self._walk_to(stop)
            if self.failed:
                return None
            k = start // self.stride
            end = -(-stop // self.stride)
            end_record, end_offset = self.frontier
            if end < len(self.points):
                end_record, end_offset = end * self.stride, self.points[end]
            return Segment(
                self.points[k], end_offset, k * self.stride, end_record - k * self.stride
            )

    def _walk_to(self, stop: int) -> None:
        """Moves the frontier to record ``stop``, learning offsets on the way."""
        size = self.shard.size_bytes
        record, offset = self.frontier
        while record < stop:
            if offset + 8 > size:  # fewer frames than the manifest's records
                self.failed = True
                return
            piece_end = min(offset + PIECE_BYTES, size)
            data = self._fetch(offset, piece_end)
            position = offset
            while record < stop and position + 8 <= piece_end:
                at = position - offset
                length = int.from_bytes(data[at : at + 8], "big")
                frame_end = position + 8 + length
                if not 0 < length <= MAX_FRAME_BYTES or frame_end > size:
                    self.failed = True
                    return
                record, position = record + 1, frame_end
                self._learn(record, position)
            # The next piece starts at the next header: a header cut by this piece's end is
            # fetched again, a body beyond it is not fetched at all.
            offset = position

    def _fetch(self, start: int, end: int) -> bytes:
        shard = self.shard
        with open_stream(
            shard.uri,
            size_bytes=shard.size_bytes,
            etag=portable_etag(shard.uri, shard.etag) or None,
            start=start,
            end=end,
            storage_config=self.storage_config,
        ) as stream:
            return b"".join(stream)

    def _learn(self, record: int, offset: int) -> None:
        self.frontier = (record, offset)
        if record % self.stride == 0 and record // self.stride == len(self.points):
            self.points.append(offset)
