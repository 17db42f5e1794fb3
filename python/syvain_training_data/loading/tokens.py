"""Sequence packing: ``SplitDataLoader.load_tokens`` (issue 16).

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

import bisect
import collections
import hashlib
import itertools
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import get_worker_info

from syvain_training_data.loading import plan
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
from syvain_training_data.loading.reader import ShardRange, consumer_records
from syvain_training_data.loading.shard_indexes import ShardIndexes
from syvain_training_data.loading.stats import PUBLISH_MASK
from syvain_training_data.loading.tensors import int_lists
from syvain_training_data.loading.transfer import BatchRing, tensor_for_transfer
from syvain_training_data.shard import iter_shard_batches

__all__ = ["TokenDataLoader", "TokenDataset", "TokenPacker", "merge_token_states"]

STATE_KIND = "tokens"
# (batch, worker, records wholly consumed, tokens of the next record consumed)
_Tagged = tuple[torch.Tensor, int, int, int]


class _Run:
    """Tokens of consecutive records held by a packer: records ``first``, ``first + 1``, ...
    from token ``offset`` of the first on; ``ends[i]`` is where record ``first + i`` ends in
    ``tokens`` (the run may stop inside its last record, which then has no end). ``taken``
    tokens of it have gone into batches."""

    __slots__ = ("ends", "first", "offset", "taken", "tokens")

    def __init__(self, first: int, offset: int, tokens: torch.Tensor, ends: list[int]) -> None:
        self.first, self.offset, self.tokens, self.ends = first, offset, tokens, ends
        self.taken = 0

    def position(self, at: int) -> tuple[int, int]:
        """(records wholly consumed, tokens of the next consumed) after token ``at``."""
        ends = self.ends
        k = bisect.bisect_left(ends, at)
        if k < len(ends) and ends[k] == at:
            return self.first + k + 1, 0
        if k == 0:
            return self.first, self.offset + at
        return self.first + k, at - ends[k - 1]


class TokenPacker:
    """Cuts a stream of token runs into batches of ``batch_size`` blocks of ``seq_len``.

    A run is the tokens of consecutive records of the consumer's part (a decoded batch's token
    column is one); each batch comes with the position after its last token. In a DataLoader
    worker a batch is built in a slot of ``ring`` when one is free (it then travels without a
    copy)."""

    def __init__(self, seq_len: int, batch_size: int, ring: BatchRing | None = None) -> None:
        self.seq_len = seq_len
        self.batch_tokens = seq_len * batch_size
        self._ring = ring
        self._runs: collections.deque[_Run] = collections.deque()
        self._held = 0

    def add(
        self, first: int, offset: int, tokens: torch.Tensor, ends: list[int]
    ) -> Iterator[tuple[torch.Tensor, int, int]]:
        """Adds the tokens of records ``first``, ``first + 1``, ... from token ``offset`` of the
        first on; ``ends[i]`` is where record ``first + i`` ends in ``tokens``, ascending. A run
        that stops inside its last record (an ``eos_id`` may follow as a run of its own) has no
        end for it."""
        count = tokens.shape[0]
        if count == 0:
            return
        self._runs.append(_Run(first, offset, tokens, ends))
        self._held += count
        while self._held >= self.batch_tokens:
            yield self._take(self.batch_tokens)

    def finish(self, drop_last: bool) -> Iterator[tuple[torch.Tensor, int, int]]:
        """The last, smaller batch of whole blocks (unless ``drop_last``); the rest, fewer than
        ``seq_len`` tokens, is left out."""
        blocks = self._held // self.seq_len
        if blocks and not drop_last:
            yield self._take(blocks * self.seq_len)

    def _take(self, count: int) -> tuple[torch.Tensor, int, int]:
        pieces = []
        left = count
        while True:
            run = self._runs[0]
            start = run.taken
            available = run.tokens.shape[0] - start
            if available > left:
                run.taken = start + left
                pieces.append(run.tokens[start : run.taken])
                position = run.position(run.taken)
                break
            pieces.append(run.tokens[start:] if start else run.tokens)
            left -= available
            self._runs.popleft()
            if left == 0:
                position = run.position(start + available)
                break
        self._held -= count
        # Its own storage: a view would pin, and send, a whole decoded batch.
        batch = self._batch(count // self.seq_len)
        if len(pieces) > 1:
            torch.cat(pieces, out=batch.view(-1))
        else:
            batch.view(-1).copy_(pieces[0])
        return batch, *position

    def _batch(self, rows: int) -> torch.Tensor:
        shape = (rows, self.seq_len)
        slotted = None if self._ring is None else self._ring.reserve(torch.int64, shape)
        return torch.empty(shape, dtype=torch.int64) if slotted is None else slotted


class TokenDataset(ShardDataset):
    """A :class:`ShardDataset` whose consumers yield packed token batches, each tagged with the
    worker and its position after it (the loader strips the tags)."""

    def __init__(
        self, *args: Any, column: str, seq_len: int, eos_id: int | None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.column = column
        self.seq_len = seq_len
        self.eos_id = eos_id
        self.token_interrupts: tuple[plan.TokenInterrupt, ...] = ()
        # Set by the loader before it forks workers: how their batches reach it, and how many
        # travel as one DataLoader item.
        self.ring: BatchRing | None = None
        self.bundle = 1

    def state_dict(self) -> dict[str, Any]:
        raise TypeError("A token dataset resumes through its loader's state_dict()")

    def load_state_dict(self, state: Any) -> None:
        raise TypeError("A token dataset resumes through its loader's load_state_dict()")

    def fingerprint(self) -> str:
        """The selection's digest plus what decides the token stream (``seq_len`` and the batch
        size may change between runs)."""
        text = f"{self.selection.fingerprint()}:{STATE_KIND}:{self.column}:{self.eos_id}"
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
        interrupts: Sequence[plan.TokenInterrupt],
        worker: int,
        workers: int,
    ) -> Iterator[_Tagged]:
        length = plan.epoch_length(self.selection, epoch)
        topology = self.topology(workers)
        layout, cuts = plan.token_layout(length, interrupts, topology, self.rank)
        part = layout[self.rank][worker]
        counters = self.counters.consumer(worker)
        orders, mixed = self.selection.orders(epoch), self.selection.mixed(epoch)
        # In plain order (no seed, no mixing) a decoded batch's records are the next
        # records of the part: they reach the packer as one run, with no Python per record.
        in_runs = mixed is None and self.selection.seed is None
        open_range = self._open if in_runs else self._open_records
        indexes = self.new_indexes()
        runs = consumer_records(
            orders,
            self.stream_shards,
            mixed,
            part,
            lambda r: counters.watch(open_range(r, indexes)),
        )
        cut_at = _cuts_by_index(part, cuts)
        cut_indices = sorted(cut_at)
        packer = TokenPacker(self.seq_len, self.batch_size, self.ring)
        index = 0
        try:
            for values, bounds in runs:
                count = len(bounds) - 1
                first_cut = bisect.bisect_left(cut_indices, index)
                if first_cut < len(cut_indices) and cut_indices[first_cut] < index + count:
                    cut = _Cut(cut_at, epoch, part)
                    pieces = _pack_records(packer, index, values, bounds, self.eos_id, cut)
                else:
                    pieces = _pack_run(packer, index, values, bounds, self.eos_id)
                for batch, whole, offset in pieces:
                    yield batch, worker, whole, offset
                if (index ^ (index + count)) & ~PUBLISH_MASK:
                    counters.yielded(index + count)
                index += count
            expected = sum(stop - start for start, stop in part)
            if index != expected:
                raise ValueError(
                    f"Read {index} records of epoch {epoch} where the plan has {expected}: "
                    "the data changed since the manifest was written"
                )
            for batch, whole, offset in packer.finish(self.drop_last):
                yield batch, worker, whole, offset
        finally:
            counters.yielded(index)  # records read (a cut one counts once)

    def _open(
        self, shard_range: ShardRange, indexes: ShardIndexes | None
    ) -> Iterator[tuple[torch.Tensor, list[int]]]:
        """The token column of a shard range's decoded batches, each as one run: (int64
        values, the offsets of its records in them), sliced from the columnar batches with no
        Python object per token."""
        table_index, start, stop = shard_range
        shard = self.table.shard(table_index)
        batches = iter_shard_batches(
            self.data_format,
            shard,
            columns=[self.column],
            storage_config=self.storage_config,
            batch_size=self.batch_rows,
            start=start,
            stop=stop,
            index=self.range_segment(shard, start, stop, indexes),
            readahead_bytes=self.readahead,
        )
        for batch in batches:
            offsets, values = self._int_lists(batch, shard.uri)
            bounds = offsets.tolist()
            if len(bounds) > 1:
                yield values, bounds

    def _open_records(
        self, shard_range: ShardRange, indexes: ShardIndexes | None
    ) -> Iterator[tuple[torch.Tensor, list[int]]]:
        """A shard range's records one by one, each a run of one (the seeded interleaving and
        mixing reorder records)."""
        for values, bounds in self._open(shard_range, indexes):
            for i in range(len(bounds) - 1):
                yield values, bounds[i : i + 2]

    def _int_lists(self, batch: Any, uri: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(offsets, int64 values) of the token column of a native or pyarrow batch."""
        try:
            return int_lists(batch, self.column)
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(
                f"The token column {self.column!r} of shard {uri} is not a list of int token "
                f"ids in every record ({error})"
            ) from None


def _sent(bundles: Iterator[Bundle], ring: BatchRing | None) -> Iterator[Bundle]:
    """In a worker: each bundle's batches ready to leave it (through ``ring`` when they fit)."""
    for worker, last, batches in bundles:
        sent = [(tensor_for_transfer(b, ring), *tags) for b, *tags in batches]
        yield worker, last, sent


def _pack_run(
    packer: TokenPacker,
    index: int,
    values: torch.Tensor,
    bounds: list[int],
    eos_id: int | None,
) -> Iterator[tuple[torch.Tensor, int, int]]:
    """Records ``index``, ``index + 1``, ... (``values[bounds[i]:bounds[i + 1]]``), each
    followed by ``eos_id`` when given, into ``packer`` as one run."""
    low, high = bounds[0], bounds[-1]
    tokens = values[low:high]
    if eos_id is None:
        return packer.add(index, 0, tokens, [end - low for end in bounds[1:]])
    # Each record's eos goes after its tokens: record i's end moves by i + 1.
    ends = [end - low + i for i, end in enumerate(bounds[1:], 1)]
    joined = torch.full((len(tokens) + len(ends),), eos_id, dtype=torch.int64)
    keep = torch.ones(len(joined), dtype=torch.bool)
    keep[torch.tensor(ends, dtype=torch.int64) - 1] = False
    joined[keep] = tokens
    return packer.add(index, 0, joined, ends)


class _Cut(NamedTuple):
    """Records of a consumer's part that a loader state cut: index in the part -> tokens of it
    already consumed; the epoch and the part, to name a record in an error."""

    at: dict[int, int]
    epoch: int
    part: Sequence[tuple[int, int]]


def _pack_records(
    packer: TokenPacker,
    index: int,
    values: torch.Tensor,
    bounds: list[int],
    eos_id: int | None,
    cut: _Cut,
) -> Iterator[tuple[torch.Tensor, int, int]]:
    """As :func:`_pack_run`, record by record, each from the token ``cut`` resumes it at."""
    eos = None if eos_id is None else torch.tensor([eos_id], dtype=torch.int64)
    for record, (low, high) in enumerate(zip(bounds, bounds[1:], strict=False), index):
        count = high - low
        start = cut.at.get(record, 0)
        length = count + (eos is not None)
        if start >= length and start > 0:
            raise ValueError(
                f"The loader state cuts record {_epoch_position(cut.part, record)} of epoch "
                f"{cut.epoch} at token {start}, but it holds {length}: the data changed since"
            )
        tokens = values[low + min(start, count) : high]
        if eos is None:
            yield from packer.add(record, start, tokens, [len(tokens)])
        else:
            yield from packer.add(record, start, tokens, [])
            yield from packer.add(record, count, eos, [1])


def _cuts_by_index(part: Sequence[tuple[int, int]], cuts: dict[int, int]) -> dict[int, int]:
    """``cuts`` (epoch position -> tokens of it already consumed) by index in ``part``, in
    O((intervals + cuts) log intervals): a state can name a cut per consumer of its runs."""
    spans = []
    base = 0
    for start, stop in part:
        spans.append((start, stop, base))
        base += stop - start
    spans.sort()
    starts = [start for start, _, _ in spans]
    by_index: dict[int, int] = {}
    for position, tokens in cuts.items():
        k = bisect.bisect_right(starts, position) - 1
        if k >= 0 and position < spans[k][1]:
            start, _, base = spans[k]
            by_index[base + position - start] = tokens
    return by_index


def _epoch_position(part: Sequence[tuple[int, int]], index: int) -> int:
    """The epoch position of the ``index``-th record of ``part``."""
    for start, stop in part:
        if index < stop - start:
            return start + index
        index -= stop - start
    raise IndexError(index)


class TokenDataLoader(EpochLoader[plan.TokenInterrupt]):
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

    def __iter__(self) -> Iterator[torch.Tensor]:  # type: ignore[override]
        started = time.perf_counter()
        epoch, interrupts = self._begin_pass()
        self.dataset.token_interrupts = interrupts
        if self._starts_workers():  # a ring of their own
            batch_bytes = self.dataset.batch_size * self.dataset.seq_len * torch.int64.itemsize
            self.dataset.bundle = max(1, min(BUNDLE_BATCHES, BUNDLE_BYTES // batch_bytes))
            in_flight = self._batches_in_flight(self.dataset.bundle)
            self.dataset.ring = BatchRing.for_batches(self.num_workers, in_flight, batch_bytes)
        workers = self._topology.workers
        progress: dict[str, Any] = {
            "epoch": epoch,
            "interrupts": interrupts,
            "positions": [(0, 0)] * workers,
            "turn": 0,
            "finished": False,
        }
        self._pass = progress
        batches = _tracked(self._worker_batches(), progress, workers, self.dataset.ring)
        return self._passing(self._stats.timed(batches, started))

    def _rank_entry(
        self, progress: dict[str, Any], earlier: plan.TokenInterrupt | None
    ) -> list[int]:
        """This rank's [rank, turn, finished, records, offset, ...] in this pass; merged with
        its entry in ``earlier``, the run this pass resumed on the same topology, when given
        (the two runs are then one: see ``plan.token_rank_then``)."""
        positions, turn = progress["positions"], progress["turn"]
        if earlier is not None:
            rank = self.dataset.rank
            positions, turn = plan.token_rank_then(
                earlier.positions[rank], earlier.turns[rank], positions, turn
            )
        flat = [value for position in positions for value in position]
        return [self.dataset.rank, turn, int(progress["finished"]), *flat]

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
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": STATE_KIND,
            "selection": self.dataset.fingerprint(),
        }
        if progress is None:
            interrupts = [_interrupt_json(i) for i in self._resume]
            return {**state, "epoch": self._next_epoch, "interrupts": interrupts}
        if progress["finished"] and topology.world_size == 1:
            return {**state, "epoch": progress["epoch"] + 1, "interrupts": []}
        before: tuple[plan.TokenInterrupt, ...] = progress["interrupts"]
        earlier = None
        if before and before[-1].topology == topology:  # this pass resumed that run
            before, earlier = before[:-1], before[-1]
        problem = plan.beyond_bounds([*(i.topology for i in before), topology])
        if problem is not None:
            raise RuntimeError(
                f"This epoch's loader state {problem}; finish the epoch before saving another state"
            )
        entries = _gather(self._rank_entry(progress, earlier), topology.world_size)
        interrupts = [_interrupt_json(i) for i in before]
        return {
            **state,
            "epoch": progress["epoch"],
            "interrupts": [*interrupts, [*topology.to_json(), entries]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Makes the next pass the rest of the epoch ``state`` was taken in, on this loader's
        topology. Raises ValueError for a state of another version, kind or selection, one
        that lacks some rank's positions, and, naming the field, for a field that is missing,
        of the wrong type or out of bounds (see :mod:`~syvain_training_data.loading.state`):
        every field is checked before anything is computed from it, and the positions against
        the epoch's plan."""
        if (
            not isinstance(state, dict)
            or state.get("version") != STATE_VERSION
            or state.get("kind") != STATE_KIND
        ):
            raise ValueError("Not a token loader state (state_dict of a load_tokens loader)")
        selection = checks.string(checks.field(state, "selection"), "selection")
        if selection != self.dataset.fingerprint():
            raise ValueError(
                "This loader state was saved for another selection, seed, shuffle, mixing, "
                "token column or eos_id"
            )
        epoch = checks.integer(checks.field(state, "epoch"), "epoch")
        length = plan.epoch_length(self.dataset.selection, epoch)
        records = sum(self.dataset.selection.totals())
        interrupts = _interrupts_from_json(checks.field(state, "interrupts"), length, records)
        # Runs on one topology at the end are one run: exact, as no run has been laid out
        # after them yet.
        interrupts = plan.merged_tail(interrupts)
        if interrupts and all(interrupts[-1].finished):
            epoch, interrupts = epoch + 1, ()  # every rank had finished the epoch
        elif interrupts:  # positions past a part or back inside a record: ValueError now
            plan.token_layout(length, interrupts, self._topology, self.dataset.rank)
        self._next_epoch, self._resume = epoch, interrupts
        self._pass = None
        self._iterator = None


def _tracked(
    batches: Iterator[Bundle], progress: dict[str, Any], workers: int, ring: BatchRing | None
) -> Iterator[torch.Tensor]:
    # Positions are those of batches the training loop received: batches workers prefetched
    # but the loop never took are not consumed. ``ring`` is held while its batches arrive.
    positions = list(progress["positions"])
    progress["positions"] = positions
    for batch, worker, whole, offset in in_turn(batches, workers):
        positions[worker] = (whole, offset)
        progress["turn"] = (worker + 1) % workers
        yield batch
    progress["finished"] = True


def _gather(entry: list[int], world_size: int) -> list[list[int]]:
    distributed = torch.distributed
    if (
        world_size > 1
        and distributed.is_available()
        and distributed.is_initialized()
        and distributed.get_world_size() == world_size
    ):
        gathered: list[Any] = [None] * world_size
        distributed.all_gather_object(gathered, entry)
        return sorted(gathered)
    return [entry]


def _interrupt_json(interrupt: plan.TokenInterrupt) -> list[Any]:
    entries = [
        [rank, turn, int(finished), *(value for position in positions for value in position)]
        for rank, (positions, turn, finished) in enumerate(
            zip(interrupt.positions, interrupt.turns, interrupt.finished, strict=True)
        )
    ]
    return [*interrupt.topology.to_json(), entries]


def _interrupts_from_json(
    value: object, length: int, records: int
) -> tuple[plan.TokenInterrupt, ...]:
    """A token state's ``interrupts`` in an epoch of ``length`` records of a selection of
    ``records``, checked field by field (ValueError naming it) before anything is computed from
    them; the consumers of all entries are bounded before their positions are read, so the
    work is that of the state's size."""
    entries = checks.items(value, "interrupts", checks.MAX_ENTRIES)
    interrupts = []
    consumers = 0
    for index, entry in enumerate(entries):
        name = f"interrupts[{index}]"
        topology = plan.Topology.from_json(checks.items(entry, name, 5, exactly=5), name)
        topology.check_workers(records, name)
        consumers += topology.consumers
        if consumers > checks.MAX_STATE_CONSUMERS:
            raise ValueError(
                f"Invalid loader state: interrupts name more than {checks.MAX_STATE_CONSUMERS} "
                "consumers (ranks x workers over its runs)"
            )
        interrupts.append(_interrupt_from_json(topology, entry[4], f"{name}[4]", length))
    problem = plan.beyond_bounds([interrupt.topology for interrupt in interrupts])
    if problem is not None:
        raise ValueError(f"Invalid loader state: interrupts {problem}")
    return tuple(interrupts)


def _interrupt_from_json(
    topology: plan.Topology, value: object, name: str, length: int
) -> plan.TokenInterrupt:
    """One run's per-rank entries [rank, turn, finished, records, offset, ...] (``name``) in
    an epoch of ``length`` records."""
    world, workers = topology.world_size, topology.workers
    entries = checks.items(value, name, world)
    width = 3 + 2 * workers
    by_rank: dict[int, tuple[tuple[tuple[int, int], ...], int, bool]] = {}
    for k, item in enumerate(entries):
        where = f"{name}[{k}]"
        entry = checks.items(item, where, width, exactly=width)
        rank = checks.integer(entry[0], f"{where}[0] (rank)", 0, world - 1)
        if rank in by_rank:
            raise ValueError(f"Invalid loader state: {where}[0] (rank) repeats rank {rank}")
        turn = checks.integer(entry[1], f"{where}[1] (turn)", 0, workers - 1)
        finished = checks.flag(entry[2], f"{where}[2] (finished)")
        positions = tuple(
            (
                checks.integer(entry[3 + 2 * w], f"{where}[{3 + 2 * w}] (records)", 0, length),
                checks.integer(entry[4 + 2 * w], f"{where}[{4 + 2 * w}] (token offset)"),
            )
            for w in range(workers)
        )
        by_rank[rank] = (positions, turn, finished)
    if len(by_rank) != world:
        # The first few missing ranks: at most len(entries) + 8 steps, whatever world says.
        missing = list(itertools.islice((r for r in range(world) if r not in by_rank), 8))
        more = " ..." if world - len(by_rank) > len(missing) else ""
        raise ValueError(
            f"This token loader state lacks the positions of rank(s) "
            f"{', '.join(map(str, missing))}{more} of {world} ({name}): call state_dict on "
            "every rank of a torch.distributed group, or merge every rank's state with "
            "merge_token_states"
        )
    ranks = [by_rank[r] for r in range(world)]
    return plan.TokenInterrupt(
        topology,
        tuple(positions for positions, _, _ in ranks),
        tuple(turn for _, turn, _ in ranks),
        tuple(finished for _, _, finished in ranks),
    )


def merge_token_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One state from the ``state_dict()`` of every rank of a token loader whose ranks are not
    one torch.distributed group (each then holds only its own positions).

    Raises ValueError when the states are of different selections, epochs or runs, or not
    token loader states (``load_state_dict`` checks the merged state field by field)."""
    if not states:
        raise ValueError("merge_token_states needs at least one state")
    for k, state in enumerate(states):
        if not isinstance(state, dict) or not isinstance(state.get("interrupts"), list):
            raise ValueError(f"states[{k}] is not a token loader state")
    first = states[0]
    for state in states:
        if {k: v for k, v in state.items() if k != "interrupts"} != {
            k: v for k, v in first.items() if k != "interrupts"
        } or len(state["interrupts"]) != len(first["interrupts"]):
            raise ValueError("These token loader states come from different runs")
    if not first["interrupts"]:
        return dict(first)
    seen: dict[int, list[int]] = {}
    last: list[Any] = []
    for k, state in enumerate(states):
        entry = checks.items(state["interrupts"][-1], f"states[{k}] interrupts[-1]", 5, exactly=5)
        if not last:
            last = [*entry[:4], []]
        if entry[:4] != last[:4] or state["interrupts"][:-1] != first["interrupts"][:-1]:
            raise ValueError("These token loader states come from different runs")
        ranks = checks.items(entry[4], f"states[{k}] interrupts[-1][4]", checks.MAX_WORLD_SIZE)
        for j, rank_entry in enumerate(ranks):
            where = f"states[{k}] interrupts[-1][4][{j}]"
            checks.items(rank_entry, where, 3 + 2 * checks.MAX_WORKERS)
            if not rank_entry:
                raise ValueError(f"Invalid loader state: {where} is empty")
            rank = checks.integer(rank_entry[0], f"{where}[0] (rank)", 0, checks.MAX_WORLD_SIZE - 1)
            seen[rank] = rank_entry
    last[4] = [seen[rank] for rank in sorted(seen)]
    return {**first, "interrupts": [*first["interrupts"][:-1], last]}
