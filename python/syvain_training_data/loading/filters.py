"""Filters: ``load(..., filter=pred)`` and ``load_tokens(..., filter=pred)``.

A :class:`RecordFilter` is a picklable predicate on a record, applied where the record is read
(in the DataLoader workers, or the main process at 0 workers), before batching. Records it
rejects are consumed like the others but never yielded, so what a worker yields no longer says
how far it read: a filtered loader's batches carry their worker's source position, the state
model of :mod:`~syvain_training_data.loading.positions` (a state counts source records consumed,
never records yielded), and resume exactly on any topology. The state names the filter
(:attr:`RecordFilter.name`), so resuming with another filter is refused, not silently shifted.

:class:`FilteredDataset` and :class:`FilteredDataLoader` are the filtered ``load``; the token
loader applies its filter in :mod:`~syvain_training_data.loading.tokens`.
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import default_collate, default_convert

from syvain_training_data.loading import plan
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading import state as checks
from syvain_training_data.loading.bundles import BUNDLE_BATCHES, Bundle
from syvain_training_data.loading.dataloader import STATE_VERSION
from syvain_training_data.loading.dataset import ShardDataset
from syvain_training_data.loading.positions import (
    PositionDataset,
    PositionLoader,
    check_read,
    sent,
)
from syvain_training_data.loading.reader import ShardRange, consumer_records
from syvain_training_data.loading.shard_indexes import ShardIndexes
from syvain_training_data.loading.stats import PUBLISH_MASK

__all__ = [
    "FILTERED_KIND",
    "MAX_FILTER_NAME",
    "FilteredDataLoader",
    "FilteredDataset",
    "RecordFilter",
    "Tagged",
    "check_filter_names",
    "filter_refusal",
    "record_filter",
    "tagged_records",
]

# A filtered record loader state's ``kind``.
FILTERED_KIND = "filtered"
# A state holds the filter's name; a loader state's strings are at most 64 characters.
MAX_FILTER_NAME = 64
# (shard index in the table, record number in the shard, record)
Tagged = tuple[int, int, Any]


@dataclass(frozen=True)
class RecordFilter:
    """``predicate`` (a record -> whether to keep it) and ``name``, what a loader state names
    it by: the caller's ``filter_name``, or ``sha256:`` and a digest of the pickled
    predicate."""

    predicate: Callable[[Any], Any]
    name: str

    def keeps(self, record: Any, uri: str, number: int) -> bool:
        """Whether the predicate keeps ``record`` (record ``number`` of shard ``uri``): a
        RuntimeError naming the shard and the record when it raises."""
        try:
            return bool(self.predicate(record))
        except Exception as error:
            raise RuntimeError(
                f"The filter raised {type(error).__name__} on record {number} of shard {uri}: "
                f"{error}"
            ) from error


def record_filter(predicate: object, filter_name: object) -> RecordFilter | None:
    """``filter`` and ``filter_name`` of ``load`` and ``load_tokens``, checked at the call:
    None without a filter. ``predicate`` must be callable; ``filter_name``, 1 to 64 characters,
    names it in a loader state (default: the sha256 of its pickle, which for a plain function
    is its module and name, and for a ``functools.partial`` also its arguments). A predicate
    that does not pickle (a lambda, a local function) needs a ``filter_name``, and runs only
    where no copy is pickled: in the main process, or in forked workers."""
    if predicate is None:
        if filter_name is not None:
            raise ValueError("filter_name names a filter: pass it with filter=")
        return None
    if not callable(predicate):
        raise TypeError(
            "filter must be a callable that takes a record and returns whether to keep it, "
            f"not {type(predicate).__name__}"
        )
    if filter_name is None:
        try:
            pickled = pickle.dumps(predicate, protocol=4)
        except Exception as error:
            raise TypeError(
                f"filter must be picklable to be named by default: {predicate!r:.80} is not "
                f"({type(error).__name__}: {str(error):.100}). Use a module-level function or a "
                "functools.partial of one (spawned workers need a picklable filter), or give "
                "this one a filter_name (it then runs only in the main process or forked "
                "workers)"
            ) from None
        return RecordFilter(predicate, f"sha256:{hashlib.sha256(pickled).hexdigest()[:32]}")
    if not isinstance(filter_name, str) or not 0 < len(filter_name) <= MAX_FILTER_NAME:
        raise TypeError(
            f"filter_name must be a str of 1 to {MAX_FILTER_NAME} characters, not "
            f"{filter_name!r:.80}"
        )
    return RecordFilter(predicate, filter_name)


def filter_refusal(theirs: str | None, ours: RecordFilter | None) -> str:
    """Why a state made with filter ``theirs`` (None: no filter) does not resume a loader
    filtering with ``ours`` (None: none)."""
    if ours is None:
        return (
            f"This loader state was made with filter {theirs!r} (filter=), and this loader has "
            "no filter: pass that filter to resume it"
        )
    if theirs is None:
        return (
            "This loader state was made by a loader without a filter, and this loader filters "
            f"with filter {ours.name!r}: its positions count other records"
        )
    return (
        f"This loader state was made with filter {theirs!r}, and this loader filters with "
        f"filter {ours.name!r} (resume with the filter that made it, or give both the same "
        "filter_name if they keep the same records)"
    )


def check_filter_names(state: Mapping[str, Any], ours: RecordFilter | None) -> None:
    """ValueError naming both when ``state`` was made with another filter than ``ours``."""
    theirs = state.get("filter")
    if theirs is not None:
        theirs = checks.string(theirs, "filter")
    if theirs != (None if ours is None else ours.name):
        raise ValueError(filter_refusal(theirs, ours))


def _convert_one(batch: list[Any]) -> Any:
    """The collate of batches of one record without batching (``batch_size=None``)."""
    return default_convert(batch[0])  # type: ignore[no-untyped-call]


def tagged_records(
    dataset: ShardDataset, shard_range: ShardRange, indexes: ShardIndexes | None
) -> Iterator[Tagged]:
    """A shard range's records as ``load`` reads them (dicts), each with its shard and its
    number in the shard (a filter error names them)."""
    return _tagged(shard_range, ShardDataset._open(dataset, shard_range, indexes))


def _tagged(shard_range: ShardRange, records: Iterator[Any]) -> Iterator[Tagged]:
    table_index, start, _ = shard_range
    return zip(itertools.repeat(table_index), itertools.count(start), records, strict=False)


class FilteredDataset(PositionDataset):
    """A :class:`PositionDataset` of records that ``keep`` keeps: each consumer reads its part
    of the epoch, applies the filter to every record and collates (``collate``) each
    ``batch_size`` records it keeps into a batch, tagged with the worker and the source records
    of its part it has consumed (the loader strips the tags). ``columns``: read only these
    columns (``load(columns=)``), each record a dict of them."""

    state_kind = FILTERED_KIND
    state_fields = "selection, seed, shuffle, mixing or filter"

    def __init__(
        self,
        *args: Any,
        keep: RecordFilter,
        collate: Callable[[list[Any]], Any] | None,
        columns: Sequence[str] | None = None,
        batched: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.keep = keep
        self.columns = None if columns is None else list(columns)
        self.collate: Callable[[list[Any]], Any]
        if not batched:  # batch_size None: each record on its own, converted as torch does
            self.batch_size, self.collate = 1, _convert_one
        else:
            self.collate = default_collate if collate is None else collate

    def fingerprint(
        self, read_plan: plan.ReadPlan | None = None, earlier_release: bool = False
    ) -> str:
        """The selection's digest and the filter's name (the batch size and the number of
        workers may change between runs)."""
        selection = (read_plan or self.read_plan).fingerprint(earlier_release)
        text = f"{selection}:{FILTERED_KIND}:{self.keep.name}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def names(self) -> dict[str, str]:
        return {"filter": self.keep.name}

    def check_names(self, state: dict[str, Any]) -> None:
        check_filter_names(state, self.keep)

    def __iter__(self) -> Iterator[Bundle]:
        bundles, in_worker = self.pass_bundles(BUNDLE_BATCHES)
        if not in_worker or self.columns is None:
            # collate_fn's batches travel as the DataLoader sends them: walking batches of any
            # shape for tensors to wrap costs more than it saves (a dict per record rebuilt).
            return bundles
        return sent(bundles, None)  # columns=: a dict of tensors, small ones sent by value

    def _batches(
        self,
        epoch: int,
        interrupts: Sequence[Any],
        worker: int,
        workers: int,
    ) -> Iterator[tuple[Any, int, int, int]]:
        topology = self.topology(workers)
        segments = self.token_segments if interrupts else None
        layout, cuts = schedules.scheduled_token_layout(
            self.read_plan, epoch, interrupts, segments, topology, self.rank
        )
        if cuts:  # a filtered loader's positions never fall inside a record
            raise ValueError("This loader state cuts a record, which a filtered loader never does")
        part = layout[self.rank][worker]
        counters = self.counters.consumer(worker)
        indexes = self.new_indexes()
        records: Iterator[Tagged] = consumer_records(
            self.read_plan.orders(epoch),
            self.stream_shards,
            self.read_plan.mixed(epoch),
            part,
            lambda r: counters.watch(self._tagged(r, indexes)),
            prefetch=self.prefetches,
        )
        return self._kept(records, part, epoch, worker, counters)

    def _kept(
        self,
        records: Iterator[Tagged],
        part: Sequence[tuple[int, int]],
        epoch: int,
        worker: int,
        counters: Any,
    ) -> Iterator[tuple[Any, int, int, int]]:
        keeps, uris = self.keep.keeps, self.table.uris
        size, collate = self.batch_size, self.collate
        batch: list[Any] = []
        index = 0
        try:
            for index, (shard, number, record) in enumerate(records, 1):
                if keeps(record, uris[shard], number):
                    batch.append(record)
                    if len(batch) == size:
                        yield collate(batch), worker, index, 0
                        batch = []
                if not index & PUBLISH_MASK:
                    counters.yielded(index)
            check_read(index, part, epoch)
            if batch and not self.drop_last:
                yield collate(batch), worker, index, 0
        finally:
            counters.yielded(index)  # records read, kept or not

    def _tagged(self, shard_range: ShardRange, indexes: ShardIndexes | None) -> Iterator[Tagged]:
        if self.columns is None:
            return tagged_records(self, shard_range, indexes)
        records = self._column_records(shard_range, indexes, self.columns)
        return _tagged(shard_range, records)

    def _column_records(
        self, shard_range: ShardRange, indexes: ShardIndexes | None, columns: Sequence[str]
    ) -> Iterator[dict[str, Any]]:
        from syvain_training_data.loading.columns import batch_records

        table_index, start, stop = shard_range
        shard = self.table.shard(table_index)
        for batch in self.column_batches(shard, start, stop, indexes, columns):
            yield from batch_records(batch, columns)


class FilteredDataLoader(PositionLoader):
    """The DataLoader a filtered ``load`` returns: batches of the records the filter keeps.
    ``len()`` is a TypeError (how many records pass is known only once the epoch is read);
    ``state_dict`` / ``load_state_dict`` resume exactly on any number of ranks, workers and any
    batch size, and only with the same filter."""

    dataset: FilteredDataset

    def __len__(self) -> int:
        raise TypeError(
            "A filtered loader has no len(): how many batches it yields depends on how many "
            "records the filter keeps, known only once the epoch is read"
        )

    def _check_kind(self, state: object) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"A loader state is a dict, got {checks.describe(state)}")
        version = state.get("version")
        if isinstance(version, bool) or version != STATE_VERSION:
            raise ValueError(f"Unsupported loader state version {checks.describe(version)}")
        kind = state.get("kind")
        if kind is None:  # a record loader's state: made without a filter
            raise ValueError(filter_refusal(None, self.dataset.keep))
        if kind != FILTERED_KIND:
            raise ValueError(
                f"Not a filtered record loader state (kind {checks.describe(kind)}): "
                "state_dict of a load(filter=) loader"
            )
