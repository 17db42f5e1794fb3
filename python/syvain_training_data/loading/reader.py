"""Reads one consumer's part of an epoch: contiguous record ranges of shards, in plan order.

Each shard range is read with ``iter_shard(start=, stop=)``, which skips the records before
``start`` without decoding them and stops after ``stop``; the next range's first bytes are
requested while the current one is read. A seeded stream is read window by window: one range
per block of the window, all requested at once, their records taken in the window's
interleaving (``block_order``), so a worker holds a window's read buffers, never its records.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from syvain_training_data.loading.block_order import Window, window_counts
from syvain_training_data.loading.mixing import MixedOrder
from syvain_training_data.loading.plan import Order, StreamOrder
from syvain_training_data.loading.prefetch import Prefetch
from syvain_training_data.loading.schedule import ScheduledOrder

__all__ = ["ShardRange", "consumer_records"]

# (shard index in the dataset's table, first record, end record)
ShardRange = tuple[int, int, int]
OpenRange = Callable[[ShardRange], Iterator[Any]]


def _read_ranges(ranges: Iterable[ShardRange], open_range: OpenRange) -> Iterator[Any]:
    """The records of ``ranges`` in order, one range ahead requested in the background.
    ``ranges`` is taken lazily, one ahead of the range being read."""
    pending = iter(ranges)
    upcoming = next(pending, None)
    prefetched: Prefetch | None = None
    while upcoming is not None:
        current = prefetched or Prefetch(open_range(upcoming))
        upcoming = next(pending, None)
        prefetched = None if upcoming is None else Prefetch(open_range(upcoming))
        yield from current


def _read_ranges_in_place(ranges: Iterable[ShardRange], open_range: OpenRange) -> Iterator[Any]:
    """The records of ``ranges`` in order, each range opened when it is reached."""
    for shard_range in ranges:
        yield from open_range(shard_range)


def _merge_ranges(pieces: Iterable[ShardRange]) -> Iterator[ShardRange]:
    """Consecutive pieces of one shard joined into one range, lazily."""
    merged: ShardRange | None = None
    for shard, start, stop in pieces:
        if merged is not None and merged[0] == shard and merged[2] == start:
            merged = (shard, merged[1], stop)
            continue
        if merged is not None:
            yield merged
        merged = (shard, start, stop)
    if merged is not None:
        yield merged


def _stream_records(
    order: Order,
    shard_ids: Sequence[int],
    positions: Sequence[tuple[int, int]],
    open_range: OpenRange,
    prefetch: bool,
) -> Iterator[Any]:
    """Records at ``positions`` (ascending [start, stop) intervals) of one stream's order."""
    if isinstance(order, StreamOrder):
        pieces = (
            (shard_ids[k], a, b)
            for start, stop in positions
            for k, a, b in order.segments(start, stop)
        )
        read = _read_ranges if prefetch else _read_ranges_in_place
        yield from read(_merge_ranges(pieces), open_range)
        return
    for start, stop in positions:
        for window, low, high in order.windows(start, stop):
            yield from _window_records(window, low, high, shard_ids, open_range, prefetch)


def _window_records(
    window: Window,
    low: int,
    high: int,
    shard_ids: Sequence[int],
    open_range: OpenRange,
    prefetch: bool,
) -> Iterator[Any]:
    """The records at positions [low, high) of ``window``: one range read per block, all
    requested at once (with ``prefetch``; else each opened when first reached), taken in the
    window's interleaving."""
    before = window_counts(window, low)
    until = window_counts(window, high)
    reads: list[Iterator[Any] | None] = []
    for (shard, first, _), a, b in zip(window.blocks, before, until, strict=True):
        wanted = (shard_ids[shard], first + a, first + b)
        if b > a:
            records = open_range(wanted)
            reads.append(iter(Prefetch(records)) if prefetch else records)
        else:
            reads.append(None)
    if window.labels is None:  # one block, in order
        if reads[0] is not None:
            yield from reads[0]
        return
    # A read that ran short must raise, not end the interleaving: next() would stop map().
    checked = [None if read is None else itertools.chain(read, _short()) for read in reads]
    # map/next in C: no Python frame per record.
    yield from map(next, map(checked.__getitem__, window.labels[low:high]))  # type: ignore[arg-type]


def _short() -> Iterator[Any]:
    """Raises once a range read ran out before the window took all it planned."""
    raise RuntimeError("A shard range read ended before its planned records")
    yield  # a generator


def consumer_records(
    orders: Sequence[Order],
    shard_ids: Sequence[Sequence[int]],
    mixed: MixedOrder | ScheduledOrder | None,
    intervals: Sequence[tuple[int, int]],
    open_range: OpenRange,
    *,
    prefetch: bool,
) -> Iterator[Any]:
    """The records of epoch ``intervals`` (mixed positions when ``mixed``), in epoch order.

    ``shard_ids[s][k]`` is the table index of stream s's k-th shard. Each stream's records of
    an interval are contiguous in its order; ``mixed.labels`` says which stream each position
    takes. ``prefetch``: each range's first record is requested in the background before it is
    reached (for stores where a request waits on the network; a local file's reads cost less
    than the hand-off to another thread)."""
    if mixed is None:
        yield from _stream_records(orders[0], shard_ids[0], intervals, open_range, prefetch)
        return
    bounds = [(mixed.prefix(start), mixed.prefix(stop)) for start, stop in intervals]
    streams = [
        _stream_records(
            order,
            shard_ids[s],
            [(low[s], high[s]) for low, high in bounds if high[s] > low[s]],
            open_range,
            prefetch,
        )
        for s, order in enumerate(orders)
    ]
    for start, stop in intervals:
        for s in mixed.labels(start, stop):
            yield next(streams[s])
