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
from collections.abc import Callable, Iterable, Iterator, Sequence
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


def _read_ranges(ranges: Iterable[ShardRange], open_range: OpenRange) -> Iterator[Any]:
    """The records of ``ranges`` in order, one range ahead requested in the background.
    ``ranges`` is taken lazily, one ahead of the range being read."""
    pending = iter(ranges)
    upcoming = next(pending, None)
    prefetched: _Prefetch | None = None
    while upcoming is not None:
        current = prefetched or _Prefetch(open_range(upcoming))
        upcoming = next(pending, None)
        prefetched = None if upcoming is None else _Prefetch(open_range(upcoming))
        yield from current


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


def _windows(
    order: StreamOrder, positions: Sequence[tuple[int, int]]
) -> Iterator[tuple[tuple[int, int], list[tuple[int, int]]]]:
    """Each window the ``positions`` touch, with the positions wanted from it, in order and
    one at a time: planning costs a window's work as the reader reaches it, never a part's."""
    span: tuple[int, int] | None = None
    wanted: list[tuple[int, int]] = []
    for start, stop in positions:
        while start < stop:
            here = order.window_span(start)
            if here != span:
                if span is not None:
                    yield span, wanted
                span, wanted = here, []
            end = min(stop, here[1])
            wanted.append((start, end))
            start = end
    if span is not None:
        yield span, wanted


def _window_reads(
    order: StreamOrder, positions: Sequence[tuple[int, int]]
) -> Iterator[tuple[int, int]]:
    """The positions to read for ``positions``: each interval widened to the windows it
    touches, without reading a window twice (two intervals may share one)."""
    end = 0
    for start, stop in positions:
        if stop <= start:
            continue
        first = max(order.window_span(start)[0], end)
        last = order.window_span(stop - 1)[1]
        if first < last:
            yield first, last
        end = max(end, last)


def _stream_records(
    order: StreamOrder,
    shard_ids: Sequence[int],
    positions: Sequence[tuple[int, int]],
    open_range: OpenRange,
) -> Iterator[Any]:
    """Records at ``positions`` (ascending [start, stop) intervals) of one stream's order."""

    def table_ranges(start: int, stop: int) -> Iterator[ShardRange]:
        return ((shard_ids[k], a, b) for k, a, b in order.segments(start, stop))

    if not order.window:
        pieces = (piece for start, stop in positions for piece in table_ranges(start, stop))
        yield from _read_ranges(_merge_ranges(pieces), open_range)
        return
    # A window's records are read whole, once, as part of one read per shard run.
    pieces = (piece for span in _window_reads(order, positions) for piece in table_ranges(*span))
    records = _read_ranges(_merge_ranges(pieces), open_range)
    windows = _windows(order, positions)
    for (first, last), wanted in windows:
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
