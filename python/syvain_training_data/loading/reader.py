"""Reads one consumer's part of an epoch: contiguous record ranges of shards, in plan order.

Each shard range is read with ``iter_shard(start=, stop=)``, which skips the records before
``start`` without decoding them and stops after ``stop``; the next range's first bytes are
requested while the current one is read. A shuffled stream is read window by window (a window
is a run of records inside one shard): one window's records are held at a time, then handed
out in the window's permutation.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from syvain_training_data.loading.plan import MixedOrder, StreamOrder

__all__ = ["ShardRange", "consumer_records"]

# (shard index in the dataset's table, first record, end record)
ShardRange = tuple[int, int, int]
OpenRange = Callable[[ShardRange], Iterator[Any]]


class _Prefetch:
    """Iterates ``records``, whose first record a background thread starts fetching at once.

    The store's reader releases the GIL while it waits, so the request overlaps the current
    range's decoding; an error surfaces when the records are reached, as without prefetch."""

    def __init__(self, records: Iterator[Any]) -> None:
        self._records = records
        self._first: list[Any] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._prime, daemon=True)
        self._thread.start()

    def _prime(self) -> None:
        try:
            self._first = [next(self._records)]
        except StopIteration:
            pass
        except BaseException as error:  # re-raised in the consumer
            self._error = error

    def __iter__(self) -> Iterator[Any]:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        yield from self._first
        yield from self._records


def _read_ranges(ranges: Sequence[ShardRange], open_range: OpenRange) -> Iterator[Any]:
    """The records of ``ranges`` in order, one range ahead requested in the background."""
    upcoming: _Prefetch | None = None
    for number, shard_range in enumerate(ranges):
        current = upcoming or _Prefetch(open_range(shard_range))
        upcoming = None
        if number + 1 < len(ranges):
            upcoming = _Prefetch(open_range(ranges[number + 1]))
        yield from current


def _merge_ranges(pieces: Sequence[ShardRange]) -> list[ShardRange]:
    merged: list[ShardRange] = []
    for shard, start, stop in pieces:
        if merged and merged[-1][0] == shard and merged[-1][2] == start:
            merged[-1] = (shard, merged[-1][1], stop)
        else:
            merged.append((shard, start, stop))
    return merged


def _stream_records(
    order: StreamOrder,
    shard_ids: Sequence[int],
    positions: Sequence[tuple[int, int]],
    open_range: OpenRange,
) -> Iterator[Any]:
    """Records at ``positions`` (ascending [start, stop) intervals) of one stream's order."""

    def table_ranges(start: int, stop: int) -> list[ShardRange]:
        return [(shard_ids[k], a, b) for k, a, b in order.segments(start, stop)]

    if not order.window:
        pieces = [piece for start, stop in positions for piece in table_ranges(start, stop)]
        yield from _read_ranges(_merge_ranges(pieces), open_range)
        return
    # Which positions each window needs; the window's records are read whole, once.
    needed: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for start, stop in positions:
        while start < stop:
            span = order.window_span(start)
            end = min(stop, span[1])
            needed.setdefault(span, []).append((start, end))
            start = end
    pieces = [piece for span in needed for piece in table_ranges(*span)]
    records = _read_ranges(_merge_ranges(pieces), open_range)
    for (first, last), wanted in needed.items():
        held = [next(records) for _ in range(last - first)]
        permutation = order.window_permutation(first, last)
        for start, stop in wanted:
            for position in range(start - first, stop - first):
                yield held[permutation[position]]
        del held


def consumer_records(
    orders: Sequence[StreamOrder],
    shard_ids: Sequence[Sequence[int]],
    mixed: MixedOrder | None,
    intervals: Sequence[tuple[int, int]],
    open_range: OpenRange,
) -> Iterator[Any]:
    """The records of epoch ``intervals`` (mixed positions when ``mixed``), in epoch order.

    ``shard_ids[s][k]`` is the table index of stream s's k-th shard."""
    if mixed is None:
        yield from _stream_records(orders[0], shard_ids[0], intervals, open_range)
        return
    bounds = [(mixed.prefix(start), mixed.prefix(stop)) for start, stop in intervals]
    streams = [
        _stream_records(
            order,
            shard_ids[s],
            [(low[s], high[s]) for low, high in bounds if high[s] > low[s]],
            open_range,
        )
        for s, order in enumerate(orders)
    ]

    def keys(stream: int, start: int, stop: int) -> Iterator[tuple[float, int]]:
        return ((mixed.key(stream, i), stream) for i in range(start, stop))

    for low, high in bounds:
        merged = heapq.merge(*(keys(s, low[s], high[s]) for s in range(len(orders))))
        for _, s in merged:
            yield next(streams[s])
