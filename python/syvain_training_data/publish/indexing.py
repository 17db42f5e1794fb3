"""Indexes for msgpack.zstf and jsonl.gz shards that lack one (``syvain-data index``): a
dataset another writer made (the seed package writes none), or one whose indexes went stale,
gets an index per shard from one streaming pass over the shard, checked against the manifest's
size, etag and record count, so that it mixes and fetches like a dataset this package's saver
wrote (SPEC section 6, indexes).

An index that already names the shard's current version is kept (a re-run after an
interruption skips the shards it finished); a missing one is created create-only; one that
names another version (stale, or an earlier release's) is replaced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from syvain_training_data.errors import ObjectDataError, ShardDataError
from syvain_training_data.formats import shard_index
from syvain_training_data.formats.gzip_index import GzipIndexLayout
from syvain_training_data.formats.indexes import build_index
from syvain_training_data.formats.shard_index import IndexLayout, index_uri
from syvain_training_data.loading.shard_indexes import (
    index_layout,
    read_index_bytes,
    sized_layout,
)
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.object_check import check_head
from syvain_training_data.storage import StorageConfig, open_stream, put_object

__all__ = ["IndexOutcome", "index_shard"]

log = logging.getLogger(__name__)

IndexOutcome = Literal["written", "kept", "replaced"]


def index_shard(
    shard: ManifestShard,
    storage_config: StorageConfig,
    *,
    data_format: str = "msgpack.zstf",
    index_root: str | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> IndexOutcome:
    """Makes sure ``shard`` (msgpack.zstf or jsonl.gz) has an index naming its current
    version, beside it or under ``index_root``; returns what was done. ``on_bytes`` is called
    with the size of every chunk of the shard streamed.

    Raises:
        ShardDataError: the shard's size or etag is not the manifest's, or its bytes are not
            ``shard.records`` records of ``data_format`` (the message names the shard).
        FileNotFoundError, PermissionError, StorageError: from the store.
    """
    head = check_head(shard.uri, storage_config, size=shard.size_bytes, etag=shard.etag)
    if head.mismatch is not None:
        found, expected = head.mismatch.found, head.mismatch.expected
        raise ShardDataError.of(
            data_format,
            shard.uri,
            f"{head.mismatch.field} mismatch: {found!r} in the store, {expected!r} in the manifest",
        )
    version = shard_index.version_tag(shard.uri, head.info.etag)
    target = index_uri(shard.uri, index_root)
    present = _header(target, data_format, shard, storage_config)
    if present is not None and present[1].header_problem(present[0], version) is None:
        return "kept"
    with open_stream(
        shard.uri,
        size_bytes=shard.size_bytes,
        etag=head.info.etag or None,
        storage_config=storage_config,
    ) as stream:
        data = build_index(
            data_format,
            shard.uri,
            _counted(stream, on_bytes),
            shard.records,
            shard.size_bytes,
            head.info.etag,
        )
    if present is None:
        try:
            put_object(
                target,
                data,
                storage_config=storage_config,
                content_type=shard_index.CONTENT_TYPE,
                create_only=True,
            )
            return "written"
        except FileExistsError:  # written meanwhile: replaced below unless it is this one
            pass
    log.info("Replacing the shard index %s: it does not name the shard's current version", target)
    put_object(target, data, storage_config=storage_config, content_type=shard_index.CONTENT_TYPE)
    return "replaced"


def _header(
    uri: str, data_format: str, shard: ManifestShard, config: StorageConfig
) -> tuple[bytes, IndexLayout | GzipIndexLayout] | None:
    """The first bytes of the index object at ``uri`` and the layout its size gives (None:
    there is none); an object no layout of this shard fits is read as an empty header, one
    that names nothing."""
    layout: IndexLayout | GzipIndexLayout = index_layout(data_format, shard)
    size = layout.header_size
    try:
        layout = sized_layout(data_format, shard, uri, config)
        return read_index_bytes(uri, layout, 0, size, config), layout
    except FileNotFoundError:
        return None
    except (ObjectDataError, ValueError):  # another size: no index of this shard
        return b"\0" * size, layout


def _counted(chunks: Iterable[bytes], on_bytes: Callable[[int], None] | None) -> Iterator[bytes]:
    for chunk in chunks:
        if on_bytes is not None:
            on_bytes(len(chunk))
        yield chunk
