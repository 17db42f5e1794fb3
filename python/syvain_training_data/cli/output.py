"""What commands print: tables, counts and sizes, and the :class:`Progress` line on stderr."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, TextIO


def table(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


class Progress:
    """One progress line on stderr: bytes, records and their rates (and shards done).

    On a terminal the line is redrawn in place at most ten times a second; elsewhere (a log,
    a pipe) it is printed every ``interval_s`` seconds. ``finish`` prints the final line.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        label: str,
        total_bytes: int,
        total_records: int,
        total_shards: int,
        enabled: bool = True,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._label = label
        self._totals = (total_bytes, total_records, total_shards)
        self._enabled = enabled
        self._tty = isatty(stream)
        self._interval_s = 0.1 if self._tty else interval_s
        self._lock = threading.Lock()
        self._clock = clock
        self._started = clock()
        self._last = self._started
        self.bytes = 0
        self.records = 0
        self.shards = 0

    def add(self, *, bytes_: int = 0, records: int = 0, shards: int = 0) -> None:
        with self._lock:
            self.bytes += bytes_
            self.records += records
            self.shards += shards
            now = self._clock()
            if self._enabled and now - self._last >= self._interval_s:
                self._last = now
                self._draw(now, final=False)

    def finish(self) -> None:
        with self._lock:
            if self._enabled:
                self._draw(self._clock(), final=True)

    def line(self, now: float | None = None) -> str:
        elapsed = max((self._clock() if now is None else now) - self._started, 1e-9)
        total_bytes, total_records, total_shards = self._totals
        percent = 100.0 * self.bytes / total_bytes if total_bytes else 100.0
        return (
            f"{self._label}: {human_bytes(self.bytes)} / {human_bytes(total_bytes)} "
            f"({percent:.0f}%), {self.records:,} / {total_records:,} records, "
            f"{self.shards} / {plural(total_shards, 'shard')}, "
            f"{human_bytes(self.bytes / elapsed)}/s, {self.records / elapsed:,.0f} records/s, "
            f"{elapsed:.1f} s"
        )

    def _draw(self, now: float, *, final: bool) -> None:
        text = self.line(now)
        if self._tty:
            self._stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()


def isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
