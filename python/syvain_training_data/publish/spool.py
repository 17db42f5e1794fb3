"""Encoding a shard into a spool: the encoded bytes held once, in memory up to ``spill_bytes``
(64 MiB), then in a temporary file (``syvain-shard-*`` in the system temp directory), hashed
as they are written. Also the size rules and their testing seam."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Final

from syvain_training_data import _native
from syvain_training_data.formats.shard_index import FrameOffsets

__all__ = ["Limits", "Spool", "encode_native", "encode_parquet", "limits", "size_limits"]

# Records per ShardEncoder.encode call. The encoder compresses one call's batch on its own
# thread while the next is serialized, so small batches keep both cores busy from a shard's first
# records to its last (256 encodes faster than 1024, benchmarks/saver.py); below ~128 the
# per-call cost starts to show on small records.
_BATCH_RECORDS: Final = 256


@dataclass
class Limits:
    """Size rules; the testing seam ``size_limits`` lowers them."""

    deterministic_single_put_bytes: int = _native.SINGLE_PUT_MAX
    spill_bytes: int = 64 * 1024 * 1024
    multipart_threshold: int = _native.MULTIPART_THRESHOLD
    part_size: int = _native.PART_SIZE


_limits = Limits()


def limits() -> Limits:
    """The size rules in force (``size_limits`` may have lowered them)."""
    return _limits


@contextlib.contextmanager
def size_limits(**overrides: int) -> Iterator[Limits]:
    """Testing seam: lowers the 5 GiB rule (``deterministic_single_put_bytes``), the in-memory
    spool (``spill_bytes``) and the multipart sizes for the duration of a ``with`` block, in this
    process. Not for production use."""
    global _limits
    previous = _limits
    _limits = Limits(**{**previous.__dict__, **overrides})
    try:
        yield _limits
    finally:
        _limits = previous


class Spool:
    """Encoded shard bytes, each byte held once: in memory up to ``spill_bytes``, then in a
    temporary file. Hashes as it goes. ``close`` removes the file."""

    def __init__(self, spill_bytes: int) -> None:
        self._spill_bytes = spill_bytes
        self.chunks: list[bytes] = []
        self.path: str | None = None
        self._file: IO[bytes] | None = None
        self.size = 0
        self._digest = hashlib.sha256()
        # The digest of a file its writer filled and hashed itself (parquet).
        self._written_sha256: str | None = None

    def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._digest.update(chunk)
        self.size += len(chunk)
        if self._file is None and self.size > self._spill_bytes:
            self._open_file()
            for held in self.chunks:
                self._write_file(held)
            self.chunks.clear()
        if self._file is not None:
            self._write_file(chunk)
        else:
            self.chunks.append(chunk)

    def _write_file(self, chunk: bytes) -> None:
        assert self._file is not None
        self._file.write(chunk)

    def _open_file(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="syvain-shard-", suffix=".part")
        self._file = os.fdopen(fd, "wb")

    def adopt_file(self) -> str:
        """A temporary file for a writer that fills and hashes it itself (parquet); record what
        it wrote with :meth:`record_file`."""
        self._open_file()
        assert self._file is not None and self.path is not None
        self._file.close()
        self._file = None
        return self.path

    def record_file(self, size: int, sha256: str) -> None:
        """The adopted file's size and digest, as its writer measured them while writing."""
        self.size = size
        self._written_sha256 = sha256

    def sha256(self) -> str:
        return self._written_sha256 or self._digest.hexdigest()

    def read_chunks(self, piece_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The sealed bytes again, in order: the chunks held, or the file's in pieces."""
        if self.path is None:
            yield from self.chunks
            return
        with open(self.path, "rb") as file:
            while piece := file.read(piece_bytes):
                yield piece

    def seal(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.seal()
        self.chunks.clear()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None


def encode_native(
    data_format: str,
    records: Iterator[Mapping[str, Any]],
    spool: Spool,
    check: Callable[[int], None],
    frames: FrameOffsets | None = None,
) -> int:
    """Encodes msgpack.zstf or jsonl.gz records into ``spool``, calling ``check`` with the size
    so far after each batch; returns the record count. ``frames`` (msgpack.zstf) notes the
    byte offset of every record, for the shard's index."""
    encoder = _native.ShardEncoder(data_format)
    while batch := list(itertools.islice(records, _BATCH_RECORDS)):
        chunk = encoder.encode(batch)
        if frames is not None:
            frames.add(chunk, spool.size)
        spool.write(chunk)
        check(spool.size)
    chunk = encoder.finish()
    if frames is not None:
        frames.add(chunk, spool.size)
    spool.write(chunk)
    check(spool.size)
    return int(encoder.records)


def encode_parquet(records: Iterator[Mapping[str, Any]], spool: Spool) -> int:
    """Writes a Parquet shard into the spool's file, hashed as it is written (once); returns the
    record count."""
    from syvain_training_data.formats.parquet import write_parquet_shard

    path = spool.adopt_file()
    written = write_parquet_shard(records, path)
    spool.record_file(written.size_bytes, written.sha256)
    return written.records
