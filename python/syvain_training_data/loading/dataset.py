"""`ShardDataset`: a torch IterableDataset that reads one consumer's part of each epoch.

The dataset carries the selection as plain lists (URIs, sizes, record counts, etags), which
pickle small and fast to spawned workers, and computes its part with the pure functions of
:mod:`syvain_training_data.loading.plan`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.formats.shard_index import Segment
from syvain_training_data.loading import plan, record_plan
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading import state as checks
from syvain_training_data.loading.reader import ShardRange, consumer_records
from syvain_training_data.loading.shard_indexes import ShardIndexes
from syvain_training_data.loading.stats import PUBLISH_MASK, ConsumerSlots
from syvain_training_data.manifest import DataManifestDataFormat, ManifestShard
from syvain_training_data.shard import (
    BATCH_RECORDS,
    BATCH_ROWS,
    iter_shard,
    iter_shard_batches,
    read_records,
)
from syvain_training_data.storage import StorageConfig
from syvain_training_data.uris import FILE_PREFIX

__all__ = ["DatasetPlan", "ShardDataset", "ShardTable"]

_WORKER_STATE_VERSION = 2
# Records decoded at a time per block read of a seeded pass (64 blocks at once).
BLOCK_READ_RECORDS = 64
# Bytes fetched ahead per block read of a seeded pass, so a window's 64 to 127 reads hold at
# most 127 MiB whatever the shards' and blocks' sizes.
BLOCK_READAHEAD_BYTES = 1024 * 1024


class ShardTable:
    """The selected shards as parallel lists (no model object per shard)."""

    def __init__(self, shards: Sequence[ManifestShard]) -> None:
        self.uris = [shard.uri for shard in shards]
        self.records = [shard.records for shard in shards]
        self.sizes = [shard.size_bytes for shard in shards]
        self.etags = [shard.etag for shard in shards]

    def __len__(self) -> int:
        return len(self.uris)

    def shard(self, index: int) -> ManifestShard:
        return ManifestShard.model_construct(
            uri=self.uris[index],
            records=self.records[index],
            size_bytes=self.sizes[index],
            etag=self.etags[index],
        )

    def identity(self) -> str:
        digest = hashlib.sha256()
        for uri in self.uris:
            digest.update(uri.encode())
            digest.update(b"\0")
        return digest.hexdigest()[:16]


@dataclass(frozen=True)
class DatasetPlan:
    """What every dataset of a ``load`` or ``load_tokens`` call reads and how: the shard format,
    the selected shards (``table``), their read plan, per stream its shards (indices in the
    table), the storage, and this process's rank of ``world_size``."""

    data_format: DataManifestDataFormat
    table: ShardTable
    read_plan: plan.ReadPlan
    stream_shards: tuple[tuple[int, ...], ...]
    storage_config: StorageConfig
    rank: int
    world_size: int
    index_root: str | None = None


class ShardDataset(IterableDataset[Any]):
    """An IterableDataset over a selection, split by rank and worker (SPEC section 6).

    Each pass is one epoch (``set_epoch`` chooses it): this consumer's part of the epoch's order,
    less what an interrupted run already consumed (``interrupts``, set by the loader's
    ``load_state_dict``). Also implements torchdata's ``state_dict`` / ``load_state_dict`` per
    worker, for a StatefulDataLoader built around it with an unchanged topology.
    """

    def __init__(self, planned: DatasetPlan, *, batch_size: int, drop_last: bool) -> None:
        self.data_format = planned.data_format
        self.table = planned.table
        self.read_plan = planned.read_plan
        self.stream_shards = planned.stream_shards
        self.storage_config = planned.storage_config
        self.index_root = planned.index_root
        self.rank = planned.rank
        self.world_size = planned.world_size
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.epoch = 0
        self.interrupts: tuple[plan.Interrupt, ...] = ()
        # With a mixing schedule: the segments the interrupted runs were laid out with (None: the
        # epoch's own), set with ``interrupts``.
        self.segments: tuple[int, ...] | None = None
        self._skip: dict[str, Any] | None = None
        self._progress: dict[str, Any] | None = None
        # Where each consumer counts its reads (the loader gives one row per worker).
        self.counters = ConsumerSlots(1)

    @property
    def shards(self) -> tuple[ManifestShard, ...]:
        """The selected shards, in selection order."""
        return tuple(self.table.shard(i) for i in range(len(self.table)))

    def set_epoch(self, epoch: int) -> None:
        """Chooses the epoch of the next pass (it seeds the shard and record order)."""
        self.epoch = checks.epoch(epoch)

    def topology(self, workers: int) -> plan.Topology:
        return plan.Topology(self.world_size, max(workers, 1), self.batch_size, self.drop_last)

    def interrupts_from_json(self, value: object, epoch: int) -> tuple[plan.Interrupt, ...]:
        """The ``interrupts`` of a state taken in ``epoch``, checked (ValueError naming the
        field) before anything is computed from them: at most ``state.MAX_ENTRIES`` entries,
        each topology within the bounds of :class:`~syvain_training_data.loading.plan.Topology`,
        at most ``state.MAX_RUNS`` runs of distinct topologies and ``MAX_STATE_CONSUMERS``
        consumers in all, no more workers per rank than a loader over this selection starts,
        and no more batches than the epoch has records. Returned as they are, not merged: a run
        laid out after them (a worker state's own run) was laid out after them entry by entry."""
        entries = checks.items(value, "interrupts", checks.MAX_ENTRIES)
        interrupts = tuple(
            plan.Interrupt.from_json(entry, f"interrupts[{index}]")
            for index, entry in enumerate(entries)
        )
        problem = plan.beyond_bounds([i.topology for i in interrupts])
        if problem is not None:
            raise ValueError(f"Invalid loader state: interrupts {problem}")
        if interrupts:
            records = sum(self.read_plan.totals())
            length = plan.epoch_length(self.read_plan, epoch)
            for index, interrupt in enumerate(interrupts):
                interrupt.topology.check_workers(records, f"interrupts[{index}]")
                checks.integer(interrupt.batches, f"interrupts[{index}][4] (batches)", 0, length)
        return interrupts

    def extent(
        self, epoch: int, segments: Sequence[int] | None
    ) -> tuple[int, tuple[int, ...] | None]:
        """(the length a pass of ``epoch`` is laid out over, the boundaries it is laid out by):
        with a mixing schedule, segment by segment with ``segments`` (a resumed state's; None:
        the epoch's own); otherwise the epoch's length and no boundaries."""
        if self.read_plan.schedule is None:
            return plan.epoch_length(self.read_plan, epoch), None
        segments = tuple(segments or schedules.epoch_segments(self.read_plan, epoch))
        return segments[-1], (0, *segments)

    def _clipped(self, epoch: int, intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """``intervals`` within the epoch's order: a resumed schedule's layout may be longer
        than the order of an edited schedule (parts are ascending, so a prefix of each stays)."""
        end = plan.epoch_length(self.read_plan, epoch)
        return [(a, min(b, end)) for a, b in intervals if a < end]

    def left_in_epoch(
        self,
        workers: int,
        epoch: int,
        interrupts: Sequence[plan.Interrupt],
        segments: Sequence[int] | None = None,
    ) -> int:
        """Records all ranks read in a pass of ``epoch`` after ``interrupts``."""
        length, boundaries = self.extent(epoch, segments)
        left = record_plan.left_positions(
            self.read_plan, length, interrupts, self.topology(workers), boundaries
        )
        return sum(b - a for a, b in self._clipped(epoch, left))

    def rank_batches(
        self,
        workers: int,
        epoch: int,
        interrupts: Sequence[plan.Interrupt],
        segments: Sequence[int] | None = None,
    ) -> int:
        """Batches this rank yields in a pass of ``epoch`` after ``interrupts``."""
        length, boundaries = self.extent(epoch, segments)
        topology = self.topology(workers)
        layout = record_plan.run_layout(
            self.read_plan, length, interrupts, topology, self.rank, boundaries
        )
        sizes = [sum(b - a for a, b in self._clipped(epoch, part)) for part in layout[self.rank]]
        return sum(plan.batch_count(n, topology.batch_size, topology.drop_last) for n in sizes)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch, interrupts, segments, skip = self.epoch, self.interrupts, self.segments, 0
        if self._skip is not None:  # a torchdata worker state
            epoch, interrupts = self._skip["epoch"], self._skip["interrupts"]
            segments, skip = self._skip["segments"], self._skip["yielded"]
            self._skip = None
        # A persistent worker's copy advances one epoch per pass, like the loader.
        self.epoch, self.interrupts, self.segments = epoch + 1, (), None
        progress = {
            "epoch": epoch,
            "interrupts": interrupts,
            "segments": segments,
            "yielded": skip,
        }
        self._progress = progress
        return self._records(progress, worker, workers, skip)

    def _records(
        self, progress: dict[str, Any], worker: int, workers: int, skip: int
    ) -> Iterator[Any]:
        epoch, interrupts = progress["epoch"], progress["interrupts"]
        length, boundaries = self.extent(epoch, progress["segments"])
        part = record_plan.consumer_part(
            self.read_plan,
            length,
            interrupts,
            self.topology(workers),
            self.rank,
            worker,
            boundaries,
        )
        intervals = plan.Level(self._clipped(epoch, part)).slice(skip, length)
        orders = self.read_plan.orders(epoch)
        mixed = self.read_plan.mixed(epoch)
        counters = self.counters.consumer(worker, progress["yielded"])
        indexes = self.new_indexes()
        records = consumer_records(
            orders,
            self.stream_shards,
            mixed,
            intervals,
            lambda r: counters.watch(self._open(r, indexes)),
            prefetch=self.prefetches,
        )
        try:
            for yielded, record in enumerate(records, progress["yielded"] + 1):
                progress["yielded"] = yielded
                if not yielded & PUBLISH_MASK:
                    counters.yielded(yielded)
                yield record
        finally:
            counters.yielded(progress["yielded"])

    def new_indexes(self) -> ShardIndexes | None:
        """A pass's cache of shard indexes (made in the process that reads), when the
        selection's shards have them."""
        if not (self.read_plan.indexed and FORMATS[self.data_format].record_index):
            return None  # Parquet is entered through its own footer
        return ShardIndexes(self.storage_config, self.index_root, self.data_format)

    @property
    def prefetches(self) -> bool:
        """Whether each range read's first record is requested before it is reached: on the
        stores whose requests wait on the network. A local range read costs less than the
        hand-off of its first record from another thread (a seeded window of 64 blocks of small
        shards spent most of its start-up on those)."""
        return not all(uri.startswith(FILE_PREFIX) for uri in self.table.uris)

    def range_segment(
        self, shard: ManifestShard, start: int, stop: int, indexes: ShardIndexes | None
    ) -> Segment | None:
        """The segment to read records [start, stop) of ``shard`` from: only for a range that
        is not the whole shard (a whole read needs none)."""
        if indexes is None or start >= stop or (start == 0 and stop == shard.records):
            return None
        return indexes.segment(shard, start, stop)

    @property
    def read_batch(self) -> int:
        """Records decoded at a time per range read: a seeded worker reads a window's blocks
        at once, so it holds a window's worth of these."""
        return BLOCK_READ_RECORDS if self.read_plan.seed is not None else BATCH_RECORDS

    def column_batches(
        self,
        shard: ManifestShard,
        start: int,
        stop: int,
        indexes: ShardIndexes | None,
        columns: Sequence[str],
    ) -> Iterator[Any]:
        """The Arrow batches of ``columns`` of records [start, stop) of ``shard`` (the
        ``columns=`` and token loaders' range read): rows per batch as ``read_batch`` for
        records, read ahead as :attr:`readahead`."""
        return iter_shard_batches(
            self.data_format,
            shard,
            columns=columns,
            storage_config=self.storage_config,
            batch_size=BLOCK_READ_RECORDS if self.read_plan.seed is not None else BATCH_ROWS,
            start=start,
            stop=stop,
            index=self.range_segment(shard, start, stop, indexes),
            readahead_bytes=self.readahead,
        )

    @property
    def readahead(self) -> int | None:
        """Bytes each range read fetches ahead: a block's worth when a window's blocks are read
        at once (the store's default, 8 MiB, for one read at a time)."""
        return BLOCK_READAHEAD_BYTES if self.read_plan.seed is not None else None

    def _open(self, shard_range: ShardRange, indexes: ShardIndexes | None) -> Iterator[Any]:
        table_index, start, stop = shard_range
        shard = self.table.shard(table_index)
        if FORMATS[self.data_format].codec == "arrow":
            yield from iter_shard(
                self.data_format, shard, storage_config=self.storage_config, start=start, stop=stop
            )
            return
        # A generator: the index is read by the first read, in the range's prefetch thread.
        segment = self.range_segment(shard, start, stop, indexes)
        yield from read_records(
            self.data_format,
            shard,
            self.storage_config,
            start,
            stop,
            segment,
            self.read_batch,
            self.readahead,
        )

    # --- torchdata's per-worker protocol (same topology) ---------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset is in its pass: epoch, the interrupted runs before
        it, and the records it yielded. Positions only, never records."""
        progress = self._progress
        if progress is None:
            return {"version": _WORKER_STATE_VERSION, "epoch": self.epoch, "started": False}
        return {
            "version": _WORKER_STATE_VERSION,
            "selection": self.read_plan.fingerprint(),
            "epoch": progress["epoch"],
            "interrupts": [i.to_json() for i in progress["interrupts"]],
            "yielded": progress["yielded"],
            "started": True,
            **schedules.state_fields(self.read_plan, progress["epoch"], progress["segments"]),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next pass continue where :meth:`state_dict` was taken, on the same
        topology. Raises ValueError, naming the field, for a state of another version or
        selection and for a field that is missing, of the wrong type or out of bounds."""
        if not isinstance(state, Mapping):
            raise ValueError(f"A loader state is a dict, got {checks.describe(state)}")
        version = state.get("version")
        if isinstance(version, bool) or version != _WORKER_STATE_VERSION:
            raise ValueError(f"Unsupported loader state version {checks.describe(version)}")
        started = checks.field(state, "started")
        if not isinstance(started, bool):
            raise ValueError(
                f"Invalid loader state: started must be a bool, got {checks.describe(started)}"
            )
        epoch = checks.epoch_of(state)
        if not started:
            self._progress = self._skip = None
            self.epoch = epoch
            return
        selection = checks.string(checks.field(state, "selection"), "selection")
        resumed = self.read_plan.resumed_by(selection, plan.ReadPlan.fingerprint)
        if resumed is None:
            raise ValueError(
                self.read_plan.refusal(
                    selection,
                    plan.ReadPlan.fingerprint,
                    "This loader state was saved for another selection or seed",
                )
            )
        self.read_plan = resumed
        interrupts = self.interrupts_from_json(checks.field(state, "interrupts"), epoch)
        segments = None
        if self.read_plan.schedule is not None:  # this worker's own schedule, unchanged
            records = sum(self.read_plan.totals())
            segments = schedules.segments_from_json(checks.field(state, "segments"), records)
        length, _ = self.extent(epoch, segments)
        yielded = checks.integer(checks.field(state, "yielded"), "yielded", 0, length)
        self._progress = None
        self._skip = {
            "epoch": epoch,
            "interrupts": interrupts,
            "segments": segments,
            "yielded": yielded,
        }


def stream_tables(
    shards: Sequence[ManifestShard], groups: Sequence[Sequence[int]]
) -> tuple[ShardTable, tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """(table, per stream its table indices, per stream its record counts)."""
    table = ShardTable(shards)
    ids = tuple(tuple(group) for group in groups)
    counts = tuple(tuple(table.records[i] for i in group) for group in ids)
    return table, ids, counts
