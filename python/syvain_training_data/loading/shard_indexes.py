"""The record offset indexes a loader reads (``formats.shard_index``): for each range read, one
ranged GET of the few index entries around the range (about 4 KiB per MiB of shard), never the
whole index.

An index is optional: a shard without one, or with one that does not fit the manifest, is read
from its start (its records before the range are skipped without being decoded), which costs
bytes, never correctness.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict

from syvain_training_data.errors import StorageError, StorageRetryExhaustedError
from syvain_training_data.formats.shard_index import (
    HEADER,
    INDEX_SUFFIX,
    IndexLayout,
    Segment,
)
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig, open_stream

__all__ = ["ShardIndexes", "has_index"]

log = logging.getLogger(__name__)

# Shards remembered as having no usable index, per consumer.
REMEMBERED = 4096


def _read(
    uri: str, layout: IndexLayout, start: int, end: int, config: StorageConfig | None
) -> bytes:
    """Bytes [start, end) of the index object at ``uri``; its size must be the layout's."""
    with open_stream(
        uri, size_bytes=layout.object_size, start=start, end=end, storage_config=config
    ) as stream:
        return b"".join(stream)


def has_index(shard: ManifestShard, storage_config: StorageConfig | None) -> bool:
    """Whether ``shard`` has an index that fits it (header and size; one small read)."""
    layout = IndexLayout(shard.records, shard.size_bytes)
    try:
        header = _read(shard.uri + INDEX_SUFFIX, layout, 0, HEADER.size, storage_config)
    except StorageRetryExhaustedError:
        raise
    except (FileNotFoundError, PermissionError, StorageError):
        return False
    return header == layout.header


class ShardIndexes:
    """Segments of indexed shards, each from the index entries around the range read.
    Thread-safe: a window's range reads start in threads of their own."""

    def __init__(self, storage_config: StorageConfig | None) -> None:
        self.storage_config = storage_config
        self._missing: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def segment(self, shard: ManifestShard, start: int, stop: int) -> Segment | None:
        """The segment holding records [start, stop) (start < stop) of ``shard``, or None when
        it has no usable index (then read the shard from its start)."""
        with self._lock:
            if shard.uri in self._missing:
                return None
        uri = shard.uri + INDEX_SUFFIX
        layout = IndexLayout(shard.records, shard.size_bytes)
        first, end = layout.entries_for(start, stop)
        try:
            data = _read(uri, layout, *layout.byte_range(first, end), self.storage_config)
            return layout.segment(first, array("q", data), start, stop)
        except FileNotFoundError:
            self._remember(shard.uri)
        except StorageRetryExhaustedError:
            raise
        except (PermissionError, StorageError, ValueError) as error:
            # Shorter or longer than the manifest's shard needs, unreadable, or offsets that
            # do not fit: read the shard without it.
            log.warning("Ignoring the shard index %s: %s", uri, error)
            self._remember(shard.uri)
        return None

    def _remember(self, uri: str) -> None:
        with self._lock:
            self._missing[uri] = None
            if len(self._missing) > REMEMBERED:
                self._missing.popitem(last=False)
