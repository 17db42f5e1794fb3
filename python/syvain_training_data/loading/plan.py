"""The epoch plan (SPEC section 6): which records each consumer reads, as pure functions.

No I/O and no torch. Everything here follows from the manifest's record counts, the seed, the
epoch and the topology, so a consumer computes its own part alone and a checkpoint needs only a
few integers.

Terms:
- *stream*: one sample space, the concatenation of its shards' records (the selection, or one
  curriculum stage when stages are mixed).
- *epoch order* of a stream: with a seed, blocks of records permuted across the stream and
  interleaved ``window`` blocks at a time, drawn from (seed, epoch) (``block_order``).
  Position p of the order names one record; without a seed the order is the manifest's.
- *mixed order*: several streams merged by a key per record, ``(i + phase_s) / share_s`` for the
  stream's i-th record, so each stream keeps its share of every stretch of the order. A mixture
  schedule changes the shares along the order, segment by segment (``loading.schedule``).
- *level*: the positions a pass runs over. Level 0 is the whole epoch; a resume adds a level
  that holds what the interrupted run had not consumed, in epoch order.
- *consumer*: one (rank, worker). Ranks take contiguous parts of a level whose sizes differ by at
  most one record; workers split their rank's part the same way.
"""

from __future__ import annotations

import array
import bisect
import hashlib
import heapq
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from syvain_training_data.loading import state as checks
from syvain_training_data.loading.block_order import DEFAULT_WINDOW_BLOCKS, BlockOrder, seeded

if TYPE_CHECKING:
    from syvain_training_data.loading.schedule import ScheduledOrder

__all__ = [
    "DEFAULT_WINDOW",
    "Interrupt",
    "Level",
    "MixedOrder",
    "Order",
    "Selection",
    "StreamOrder",
    "TokenInterrupt",
    "Topology",
    "appended",
    "batch_count",
    "beyond_bounds",
    "consumer_part",
    "left_in_epoch",
    "merged_tail",
    "run_layout",
    "rank_batches",
    "round_robin_taken",
    "split_evenly",
    "token_layout",
    "token_rank_then",
    "topology_runs",
]

# Blocks interleaved together when a seed is given and no window is (see block_order).
DEFAULT_WINDOW = DEFAULT_WINDOW_BLOCKS
MIX_STOPS = ("first_exhausted", "all_exhausted")


@dataclass(frozen=True)
class Topology:
    """How a pass is consumed: ranks, DataLoader workers per rank (0 workers is one consumer in
    the training process, so ``workers`` is at least 1), batch size and ``drop_last``."""

    world_size: int
    workers: int
    batch_size: int
    drop_last: bool

    def __post_init__(self) -> None:
        for name, value, most in (
            ("world_size", self.world_size, checks.MAX_WORLD_SIZE),
            ("workers", self.workers, checks.MAX_WORKERS),
            ("batch_size", self.batch_size, checks.MAX_BATCH_SIZE),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(
                    f"Invalid loader topology: {name} must be an int in [1, {most}], "
                    f"got {checks.describe(value)}"
                )
        if self.world_size * self.workers > checks.MAX_CONSUMERS:
            raise ValueError(
                f"Invalid loader topology: world_size x workers must be at most "
                f"{checks.MAX_CONSUMERS}, got {self.world_size} x {self.workers}"
            )

    def to_json(self) -> list[int]:
        return [self.world_size, self.workers, self.batch_size, int(self.drop_last)]

    @classmethod
    def from_json(cls, value: list[Any], name: str) -> Topology:
        """The topology of a state entry whose first four items are (world_size, workers,
        batch_size, drop_last); ValueError naming the field (``name[i] (what)``)."""
        world, workers, batch = (
            checks.integer(value[i], f"{name}[{i}] ({what})", 1, most)
            for i, what, most in (
                (0, "world_size", checks.MAX_WORLD_SIZE),
                (1, "workers", checks.MAX_WORKERS),
                (2, "batch_size", checks.MAX_BATCH_SIZE),
            )
        )
        drop = checks.flag(value[3], f"{name}[3] (drop_last)")
        if world * workers > checks.MAX_CONSUMERS:
            raise ValueError(
                f"Invalid loader state: {name}[0:2] (world_size x workers) must be at most "
                f"{checks.MAX_CONSUMERS}, got {world} x {workers}"
            )
        return cls(world, workers, batch, drop)

    @property
    def consumers(self) -> int:
        return self.world_size * self.workers

    def check_workers(self, records: int, name: str) -> None:
        """ValueError naming ``name[1] (workers)`` when this topology has more workers per
        rank than a loader over ``records`` records starts (``SplitDataLoader`` caps them at a
        rank's records: a worker beyond them would only idle). With this, laying out a run
        costs at most min(ranks, records) x workers <= about ``records`` parts."""
        most = max(1, records // self.world_size)
        checks.integer(self.workers, f"{name}[1] (workers)", 1, most)


@dataclass(frozen=True)
class Interrupt:
    """A pass stopped after every rank of ``topology`` received ``batches`` batches."""

    topology: Topology
    batches: int

    def to_json(self) -> list[int]:
        return [*self.topology.to_json(), self.batches]

    @classmethod
    def from_json(cls, value: object, name: str = "interrupt") -> Interrupt:
        """An entry of a state's ``interrupts``: [world_size, workers, batch_size, drop_last,
        batches]. ValueError naming the field (``name[i] (what)``) for anything else; the
        batches are bounded here by MAX_COUNT only (the loader bounds them by its epoch)."""
        entry = checks.items(value, name, 5, exactly=5)
        topology = Topology.from_json(entry, name)
        return cls(topology, checks.integer(entry[4], f"{name}[4] (batches)"))

    def then(self, later: Interrupt) -> Interrupt:
        """This run and ``later``, a run on the same topology that resumed it, as one run.

        A run on the interrupted run's topology continues it exactly (``_continued``: each
        worker takes one old worker's rest, rotated to the worker whose turn was next), so the
        two leave what one run stopped after both runs' batches leaves
        (tests/test_loading_plan.py checks it, drop_last, equal batches, mixing and ranks of
        unequal batch counts included)."""
        if later.topology != self.topology:
            raise ValueError("Only runs on one topology merge")
        return Interrupt(self.topology, self.batches + later.batches)


def appended[T: (Interrupt, TokenInterrupt)](
    interrupts: Sequence[T], interrupt: T
) -> tuple[T, ...]:
    """``interrupts`` followed by ``interrupt``, merged into the last when both runs had one
    topology (see :meth:`Interrupt.then`): a state grows only when the topology changes."""
    if interrupts and interrupts[-1].topology == interrupt.topology:
        return tuple(interrupts[:-1]) + (interrupts[-1].then(interrupt),)
    return tuple(interrupts) + (interrupt,)


def merged_tail[T: (Interrupt, TokenInterrupt)](interrupts: Sequence[T]) -> tuple[T, ...]:
    """``interrupts`` with the runs at its end that share one topology merged into one (states
    of earlier versions kept an entry per run). Only the tail: a later run of another topology
    was laid out after the earlier ones as they were, entry by entry."""
    merged: tuple[T, ...] = tuple(interrupts)
    while len(merged) > 1 and merged[-2].topology == merged[-1].topology:
        merged = merged[:-2] + (merged[-2].then(merged[-1]),)
    return merged


def topology_runs(topologies: Sequence[Topology]) -> int:
    """Runs of distinct topologies in a state whose interrupted runs had ``topologies``,
    consecutive runs on one topology counting once: what ``state.MAX_RUNS`` bounds."""
    return sum(1 for i, t in enumerate(topologies) if i == 0 or t != topologies[i - 1])


def beyond_bounds(topologies: Sequence[Topology]) -> str | None:
    """Why a state whose interrupted runs had ``topologies`` is beyond what a state may name
    (``state.MAX_RUNS``, ``MAX_ENTRIES``, ``MAX_STATE_CONSUMERS``), or None. The loaders refuse
    to save such a state and to load one."""
    runs = topology_runs(topologies)
    if runs > checks.MAX_RUNS:
        return (
            f"names {runs} interrupted runs of distinct topologies in one epoch, more than "
            f"{checks.MAX_RUNS} (runs on one topology in a row count once)"
        )
    if len(topologies) > checks.MAX_ENTRIES:
        return f"names {len(topologies)} interrupted runs, more than {checks.MAX_ENTRIES}"
    consumers = sum(t.consumers for t in topologies)
    if consumers > checks.MAX_STATE_CONSUMERS:
        return (
            f"names {consumers} consumers (ranks x workers over its runs), more than "
            f"{checks.MAX_STATE_CONSUMERS}"
        )
    return None


@dataclass(frozen=True)
class Selection:
    """What a loader reads and how it orders it: per stream, the record count of each of its
    shards; mixing weights (None: one stream); the seed and shuffle window (in blocks); equal
    batches. ``schedule``: mixing weights that change along the order, as (position, weights)
    entries (``loading.schedule``; ``weights`` is then its first entry's); the fingerprint
    names a schedule without its entries, so a state resumes with an edited schedule (the loader
    compares the two). ``identity`` names the shards themselves (a digest of their URIs), so a
    state saved for one selection is refused by another. ``blocks``: per stream, the records per
    block of each shard (None: whole shards); ``indexed``: the shards have record offset
    indexes to read ranges with (it changes bytes fetched, never the order)."""

    streams: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...] | None = None
    mix_stop: str = "first_exhausted"
    seed: int | None = None
    window: int = 0
    equal_batches: bool = False
    identity: str = ""
    blocks: tuple[tuple[int, ...], ...] | None = None
    indexed: bool = False
    schedule: tuple[tuple[int, tuple[float, ...]], ...] | None = None

    def __post_init__(self) -> None:
        if not self.streams:
            raise ValueError("A selection needs at least one stream")
        if self.weights is not None and len(self.weights) != len(self.streams):
            raise ValueError("One mixing weight per stream")
        if self.schedule is not None and (
            self.weights != self.schedule[0][1]
            or any(len(weights) != len(self.streams) for _, weights in self.schedule)
        ):
            raise ValueError("A schedule's first weights are the selection's, one per stream")
        if self.mix_stop not in MIX_STOPS:
            raise ValueError(f"mixing_stop must be one of {', '.join(MIX_STOPS)}")
        if self.blocks is not None and [len(b) for b in self.blocks] != [
            len(c) for c in self.streams
        ]:
            raise ValueError("One block size per shard")

    def fingerprint(self) -> str:
        """A short digest of everything that decides the epoch order."""
        digest = hashlib.sha256()
        for counts in (*self.streams, *(self.blocks or ())):
            digest.update(array.array("q", counts).tobytes())
            digest.update(b"/")
        # v3 is the seeded block order; an unseeded order is v2's, so its states still load.
        version = "syvain-loader-plan-v2" if self.seed is None else "syvain-loader-plan-v3"
        mixing: str | list[str] | None = None
        if self.schedule is not None:  # not its entries: the loader compares schedules
            mixing = "schedule"
        elif self.weights is not None:
            mixing = [repr(w) for w in self.weights]
        text = json.dumps(
            [
                version,
                digest.hexdigest(),
                mixing,
                self.mix_stop,
                self.seed,
                self.window,
                self.equal_batches,
                self.identity,
            ],
            separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def orders(self, epoch: int) -> list[Order]:
        """Per stream, its epoch order: manifest order without a seed, else blocks permuted
        and interleaved ``window`` at a time (``block_order``)."""
        if self.seed is None:
            return [StreamOrder(counts) for counts in self.streams]
        blocks = self.blocks or self.streams
        return [
            BlockOrder(counts, blocks[number], self.seed, epoch, number, self.window)
            for number, counts in enumerate(self.streams)
        ]

    def totals(self) -> list[int]:
        return [sum(counts) for counts in self.streams]

    def mixed(self, epoch: int) -> MixedOrder | ScheduledOrder | None:
        if self.weights is None:
            return None
        if self.schedule is not None:
            from syvain_training_data.loading.schedule import scheduled_order

            return scheduled_order(self, epoch)
        return MixedOrder(self.totals(), self.weights, self.mix_stop, self.seed, epoch)


def split_evenly(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part ``index`` of ``parts`` contiguous parts of ``total`` items; part
    sizes differ by at most one."""
    return total * index // parts, total * (index + 1) // parts


def batch_count(records: int, batch_size: int, drop_last: bool) -> int:
    return records // batch_size if drop_last else -(-records // batch_size)


_seeded = seeded


class StreamOrder:
    """One stream's unseeded epoch order: its shards' records in manifest order."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = counts
        self.offsets = array.array("q", [0, *itertools.accumulate(counts)])
        self.total = self.offsets[-1]

    def segments(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """The records [start, stop) as (shard index in the stream, first record, end record)
        pieces, in order."""
        pieces = []
        k = bisect.bisect_right(self.offsets, start) - 1
        while start < stop:
            shard_start = self.offsets[k]
            end = min(stop, self.offsets[k + 1])
            if end > start:
                pieces.append((k, start - shard_start, end - shard_start))
            start = end
            k += 1
        return pieces


Order = StreamOrder | BlockOrder


class MixedOrder:
    """Streams merged by the key ``((i + phase_s) / share_s, s)`` of stream s's i-th record.

    Shares are the normalised weights and phases are drawn from (seed, epoch), so every stretch of
    the mixed order holds each stream in proportion to its weight. ``first_exhausted`` ends the
    order before the first key a stream cannot fill; ``all_exhausted`` keeps every record.
    ``phases`` given replace the drawn ones (a schedule's later segments continue the draws)."""

    def __init__(
        self,
        lengths: Sequence[int],
        weights: Sequence[float],
        mix_stop: str,
        seed: int | None,
        epoch: int,
        phases: Sequence[float] | None = None,
    ) -> None:
        total_weight = math.fsum(weights)
        self.lengths = list(lengths)
        self.shares = [weight / total_weight for weight in weights]
        if phases is None:
            draw = _seeded(seed, epoch, "mix")
            phases = [draw.random() for _ in lengths]
        self.phases = list(phases)
        if mix_stop == "all_exhausted":
            self.length = sum(self.lengths)
            self._end: tuple[float, int] | None = None
        else:
            self._end = min((self.key(s, n), s) for s, n in enumerate(self.lengths))
            self.length = sum(self._count_before(s, *self._end) for s in range(len(lengths)))

    def key(self, stream: int, index: int) -> float:
        return (index + self.phases[stream]) / self.shares[stream]

    def _count_le(self, stream: int, value: float) -> int:
        """How many of the stream's records have a key <= value (keys never decrease)."""
        length = self.lengths[stream]
        guess = math.floor(value * self.shares[stream] - self.phases[stream]) + 1
        index = min(max(guess, 0), length)
        while index > 0 and self.key(stream, index - 1) > value:
            index -= 1
        while index < length and self.key(stream, index) <= value:
            index += 1
        return index

    def _count_before(self, stream: int, value: float, tie_stream: int) -> int:
        """How many of the stream's records order before the key (value, tie_stream)."""
        if stream < tie_stream:
            return self._count_le(stream, value)
        return self._count_le(stream, math.nextafter(value, -math.inf))

    def prefix(self, position: int) -> list[int]:
        """Per stream, how many of its records are among the first ``position`` mixed ones."""
        if not 0 <= position <= self.length:
            raise ValueError(f"Mixed position {position} outside [0, {self.length}]")
        streams = range(len(self.lengths))
        if position == 0:
            return [0 for _ in streams]
        if position == self.length:
            if self._end is None:
                return list(self.lengths)
            return [self._count_before(s, *self._end) for s in streams]
        # The smallest key value whose records with keys <= it number at least `position`.
        low, high = -1.0, max(self.key(s, n) for s, n in enumerate(self.lengths))
        while True:
            middle = low + (high - low) / 2
            if middle <= low or middle >= high:
                break
            if sum(self._count_le(s, middle) for s in streams) >= position:
                high = middle
            else:
                low = middle
        counts = [self._count_le(s, math.nextafter(high, -math.inf)) for s in streams]
        missing = position - sum(counts)
        for s in streams:  # records whose key equals `high` order by stream
            take = min(missing, self._count_le(s, high) - counts[s])
            counts[s] += take
            missing -= take
        return counts

    def labels(self, start: int, stop: int) -> Iterator[int]:
        """The stream of each mixed position in [start, stop), in order."""
        low, high = self.prefix(start), self.prefix(stop)

        def keys(stream: int) -> Iterator[tuple[float, int]]:
            return ((self.key(stream, i), stream) for i in range(low[stream], high[stream]))

        for _, s in heapq.merge(*map(keys, range(len(self.lengths)))):
            yield s


class Level:
    """The positions of a pass, as ascending disjoint [start, stop) intervals of the epoch."""

    def __init__(self, intervals: Sequence[tuple[int, int]]) -> None:
        merged: list[tuple[int, int]] = []
        for start, stop in intervals:
            if stop <= start:
                continue
            if merged and merged[-1][1] == start:
                merged[-1] = (merged[-1][0], stop)
            else:
                merged.append((start, stop))
        self.intervals = merged
        self.starts = [0, *itertools.accumulate(stop - start for start, stop in merged)]
        self.length = self.starts[-1]

    def slice(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Epoch intervals of this level's positions [start, stop)."""
        pieces = []
        k = bisect.bisect_right(self.starts, start) - 1
        while start < stop and k < len(self.intervals):
            first, last = self.intervals[k]
            offset = start - self.starts[k]
            end = min(stop, self.starts[k + 1])
            pieces.append((first + offset, first + offset + end - start))
            start = end
            k += 1
        return pieces

    def head(self, count: int) -> Level:
        return Level(self.slice(0, count))


def _worker_parts(level: Level, topology: Topology, rank: int) -> list[tuple[int, int]]:
    """[start, stop) in level positions of each worker of ``rank``."""
    rank_start, rank_stop = split_evenly(level.length, topology.world_size, rank)
    parts = []
    for worker in range(topology.workers):
        start, stop = split_evenly(rank_stop - rank_start, topology.workers, worker)
        parts.append((rank_start + start, rank_start + stop))
    return parts


def round_robin_taken(batches: Sequence[int], received: int) -> list[int]:
    """Batches taken from each worker once ``received`` batches came out of a torch DataLoader
    whose workers hold ``batches``: it takes one from each worker in turn, passing over
    exhausted ones (in-order delivery). A rank with fewer batches gives all of them."""
    return _round_robin(batches, received)[0]


def _round_robin(batches: Sequence[int], received: int) -> tuple[list[int], int]:
    """(batches taken from each worker, the worker whose turn comes next) after ``received``
    batches of torch's in-order round robin (see round_robin_taken)."""
    taken = [0 for _ in batches]
    active = [w for w, count in enumerate(batches) if count > 0]
    last = -1
    while received > 0 and active:
        rounds = min(min(batches[w] - taken[w] for w in active), received // len(active))
        if rounds == 0:  # a last, partial round
            for w in active[:received]:
                taken[w] += 1
            last = active[received - 1]
            break
        for w in active:
            taken[w] += rounds
        received -= rounds * len(active)
        last = active[-1]
        active = [w for w in active if taken[w] < batches[w]]
    return taken, (last + 1) % len(batches)


def _balanced(level: Level, world_size: int, equal_batches: bool) -> Level:
    # Equal batches: every rank gets the same number of records, so the same worker parts and
    # batch counts; fewer than world_size records of the level are left out.
    if not equal_batches:
        return level
    return level.head(level.length // world_size * world_size)


# Per rank, per worker: the epoch intervals that consumer reads in a run.
Layout = dict[int, list[list[tuple[int, int]]]]


def _length(intervals: Sequence[tuple[int, int]]) -> int:
    return sum(stop - start for start, stop in intervals)


def _unread(
    parts: list[list[tuple[int, int]]], interrupt: Interrupt
) -> list[list[tuple[int, int]]]:
    """Per worker, what is left of its part once its rank received ``interrupt.batches``."""
    topology = interrupt.topology
    sizes = [_length(part) for part in parts]
    batches = [batch_count(n, topology.batch_size, topology.drop_last) for n in sizes]
    taken = round_robin_taken(batches, interrupt.batches)
    return [
        Level(part).slice(min(count * topology.batch_size, size), size)
        for part, size, count in zip(parts, sizes, taken, strict=True)
    ]


def _continued(
    parts: list[list[tuple[int, int]]], interrupt: Interrupt
) -> list[list[tuple[int, int]]]:
    """The same topology again: each worker takes one old worker's unread rest, rotated so the
    DataLoader's first turn goes to the worker whose turn was next: record for record the
    uninterrupted run."""
    topology = interrupt.topology
    batches = [
        batch_count(_length(part), topology.batch_size, topology.drop_last) for part in parts
    ]
    turn = _round_robin(batches, interrupt.batches)[1]
    rest = _unread(parts, interrupt)
    return [rest[(worker + turn) % topology.workers] for worker in range(topology.workers)]


def run_layout(
    selection: Selection,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    rank: int | None = None,
) -> Layout:
    """Who reads what in a run of ``topology`` after the ``interrupts`` of this epoch (only
    ``rank``'s part of the run itself when given; earlier runs are laid out whole).

    A run on a new topology splits what is left evenly (ranks, then workers, in epoch order);
    a run on the interrupted run's topology continues it exactly."""
    ranks = range(topology.world_size) if rank is None else [rank]
    return _layout(selection, epoch_length, interrupts, topology, ranks)


def _ranks_with_records(length: int, world_size: int) -> Sequence[int]:
    """The ranks whose part of a level of ``length`` positions is not empty, ascending, in
    min(length, world_size) steps (with fewer positions than ranks, each holds one: position
    p is rank r's when r < (p + 1) x world_size / length <= r + 1)."""
    if length >= world_size:
        return range(world_size)
    return [-(-(p + 1) * world_size // length) - 1 for p in range(length)]


def _layout(
    selection: Selection,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    ranks: Sequence[int] | None,
) -> Layout:
    """``run_layout`` for ``ranks`` of the run itself (None: the ranks that hold records).

    Earlier runs are laid out for their ranks that hold records only: the others read nothing
    and leave nothing. So the work per earlier run grows with min(ranks, records) x workers,
    never with the ranks alone: a state naming 2^20 ranks over a small split costs what the
    split's records do."""
    topologies = [interrupt.topology for interrupt in interrupts] + [topology]
    level = Level([(0, epoch_length)])
    layout: Layout = {}
    for index, current in enumerate(topologies):
        wanted = ranks if index == len(interrupts) else None
        if index > 0 and current == topologies[index - 1]:
            before, previous = layout, interrupts[index - 1]
            layout = {
                r: _continued(before[r], previous)
                if r in before
                else [[] for _ in range(current.workers)]
                for r in (before.keys() if wanted is None else wanted)
            }
            continue
        if index > 0:
            previous = interrupts[index - 1]
            level = Level(
                [i for parts in layout.values() for rest in _unread(parts, previous) for i in rest]
            )
        level = _balanced(level, current.world_size, selection.equal_batches)
        if wanted is None:
            wanted = _ranks_with_records(level.length, current.world_size)
        layout = {
            r: [level.slice(start, stop) for start, stop in _worker_parts(level, current, r)]
            for r in wanted
        }
    return layout


def consumer_part(
    selection: Selection,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    rank: int,
    worker: int,
) -> list[tuple[int, int]]:
    """Epoch intervals consumer (rank, worker) reads in a run after ``interrupts``."""
    return run_layout(selection, epoch_length, interrupts, topology, rank)[rank][worker]


def rank_batches(
    selection: Selection,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    rank: int,
) -> int:
    """Batches ``rank`` yields in a run after ``interrupts``."""
    parts = run_layout(selection, epoch_length, interrupts, topology, rank)[rank]
    return sum(batch_count(_length(p), topology.batch_size, topology.drop_last) for p in parts)


def left_in_epoch(
    selection: Selection, epoch_length: int, interrupts: Sequence[Interrupt], topology: Topology
) -> int:
    """Records a run of ``topology`` after ``interrupts`` reads, over all its consumers."""
    layout = _layout(selection, epoch_length, interrupts, topology, None)
    return sum(_length(part) for parts in layout.values() for part in parts)


def epoch_length(selection: Selection, epoch: int) -> int:
    mixed = selection.mixed(epoch)
    return selection.totals()[0] if mixed is None else mixed.length


@dataclass(frozen=True)
class TokenInterrupt:
    """A token pass (``load_tokens``) stopped. Token blocks cut records, so what a consumer
    consumed cannot follow from batch counts: per rank and worker, ``positions`` holds (records
    of its part wholly consumed, tokens consumed of the next record, counted from the record's
    start; 0 when this run took none of it). Per rank, ``turns`` is the worker whose turn came
    next and ``finished`` whether the rank had received all its batches."""

    topology: Topology
    positions: tuple[tuple[tuple[int, int], ...], ...]
    turns: tuple[int, ...]
    finished: tuple[bool, ...]

    def __post_init__(self) -> None:
        ranks, workers = self.topology.world_size, self.topology.workers
        if len(self.positions) != ranks or len(self.turns) != ranks or len(self.finished) != ranks:
            raise ValueError(f"A token loader state needs every one of its {ranks} ranks")
        for rank, (positions, turn) in enumerate(zip(self.positions, self.turns, strict=True)):
            if len(positions) != workers or not 0 <= turn < workers:
                raise ValueError(f"Invalid token loader state for rank {rank}")
            if any(records < 0 or offset < 0 for records, offset in positions):
                raise ValueError(f"Invalid token loader state for rank {rank}")

    def then(self, later: TokenInterrupt) -> TokenInterrupt:
        """This run and ``later``, a run on the same topology that resumed it, as one run (see
        :func:`token_rank_then`)."""
        if later.topology != self.topology:
            raise ValueError("Only runs on one topology merge")
        ranks = [
            token_rank_then(self.positions[r], self.turns[r], later.positions[r], later.turns[r])
            for r in range(self.topology.world_size)
        ]
        return TokenInterrupt(
            self.topology,
            tuple(positions for positions, _ in ranks),
            tuple(turn for _, turn in ranks),
            later.finished,
        )


Position = tuple[int, int]


def token_rank_then(
    positions: Sequence[Position],
    turn: int,
    later_positions: Sequence[Position],
    later_turn: int,
) -> tuple[tuple[Position, ...], int]:
    """One rank's (positions, turn) after a run and a later run on the same topology that
    resumed it, as one run's.

    The later run's worker w read the rest of the earlier run's worker (w + turn) % workers
    (``token_layout``), counting its records from there and its token offset from the start of
    the record, as the earlier run did; a worker that took nothing keeps the earlier position,
    cut included. The turns add. (tests/test_load_tokens.py checks that the merged run leaves
    what the two leave.)"""
    workers = len(positions)
    merged = list(positions)
    for worker, (records, offset) in enumerate(later_positions):
        if records or offset:
            earlier = (worker + turn) % workers
            merged[earlier] = (positions[earlier][0] + records, offset)
    return tuple(merged), (turn + later_turn) % workers


def _unread_tokens(
    parts: list[list[tuple[int, int]]],
    positions: Sequence[tuple[int, int]],
    cuts: dict[int, int],
) -> list[list[tuple[int, int]]]:
    """Per worker, the rest of its part after ``positions``; a record a block cut is kept
    whole, and ``cuts`` records where its unconsumed tokens start."""
    rests = []
    for part, (records, offset) in zip(parts, positions, strict=True):
        level = Level(part)
        if records > level.length or (records == level.length and offset > 0):
            raise ValueError(
                f"Token loader state consumed {records} records of a part of {level.length}"
            )
        rest = level.slice(records, level.length)
        if offset > 0:
            first = rest[0][0]
            if offset <= cuts.get(first, 0):
                raise ValueError(f"Token loader state went back inside record {first}")
            cuts[first] = offset
        rests.append(rest)
    return rests


def token_layout(
    epoch_length: int,
    interrupts: Sequence[TokenInterrupt],
    topology: Topology,
    rank: int | None = None,
    boundaries: Sequence[int] | None = None,
) -> tuple[Layout, dict[int, int]]:
    """``run_layout`` for token passes: (who reads which epoch intervals, and per epoch position
    of a record earlier runs consumed in part, the token its rest starts at).

    A run on a new topology splits the unconsumed records evenly; a run on the interrupted
    run's topology gives each worker one old worker's rest, rotated by the turn that was next:
    block for block the uninterrupted run.

    ``boundaries`` (a mixture schedule's segments: 0, ..., ``epoch_length``, ascending): a run
    on a new topology sorts what is left, cuts it at the boundaries and gives every consumer its
    even share of each segment's piece, segment after segment, so that all consumers cross a
    boundary together; each part is then ascending. [0, epoch_length] alone splits as without
    boundaries (what is left is then already ascending)."""
    topologies = [interrupt.topology for interrupt in interrupts] + [topology]
    level = Level([(0, epoch_length)])
    layout: Layout = {}
    cuts: dict[int, int] = {}
    for index, current in enumerate(topologies):
        final = index == len(interrupts)
        ranks = [rank] if final and rank is not None else range(current.world_size)
        if index > 0:
            previous = interrupts[index - 1]
            rests = {
                r: _unread_tokens(layout[r], previous.positions[r], cuts)
                for r in range(previous.topology.world_size)
            }
            if current == previous.topology:
                workers = current.workers
                layout = {
                    r: [rests[r][(w + previous.turns[r]) % workers] for w in range(workers)]
                    for r in ranks
                }
                continue
            left = [i for r in sorted(rests) for rest in rests[r] for i in rest]
            level = Level(left if boundaries is None else sorted(left))
        pieces = None if boundaries is None else _segment_pieces(level, boundaries)
        layout = {r: _token_parts(level, pieces, current, r) for r in ranks}
    return layout, cuts


def _segment_pieces(level: Level, boundaries: Sequence[int]) -> list[Level]:
    """The positions of ``level`` (ascending) inside each segment [boundaries[j],
    boundaries[j + 1])."""
    pieces: list[list[tuple[int, int]]] = [[] for _ in boundaries[1:]]
    for start, stop in level.intervals:
        j = min(bisect.bisect_right(boundaries, start) - 1, len(pieces) - 1)
        while start < stop:
            end = stop if j + 1 == len(pieces) else min(stop, boundaries[j + 1])
            pieces[j].append((start, end))
            start, j = end, j + 1
    return [Level(piece) for piece in pieces]


def _token_parts(
    level: Level, pieces: list[Level] | None, topology: Topology, rank: int
) -> list[list[tuple[int, int]]]:
    """Per worker of ``rank``, its epoch intervals: its even part of ``level``, or of each
    segment's piece in turn."""
    if pieces is None:
        return [level.slice(start, stop) for start, stop in _worker_parts(level, topology, rank)]
    parts: list[list[tuple[int, int]]] = [[] for _ in range(topology.workers)]
    for piece in pieces:
        for worker, (start, stop) in enumerate(_worker_parts(piece, topology, rank)):
            parts[worker] += piece.slice(start, stop)
    return [Level(part).intervals for part in parts]
