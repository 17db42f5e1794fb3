"""A Parquet shard in an object store read in place: a seekable file whose every read is one
ranged GET of the bytes pyarrow asks for (the footer, then the column chunks of the row groups
and columns it decodes), so no temporary file is written and the row groups before a range,
or columns not selected, are never fetched.

The file's tail (the footer, and for a small file all of it) is kept once fetched, so the
column chunks pyarrow reads from it later are not fetched twice (a 64 KiB footer read of a
1 MB shard was 7 % more bytes).

Each read holds the object to one version (If-Match on the manifest's etag, else on the etag a
HEAD found when the file was opened) and is resumed by the store's stream after transient
failures; the streams count where the read that opened the file counts (``stats()``), also
when pyarrow reads from a helper thread.
"""

from __future__ import annotations

import io
from typing import Any

from syvain_training_data import _native, storage
from syvain_training_data.errors import ObjectDataError, ShardDataError
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import portable_etag

__all__ = ["RangedFile"]

#: The most bytes at the file's end kept for later reads (pyarrow's footer reads are 64 KiB,
#: more for a large footer).
TAIL_BYTES = 1024 * 1024


class RangedFile(io.RawIOBase):
    """The bytes of ``shard`` as a read-only seekable file of ``shard.size_bytes`` bytes."""

    def __init__(
        self,
        shard: ManifestShard,
        storage_config: StorageConfig | None,
        *,
        etag: str | None = None,
    ) -> None:
        """``etag``: the version to hold every read to, when the caller knows it (a HEAD it
        made); else the manifest's. With neither, a HEAD finds it (and the size is checked
        there); with one, no HEAD is made: the first read's response is held to it by
        If-Match and its size checked against ``shard.size_bytes``."""
        super().__init__()
        self.shard = shard
        self.storage_config = storage_config
        self.size = shard.size_bytes
        self.position = 0
        self.fetched = 0
        self.reads = 0
        self._counters = _native.StreamCounters.entered()
        self.etag = etag or portable_etag(shard.uri, shard.etag) or None
        if self.etag is None:
            info = storage.head_object(shard.uri, storage_config=storage_config)
            if info.size != self.size:
                raise ShardDataError.of(
                    "parquet",
                    shard.uri,
                    f"size mismatch: the object has {info.size} bytes but size_bytes is "
                    f"{self.size}",
                )
            self.etag = info.etag or None
        # (first byte, bytes) of the file's last bytes fetched, when at most TAIL_BYTES.
        self._tail: tuple[int, bytes] = (self.size, b"")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self.position = base + offset
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.position + size)
        if end <= self.position:
            return b""
        data = self._fetch(self.position, end)
        self.position = end
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def _fetch(self, start: int, end: int) -> bytes:
        tail_start, tail = self._tail
        if end > tail_start:  # served, in whole or in part, from the kept tail
            kept = tail[max(start, tail_start) - tail_start : end - tail_start]
            return (self._fetch(start, tail_start) if start < tail_start else b"") + kept
        self.reads += 1
        self.fetched += end - start
        if self._counters is not None:
            with self._counters:
                data = self._get(start, end)
        else:
            data = self._get(start, end)
        if end == self.size and end - start <= TAIL_BYTES and start < tail_start:
            self._tail = (start, data)
        return data

    def _get(self, start: int, end: int) -> bytes:
        try:
            with storage.open_stream(
                self.shard.uri,
                size_bytes=self.size,
                etag=self.etag,
                start=start,
                end=end,
                storage_config=self.storage_config,
            ) as stream:
                return b"".join(stream)
        except ObjectDataError as error:
            # The stream's own data errors (size) are this shard's; store failures (retry
            # budget, changed object, ...) keep their types.
            raise ShardDataError.of("parquet", self.shard.uri, error.reason) from error
