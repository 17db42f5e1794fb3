"""The record offset indexes a seeded loader reads (``formats.shard_index``), fetched when a
consumer first reads a block of a shard and kept in a small cache.

An index is optional: a shard without one, or with one that is unreadable or does not match
the manifest, is read from its start (its records before the range are skipped without being
decoded), which costs bytes, never correctness.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from syvain_training_data.formats.shard_index import INDEX_SUFFIX, MAX_INDEX_BYTES, ShardIndex
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import StorageConfig, head_object, open_stream

__all__ = ["ShardIndexes", "fetch_index"]

log = logging.getLogger(__name__)

# Indexes kept per consumer: a window's blocks come from up to 64 shards.
CACHED_INDEXES = 256


def fetch_index(shard: ManifestShard, storage_config: StorageConfig | None) -> ShardIndex | None:
    """The index of ``shard``, or None when it has none or a bad one (logged at WARNING)."""
    uri = shard.uri + INDEX_SUFFIX
    try:
        size = head_object(uri, storage_config=storage_config).size
        if size > MAX_INDEX_BYTES:
            raise ValueError(f"it holds {size} bytes, more than {MAX_INDEX_BYTES}")
        # Streamed, so the loader's byte counters count it with the reads it serves.
        with open_stream(uri, size_bytes=size, storage_config=storage_config) as stream:
            data = b"".join(stream)
        return ShardIndex.parse(data, shard.records, shard.size_bytes)
    except FileNotFoundError:
        return None
    except ValueError as error:
        log.warning("Ignoring the shard index %s: %s", uri, error)
        return None


class ShardIndexes:
    """Indexes by shard URI, fetched on first use; the least recently used are dropped.
    Thread-safe: a window's range reads start in threads of their own."""

    def __init__(self, storage_config: StorageConfig | None) -> None:
        self.storage_config = storage_config
        self._cache: OrderedDict[str, ShardIndex | None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, shard: ManifestShard) -> ShardIndex | None:
        with self._lock:
            if shard.uri in self._cache:
                self._cache.move_to_end(shard.uri)
                return self._cache[shard.uri]
        # Fetched outside the lock: a window's reads fetch their indexes concurrently.
        index = fetch_index(shard, self.storage_config)
        with self._lock:
            self._cache[shard.uri] = index
            if len(self._cache) > CACHED_INDEXES:
                self._cache.popitem(last=False)
        return index
