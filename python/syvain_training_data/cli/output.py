r"""What commands print: tables, counts and sizes, and the progress lines on stderr.

Everything a command prints goes through :func:`printable` (:func:`emit` prints a line with it):
names, URIs, etags and messages come from manifests, store listings, descriptors and errors
that quote them, which anyone who can write a manifest controls. Terminal control characters
in them are written as visible escapes, so a manifest cannot move the cursor, rewrite earlier
lines, change colours, set the window title or reorder text on the user's terminal: C0 controls
(``\x00``-``\x1f``, so ESC, CR, LF and TAB too), DEL, C1 controls (``\x80``-``\x9f``), the bidi
controls (U+061C, U+200E, U+200F, U+202A-U+202E, U+2066-U+2069) and the line and paragraph
separators (U+2028, U+2029). ``\n``, ``\r`` and ``\t`` are written as such, the others as
``\xNN`` or ``\uNNNN``. Backslashes are left alone: the output is for reading, not parsing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from syvain_training_data.manifest import ManifestShard

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE: Final = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    0x2028,
    0x2029,
]
_ESCAPES: Final = {
    code: _NAMED.get(chr(code)) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in _UNSAFE
}


def printable(value: object) -> str:
    """``str(value)`` with its terminal control characters escaped (see the module docstring).
    Idempotent: escaping an escaped text changes nothing."""
    return str(value).translate(_ESCAPES)


def emit(stream: IO[str], text: object = "") -> None:
    """Prints one line of command output, its control characters escaped (:func:`printable`)."""
    print(printable(text), file=stream)


def printable_lines(text: str) -> str:
    """A multi-line text (a traceback) with each line escaped, its line breaks kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


class EscapingFormatter(logging.Formatter):
    """A log formatter that escapes control characters: the message as one line (retry
    warnings quote shard URIs), a traceback line by line."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return printable_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return printable_lines(super().formatStack(stack_info))


def json_line(value: object, *, default: Callable[[object], object] | None = None) -> str:
    r"""``value`` as one line of ASCII JSON plus ``"\n"``: control characters are JSON
    escapes (``\u001b``), DEL included (``json.dumps`` leaves it raw), so the line is both
    valid JSON and safe on a terminal."""
    text = json.dumps(value, default=default, ensure_ascii=True)
    return text.replace("\x7f", "\\u007f") + "\n"


def table(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Aligned lines of ``rows`` (cells escaped by :func:`printable` before measuring)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def conclude(stream: IO[str], problems: Sequence[str], summary: str) -> None:
    """Prints each problem on its own line, then ``OK: {summary}``, or ``FAILED: N problems
    in {summary}`` and CommandFailed (exit status 1) when there is any."""
    from syvain_training_data.cli.errors import CommandFailed

    for problem in problems:
        emit(stream, f"problem: {problem}")
    if problems:
        emit(stream, f"FAILED: {plural(len(problems), 'problem')} in {summary}")
        raise CommandFailed
    emit(stream, f"OK: {summary}")


def plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


class ProgressLine:
    """One progress line on a stream, from the subclass's :meth:`line`.

    On a terminal it is redrawn in place at most ten times a second; elsewhere (a log, a pipe)
    it is printed every ``interval_s`` seconds, or, when that is None, only by :meth:`finish`,
    which prints the final line. Thread-safe: workers of a pool may report to one line.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        enabled: bool = True,
        interval_s: float | None = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._enabled = enabled
        self._tty = isatty(stream)
        self._interval_s = 0.1 if self._tty else interval_s
        self._lock = threading.Lock()
        self._clock = clock
        self._started = clock()
        self._last = self._started

    def line(self, now: float | None = None) -> str:
        raise NotImplementedError

    def finish(self) -> None:
        with self._lock:
            if self._enabled:
                self._draw(self._clock(), final=True)

    def _elapsed(self, now: float | None) -> float:
        return max((self._clock() if now is None else now) - self._started, 1e-9)

    def _changed(self) -> None:
        """Draws the line if it is due; the caller holds the lock and has updated the counts."""
        now = self._clock()
        due = self._interval_s is not None and now - self._last >= self._interval_s
        if self._enabled and due:
            self._last = now
            self._draw(now, final=False)

    def _draw(self, now: float, *, final: bool) -> None:
        text = printable(self.line(now))
        if self._tty:
            self._stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()


class ShardProgress(ProgressLine):
    """Bytes, records and their rates, and shards done, out of the totals of a set of shards
    (``verify --deep``, ``cp --with-shards``)."""

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
        super().__init__(stream, enabled=enabled, interval_s=interval_s, clock=clock)
        self._label = label
        self._totals = (total_bytes, total_records, total_shards)
        self.bytes = 0
        self.records = 0
        self.shards = 0

    @classmethod
    def of_shards(
        cls, stream: TextIO, label: str, shards: Sequence[ManifestShard], *, enabled: bool
    ) -> ShardProgress:
        """A line whose totals are those of ``shards`` (their manifest sizes and records)."""
        return cls(
            stream,
            label=label,
            total_bytes=sum(shard.size_bytes for shard in shards),
            total_records=sum(shard.records for shard in shards),
            total_shards=len(shards),
            enabled=enabled,
        )

    def add(self, *, bytes_: int = 0, records: int = 0, shards: int = 0) -> None:
        with self._lock:
            self.bytes += bytes_
            self.records += records
            self.shards += shards
            self._changed()

    def line(self, now: float | None = None) -> str:
        elapsed = self._elapsed(now)
        total_bytes, total_records, total_shards = self._totals
        percent = 100.0 * self.bytes / total_bytes if total_bytes else 100.0
        return (
            f"{self._label}: {human_bytes(self.bytes)} / {human_bytes(total_bytes)} "
            f"({percent:.0f}%), {self.records:,} / {total_records:,} records, "
            f"{self.shards} / {plural(total_shards, 'shard')}, "
            f"{human_bytes(self.bytes / elapsed)}/s, {self.records / elapsed:,.0f} records/s, "
            f"{elapsed:.1f} s"
        )


class CountProgress(ProgressLine):
    """A bar of tasks or batches done out of a known total, and the elapsed time (``bench``,
    ``demo``). Off a terminal only the final line is printed: these runs are short."""

    WIDTH: Final = 30

    def __init__(
        self,
        stream: TextIO,
        label: str,
        total: int,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(stream, enabled=enabled, interval_s=None, clock=clock)
        self._label = label
        self._total = total
        self.done = 0

    def advance(self, count: int = 1) -> None:
        with self._lock:
            self.done += count
            self._changed()

    def line(self, now: float | None = None) -> str:
        filled = self.WIDTH * self.done // max(self._total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        return f"  {self._label:<8} [{bar}] {self.done}/{self._total}  {self._elapsed(now):5.1f} s"


def isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
