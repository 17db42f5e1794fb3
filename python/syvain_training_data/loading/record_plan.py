"""The plan of record passes (``load``): who reads which records in a run after earlier runs
of the epoch stopped, as pure functions of record counts, batch counts and topologies (no I/O,
no torch; see :mod:`~syvain_training_data.loading.plan` for the terms).

A record pass's interrupt holds per rank the batches the training loop received; what each
worker consumed follows from torch's in-order round robin over its workers.

With a mixture schedule (``boundaries``: its segments, see :mod:`.schedule`) a run on a new
topology gives every consumer its even share of each segment's piece of what is left, segment
after segment, as token passes do, so all consumers cross a boundary together.
"""

from __future__ import annotations

from collections.abc import Sequence

from syvain_training_data.loading.plan import (
    Interrupt,
    Layout,
    Level,
    ReadPlan,
    Topology,
    batch_count,
    segment_pieces,
    segmented_parts,
)

__all__ = [
    "consumer_part",
    "left_in_epoch",
    "left_positions",
    "rank_batches",
    "round_robin_taken",
    "run_layout",
]

Boundaries = Sequence[int] | None


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
    read_plan: ReadPlan,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    rank: int | None = None,
    boundaries: Boundaries = None,
) -> Layout:
    """Who reads what in a run of ``topology`` after the ``interrupts`` of this epoch (only
    ``rank``'s part of the run itself when given; earlier runs are laid out whole).

    A run on a new topology splits what is left evenly (ranks, then workers, in epoch order;
    with ``boundaries``, segment by segment); a run on the interrupted run's topology
    continues it exactly."""
    ranks = range(topology.world_size) if rank is None else [rank]
    return _layout(read_plan, epoch_length, interrupts, topology, ranks, boundaries)


def _ranks_with_records(length: int, world_size: int) -> Sequence[int]:
    """The ranks whose part of a level of ``length`` positions is not empty, ascending, in
    min(length, world_size) steps (with fewer positions than ranks, each holds one: position
    p is rank r's when r < (p + 1) x world_size / length <= r + 1)."""
    if length >= world_size:
        return range(world_size)
    return [-(-(p + 1) * world_size // length) - 1 for p in range(length)]


def _layout(
    read_plan: ReadPlan,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    ranks: Sequence[int] | None,
    boundaries: Boundaries = None,
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
            left = [
                i for parts in layout.values() for rest in _unread(parts, previous) for i in rest
            ]
            level = Level(left if boundaries is None else sorted(left))
        if boundaries is None:
            pieces = [_balanced(level, current.world_size, read_plan.equal_batches)]
        else:  # with equal batches, every segment's piece splits exactly
            pieces = [
                _balanced(piece, current.world_size, read_plan.equal_batches)
                for piece in segment_pieces(level, boundaries)
            ]
        if wanted is None:
            wanted = sorted(
                {
                    r
                    for piece in pieces
                    for r in _ranks_with_records(piece.length, current.world_size)
                }
            )
        layout = {r: segmented_parts(level, pieces, current, r) for r in wanted}
    return layout


def consumer_part(
    read_plan: ReadPlan,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    rank: int,
    worker: int,
    boundaries: Boundaries = None,
) -> list[tuple[int, int]]:
    """Epoch intervals consumer (rank, worker) reads in a run after ``interrupts``."""
    layout = run_layout(read_plan, epoch_length, interrupts, topology, rank, boundaries)
    return layout[rank][worker]


def rank_batches(
    read_plan: ReadPlan,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    rank: int,
    boundaries: Boundaries = None,
) -> int:
    """Batches ``rank`` yields in a run after ``interrupts``."""
    parts = run_layout(read_plan, epoch_length, interrupts, topology, rank, boundaries)[rank]
    return sum(batch_count(_length(p), topology.batch_size, topology.drop_last) for p in parts)


def left_in_epoch(
    read_plan: ReadPlan,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    boundaries: Boundaries = None,
) -> int:
    """Records a run of ``topology`` after ``interrupts`` reads, over all its consumers."""
    return sum(
        b - a for a, b in left_positions(read_plan, epoch_length, interrupts, topology, boundaries)
    )


def left_positions(
    read_plan: ReadPlan,
    epoch_length: int,
    interrupts: Sequence[Interrupt],
    topology: Topology,
    boundaries: Boundaries = None,
) -> list[tuple[int, int]]:
    """The epoch intervals a run of ``topology`` after ``interrupts`` reads (all consumers)."""
    layout = _layout(read_plan, epoch_length, interrupts, topology, None, boundaries)
    return [i for parts in layout.values() for part in parts for i in part]
