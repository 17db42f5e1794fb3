"""The index of a shard in any format that has one (``FORMATS[...].index``), built from the
shard's bytes streamed once: frame offsets for msgpack.zstf (``formats.shard_index``), access
points for jsonl.gz (``formats.gzip_index``). One entry point for the saver, ``cp
--with-shards``, ``syvain-data index`` and ``verify --deep``."""

from __future__ import annotations

from collections.abc import Iterable

from syvain_training_data.errors import ShardDataError
from syvain_training_data.formats.gzip_index import build_gzip_index
from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.formats.shard_index import FrameOffsets, version_tag

__all__ = ["build_index"]


def build_index(
    data_format: str,
    uri: str,
    chunks: Iterable[bytes | memoryview],
    records: int,
    size_bytes: int,
    etag: str,
) -> list[bytes]:
    """The index object (as chunks) of the shard at ``uri`` whose bytes are ``chunks``, for
    the manifest's ``records`` and ``size_bytes``, naming the version ``etag`` (as its store
    gives it).

    Raises:
        ShardDataError: the bytes are not ``records`` records of ``data_format`` in
            ``size_bytes`` bytes (the message names the shard).
        ValueError: ``data_format`` has no index.
    """
    kind = FORMATS[data_format].index
    version = version_tag(uri, etag)
    if kind == "access_points":
        return build_gzip_index(uri, chunks, records, size_bytes, version)
    if kind != "frame_offsets":
        raise ValueError(f"{data_format} shards have no index")
    try:
        frames = FrameOffsets.of_chunks(chunks)
    except ValueError as error:
        raise ShardDataError.of(data_format, uri, str(error)) from error
    if frames.records != records:
        found = f"declared {records} records but found {frames.records}"
        raise ShardDataError.of(data_format, uri, found)
    return [frames.index(size_bytes, version).to_bytes()]
