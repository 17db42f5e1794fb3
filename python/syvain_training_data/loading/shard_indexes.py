"""The record offset indexes a loader reads (``formats.shard_index``): per shard, the index's
header once, then for each range read one ranged GET of the few index entries around the range
(about 4 KiB per MiB of shard), never the whole index.

Two questions, kept apart (SPEC section 6, the order and indexes, v4):

- *Does the dataset have indexes?* (:func:`has_index`) It decides whether a seeded order cuts
  shards into blocks, so it must get the same answer on every rank: only a definite "not
  found" means no, every other error is raised (after the store's retries), and what the index
  holds plays no part.
- *May this consumer read this shard through its index?* (:class:`ShardIndexes`) Only when the
  index names the shard the manifest names, at the version the store serves (records, size and
  version tag, ``formats.shard_index``); otherwise, once per shard and with one warning (none
  when there is no index), the consumer learns the shard's frame offsets as it reads
  (``loading.learned_offsets``). This changes the bytes fetched, never the records.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict

from syvain_training_data.errors import StorageError, StorageRetryExhaustedError
from syvain_training_data.formats.gzip_index import GzipIndexLayout
from syvain_training_data.formats.indexes import build_index
from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.formats.shard_index import (
    EARLIER_MAGIC,
    IndexLayout,
    Segment,
    ShardIndex,
    index_uri,
    version_tag,
)
from syvain_training_data.loading.learned_offsets import LearnedOffsets
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    open_stream,
    read_range,
)
from syvain_training_data.uris import portable_etag

__all__ = ["ShardIndexes", "has_index", "index_problem", "read_index_bytes", "shard_version"]

log = logging.getLogger(__name__)

# Shards whose verdict (index usable or not) a consumer remembers.
REMEMBERED = 4096
# Shards without a usable index whose learned frame offsets a consumer keeps (512 KiB each at
# most): a window reads at most 127 blocks at once.
LEARNED_SHARDS = 128


def index_layout(data_format: str, shard: ManifestShard) -> IndexLayout | GzipIndexLayout:
    """The layout of ``shard``'s index in its format."""
    if FORMATS[data_format].index == "access_points":
        return GzipIndexLayout(shard.records, shard.size_bytes)
    return IndexLayout(shard.records, shard.size_bytes)


def sized_layout(
    data_format: str, shard: ManifestShard, uri: str, config: StorageConfig | None
) -> IndexLayout | GzipIndexLayout:
    """The layout of ``shard``'s index object at ``uri`` as stored: a jsonl.gz index's slot
    size depends on its longest window, so its object is HEADed for its size (FileNotFoundError
    when there is none; ValueError when no layout fits it)."""
    layout = index_layout(data_format, shard)
    if isinstance(layout, GzipIndexLayout):
        layout = layout.with_object_size(head_object(uri, storage_config=config).size)
    return layout


def read_index_bytes(
    uri: str,
    layout: IndexLayout | GzipIndexLayout,
    start: int,
    end: int,
    config: StorageConfig | None,
) -> bytes:
    """Bytes [start, end) of the index object at ``uri``; its size must be the layout's."""
    return read_range(
        uri, size_bytes=layout.object_size, start=start, end=end, storage_config=config
    )


def has_index(
    shard: ManifestShard, storage_config: StorageConfig | None, index_root: str | None = None
) -> bool:
    """Whether ``shard`` has an index object (beside it, or under ``index_root``; one HEAD; its
    content plays no part).

    Raises the store's error, naming the index, for anything but a definite "not found": a
    rank that cannot tell must not guess, or ranks would order the epoch differently."""
    uri = index_uri(shard.uri, index_root)
    try:
        head_object(uri, storage_config=storage_config)
    except FileNotFoundError:
        return False
    except StorageError as error:  # the same class, so callers' handling stays right
        raise type(error)(_undecided(uri, error), error.uri, error.reason) from error
    except OSError as error:
        raise type(error)(_undecided(uri, error)) from error
    return True


def has_page_index(shard: ManifestShard, storage_config: StorageConfig | None) -> bool:
    """Whether a Parquet ``shard`` has an offset index for every column chunk (its footer read:
    one or two ranged reads of its tail), so a block inside a row group fetches only its pages.

    Raises the store's error or the ShardDataError of a footer that does not parse, naming the
    shard: a rank that cannot tell must not guess."""
    from syvain_training_data.formats.parquet.reader import open_native

    try:
        return bool(open_native(shard, storage_config, 0, 0, None, None).paged)
    except StorageError as error:
        raise type(error)(_undecided(shard.uri, error), error.uri, error.reason) from error
    except OSError as error:
        raise type(error)(_undecided(shard.uri, error)) from error
    except RuntimeError as error:
        raise type(error)(_undecided(shard.uri, error)) from error


def _undecided(uri: str, error: BaseException) -> str:
    return (
        "Cannot tell whether the dataset has record offset indexes (which decides the seeded "
        f"order): reading {uri} failed: {error}. Pass indexes=True or indexes=False to load() "
        "to decide without reading it"
    )


class ShardIndexes:
    """Segments of indexed shards, each from the index entries around the range read, once
    the index is known to name its shard. Thread-safe: a window's range reads start in
    threads of their own."""

    def __init__(
        self,
        storage_config: StorageConfig | None,
        index_root: str | None = None,
        data_format: str = "msgpack.zstf",
    ) -> None:
        self.data_format = data_format
        self.storage_config = storage_config
        self.index_root = index_root
        self._usable: OrderedDict[str, bool] = OrderedDict()
        self._checking: dict[str, threading.Lock] = {}
        self._learned_offsets: OrderedDict[str, LearnedOffsets] = OrderedDict()
        # jsonl.gz index layouts (their window room places the slots), once checked.
        self._gzip_layouts: dict[str, GzipIndexLayout] = {}
        self._lock = threading.Lock()

    def segment(self, shard: ManifestShard, start: int, stop: int) -> Segment | None:
        """The segment holding records [start, stop) (start < stop) of ``shard``: from the
        index entries around it, or, when the shard has no index that names it, from the
        offsets this consumer learns of its frames (``loading.learned_offsets``); None: read
        the shard from its start."""
        layout = index_layout(self.data_format, shard)
        if isinstance(layout, GzipIndexLayout):
            return self._entered(shard, layout, start, stop)
        first, end = layout.entries_for(start, stop)
        low, high = layout.byte_range(first, end)
        # Entries right after the header come with it on the index's first read: one request.
        usable, read = self._names_its_shard(shard, high if low == layout.header_size else 0)
        if not usable:
            return self._learned(shard).segment(start, stop)
        uri = index_uri(shard.uri, self.index_root)
        try:
            if len(read) >= high:
                data = read[low:high]
            else:
                data = read_index_bytes(uri, layout, low, high, self.storage_config)
            return layout.segment(first, array("q", data), start, stop)
        except StorageRetryExhaustedError:
            raise
        except (FileNotFoundError, PermissionError, StorageError, ValueError) as error:
            # Gone or changed since its header was read, or offsets that do not fit.
            self._set_unusable(shard, uri, str(error))
        return self._learned(shard).segment(start, stop)

    def _entered(
        self, shard: ManifestShard, layout: GzipIndexLayout, start: int, stop: int
    ) -> Segment | None:
        """A jsonl.gz segment from the access points around [start, stop): the first one's
        entry (with its window) and the last one's end; None (read from the shard's start)
        when the shard has no index that names it."""
        if not self._names_its_shard(shard)[0]:
            return None
        uri = index_uri(shard.uri, self.index_root)
        with self._lock:
            sized = self._gzip_layouts.get(shard.uri)
        if sized is None:  # forgotten since it was checked: check again
            usable = self._check(shard)[0]
            return self._entered(shard, layout, start, stop) if usable else None
        layout = sized
        first, last = layout.entry_of(start), layout.entry_of(stop - 1)
        try:
            slot = read_index_bytes(
                uri, layout, *layout.slot_range(first, window=first > 0), self.storage_config
            )
            entry = layout.entry(slot)
            end_byte = entry.end_byte
            if last != first:
                slot = read_index_bytes(
                    uri, layout, *layout.slot_range(last, window=False), self.storage_config
                )
                end_byte = layout.entry(slot).end_byte
            if entry.first_record > start:
                raise ValueError(f"its entry for record {start} starts after it")
            return layout.segment(entry, end_byte)
        except StorageRetryExhaustedError:
            raise
        except (FileNotFoundError, PermissionError, StorageError, ValueError) as error:
            self._set_unusable(shard, uri, str(error))
        return None

    def _learned(self, shard: ManifestShard) -> LearnedOffsets:
        with self._lock:
            learned = self._learned_offsets.get(shard.uri)
            if learned is None:
                learned = self._learned_offsets[shard.uri] = LearnedOffsets(
                    shard, self.storage_config
                )
                if len(self._learned_offsets) > LEARNED_SHARDS:
                    self._learned_offsets.popitem(last=False)
            self._learned_offsets.move_to_end(shard.uri)
            return learned

    def _names_its_shard(self, shard: ManifestShard, until: int = 0) -> tuple[bool, bytes]:
        """Whether ``shard``'s index names it, checked once per shard; when this call checks
        it, also the index's bytes it read, up to ``until`` (at least its header)."""
        with self._lock:
            known = self._usable.get(shard.uri)
            checking = self._checking.setdefault(shard.uri, threading.Lock())
        if known is not None:
            return known, b""
        read = b""
        with checking:  # one check per shard, whatever number of its blocks a window reads
            with self._lock:
                known = self._usable.get(shard.uri)
            if known is None:
                known, read = self._check(shard, until)
            with self._lock:
                self._checking.pop(shard.uri, None)
        return known, read

    def _check(self, shard: ManifestShard, until: int = 0) -> tuple[bool, bytes]:
        """Whether ``shard``'s index names it, and the index's bytes read to tell (its header,
        or up to ``until`` when that is further)."""
        uri = index_uri(shard.uri, self.index_root)
        layout = index_layout(self.data_format, shard)
        read = b""
        try:
            layout = sized_layout(self.data_format, shard, uri, self.storage_config)
            end = max(layout.header_size, min(until, layout.object_size))
            read = read_index_bytes(uri, layout, 0, end, self.storage_config)
            problem = layout.header_problem(
                read[: layout.header_size], shard_version(shard, self.storage_config)
            )
        except FileNotFoundError:
            self._remember(shard.uri, False)
            return False, b""
        except StorageRetryExhaustedError:
            raise
        except (PermissionError, StorageError, ValueError) as error:
            problem = str(error)
        if problem is not None:
            self._set_unusable(shard, uri, problem)
            return False, b""
        if isinstance(layout, GzipIndexLayout):
            with self._lock:
                self._gzip_layouts[shard.uri] = layout
                if len(self._gzip_layouts) > REMEMBERED:
                    del self._gzip_layouts[next(iter(self._gzip_layouts))]
        self._remember(shard.uri, True)
        return True, read

    def _set_unusable(self, shard: ManifestShard, uri: str, problem: str) -> None:
        with self._lock:
            warned = self._usable.get(shard.uri) is False
        if not warned:
            log.warning(
                "Ignoring the shard index %s: %s; reading the shard without it", uri, problem
            )
        self._remember(shard.uri, False)

    def _remember(self, uri: str, usable: bool) -> None:
        with self._lock:
            self._usable[uri] = usable
            self._usable.move_to_end(uri)
            if len(self._usable) > REMEMBERED:
                self._usable.popitem(last=False)


def shard_etag(shard: ManifestShard, storage_config: StorageConfig | None) -> str:
    """The etag ``shard`` is read at: its manifest etag (the read holds the store to it), else
    the one the store gives now (one HEAD)."""
    etag = portable_etag(shard.uri, shard.etag)
    return etag or head_object(shard.uri, storage_config=storage_config).etag


def shard_version(shard: ManifestShard, storage_config: StorageConfig | None) -> bytes:
    """The version tag of ``shard`` as a reader reads it (of :func:`shard_etag`)."""
    return version_tag(shard.uri, shard_etag(shard, storage_config))


def index_problem(
    shard: ManifestShard,
    storage_config: StorageConfig | None,
    index_root: str | None = None,
    data_format: str = "msgpack.zstf",
) -> str | None:
    """What is wrong with ``shard``'s index (``syvain-data verify --deep``): read whole and
    compared with the index built anew from the shard, streamed once more; None when it is
    right, or when there is none or an earlier release's, which loaders do not use.

    A loader trusts an index that names its shard's version (nothing pins its entries), so
    this is the check that an index's entries are those of its shard."""
    uri = index_uri(shard.uri, index_root)
    try:
        data = get_object(uri, storage_config=storage_config)
    except FileNotFoundError:
        return None
    if data[: len(EARLIER_MAGIC)] == EARLIER_MAGIC:
        return None
    etag = shard_etag(shard, storage_config)
    version = version_tag(shard.uri, etag)
    layout = index_layout(data_format, shard)
    try:
        if isinstance(layout, GzipIndexLayout):
            layout = layout.with_object_size(len(data))
        problem = layout.header_problem(data[: layout.header_size], version)
    except ValueError as error:
        problem = str(error)
    if problem is None and len(data) != layout.object_size:
        problem = f"it holds {len(data)} bytes, not the {layout.object_size} expected"
    if problem is not None:
        return f"{uri}: loaders do not use it: {problem}"
    pinned = portable_etag(shard.uri, shard.etag) or None  # as the loader reads it
    with open_stream(
        shard.uri, size_bytes=shard.size_bytes, etag=pinned, storage_config=storage_config
    ) as stream:
        expected = b"".join(
            build_index(
                data_format,
                shard.uri,
                stream,
                shard.records,
                shard.size_bytes,
                etag,
            )
        )
    if data == expected:
        return None
    if isinstance(layout, GzipIndexLayout):
        if data[: layout.header_size] != expected[: layout.header_size]:
            return f"{uri}: its header is not the one its shard gives (another window room)"
        wrong = _first_difference(data, expected, layout.header_size, layout.slot)
        return (
            f"{uri}: access point {wrong} (records from {wrong * layout.step}) "
            "is not the one its shard has; loaders trust an index that names its shard's "
            "version, so delete it or write it anew (syvain-data index)"
        )
    try:
        index = ShardIndex.parse(data, shard.records, shard.size_bytes, version)
    except ValueError as error:
        return f"{uri}: loaders do not use it: {error}"
    offsets = ShardIndex.parse(expected, shard.records, shard.size_bytes, version).offsets
    wrong_entries = [
        k for k, (a, b) in enumerate(zip(index.offsets, offsets, strict=True)) if a != b
    ]
    k = wrong_entries[0]
    return (
        f"{uri}: {len(wrong_entries)} of {len(offsets)} entries name the wrong byte offset "
        f"(entry {k}: record {k * index.layout.every} starts at byte {offsets[k]}, the index "
        f"says {index.offsets[k]}); loaders trust an index that names its shard's version, so "
        "delete it or write it anew (syvain-data cp --with-shards)"
    )


def _first_difference(data: bytes, expected: bytes, header: int, slot: int) -> int:
    """The first slot where two index objects of the same layout differ."""
    k = 0
    while (
        data[header + k * slot : header + (k + 1) * slot]
        == (expected[header + k * slot : header + (k + 1) * slot])
    ):
        k += 1
    return k
