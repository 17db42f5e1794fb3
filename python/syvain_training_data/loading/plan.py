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
- *mixed order*: several streams merged by a key per record (``loading.mixing``), so each
  stream keeps its share of every stretch of the order. A mixture schedule changes the shares
  along the order, segment by segment (``loading.schedule``).
- *level*: the positions a pass runs over. Level 0 is the whole epoch; a resume adds a level
  that holds what the interrupted run had not consumed, in epoch order.
- *consumer*: one (rank, worker). Ranks take contiguous parts of a level whose sizes differ by at
  most one record; workers split their rank's part the same way.
"""

from __future__ import annotations

import array
import bisect
import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from syvain_training_data.loading import state as checks
from syvain_training_data.loading.block_order import DEFAULT_WINDOW_BLOCKS, BlockOrder
from syvain_training_data.loading.mixing import MIX_STOPS, MixedOrder

if TYPE_CHECKING:
    from syvain_training_data.loading.schedule import ScheduledOrder
    from syvain_training_data.loading.token_plan import TokenInterrupt

__all__ = [
    "DEFAULT_WINDOW",
    "Interrupt",
    "Level",
    "Order",
    "ReadPlan",
    "StreamOrder",
    "Topology",
    "appended",
    "batch_count",
    "beyond_bounds",
    "merged_tail",
    "split_evenly",
    "topology_runs",
    "worker_parts",
]

# Blocks interleaved together when a seed is given and no window is (see block_order).
DEFAULT_WINDOW = DEFAULT_WINDOW_BLOCKS


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
        two leave what one run stopped after both runs' batches leaves (drop_last, equal
        batches, mixing and ranks of unequal batch counts included)."""
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
class ReadPlan:
    """What a loader reads and how it orders it: per stream, the record count of each of its
    shards; mixing weights (None: one stream); the seed and shuffle window (in blocks); equal
    batches. ``schedule``: mixing weights that change along the order, as (position, weights)
    entries (``loading.schedule``; ``weights`` is then its first entry's); the fingerprint
    names a schedule without its entries, so a state resumes with an edited schedule (the loader
    compares the two). ``identity`` names the shards themselves (a digest of their URIs), so a
    state saved for one selection is refused by another. ``blocks``: per stream, the records per
    block of each shard of an indexed dataset; ``indexed``: the dataset has record offset
    indexes (established alike on every rank, ``loading.shard_indexes``), so a seeded order
    cuts its shards into ``blocks`` (else whole shards are blocks). The order never depends on
    what an index holds, only on whether the dataset has them. ``spread``: a window spreads
    each block's records evenly over it (this release's order); False is the previous
    release's uniform interleaving, kept so its states resume (:meth:`resumed_by`)."""

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
    spread: bool = True

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

    @property
    def block_counts(self) -> tuple[tuple[int, ...], ...]:
        """Per stream, the records per block of each shard the seeded order uses."""
        return self.blocks if self.indexed and self.blocks is not None else self.streams

    def fingerprint(self, earlier_release: bool = False) -> str:
        """A short digest of everything that decides the epoch order. ``earlier_release``:
        the digest the previous release gave the same seeded plan (its order came from
        Python's ``random.shuffle``), so such a state is refused with its own reason."""
        blocks = self.blocks if self.seed is not None and self.indexed and self.blocks else ()
        digest = hashlib.sha256()
        for counts in (*self.streams, *blocks):
            digest.update(array.array("q", counts).tobytes())
            digest.update(b"/")
        # v5 is the seeded block order of the native generator with spread windows, v4 the
        # same with uniformly interleaved windows; an unseeded order is v2's, so its states
        # still load.
        version = "syvain-loader-plan-v2"
        if self.seed is not None:
            version = "syvain-loader-plan-v5" if self.spread else "syvain-loader-plan-v4"
            if earlier_release:
                version = "syvain-loader-plan-v3"
        mixing: str | list[str] | None = None
        if self.schedule is not None:  # not its entries: the loader compares schedules
            mixing = "schedule"
        elif self.weights is not None:
            mixing = [repr(w) for w in self.weights]
        fields: list[Any] = [
            version,
            digest.hexdigest(),
            mixing,
            self.mix_stop,
            self.seed,
            self.window,
            self.equal_batches,
            self.identity,
        ]
        if self.seed is not None and not earlier_release:
            fields.append(self.indexed)
        text = json.dumps(fields, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def resumed_by(self, selection: str, digest: Callable[[ReadPlan], str]) -> ReadPlan | None:
        """The plan that resumes a state whose fingerprint is ``selection`` (``digest`` gives
        a plan's): this one, or, for a state of the previous release's seeded order, this plan
        with its uniformly interleaved windows; None when neither made it."""
        if selection == digest(self):
            return self
        if self.seed is not None and self.spread:
            previous = dataclasses.replace(self, spread=False)
            if selection == digest(previous):
                return previous
        return None

    def refusal(self, selection: str, digest: Callable[[ReadPlan, bool], str], other: str) -> str:
        """Why a state whose fingerprint is ``selection`` does not resume this plan (its
        fingerprint, ``digest(self, False)``, differs): made by an earlier release's seeded
        order, or by a loader that answered "has indexes" otherwise; else ``other``."""
        if self.seed is None:
            return other
        if selection == digest(self, True):
            return (
                "This loader state was made by an earlier release's seeded order, which this "
                "release no longer draws (its permutations came from Python's random module, "
                "which may change between Python versions); it cannot resume exactly here: "
                "finish its epoch with the release that saved it, or start a new epoch"
            )
        flipped = dataclasses.replace(self, indexed=not self.indexed)
        if selection == digest(flipped, False):
            saved, ours = ("with", "without") if flipped.indexed else ("without", "with")
            return (
                f"This loader state was saved by a loader that read the dataset {saved} record "
                f"offset indexes, and this one reads it {ours} them (which decides the seeded "
                f"order); pass indexes={flipped.indexed} to load() to resume it"
            )
        return other

    def orders(self, epoch: int) -> list[Order]:
        """Per stream, its epoch order: manifest order without a seed, else blocks permuted
        and interleaved ``window`` at a time (``block_order``)."""
        if self.seed is None:
            return [StreamOrder(counts) for counts in self.streams]
        blocks = self.block_counts
        return [
            BlockOrder(counts, blocks[number], self.seed, epoch, number, self.window, self.spread)
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


def worker_parts(level: Level, topology: Topology, rank: int) -> list[tuple[int, int]]:
    """[start, stop) in level positions of each worker of ``rank``."""
    rank_start, rank_stop = split_evenly(level.length, topology.world_size, rank)
    parts = []
    for worker in range(topology.workers):
        start, stop = split_evenly(rank_stop - rank_start, topology.workers, worker)
        parts.append((rank_start + start, rank_start + stop))
    return parts


def segment_pieces(level: Level, boundaries: Sequence[int]) -> list[Level]:
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


def segmented_parts(
    level: Level, pieces: list[Level] | None, topology: Topology, rank: int
) -> list[list[tuple[int, int]]]:
    """Per worker of ``rank``, its epoch intervals: its even part of ``level``, or of each
    segment's piece in turn."""
    if pieces is None:
        return [level.slice(start, stop) for start, stop in worker_parts(level, topology, rank)]
    parts: list[list[tuple[int, int]]] = [[] for _ in range(topology.workers)]
    for piece in pieces:
        for worker, (start, stop) in enumerate(worker_parts(piece, topology, rank)):
            parts[worker] += piece.slice(start, stop)
    return [Level(part).intervals for part in parts]


# Per rank, per worker: the epoch intervals that consumer reads in a run.
Layout = dict[int, list[list[tuple[int, int]]]]


def epoch_length(read_plan: ReadPlan, epoch: int) -> int:
    mixed = read_plan.mixed(epoch)
    return read_plan.totals()[0] if mixed is None else mixed.length
