"""Where the loader's time goes: counters of its consumers and of the training loop.

Each consumer (the main process without workers, else each DataLoader worker) counts the
records it yields, the shard ranges it opens, the seconds from opening a range to its first
record, and, through the native ``StreamCounters`` entered around each open, the bytes its
streams received and their retries by cause. It adds them, every 1024 records and at each
range's first record, to its own row of a small shared-memory array that the loader creates
before any worker starts (inherited on fork, handed over while spawning), so the main process
sums every consumer's row without a message and without touching the batches. The main process
adds the batches the training loop received and the seconds it waited in ``next()`` for them.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.sharedctypes
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from syvain_training_data import _native

__all__ = ["PUBLISH_MASK", "RETRY_CAUSES", "ConsumerSlots", "LoaderStats", "StatsClock"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# The native StreamCounters' causes, in its order.
RETRY_CAUSES: Final = ("connection", "timeout", "status", "ended_early", "other")
_RECORDS, _BYTES, _OPENS, _FIRSTS, _FIRST_SUM, _FIRST_MAX = range(6)
_FIELDS: Final = 6 + len(RETRY_CAUSES)
# Records between two writes of a consumer's row, less one (a mask of a power of two).
PUBLISH_MASK: Final = 1023


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's counters, summed over its consumers (main process and
    workers), since the loader was created.

    Attributes:
        records: records the consumers yielded to the DataLoader (batches prefetched but not
            yet received included).
        bytes: bytes the consumers' streams received from the store (a full read: the shards'
            ``size_bytes``; file:// parquet shards, read in place by pyarrow, add none).
        shard_opens: shard record ranges opened (one per shard for an unshuffled full read by
            one consumer; a seeded read opens one per block of each window).
        first_record_mean_s, first_record_max_s: seconds from opening a range to its first
            record (request, first bytes, decoding), over the ranges that yielded one.
        retries: transient failures the streams retried, by cause: ``connection`` (refused,
            reset or dropped), ``timeout``, ``status`` (5xx, throttling), ``ended_early`` (a
            body shorter than the object), ``other``.
        batches: batches the training loop received.
        waited_s: seconds the training loop spent waiting for them (in ``next()``, worker
            start included).
        first_batch_s: seconds from the start of the latest pass to its first batch (None
            before any batch).
        elapsed_s: seconds since the loader's first pass started.
        workers: DataLoader worker processes (0: the main process reads).
    """

    records: int
    bytes: int
    shard_opens: int
    first_record_mean_s: float
    first_record_max_s: float
    retries: Mapping[str, int]
    batches: int
    waited_s: float
    first_batch_s: float | None
    elapsed_s: float
    workers: int

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def megabytes_per_s(self) -> float:
        return self.bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        """One line of numbers (no URI, no credential): what the periodic log prints."""
        waited = 100.0 * self.waited_s / self.elapsed_s if self.elapsed_s > 0 else 0.0
        first = "-" if self.first_batch_s is None else f"{self.first_batch_s:.3f} s"
        retries = sum(self.retries.values())
        causes = ", ".join(f"{cause} {n}" for cause, n in self.retries.items() if n)
        return (
            f"loader: {self.records:,} records ({self.records_per_s:,.0f}/s), "
            f"{self.bytes / 1e6:,.1f} MB ({self.megabytes_per_s:,.1f} MB/s), "
            f"{self.batches:,} batches, waited {self.waited_s:.2f} s of {self.elapsed_s:.2f} s "
            f"({waited:.0f}%), first batch {first}, {self.shard_opens:,} shard opens "
            f"(first record mean {self.first_record_mean_s:.3f} s, max "
            f"{self.first_record_max_s:.3f} s), {retries} retries"
            + (f" ({causes})" if causes else "")
            + f", {self.workers} workers"
        )


_rows_lock = threading.Lock()


def _new_rows_lock() -> None:
    global _rows_lock
    _rows_lock = threading.Lock()  # one copied by fork may be held by a thread left behind


os.register_at_fork(after_in_child=_new_rows_lock)


class ConsumerSlots:
    """One row of float64 counters per consumer, in shared memory (exact for integers below
    2**53). Pickled while spawning a worker, the worker gets the same memory; pickled any other
    way (a copy of the dataset), the copy counts in fresh rows of its own."""

    def __init__(self, consumers: int, array: Any = None) -> None:
        self.consumers = max(consumers, 1)
        self._array = (
            multiprocessing.sharedctypes.RawArray("d", self.consumers * _FIELDS)
            if array is None
            else array
        )

    def __reduce__(self) -> tuple[Any, ...]:
        if multiprocessing.context.get_spawning_popen() is None:
            return (ConsumerSlots, (self.consumers,))
        return (ConsumerSlots, (self.consumers, self._array))

    def consumer(self, index: int, yielded: int = 0) -> ConsumerCounters:
        """The counters of consumer ``index`` (a worker id; 0 in the main process) for a pass
        whose part starts after ``yielded`` records."""
        return ConsumerCounters(self, index % self.consumers, yielded)

    def add(self, consumer: int, deltas: list[float]) -> None:
        """Adds ``deltas`` to a row (the first-record maximum is kept as a maximum). Only the
        consumer's own process writes its row; its threads and passes take turns."""
        start = consumer * _FIELDS
        with _rows_lock:
            row = self._array[start : start + _FIELDS]
            for field, delta in enumerate(deltas):
                row[field] = max(row[field], delta) if field == _FIRST_MAX else row[field] + delta
            self._array[start : start + _FIELDS] = row

    def totals(self) -> list[float]:
        rows = [self._array[i * _FIELDS : (i + 1) * _FIELDS] for i in range(self.consumers)]
        totals = [sum(column) for column in zip(*rows, strict=True)]
        totals[_FIRST_MAX] = max(row[_FIRST_MAX] for row in rows)
        return totals


class ConsumerCounters:
    """One consumer's counting during one pass, added to the consumer's row at each range's
    first record and every 1024 records yielded (a pass left unfinished may still add after
    the next one began). No layer of Python sits between the records and the consumer."""

    def __init__(self, slots: ConsumerSlots, index: int, yielded: int) -> None:
        self._slots = slots
        self._index = index
        self._streams = _native.StreamCounters()
        self._yielded = yielded
        # What of the streams' running totals (bytes, retries) the row already holds.
        self._added = [0] * (1 + len(RETRY_CAUSES))
        self._lock = threading.Lock()

    def watch(self, records: Iterator[T]) -> Iterator[T]:
        """``records`` (one shard range, opened by its first ``next``), the open timed."""
        return itertools.chain(self._first(records), records)

    def _first(self, records: Iterator[T]) -> Iterator[T]:
        started = time.perf_counter()
        try:
            with self._streams:  # the streams this open starts count here
                first = next(records, _END)
        except BaseException:
            self._add(opens=1)  # the retries before the failure
            raise
        if first is _END:
            self._add(opens=1)
            return
        self._add(opens=1, first_record_s=time.perf_counter() - started)
        yield first  # type: ignore[misc]

    def yielded(self, count: int) -> None:
        """The consumer has yielded ``count`` records of its part so far."""
        self._add(records=count - self._yielded)
        self._yielded = count

    def _add(
        self, *, records: int = 0, opens: int = 0, first_record_s: float | None = None
    ) -> None:
        deltas = [0.0] * _FIELDS
        deltas[_RECORDS] = records
        deltas[_OPENS] = opens
        if first_record_s is not None:
            deltas[_FIRSTS], deltas[_FIRST_SUM] = 1, first_record_s
            deltas[_FIRST_MAX] = first_record_s
        fields = (_BYTES, *range(_FIRST_MAX + 1, _FIELDS))
        # Ranges are opened from the reader's prefetch thread too: the streams' growth is
        # taken by one thread at a time, so it is added once.
        with self._lock:
            retries = self._streams.retries
            totals = [self._streams.bytes, *(retries[cause] for cause in RETRY_CAUSES)]
            for position, (field, total) in enumerate(zip(fields, totals, strict=True)):
                deltas[field] = total - self._added[position]
                self._added[position] = total
            self._slots.add(self._index, deltas)


_END: Final = object()


class StatsClock:
    """The main process's side: batches the training loop received and the seconds it waited
    for them; logs the summary every ``log_every`` seconds when set."""

    def __init__(self, slots: ConsumerSlots, workers: int, log_every: float | None) -> None:
        if log_every is not None and not (
            isinstance(log_every, int | float) and not isinstance(log_every, bool) and log_every > 0
        ):
            raise ValueError(f"log_stats_every must be a positive number, got {log_every!r}")
        self._slots = slots
        self._workers = workers
        self._log_every = log_every
        self._first_pass: float | None = None
        self._logged = 0.0
        self.batches = 0
        self.waited_s = 0.0
        self.first_batch_s: float | None = None

    def timed(self, batches: Iterator[T], pass_started: float) -> Iterator[T]:
        """``batches`` with the wait for each counted (``pass_started``: when the pass began,
        so that the first wait includes starting the workers)."""
        if self._first_pass is None:
            self._first_pass = self._logged = pass_started
        asked, first = pass_started, True
        while True:
            batch = next(batches, _END)
            now = time.perf_counter()
            self.waited_s += now - asked
            if batch is _END:
                return
            self.batches += 1
            if first:
                first, self.first_batch_s = False, now - pass_started
            if self._log_every is not None and now - self._logged >= self._log_every:
                self._logged = now
                log.info("%s", self.snapshot(now).summary())
            yield batch  # type: ignore[misc]
            asked = time.perf_counter()

    def snapshot(self, now: float | None = None) -> LoaderStats:
        totals = self._slots.totals()
        now = time.perf_counter() if now is None else now
        firsts = totals[_FIRSTS]
        return LoaderStats(
            records=int(totals[_RECORDS]),
            bytes=int(totals[_BYTES]),
            shard_opens=int(totals[_OPENS]),
            first_record_mean_s=totals[_FIRST_SUM] / firsts if firsts else 0.0,
            first_record_max_s=totals[_FIRST_MAX],
            retries={
                cause: int(totals[offset])
                for offset, cause in enumerate(RETRY_CAUSES, _FIRST_MAX + 1)
            },
            batches=self.batches,
            waited_s=self.waited_s,
            first_batch_s=self.first_batch_s,
            elapsed_s=0.0 if self._first_pass is None else now - self._first_pass,
            workers=self._workers,
        )
