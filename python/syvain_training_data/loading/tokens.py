"""Sequence packing: ``SplitDataLoader.load_tokens``.

Each consumer (rank, worker) reads its part of the epoch order (the record plan of
:mod:`~syvain_training_data.loading.plan`), concatenates its records' token lists, with
``eos_id`` after each when given, and cuts the result into blocks of ``seq_len`` tokens; a batch
is ``batch_size`` blocks, an int64 tensor of shape (batch, seq_len). Fewer than ``seq_len``
tokens per consumer are left out of an epoch.

Blocks cut records, so what a consumer consumed does not follow from batch counts: every batch
travels with its worker's position after it (records of the part wholly consumed, tokens of
the next), the loader keeps the position of the last batch the training loop received from
each worker, and ``state_dict`` holds those positions (never tokens).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import get_worker_info

from syvain_training_data.errors import ShardDataError
from syvain_training_data.loading import plan, token_plan, token_state
from syvain_training_data.loading import schedule as schedules
from syvain_training_data.loading import state as checks
from syvain_training_data.loading.bundles import (
    BUNDLE_BATCHES,
    BUNDLE_BYTES,
    Bundle,
    as_is,
    bundled,
    in_turn,
)
from syvain_training_data.loading.dataloader import STATE_VERSION, EpochLoader
from syvain_training_data.loading.dataset import ShardDataset
from syvain_training_data.loading.list_columns import int_lists
from syvain_training_data.loading.packing import (
    BlockPacking,
    Cut,
    Records,
    RowOptions,
    RowPacker,
    TokenChannels,
    TokenPacker,
    loss_mask,
)
from syvain_training_data.loading.reader import ShardRange, consumer_records
from syvain_training_data.loading.shard_indexes import ShardIndexes
from syvain_training_data.loading.stats import PUBLISH_MASK
from syvain_training_data.loading.text_tokens import (
    TextTokenizer,
    text_problem,
    tokenizer_refusal,
)
from syvain_training_data.loading.token_state import merge_token_states
from syvain_training_data.loading.transfer import BatchRing, for_transfer
from syvain_training_data.shard import iter_shard

__all__ = ["TokenDataLoader", "TokenDataset", "merge_token_states"]

STATE_KIND = "tokens"
# (batch, worker, records wholly consumed, tokens of the next record consumed)
_Tagged = tuple[torch.Tensor, int, int, int]


class TokenDataset(ShardDataset):
    """A :class:`ShardDataset` whose consumers yield packed token batches, each tagged with the
    worker and its position after it (the loader strips the tags)."""

    def __init__(
        self,
        *args: Any,
        column: str,
        seq_len: int,
        eos_id: int | None,
        documents: bool = False,
        mask_column: str | None = None,
        rows: RowOptions | None = None,
        text: TextTokenizer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.column = column
        # Tokenizes a text column instead of reading ``column`` (load_tokens(text_column=)).
        self.text = text
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.mask_column = mask_column
        self.rows = rows
        self.channels = TokenChannels(documents, mask_column is not None, rows is not None)
        self.token_interrupts: tuple[token_plan.TokenInterrupt, ...] = ()
        # Set by the loader before it forks workers: how their batches reach it, and how many
        # travel as one DataLoader item.
        self.ring: BatchRing | None = None
        self.bundle = 1

    # The segments a resumed epoch of a mixing schedule is laid out with (its state's; None:
    # the epoch's own), set by the loader with ``token_interrupts``.
    token_segments: tuple[int, ...] | None = None

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("A token dataset resumes through its loader's state_dict()")

    def load_state_dict(self, state: Any) -> None:
        raise TypeError("A token dataset resumes through its loader's load_state_dict()")

    def fingerprint(
        self, read_plan: plan.ReadPlan | None = None, earlier_release: bool = False
    ) -> str:
        """The selection's digest plus what decides the token stream (``seq_len`` and the batch
        size may change between runs); of ``read_plan`` instead of this dataset's when given
        (the plan's ``earlier_release`` digest: see :meth:`ReadPlan.fingerprint`)."""
        selection = (read_plan or self.read_plan).fingerprint(earlier_release)
        source = self.column if self.text is None else f"text:{self.text.column}:{self.text.name}"
        text = f"{selection}:{STATE_KIND}:{source}:{self.eos_id}"
        if self.rows is not None:  # a row per record: no state of packed blocks applies
            text += f":rows:{self.rows.truncate}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __iter__(self) -> Iterator[Bundle]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        epoch, interrupts = self.epoch, self.token_interrupts
        # A persistent worker's copy advances one epoch per pass, like the loader.
        self.epoch, self.token_interrupts = epoch + 1, ()
        batches = self._batches(epoch, interrupts, worker, workers)
        bundles = bundled(batches, worker, self.bundle)
        return bundles if info is None else _sent(bundles, self.ring)

    def _batches(
        self,
        epoch: int,
        interrupts: Sequence[token_plan.TokenInterrupt],
        worker: int,
        workers: int,
    ) -> Iterator[_Tagged]:
        topology = self.topology(workers)
        segments = self.token_segments if interrupts else None
        layout, cuts = schedules.scheduled_token_layout(
            self.read_plan, epoch, interrupts, segments, topology, self.rank
        )
        part = layout[self.rank][worker]
        counters = self.counters.consumer(worker)
        orders, mixed = self.read_plan.orders(epoch), self.read_plan.mixed(epoch)
        # In plain order (no seed, no mixing) a decoded batch's records are the next
        # records of the part: they reach the packer as one run, with no Python per record.
        in_runs = mixed is None and self.read_plan.seed is None
        open_range = self._open if in_runs else self._open_records
        indexes = self.new_indexes()
        runs = consumer_records(
            orders,
            self.stream_shards,
            mixed,
            part,
            lambda r: counters.watch(open_range(r, indexes)),
        )
        cut_at = token_plan.cuts_by_index(part, cuts)
        packer: RowPacker | BlockPacking
        if self.rows is not None:
            if cut_at:  # a row-per-record state never cuts a record
                raise ValueError("This loader state cuts a record, which pack=False never does")
            packer = RowPacker(
                self.seq_len,
                self.batch_size,
                self.rows.pad_id,
                self.eos_id,
                self.ring,
                self.channels,
            )
        else:
            blocks = TokenPacker(self.seq_len, self.batch_size, self.ring, self.channels)
            packer = BlockPacking(blocks, self.eos_id, Cut(cut_at, epoch, part))
        return self._packed(runs, packer, epoch, part, worker, counters)

    def _packed(
        self,
        runs: Iterator[Records],
        packer: RowPacker | BlockPacking,
        epoch: int,
        part: Sequence[tuple[int, int]],
        worker: int,
        counters: Any,
    ) -> Iterator[_Tagged]:
        index = 0
        try:
            for records in runs:
                count = len(records.bounds) - 1
                for batch, whole, offset in packer.pack(index, records):
                    yield batch, worker, whole, offset
                if (index ^ (index + count)) & ~PUBLISH_MASK:
                    counters.yielded(index + count)
                index += count
            _check_read(index, part, epoch)
            for batch, whole, offset in packer.finish(self.drop_last):
                yield batch, worker, whole, offset
        finally:
            counters.yielded(index)  # records read (a cut one counts once)

    def _open(self, shard_range: ShardRange, indexes: ShardIndexes | None) -> Iterator[Records]:
        """A shard range's decoded batches, each as one run (or, tokenizing, a run per
        tokenizer call): the token column's int64 values, the offsets of its records in them
        and their loss mask, sliced from the columnar batches with no Python object per
        token."""
        table_index, start, stop = shard_range
        shard = self.table.shard(table_index)
        if self.text is not None:
            columns = [self.text.column]
        elif self.mask_column is None:
            columns = [self.column]
        else:
            columns = [self.column, self.mask_column]
        batches = self.column_batches(shard, start, stop, indexes, columns)
        record = start
        try:
            for batch in batches:
                for offsets, values, mask in self._token_lists(batch, shard.uri, record):
                    if self.rows is not None and self.rows.truncate == "error":
                        self._check_fits(offsets, shard.uri, record)
                    bounds = offsets.tolist()
                    record += len(bounds) - 1
                    if len(bounds) > 1:
                        yield Records(values, bounds, mask)
        except ShardDataError as error:
            if self.text is None:
                raise
            # The columnar decoder refuses a text column that mixes str with other values
            # without naming the record: the records themselves do.
            records = iter_shard(
                self.data_format, shard, storage_config=self.storage_config, start=record, stop=stop
            )
            problem = text_problem(records, self.text.column, shard.uri, record)
            if problem is None:
                raise
            raise problem from error

    def _token_lists(
        self, batch: Any, uri: str, first: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """(offsets, int64 values, loss mask or None) of a decoded batch's records, whose
        first is record ``first`` of shard ``uri``: the token column's, or the text column's
        tokens, a tokenizer call at a time."""
        if self.text is not None:
            for offsets, values in self.text.token_lists(batch, uri, first):
                yield offsets, values, None
            return
        offsets, values = self._int_lists(batch, uri)
        mask = None
        if self.mask_column is not None:
            mask = loss_mask(batch, self.mask_column, offsets, len(values), uri, first)
        yield offsets, values, mask

    def _open_records(
        self, shard_range: ShardRange, indexes: ShardIndexes | None
    ) -> Iterator[Records]:
        """A shard range's records one by one, each a run of one (the seeded interleaving and
        mixing reorder records)."""
        for values, bounds, mask in self._open(shard_range, indexes):
            for i in range(len(bounds) - 1):
                yield Records(values, bounds[i : i + 2], mask)

    def _check_fits(self, offsets: torch.Tensor, uri: str, first: int) -> None:
        """With ``truncate="error"``: ValueError naming the first record longer than a row."""
        sizes = offsets[1:] - offsets[:-1] + (self.eos_id is not None)
        over = (sizes > self.seq_len).nonzero()
        if len(over):
            k = int(over[0])
            raise ValueError(
                f"Record {first + k} of shard {uri} holds {int(sizes[k])} tokens"
                f"{' with its eos_id' if self.eos_id is not None else ''}, more than seq_len "
                f'{self.seq_len} (pack=False with truncate="error")'
            )

    def _int_lists(self, batch: Any, uri: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets, int64 values) of the token column of a native or pyarrow batch."""
        try:
            return int_lists(batch, self.column)
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(
                f"The token column {self.column!r} of shard {uri} is not a list of int token "
                f"ids in every record ({error})"
            ) from None


def _check_read(index: int, part: Sequence[tuple[int, int]], epoch: int) -> None:
    expected = sum(stop - start for start, stop in part)
    if index != expected:
        raise ValueError(
            f"Read {index} records of epoch {epoch} where the plan has {expected}: "
            "the data changed since the manifest was written"
        )


def _sent(bundles: Iterator[Bundle], ring: BatchRing | None) -> Iterator[Bundle]:
    """In a worker: each bundle's batches ready to leave it (through ``ring`` when they fit)."""
    for worker, last, batches in bundles:
        sent = [(for_transfer(b, ring), *tags) for b, *tags in batches]
        yield worker, last, sent


class TokenDataLoader(EpochLoader[token_plan.TokenInterrupt]):
    """The DataLoader ``load_tokens`` returns: int64 tensors of shape (batch, seq_len). Each
    pass is the next epoch; ``state_dict`` / ``load_state_dict`` resume exactly on any number of
    ranks, workers and any batch size (see :func:`merge_token_states` for ranks that are not one
    torch.distributed group)."""

    dataset: TokenDataset

    def __init__(
        self, dataset: TokenDataset, *, log_stats_every: float | None = None, **kwargs: Any
    ) -> None:
        super().__init__(
            dataset,
            log_stats_every=log_stats_every,
            batch_size=None,
            collate_fn=as_is,
            **kwargs,
        )
        # With a mixing schedule: the segments of the resumed epoch (a loaded state's).
        self._segments: tuple[int, ...] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        started = time.perf_counter()
        epoch, interrupts = self._begin_pass()
        self.dataset.token_interrupts = interrupts
        segments = self._segments if interrupts else None
        self.dataset.token_segments, self._segments = segments, None
        if self._starts_workers():  # a ring of their own
            # A slot holds a batch's largest tensor (its tokens); the others take a slot each.
            tensor_bytes = self.dataset.batch_size * self.dataset.seq_len * torch.int64.itemsize
            tensors = self.dataset.channels.tensors
            batch_bytes = tensor_bytes * tensors
            self.dataset.bundle = max(1, min(BUNDLE_BATCHES, BUNDLE_BYTES // batch_bytes))
            in_flight = self._batches_in_flight(self.dataset.bundle) * tensors
            self.dataset.ring = BatchRing.for_batches(self.num_workers, in_flight, tensor_bytes)
        workers = self._topology.workers
        progress: dict[str, Any] = {
            "epoch": epoch,
            "interrupts": interrupts,
            "positions": [(0, 0)] * workers,
            "turn": 0,
            "finished": False,
            "segments": schedules.epoch_layout(self.dataset.read_plan, epoch, segments),
        }
        self._pass = progress
        batches = _tracked(self._worker_batches(), progress, workers, self.dataset.ring)
        return self._passing(self._stats.timed(batches, started))

    def _rank_entry(
        self, progress: dict[str, Any], earlier: token_plan.TokenInterrupt | None
    ) -> list[int]:
        """This rank's [rank, turn, finished, records, offset, ...] in this pass; merged with
        its entry in ``earlier``, the run this pass resumed on the same topology, when given
        (the two runs are then one: see ``token_plan.token_rank_then``)."""
        positions, turn = progress["positions"], progress["turn"]
        if earlier is not None:
            rank = self.dataset.rank
            positions, turn = token_plan.token_rank_then(
                earlier.positions[rank], earlier.turns[rank], positions, turn
            )
        return token_plan.rank_json(self.dataset.rank, positions, turn, progress["finished"])

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: the epoch and, for each interrupted run of it, its topology and per
        rank each worker's position. Consecutive runs on one topology are one entry, so a run
        resumed on its own topology any number of times can always save its state
        (RuntimeError only when one epoch ran on more than ``state.MAX_RUNS`` topologies in
        turn). With an initialised torch.distributed group of the loader's world size, every
        rank must call it (it gathers the ranks' positions); otherwise it holds this rank's, for
        :func:`merge_token_states`."""
        progress = self._pass
        topology = self._topology
        read_plan = self.dataset.read_plan
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": STATE_KIND,
            "selection": self.dataset.fingerprint(),
        }
        if self.dataset.text is not None:  # named, so that another tokenizer refuses it
            state["tokenizer"] = self.dataset.text.name
        if progress is None:
            interrupts = [i.to_json() for i in self._resume]
            segments = self._segments if self._resume else None
            scheduled = schedules.state_fields(read_plan, self._next_epoch, segments)
            return {**state, **scheduled, "epoch": self._next_epoch, "interrupts": interrupts}
        if progress["finished"] and topology.world_size == 1:
            scheduled = schedules.state_fields(read_plan, progress["epoch"] + 1, None)
            return {**state, **scheduled, "epoch": progress["epoch"] + 1, "interrupts": []}
        before: tuple[token_plan.TokenInterrupt, ...] = progress["interrupts"]
        earlier = None
        if before and before[-1].topology == topology:  # this pass resumed that run
            before, earlier = before[:-1], before[-1]
        problem = plan.beyond_bounds([*(i.topology for i in before), topology])
        if problem is not None:
            raise RuntimeError(
                f"This epoch's loader state {problem}; finish the epoch before saving another state"
            )
        entries = token_state.gather_entries(
            self._rank_entry(progress, earlier), topology.world_size
        )
        interrupts = [i.to_json() for i in before]
        return {
            **state,
            **schedules.state_fields(
                self.dataset.read_plan, progress["epoch"], progress["segments"]
            ),
            "epoch": progress["epoch"],
            "interrupts": [*interrupts, [*topology.to_json(), entries]],
        }

    def _resumed_schedule(
        self, state: dict[str, Any], epoch: int, records: int, by_weights: bool
    ) -> tuple[schedules.Schedule, tuple[int, ...]]:
        """A scheduled loader resuming ``state``: (the schedule its runs used, the segments
        they were laid out with), checked field by field. A state of a ``mixing_weights``
        loader (``by_weights``) used this loader's first weights alone, in one segment."""
        read_plan = self.dataset.read_plan
        assert read_plan.schedule is not None
        if by_weights:
            weights = dataclasses.replace(read_plan, schedule=None)
            return read_plan.schedule[:1], (plan.epoch_length(weights, epoch),)
        old = schedules.schedule_from_json(checks.field(state, "schedule"), len(read_plan.streams))
        segments = schedules.segments_from_json(checks.field(state, "segments"), records)
        return old, segments

    def _by_weights(self, state: dict[str, Any], fingerprint: str) -> bool:
        """Whether a scheduled loader resumes a state of the ``mixing_weights`` loader of its
        first entry's weights (``fingerprint``, the state's, is that loader's)."""
        read_plan = self.dataset.read_plan
        if read_plan.schedule is None or "schedule" in state:
            return False
        resumed = dataclasses.replace(read_plan, schedule=None).resumed_by(
            fingerprint, self.dataset.fingerprint
        )
        if resumed is not None and resumed.spread != read_plan.spread:
            self.dataset.read_plan = dataclasses.replace(read_plan, spread=resumed.spread)
        return resumed is not None

    def _check_tokenizer(self, state: dict[str, Any]) -> None:
        """ValueError naming both when ``state`` was made with another tokenizer than this
        loader's, or with one where this loader reads a token column (or the reverse)."""
        theirs = state.get("tokenizer")
        if theirs is not None:
            theirs = checks.string(theirs, "tokenizer")
        text = self.dataset.text
        if theirs != (None if text is None else text.name):
            raise ValueError(tokenizer_refusal(theirs, text))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next pass the rest of the epoch ``state`` was taken in, on this loader's
        topology. Raises ValueError for a state of another version, kind or selection, one
        that lacks some rank's positions, and, naming the field, for a field that is missing,
        of the wrong type or out of bounds (see :mod:`~syvain_training_data.loading.state`):
        every field is checked before anything is computed from it, and the positions against
        the epoch's plan. A state made with another tokenizer (``text_column=``,
        ``tokenizer=``) is a ValueError naming both. With a mixing schedule, ValueError naming
        the first difference when this loader's schedule differs from the state's at or before
        a position its runs consumed (see :mod:`~syvain_training_data.loading.schedule`)."""
        if (
            not isinstance(state, dict)
            or state.get("version") != STATE_VERSION
            or state.get("kind") != STATE_KIND
        ):
            raise ValueError("Not a token loader state (state_dict of a load_tokens loader)")
        self._check_tokenizer(state)
        selection = checks.string(checks.field(state, "selection"), "selection")
        resumed = self.dataset.read_plan.resumed_by(selection, self.dataset.fingerprint)
        ours = resumed is not None
        if resumed is not None:
            self.dataset.read_plan = resumed
        by_weights = not ours and self._by_weights(state, selection)
        if not ours and not by_weights:
            raise ValueError(
                self.dataset.read_plan.refusal(
                    selection,
                    self.dataset.fingerprint,
                    "This loader state was saved for another selection, seed, shuffle, mixing, "
                    "token column or eos_id",
                )
            )
        epoch = checks.epoch_of(state)
        records = sum(self.dataset.read_plan.totals())
        schedule = self.dataset.read_plan.schedule
        old, segments, boundaries = None, None, None
        if schedule is not None:  # laid out segment by segment, as the state's runs were
            old, segments = self._resumed_schedule(state, epoch, records, by_weights)
            length, boundaries = segments[-1], (0, *segments)
        else:
            length = plan.epoch_length(self.dataset.read_plan, epoch)
        interrupts = token_state.interrupts_from_json(
            checks.field(state, "interrupts"), length, records
        )
        # Runs on one topology at the end are one run: exact, as no run has been laid out
        # after them yet.
        interrupts = plan.merged_tail(interrupts)
        if interrupts and all(interrupts[-1].finished):
            epoch, interrupts = epoch + 1, ()  # every rank had finished the epoch
        elif interrupts:  # positions past a part or back inside a record: ValueError now
            token_plan.token_layout(
                length, interrupts, self._topology, self.dataset.rank, boundaries
            )
            if schedule is not None and old is not None and segments is not None:
                schedules.check_resume(old, schedule, segments, interrupts, self._topology)
        self._segments = segments if interrupts else None
        self._next_epoch, self._resume = epoch, interrupts
        self._pass = None
        self._iterator = None


def _tracked(
    batches: Iterator[Bundle], progress: dict[str, Any], workers: int, ring: BatchRing | None
) -> Iterator[Any]:
    # Positions are those of batches the training loop received: batches workers prefetched
    # but the loop never took are not consumed. ``ring`` is held while its batches arrive.
    positions = list(progress["positions"])
    progress["positions"] = positions
    for batch, worker, whole, offset in in_turn(batches, workers):
        positions[worker] = (whole, offset)
        progress["turn"] = (worker + 1) % workers
        yield batch
    progress["finished"] = True
