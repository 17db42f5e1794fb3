"""Mixture schedules (``mixing_schedule=`` of ``load`` and ``load_tokens``): mixing weights
that change along the epoch's mixed order. No I/O and no torch.

A schedule is a list of (position, weights) entries, the first at position 0, positions
strictly ascending; entry j holds for mixed positions [P_j, P_{j+1}) (counted across all ranks),
its *segment*. Within a segment the streams' remaining records merge as in
:class:`~syvain_training_data.loading.mixing.MixedOrder`: stream s, of which C_j[s] records came
before the segment, orders its i-th record by ``((i - C_j[s]) + phase_{j,s}) / share_{j,s}``.
Segment 0's phases are drawn as MixedOrder draws them and later segments' continue the same
draws, so a one-entry schedule is the ``mixing_weights`` order bit for bit. ``first_exhausted``
ends the order where a segment's merge reaches the first key a stream cannot fill;
``all_exhausted`` keeps every record (a stream with nothing left takes no more positions).

Record and token passes lay a scheduled epoch out segment by segment (the ``boundaries`` of
``record_plan.run_layout`` and ``token_plan.token_layout``): every consumer takes its even
share of each segment, so all ranks and workers cross a boundary together. The boundaries the
epoch's runs were laid out with (``segments``: the interior boundaries and the layout's
length) and the schedule travel in the loader's state.
A state resumes with an edited schedule when the first difference lies beyond every position
its runs consumed (:func:`check_resume`): the order is identical below that difference, so the
rest of the epoch keeps the state's layout and takes its records from the new order. Records
the new order holds beyond the state's layout length (a later first_exhausted end) are left out
of that epoch; a shorter new order clips the layout.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from syvain_training_data.loading import mixing, plan, token_plan
from syvain_training_data.loading import state as checks

__all__ = [
    "MAX_SCHEDULE_ENTRIES",
    "MAX_SCHEDULE_JSON_BYTES",
    "Entry",
    "Schedule",
    "ScheduledOrder",
    "check_consumed",
    "check_resume",
    "consumed_through",
    "entries",
    "epoch_layout",
    "epoch_segments",
    "first_difference",
    "last_consumed",
    "resolved",
    "schedule_from_json",
    "schedule_json",
    "scheduled_order",
    "scheduled_token_layout",
    "segments_from_json",
    "state_fields",
]

MAX_SCHEDULE_ENTRIES = 64
# A schedule travels in every loader state: its JSON is bounded, so that with its segments it
# stays under 4 KiB.
MAX_SCHEDULE_JSON_BYTES = 2560

# An entry: (position, weights in stage order).
Entry = tuple[int, tuple[float, ...]]
Schedule = tuple[Entry, ...]


def _where(index: int) -> str:
    return f"mixing_schedule[{index}]"


def entries(value: object) -> list[tuple[int, object]]:
    """The (position, weights) entries of a ``mixing_schedule`` argument, their structure and
    positions checked: a list or tuple of 1 to 64 pairs, the first at position 0, positions
    ints strictly ascending, weights a mapping or a str. The weights are returned as given (see
    :func:`resolved`)."""
    if not isinstance(value, list | tuple):
        raise ValueError(
            f"mixing_schedule must be a list of (position, weights) pairs, got "
            f"{checks.describe(value)}"
        )
    if not 1 <= len(value) <= MAX_SCHEDULE_ENTRIES:
        raise ValueError(
            f"mixing_schedule must hold 1 to {MAX_SCHEDULE_ENTRIES} entries, got {len(value)}"
        )
    result: list[tuple[int, object]] = []
    for index, entry in enumerate(value):
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise ValueError(
                f"{_where(index)} must be a (position, weights) pair, got {checks.describe(entry)}"
            )
        position, weights = entry
        if isinstance(position, bool) or not isinstance(position, int):
            raise ValueError(
                f"{_where(index)} position must be an int, got {checks.describe(position)}"
            )
        if index == 0 and position != 0:
            raise ValueError(
                f"{_where(0)} must start at position 0, got {checks.describe(position)}"
            )
        if index and position <= result[-1][0]:
            raise ValueError(
                f"{_where(index)} position {checks.describe(position)} must be greater than "
                f"{_where(index - 1)}'s {result[-1][0]} (positions strictly ascending)"
            )
        if position > checks.MAX_COUNT:
            raise ValueError(f"{_where(index)} position {checks.describe(position)} is too large")
        if not isinstance(weights, Mapping | str):
            raise ValueError(
                f"{_where(index)} (position {position}): weights must be a mapping stage -> "
                f"weight or 'metadata', got {checks.describe(weights)}"
            )
        result.append((position, weights))
    return result


def resolved(
    pairs: Sequence[tuple[int, object]], resolve: Callable[[Any], Sequence[float]]
) -> Schedule:
    """``pairs`` (from :func:`entries`) with each entry's weights turned into floats in stage
    order by ``resolve`` (a mapping or "metadata", checked as ``mixing_weights``); its
    ValueError is re-raised naming the entry."""
    schedule = []
    for index, (position, weights) in enumerate(pairs):
        try:
            values = tuple(resolve(weights))
        except ValueError as error:
            raise ValueError(f"{_where(index)} (position {position}): {error}") from None
        schedule.append((position, values))
    size = len(json.dumps(schedule_json(tuple(schedule)), separators=(",", ":")))
    if size > MAX_SCHEDULE_JSON_BYTES:
        raise ValueError(
            f"mixing_schedule takes {size} bytes in a loader state, more than "
            f"{MAX_SCHEDULE_JSON_BYTES}: use fewer entries or shorter weights"
        )
    return tuple(schedule)


def schedule_json(schedule: Schedule) -> list[Any]:
    """A state's ``schedule``: [[position, [weights in stage order]], ...]."""
    return [[position, [float(w) for w in weights]] for position, weights in schedule]


def schedule_from_json(value: object, stages: int, name: str = "schedule") -> Schedule:
    """A state's ``schedule`` for ``stages`` mixed stages, checked field by field (ValueError
    naming it): at most 64 entries, positions ascending from 0, positive finite weights."""
    items = checks.items(value, name, MAX_SCHEDULE_ENTRIES)
    if not items:
        raise ValueError(f"Invalid loader state: {name} must hold at least one entry")
    schedule: list[Entry] = []
    for index, item in enumerate(items):
        where = f"{name}[{index}]"
        entry = checks.items(item, where, 2, exactly=2)
        low = 0 if index == 0 else schedule[-1][0] + 1
        high = 0 if index == 0 else checks.MAX_COUNT
        position = checks.integer(entry[0], f"{where}[0] (position)", low, high)
        raw = checks.items(entry[1], f"{where}[1] (weights)", stages, exactly=stages)
        weights = []
        for k, weight in enumerate(raw):
            what = f"{where}[1][{k}] (weight)"
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise ValueError(
                    f"Invalid loader state: {what} must be a number, got {checks.describe(weight)}"
                )
            if isinstance(weight, int) and weight.bit_length() > 1000:
                raise ValueError(f"Invalid loader state: {what} is too large")
            number = float(weight)
            if not math.isfinite(number) or number <= 0:
                raise ValueError(
                    f"Invalid loader state: {what} must be positive and finite, got "
                    f"{checks.describe(weight)}"
                )
            weights.append(number)
        schedule.append((position, tuple(weights)))
    return tuple(schedule)


def segments_from_json(value: object, records: int, name: str = "segments") -> tuple[int, ...]:
    """A state's ``segments`` (the interior layout boundaries and the layout's length) in a
    selection of ``records`` records, checked field by field: 1 to 64 ints strictly ascending,
    at most ``records``."""
    items = checks.items(value, name, MAX_SCHEDULE_ENTRIES)
    if not items:
        raise ValueError(f"Invalid loader state: {name} must hold at least the epoch length")
    segments: list[int] = []
    for index, item in enumerate(items):
        low = 0 if index == 0 else segments[-1] + 1
        segments.append(checks.integer(item, f"{name}[{index}]", low, records))
    if len(segments) > 1 and segments[0] == 0:
        raise ValueError(f"Invalid loader state: {name}[0] must be positive, got 0")
    return tuple(segments)


def first_difference(
    old: Schedule, new: Schedule
) -> tuple[int, int, Entry | None, Entry | None] | None:
    """Where ``new`` first differs from ``old``: (entry index, the position X from which the
    orders may differ, old's entry there, new's; None for an entry one list lacks), or None
    when they are equal. X is the smaller position of two differing entries."""
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            return index, min(a[0], b[0]), a, b
    if len(old) == len(new):
        return None
    index = min(len(old), len(new))
    if len(old) > len(new):
        return index, old[index][0], old[index], None
    return index, new[index][0], None, new[index]


class ScheduledOrder:
    """The mixed order of a schedule (see the module docstring): per segment a
    :class:`~syvain_training_data.loading.mixing.MixedOrder` of the records left, so that
    ``prefix`` costs one segment's binary search."""

    def __init__(
        self,
        lengths: Sequence[int],
        schedule: Schedule,
        mix_stop: str,
        seed: int | None,
        epoch: int,
    ) -> None:
        draws = mixing.PhaseDraws(seed, epoch)
        self.lengths = list(lengths)
        self.starts: list[int] = []
        self.before: list[list[int]] = []  # per segment, records of each stream before it
        self.parts: list[mixing.MixedOrder] = []
        used = [0 for _ in self.lengths]
        self.length = 0
        for index, (start, weights) in enumerate(schedule):
            phases = draws.take(len(self.lengths))
            rest = [n - u for n, u in zip(self.lengths, used, strict=True)]
            part = mixing.MixedOrder(rest, weights, mix_stop, seed, epoch, phases)
            self.starts.append(start)
            self.before.append(list(used))
            self.parts.append(part)
            span = schedule[index + 1][0] - start if index + 1 < len(schedule) else None
            if span is None or part.length <= span:  # the order ends in this segment
                self.length = start + part.length
                break
            used = [u + c for u, c in zip(used, part.prefix(span), strict=True)]

    def _segment(self, position: int) -> int:
        return bisect.bisect_right(self.starts, position) - 1

    def _stop(self, segment: int) -> int:
        return self.starts[segment + 1] if segment + 1 < len(self.starts) else self.length

    def prefix(self, position: int) -> list[int]:
        """Per stream, how many of its records are among the first ``position`` mixed ones."""
        if not 0 <= position <= self.length:
            raise ValueError(f"Mixed position {position} outside [0, {self.length}]")
        segment = self._segment(position)
        counts = self.parts[segment].prefix(position - self.starts[segment])
        return [b + c for b, c in zip(self.before[segment], counts, strict=True)]

    def labels(self, start: int, stop: int) -> Iterator[int]:
        """The stream of each mixed position in [start, stop), in order, segment by segment."""
        segment = self._segment(start)
        while start < stop:
            end = min(stop, self._stop(segment))
            offset = self.starts[segment]
            yield from self.parts[segment].labels(start - offset, end - offset)
            start, segment = end, segment + 1

    def boundaries(self) -> tuple[int, ...]:
        """A fresh epoch's ``segments``: the segment starts inside the order, then its length."""
        return (*(p for p in self.starts[1:] if p < self.length), self.length)


@functools.lru_cache(maxsize=8)
def scheduled_order(read_plan: plan.ReadPlan, epoch: int) -> ScheduledOrder:
    """The epoch's order of a scheduled selection (cached: the loader and its dataset ask for
    it several times per pass)."""
    if read_plan.schedule is None:
        raise ValueError("This selection has no mixing schedule")
    return ScheduledOrder(
        read_plan.totals(), read_plan.schedule, read_plan.mix_stop, read_plan.seed, epoch
    )


def epoch_segments(read_plan: plan.ReadPlan, epoch: int) -> tuple[int, ...]:
    """The ``segments`` a fresh epoch of a scheduled selection is laid out with."""
    return scheduled_order(read_plan, epoch).boundaries()


def scheduled_token_layout(
    read_plan: plan.ReadPlan,
    epoch: int,
    interrupts: Sequence[token_plan.TokenInterrupt],
    segments: Sequence[int] | None,
    topology: plan.Topology,
    rank: int | None = None,
) -> tuple[plan.Layout, dict[int, int]]:
    """``token_plan.token_layout`` of a token pass: without a schedule as it is; with one, laid out
    segment by segment with ``segments`` (the state's, when resuming; None: the epoch's own),
    each part clipped to the order's length (an edited schedule may end the order sooner)."""
    if read_plan.schedule is None:
        length = plan.epoch_length(read_plan, epoch)
        return token_plan.token_layout(length, interrupts, topology, rank)
    order = scheduled_order(read_plan, epoch)
    if segments is None:
        segments = order.boundaries()
    boundaries = (0, *segments)
    layout, cuts = token_plan.token_layout(segments[-1], interrupts, topology, rank, boundaries)
    if segments[-1] > order.length:
        # Parts are ascending (see token_plan.token_layout), so clipping keeps a prefix of each.
        end = order.length
        layout = {
            r: [[(a, min(b, end)) for a, b in part if a < end] for part in parts]
            for r, parts in layout.items()
        }
    return layout, cuts


def last_consumed(length: int, left: Sequence[tuple[int, int]], cuts: Sequence[int] = ()) -> int:
    """The largest position below ``length`` that earlier runs consumed wholly or in part, when
    a run after them reads the epoch intervals ``left`` (records consumed in part are ``cuts``,
    their positions); -1 when they consumed nothing."""
    highest = length - 1
    for start, stop in reversed(plan.Level(sorted(left)).intervals):
        if highest >= stop:
            break
        highest = min(highest, start - 1)
    return max(highest, max(cuts, default=-1))


def consumed_through(
    segments: Sequence[int],
    interrupts: Sequence[token_plan.TokenInterrupt],
    topology: plan.Topology,
) -> int:
    """The largest epoch position the token runs of ``interrupts`` (laid out with
    ``segments``) consumed wholly or in part; -1 when they consumed nothing. What the runs left
    is what a run of ``topology`` after them lays out (every rank); the rest was consumed, and
    records consumed in part are the layout's cuts."""
    length = segments[-1]
    layout, cuts = token_plan.token_layout(length, interrupts, topology, None, (0, *segments))
    left = [i for parts in layout.values() for part in parts for i in part]
    return last_consumed(length, left, list(cuts))


def check_resume(
    old: Schedule,
    new: Schedule,
    segments: Sequence[int],
    interrupts: Sequence[token_plan.TokenInterrupt],
    topology: plan.Topology,
) -> None:
    """ValueError when a token state whose runs used schedule ``old`` cannot resume with
    ``new``: see :func:`check_consumed`."""
    if first_difference(old, new) is None or not interrupts:
        return
    check_consumed(old, new, consumed_through(segments, interrupts, topology))


def check_consumed(old: Schedule, new: Schedule, consumed: int) -> None:
    """ValueError when a state whose runs used schedule ``old`` and consumed up to epoch
    position ``consumed`` cannot resume with ``new``: their first difference lies at or before
    it (the order is identical only below the first difference)."""
    difference = first_difference(old, new)
    if difference is None:
        return
    index, position, before, after = difference
    if position <= consumed:
        raise ValueError(
            f"The mixing schedule differs from the loader state's from position {position} "
            f"(entry {index}: the state's {_entry(before)}, this loader's {_entry(after)}), "
            f"at or before epoch position {consumed}, which the state's runs already "
            "consumed; only what comes after it may change"
        )


def _entry(entry: Entry | None) -> str:
    if entry is None:
        return "none"
    position, weights = entry
    return f"position {position} weights [{', '.join(map(repr, weights))}]"


def epoch_layout(
    read_plan: plan.ReadPlan, epoch: int, segments: tuple[int, ...] | None
) -> list[int] | None:
    """With a mixing schedule: the segments ``epoch`` is laid out with (``segments``, a
    resumed state's, else the epoch's own); None without one."""
    if read_plan.schedule is None:
        return None
    return list(segments or epoch_segments(read_plan, epoch))


def state_fields(
    read_plan: plan.ReadPlan, epoch: int, segments: Sequence[int] | None
) -> dict[str, Any]:
    """A scheduled loader's state fields: the schedule the runs used (the loader's: a state
    it resumed differed only after what it had consumed) and the segments ``epoch`` is laid
    out with; none without a schedule."""
    if read_plan.schedule is None:
        return {}
    return {
        "schedule": schedule_json(read_plan.schedule),
        "segments": epoch_layout(read_plan, epoch, None if segments is None else tuple(segments)),
    }
