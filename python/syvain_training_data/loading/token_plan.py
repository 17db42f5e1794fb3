"""The plan of token passes (``load_tokens``): who reads which records in a run after earlier
runs of the epoch stopped inside records, as pure functions (no I/O, no torch).

Token blocks cut records, so a token pass's interrupt holds per worker a position (records
wholly consumed, tokens of the next), not a batch count; the record plan's levels, parts and
topologies (:mod:`~syvain_training_data.loading.plan`) are otherwise the same.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from syvain_training_data.loading import state as checks
from syvain_training_data.loading.plan import (
    Layout,
    Level,
    Topology,
    segment_pieces,
    segmented_parts,
)

__all__ = [
    "Position",
    "TokenInterrupt",
    "cuts_by_index",
    "rank_json",
    "token_layout",
    "token_rank_then",
]


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

    def to_json(self) -> list[Any]:
        """[world_size, workers, batch_size, drop_last, per rank its :func:`rank_json`]: the
        record interrupt's topology fields, then positions instead of a batch count."""
        entries = [
            rank_json(rank, positions, turn, finished)
            for rank, (positions, turn, finished) in enumerate(
                zip(self.positions, self.turns, self.finished, strict=True)
            )
        ]
        return [*self.topology.to_json(), entries]

    @classmethod
    def from_json(cls, value: object, name: str, length: int) -> TokenInterrupt:
        """An entry of a token state's ``interrupts`` (see :meth:`to_json`) in an epoch of
        ``length`` records. ValueError naming the field (``name[i] (what)``) for anything
        else, or when some rank's entry is missing."""
        entry = checks.items(value, name, 5, exactly=5)
        topology = Topology.from_json(entry, name)
        world, workers = topology.world_size, topology.workers
        name = f"{name}[4]"
        entries = checks.items(entry[4], name, world)
        width = 3 + 2 * workers
        by_rank: dict[int, tuple[tuple[tuple[int, int], ...], int, bool]] = {}
        for k, item in enumerate(entries):
            where = f"{name}[{k}]"
            fields = checks.items(item, where, width, exactly=width)
            rank = checks.integer(fields[0], f"{where}[0] (rank)", 0, world - 1)
            if rank in by_rank:
                raise ValueError(f"Invalid loader state: {where}[0] (rank) repeats rank {rank}")
            turn = checks.integer(fields[1], f"{where}[1] (turn)", 0, workers - 1)
            finished = checks.flag(fields[2], f"{where}[2] (finished)")
            positions = tuple(
                (
                    checks.integer(fields[3 + 2 * w], f"{where}[{3 + 2 * w}] (records)", 0, length),
                    checks.integer(fields[4 + 2 * w], f"{where}[{4 + 2 * w}] (token offset)"),
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
        return cls(
            topology,
            tuple(positions for positions, _, _ in ranks),
            tuple(turn for _, turn, _ in ranks),
            tuple(finished for _, _, finished in ranks),
        )

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


def rank_json(rank: int, positions: Sequence[Position], turn: int, finished: bool) -> list[int]:
    """One rank's entry of a token interrupt: [rank, turn, finished, records, offset, ...]
    (each worker's position in turn)."""
    return [rank, turn, int(finished), *(value for position in positions for value in position)]


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
    cut included. The turns add, so the merged run leaves what the two leave."""
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
        pieces = None if boundaries is None else segment_pieces(level, boundaries)
        layout = {r: segmented_parts(level, pieces, current, r) for r in ranks}
    return layout, cuts


def cuts_by_index(part: Sequence[tuple[int, int]], cuts: dict[int, int]) -> dict[int, int]:
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
