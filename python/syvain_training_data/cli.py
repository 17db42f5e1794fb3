"""The ``syvain-data`` command (also ``python -m syvain_training_data``).

Subcommands: ``inspect``, ``verify``, ``head``, ``cp``, ``bench`` and ``demo``;
``syvain-data --help`` and ``syvain-data COMMAND --help`` describe them. :func:`main` runs one
command line and returns its exit status, so tests (and other programs) call it in-process.

Decisions:

- **Exit status.** 0 on success; 1 when a command fails, ``verify`` included when it finds a
  problem; 2 for a usage error (bad arguments, a URI that is neither ``s3://bucket/key`` nor
  ``file:///absolute/path`` nor a local path, s3:// without credentials, an invalid endpoint).
  A failure prints one line, ``syvain-data: error: {ExceptionType}: {first line}``, and no
  traceback unless ``--debug`` is given; Ctrl-C exits with 130.
- **Credentials** come from the flags or the standard AWS variables, exactly as
  :meth:`SyvainTrainingData.from_env` reads them: a flag overrides its variable. The secret is
  best left in ``AWS_SECRET_ACCESS_KEY`` or read with ``--secret-access-key-file PATH`` (``-``
  for stdin): a command line is visible to other users of the machine. A secret given on the
  command line that begins with ``-`` must be written ``--secret-access-key=SECRET`` (argparse
  would take it for an option). It is never printed, not even with ``--debug``.
- **Local paths** are accepted wherever a URI is: an argument without ``://`` is a path,
  turned into a ``file:///absolute/path`` URI.
- **Progress** (``verify --deep``, ``cp --with-shards``) is one line on stderr, redrawn in place
  on a terminal and printed every few seconds otherwise; a small hand-written line rather than
  tqdm keeps the base install at pydantic only. Bytes are the shards' manifest sizes, credited
  as records are read (proportionally within a shard, exactly when it ends).
- **head** prints records as JSON lines (ASCII, keys in record order); ``bytes`` values become
  ``{"$base64": "..."}``.
- **cp** copies the manifest's exact bytes; with ``--with-shards`` see :func:`copy_layout`.
  Destination objects are written create-only: an existing identical object is reused (a
  re-run finishes an interrupted copy), different bytes are an error, nothing is overwritten.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, TextIO

from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.manifest import (
    DataManifest,
    DataManifestDataFormat,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
)
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import get_object, head_object, put_object
from syvain_training_data.uris import check_shard_scheme, check_uri, plain_etag, portable_etag

__all__ = ["UsageError", "copy_layout", "main"]

PROG: Final = "syvain-data"
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130

# Flag -> the AWS variable it overrides (SyvainTrainingData.from_env reads these).
_CREDENTIAL_FLAGS: Final = (
    ("endpoint_url", "AWS_ENDPOINT_URL_S3"),
    ("region", "AWS_REGION"),
    ("access_key_id", "AWS_ACCESS_KEY_ID"),
    ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
)


class UsageError(Exception):
    """A command line that cannot run as given: exit status 2."""


class CommandFailed(Exception):
    """A command finished but found problems it already reported: exit status 1."""


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def _common_options(suppress: bool) -> argparse.ArgumentParser:
    """The connection options, accepted before or after the subcommand. Subcommand copies
    default to SUPPRESS so that they do not overwrite a value given before the subcommand."""
    default = argparse.SUPPRESS if suppress else None
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("connection (default: the standard AWS variables)")
    group.add_argument(
        "--endpoint-url",
        default=default,
        metavar="URL",
        help="S3 endpoint, e.g. http://127.0.0.1:8333 (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL)",
    )
    group.add_argument(
        "--region", default=default, help="S3 region (AWS_REGION, AWS_DEFAULT_REGION)"
    )
    group.add_argument(
        "--access-key-id", default=default, metavar="ID", help="access key (AWS_ACCESS_KEY_ID)"
    )
    group.add_argument(
        "--secret-access-key",
        default=default,
        metavar="SECRET",
        help="secret key, as --secret-access-key=SECRET if it may begin with '-'; prefer "
        "AWS_SECRET_ACCESS_KEY or --secret-access-key-file, as command lines are visible to "
        "others",
    )
    group.add_argument(
        "--secret-access-key-file",
        default=default,
        metavar="PATH",
        help="read the secret key from the first line of this file ('-' for stdin)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="show tracebacks and debug logs",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    common = _common_options(suppress=True)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, read and copy syvain-training-data datasets.",
        parents=[_common_options(suppress=False)],
        epilog="Exit status: 0 success, 1 failure or a problem found, 2 usage error.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect",
        parents=[common],
        help="splits, stages, records, bytes and shard counts, as a table",
        description="Print a manifest's splits and curriculum stages with their records, bytes "
        "and shard counts.",
    )
    inspect.add_argument("manifest", metavar="MANIFEST", help="manifest URI or local path")
    inspect.set_defaults(run=_inspect)

    verify = commands.add_parser(
        "verify",
        parents=[common],
        help="check every shard: size and etag (HEAD); --deep reads every record",
        description="HEAD every shard of a manifest and compare its size and etag with the "
        "manifest. With --deep, also stream every shard and check its record count. Every "
        "problem is printed on its own line; the exit status is 1 if there is any.",
    )
    verify.add_argument("manifest", metavar="MANIFEST", help="manifest URI or local path")
    verify.add_argument("--deep", action="store_true", help="stream every shard and count records")
    _add_jobs(verify, 8)
    _add_progress(verify)
    _add_allow_mixed_schemes(verify)
    verify.set_defaults(run=_verify)

    head = commands.add_parser(
        "head",
        parents=[common],
        help="the first records of a split, as JSON lines",
        description="Print the first records of a split (or of one curriculum stage) as JSON "
        'lines. bytes values are printed as {"$base64": "..."}.',
    )
    head.add_argument("manifest", metavar="MANIFEST", help="manifest URI or local path")
    head.add_argument("--split", help="split to read (default: the manifest's first split)")
    head.add_argument("--stage", help="read this curriculum stage of the split")
    head.add_argument(
        "-n", "--records", type=_non_negative, default=10, metavar="N", help="default 10"
    )
    _add_allow_mixed_schemes(head)
    head.set_defaults(run=_head)

    cp = commands.add_parser(
        "cp",
        parents=[common],
        help="copy a manifest; --with-shards copies and verifies its shards too",
        description="Copy a manifest (its exact bytes). With --with-shards, copy every shard "
        "under the destination manifest's folder, verify each copy (size, etag, record "
        "count), and write a manifest with the new URIs, last. Shards under the source "
        "manifest's folder keep their relative path; others go to "
        "shards/external/{scheme}/{bucket or path}/... . DST may be a folder (ending in /).",
    )
    cp.add_argument("source", metavar="SRC", help="source manifest URI or local path")
    cp.add_argument("destination", metavar="DST", help="destination manifest URI or local path")
    cp.add_argument("--with-shards", action="store_true", help="copy and verify the shards too")
    _add_jobs(cp, 4)
    _add_progress(cp)
    _add_allow_mixed_schemes(cp)
    cp.set_defaults(run=_cp)

    bench = commands.add_parser(
        "bench",
        parents=[common],
        help="read a split as training does: records/s, MB/s, time to first batch, counters",
        description="Read a split (or one curriculum stage) with SplitDataLoader, as a training "
        "loop does, for --seconds or to the end of the split, and print records/s, MB/s, the "
        "time to the first batch and the loader's counters (shard opens, time to first record, "
        "retries by cause), to size workers and shards before a run. Needs the torch extra.",
    )
    bench.add_argument("manifest", metavar="MANIFEST", help="manifest URI or local path")
    bench.add_argument("--split", help="split to read (default: the manifest's first split)")
    bench.add_argument("--stage", help="read this curriculum stage of the split")
    bench.add_argument(
        "--workers", type=_non_negative, default=2, help="DataLoader workers (default 2)"
    )
    bench.add_argument(
        "--seconds",
        type=_positive_seconds,
        default=30.0,
        metavar="T",
        help="stop after T seconds if the split lasts longer (default 30)",
    )
    bench.add_argument(
        "--batch-size", type=_positive, default=32, metavar="B", help="records per batch (32)"
    )
    _add_progress(bench)
    _add_allow_mixed_schemes(bench)
    bench.set_defaults(run=_bench)

    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="publish a dataset from a process pool and read it back with SplitDataLoader",
        description="The README's main job: publish a curriculum dataset with DatasetSaver from "
        "two processes (deterministic shard ids, so a second run reuses finished shards), then "
        "read one epoch with SplitDataLoader (two workers, shuffled) and check every record.",
    )
    demo.add_argument("--root", type=Path, default=None, help="directory of the local store")
    demo.add_argument("--records", type=_positive, default=20_000)
    demo.add_argument(
        "--s3", action="store_true", help="against a SeaweedFS started for the occasion"
    )
    demo.set_defaults(run=_demo)
    return parser


def _add_jobs(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "-j",
        "--jobs",
        type=_positive,
        default=default,
        help=f"shards handled at once (default {default})",
    )


def _add_allow_mixed_schemes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-mixed-schemes",
        action="store_true",
        help="read a trusted manifest whose shards use another scheme than the manifest "
        "(by default an s3:// manifest may name only s3:// shards, a file:// one only file://)",
    )


def _add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress line on stderr"
    )


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


@dataclass
class Context:
    """What a subcommand gets: its arguments, the client, and where to write."""

    args: argparse.Namespace
    client: SyvainTrainingData
    stdout: TextIO
    stderr: TextIO


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Runs one command line (``sys.argv[1:]`` by default) and returns its exit status.

    ``environ`` (default ``os.environ``) supplies the AWS variables; output goes to
    ``stdout`` and ``stderr`` (default the process's).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    parser = build_parser()
    try:
        # argparse prints help and usage errors to sys.stdout / sys.stderr itself.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error argparse printed (2)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=err,
    )
    try:
        client = _client(args, os.environ if environ is None else environ)
        run: Callable[[Context], None] = args.run
        run(Context(args, client, out, err))
        return EXIT_OK
    except CommandFailed:
        return EXIT_FAILED
    except UsageError as error:
        _report(err, debug, f"{PROG} {args.command}: error: {error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _report(err, debug, f"{PROG}: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``syvain-data head ... | head -1``): nothing left to do.
        _silence_stdout(out)
        return EXIT_OK
    except Exception as error:
        _report(err, debug, f"{PROG}: error: {_describe(error)}")
        return EXIT_FAILED


def _report(err: TextIO, debug: bool, line: str) -> None:
    if debug:
        traceback.print_exc(file=err)
    print(line, file=err)


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else '(no message)'}"


def _silence_stdout(out: TextIO) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file: nothing will be flushed into a closed pipe at exit


def _read_secret(path: str) -> str:
    """The first line of ``path`` (``-``: stdin) without its line ending; UsageError if it
    cannot be read or is empty. The message names the path, never the content."""
    try:
        if path == "-":
            line = sys.stdin.readline()
        else:
            with open(path, encoding="utf-8") as file:
                line = file.readline()
    except OSError as error:
        raise UsageError(f"cannot read the secret key from {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read the secret key from {path}: not UTF-8 text") from None
    secret = line.rstrip("\r\n")
    if not secret:
        raise UsageError(f"{path} holds no secret key on its first line")
    return secret


def _client(args: argparse.Namespace, environ: Mapping[str, str]) -> SyvainTrainingData:
    env = dict(environ)
    secret_file = getattr(args, "secret_access_key_file", None)
    if secret_file and getattr(args, "secret_access_key", None):
        raise UsageError("give --secret-access-key or --secret-access-key-file, not both")
    if secret_file:
        env["AWS_SECRET_ACCESS_KEY"] = _read_secret(secret_file)
    for flag, variable in _CREDENTIAL_FLAGS:
        value = getattr(args, flag, None)
        if value:
            env[variable] = value
    try:
        return SyvainTrainingData.from_env(env)
    except ValueError as error:
        raise UsageError(str(error).splitlines()[0]) from error


def to_uri(argument: str) -> str:
    """A URI argument as given, or a local path as a ``file:///absolute/path`` URI.

    Raises UsageError for another scheme or a malformed s3:// or file:// URI.
    """
    if "://" not in argument:
        path = Path(argument).expanduser().resolve().as_posix()
        return "file://" + (path if path.startswith("/") else "/" + path)
    try:
        return check_uri(argument)
    except ValueError as error:
        raise UsageError(
            f"{error}: use s3://bucket/key, file:///absolute/path or a local path"
        ) from None


def _require_credentials(ctx: Context, *uris: str) -> None:
    config = ctx.client.storage_config
    if any(uri.startswith("s3://") for uri in uris) and not (
        config.access_key_id and config.secret_access_key
    ):
        raise UsageError(
            "s3:// URIs need credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and AWS_ENDPOINT_URL for a server other than AWS), or pass --access-key-id"
        )


def _manifest_uri(ctx: Context, argument: str) -> str:
    uri = to_uri(argument)
    _require_credentials(ctx, uri)
    return uri


def _check_schemes(ctx: Context, manifest_uri: str, shards: Sequence[ManifestShard]) -> None:
    """Every shard's scheme is its manifest's (SPEC 4), before any shard is read."""
    for shard in shards:
        check_shard_scheme(
            manifest_uri, shard.uri, allow_mixed_schemes=ctx.args.allow_mixed_schemes
        )


# --------------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------------


def _table(rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
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


def _unique_shards(manifest: DataManifest) -> list[ManifestShard]:
    """Every distinct shard of the manifest, in manifest order (stages list split shards)."""
    seen: dict[str, ManifestShard] = {}
    for entry in manifest.splits.values():
        for shard in entry.shards:
            seen.setdefault(shard.uri, shard)
    return list(seen.values())


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
        self._tty = _isatty(stream)
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


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------------


def _inspect(ctx: Context) -> None:
    uri = _manifest_uri(ctx, ctx.args.manifest)
    manifest = ctx.client.load_manifest(uri)
    rows = [["split", "stage", "records", "bytes", "size", "shards"]]
    for name, entry in manifest.splits.items():
        stages = [("(all)", entry.records, entry.shards)] + [
            (stage, value.records, value.shards) for stage, value in entry.curriculum.items()
        ]
        for stage, records, shards in stages:
            size = sum(shard.size_bytes for shard in shards)
            rows.append(
                [
                    name if stage == "(all)" else "",
                    stage,
                    f"{records:,}",
                    f"{size:,}",
                    human_bytes(size),
                    str(len(shards)),
                ]
            )
    unique = _unique_shards(manifest)
    size = sum(shard.size_bytes for shard in unique)
    rows.append(
        [
            "total",
            "",
            f"{sum(s.records for s in unique):,}",
            f"{size:,}",
            human_bytes(size),
            str(len(unique)),
        ]
    )
    print(f"manifest  {uri}", file=ctx.stdout)
    print(f"format    {manifest.data_format}", file=ctx.stdout)
    print(f"splits    {len(manifest.splits)}", file=ctx.stdout)
    print(file=ctx.stdout)
    for line in _table(rows, right={2, 3, 4, 5}):
        print(line, file=ctx.stdout)


# --------------------------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------------------------


def head_problem(shard: ManifestShard, ctx: Context) -> str | None:
    """What HEAD finds wrong with a shard (missing, size, etag), or None."""
    try:
        info = head_object(shard.uri, storage_config=ctx.client.storage_config)
    except FileNotFoundError:
        return f"{shard.uri}: missing (the store has no such object)"
    if info.size != shard.size_bytes:
        return (
            f"{shard.uri}: size mismatch: {info.size:,} bytes in the store, "
            f"{shard.size_bytes:,} in the manifest"
        )
    etag = portable_etag(shard.uri, shard.etag)
    if etag and info.etag and plain_etag(etag) != plain_etag(info.etag):
        return (
            f"{shard.uri}: etag mismatch: {info.etag!r} in the store, {shard.etag!r} in the "
            "manifest (the object was replaced)"
        )
    return None


def count_records(
    ctx: Context, data_format: DataManifestDataFormat, shard: ManifestShard, progress: Progress
) -> int:
    """Streams a shard through ``iter_shard`` (which checks its size and record count),
    crediting progress every 1024 records; returns the number of records."""
    credited = 0
    count = 0
    for _ in iter_shard(data_format, shard, storage_config=ctx.client.storage_config):
        count += 1
        if count % 1024 == 0:
            owed = shard.size_bytes * count // shard.records - credited
            credited += owed
            progress.add(bytes_=owed, records=1024)
    progress.add(bytes_=shard.size_bytes - credited, records=count % 1024, shards=1)
    return count


def deep_problem(
    ctx: Context, data_format: DataManifestDataFormat, shard: ManifestShard, progress: Progress
) -> str | None:
    """What reading the whole shard finds wrong (bytes, record count, format), or None."""
    try:
        count_records(ctx, data_format, shard, progress)
    except (RuntimeError, OSError) as error:
        message = _describe(error).split(": ", 1)[1]
        return message if shard.uri in message else f"{shard.uri}: {message}"
    return None


def _verify(ctx: Context) -> None:
    uri = _manifest_uri(ctx, ctx.args.manifest)
    manifest = ctx.client.load_manifest(uri)
    shards = _unique_shards(manifest)
    _check_schemes(ctx, uri, shards)
    problems = _conflicting_descriptions(manifest)
    with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
        found = list(pool.map(lambda shard: head_problem(shard, ctx), shards))
    problems += [problem for problem in found if problem]
    checked = "size and etag"
    if ctx.args.deep:
        checked = "size, etag and records"
        healthy = [shard for shard, problem in zip(shards, found, strict=True) if not problem]
        progress = Progress(
            ctx.stderr,
            label="verify",
            total_bytes=sum(shard.size_bytes for shard in healthy),
            total_records=sum(shard.records for shard in healthy),
            total_shards=len(healthy),
            enabled=ctx.args.progress,
        )
        with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
            deep = list(
                pool.map(
                    lambda shard: deep_problem(ctx, manifest.data_format, shard, progress),
                    healthy,
                )
            )
        progress.finish()
        problems += [problem for problem in deep if problem]
    for problem in problems:
        print(f"problem: {problem}", file=ctx.stdout)
    records = sum(shard.records for shard in shards)
    size = sum(shard.size_bytes for shard in shards)
    summary = (
        f"{plural(len(shards), 'shard')}, {plural(records, 'record')}, {size:,} bytes "
        f"({checked} checked)"
    )
    if problems:
        print(f"FAILED: {plural(len(problems), 'problem')} in {summary}", file=ctx.stdout)
        raise CommandFailed
    print(f"OK: {summary}", file=ctx.stdout)


def _conflicting_descriptions(manifest: DataManifest) -> list[str]:
    """A URI that two splits describe differently cannot match both descriptions."""
    first: dict[str, ManifestShard] = {}
    problems = []
    for entry in manifest.splits.values():
        for shard in entry.shards:
            known = first.setdefault(shard.uri, shard)
            if known != shard:
                problems.append(f"{shard.uri}: described differently by two splits")
    return problems


# --------------------------------------------------------------------------------------------
# head
# --------------------------------------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _selected_shards(ctx: Context, manifest: DataManifest) -> tuple[str, list[ManifestShard]]:
    """(split, its shards or those of ``--stage``) from ``--split`` (default: the first)."""
    split = ctx.args.split or next(iter(manifest.splits))
    entry = manifest.splits.get(split)
    if entry is None:
        raise UsageError(f"unknown split {split!r}; available splits: {', '.join(manifest.splits)}")
    shards = entry.shards
    if ctx.args.stage is not None:
        stage = entry.curriculum.get(ctx.args.stage)
        if stage is None:
            available = ", ".join(entry.curriculum) or "(none)"
            raise UsageError(
                f"unknown curriculum stage {ctx.args.stage!r} in split {split!r}; "
                f"available stages: {available}"
            )
        shards = stage.shards
    return split, list(shards)


def _head(ctx: Context) -> None:
    uri = _manifest_uri(ctx, ctx.args.manifest)
    manifest = ctx.client.load_manifest(uri)
    _, shards = _selected_shards(ctx, manifest)
    _check_schemes(ctx, uri, shards)
    left = ctx.args.records
    for shard in shards:
        if left <= 0:
            break
        records = iter_shard(manifest.data_format, shard, storage_config=ctx.client.storage_config)
        try:
            for record in records:
                ctx.stdout.write(json.dumps(record, default=_json_default) + "\n")
                left -= 1
                if left <= 0:
                    break
        finally:
            records.close()  # stops the stream of a shard left unfinished
    ctx.stdout.flush()


# --------------------------------------------------------------------------------------------
# cp
# --------------------------------------------------------------------------------------------


def _parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0]


def copy_layout(source_manifest: str, destination_manifest: str, shard_uri: str) -> str:
    """Where ``cp --with-shards`` puts a shard.

    A shard under the source manifest's folder keeps its path relative to that folder, now
    under the destination manifest's folder (so the saver's ``shards/...`` layout is kept);
    any other shard goes to ``{destination folder}/shards/external/{scheme}/{bucket/key or
    path}``. Keys are kept literally (``%2F`` stays ``%2F``).
    """
    source_folder = _parent(source_manifest) + "/"
    destination_folder = _parent(destination_manifest)
    if shard_uri.startswith(source_folder):
        return f"{destination_folder}/{shard_uri[len(source_folder) :]}"
    scheme, _, rest = shard_uri.partition("://")
    return f"{destination_folder}/shards/external/{scheme}/{rest.lstrip('/')}"


def _destination(source: str, argument: str) -> str:
    if argument.endswith("/") or ("://" not in argument and Path(argument).is_dir()):
        argument = argument.rstrip("/") + "/" + source.rsplit("/", 1)[1]
    return to_uri(argument)


def _publish_manifest(ctx: Context, uri: str, data: bytes) -> None:
    """Writes the manifest create-only; identical bytes already there are fine."""
    config = ctx.client.storage_config
    try:
        put_object(
            uri, data, storage_config=config, content_type="application/json", create_only=True
        )
    except FileExistsError:
        if get_object(uri, storage_config=config) != data:
            raise FileExistsError(
                f"{uri} already exists with other content; delete it or choose another destination"
            ) from None
        print(f"{uri} already holds this manifest", file=ctx.stdout)


def _cp(ctx: Context) -> None:
    source = to_uri(ctx.args.source)
    destination = _destination(source, ctx.args.destination)
    _require_credentials(ctx, source, destination)
    config = ctx.client.storage_config
    data = get_object(source, storage_config=config)
    manifest = parse_manifest(data, source)
    if not ctx.args.with_shards:
        _publish_manifest(ctx, destination, data)
        print(f"copied {source} -> {destination}", file=ctx.stdout)
        return

    shards = _unique_shards(manifest)
    _check_schemes(ctx, source, shards)
    _require_credentials(ctx, *(shard.uri for shard in shards))
    targets = {shard.uri: copy_layout(source, destination, shard.uri) for shard in shards}
    if len(set(targets.values())) != len(targets) or destination in targets.values():
        raise RuntimeError(f"two objects of {source} would be copied to the same destination URI")
    progress = Progress(
        ctx.stderr,
        label="cp",
        total_bytes=sum(shard.size_bytes for shard in shards),
        total_records=sum(shard.records for shard in shards),
        total_shards=len(shards),
        enabled=ctx.args.progress,
    )

    def copy(shard: ManifestShard) -> ManifestShard:
        from syvain_training_data.publish import copy_shard

        copied = copy_shard(
            shard,
            targets[shard.uri],
            data_format=manifest.data_format,
            storage_config=config,
            on_bytes=lambda size: progress.add(bytes_=size),
        )
        if copied.size_bytes != shard.size_bytes:
            raise RuntimeError(
                f"{copied.uri}: the copy has {copied.size_bytes:,} bytes, the source "
                f"{shard.size_bytes:,}"
            )
        # Read the copy back: size, etag and record count at the destination.
        count = sum(1 for _ in iter_shard(manifest.data_format, copied, storage_config=config))
        progress.add(records=count, shards=1)
        return copied

    with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
        copies = {
            copied_from.uri: copied
            for copied_from, copied in zip(shards, pool.map(copy, shards), strict=True)
        }
    progress.finish()
    rewritten = _rewrite(manifest, copies)
    _publish_manifest(ctx, destination, canonical_manifest_bytes(rewritten))
    print(
        f"copied {source} -> {destination} with {plural(len(shards), 'shard')} "
        f"({progress.bytes:,} bytes, {progress.records:,} records verified)",
        file=ctx.stdout,
    )


def _rewrite(manifest: DataManifest, copies: Mapping[str, ManifestShard]) -> DataManifest:
    """The manifest with every shard replaced by its copy (same structure and metadata)."""
    document = manifest.model_dump(mode="python")
    for entry in document["splits"].values():
        entry["shards"] = [copies[shard["uri"]].model_dump() for shard in entry["shards"]]
        for stage in entry["curriculum"].values():
            stage["shards"] = [copies[shard["uri"]].model_dump() for shard in stage["shards"]]
    return DataManifest.model_validate(document, strict=True)


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------


def _bench_batch(records: list[object]) -> list[object]:
    """The batch as a list of records (module level: spawned workers import it)."""
    return records


def _bench(ctx: Context) -> None:
    from syvain_training_data.demo import progress
    from syvain_training_data.loading.split_loader import SplitDataLoader

    args = ctx.args
    uri = _manifest_uri(ctx, args.manifest)
    manifest = ctx.client.load_manifest(uri)
    split, shards = _selected_shards(ctx, manifest)
    _check_schemes(ctx, uri, shards)
    loader = SplitDataLoader(
        manifest,
        _bench_batch,
        {"batch_size": args.batch_size, "num_workers": args.workers},
        storage_config=ctx.client.storage_config,
        manifest_uri=uri,
        allow_mixed_schemes=args.allow_mixed_schemes,
    ).load(split, args.stage)
    total, done, received = len(loader), 0, 0
    stopped = "the end of the split"
    started = drawn = time.perf_counter()
    for batch in loader:
        done += 1
        received += len(batch)
        now = time.perf_counter()
        if args.progress and (now - drawn >= 0.1 or done == total):
            drawn = now
            progress("bench", done, total, started, stream=ctx.stderr)
        if now - started >= args.seconds and done < total:
            stopped = f"{args.seconds:g} s"
            break
    elapsed = time.perf_counter() - started
    if args.progress and done < total and _isatty(ctx.stderr):
        ctx.stderr.write("\n")
    stats = loader.stats()
    selected = f"{split}" + (f", stage {args.stage}" if args.stage else "")
    size = sum(shard.size_bytes for shard in shards)
    first_batch = "-" if stats.first_batch_s is None else f"{stats.first_batch_s:.3f} s"
    retries = ", ".join(f"{cause} {count}" for cause, count in stats.retries.items())
    rows = [
        ("manifest", uri),
        (
            "split",
            f"{selected}: {plural(sum(s.records for s in shards), 'record')}, "
            f"{plural(len(shards), 'shard')}, {human_bytes(size)}",
        ),
        ("loader", f"{plural(stats.workers, 'worker')}, batch size {args.batch_size}"),
        ("read", f"{received:,} records in {done:,} batch{'es' * (done != 1)}, {elapsed:.2f} s"),
        ("stopped at", stopped),
        ("records/s", f"{received / elapsed:,.0f}"),
        ("MB/s", f"{stats.bytes / 1e6 / elapsed:,.2f}"),
        ("first batch", first_batch),
        ("waited", f"{stats.waited_s:.2f} s for batches"),
        ("records", f"{stats.records:,} read by the loader (prefetched included)"),
        ("bytes", f"{stats.bytes:,} received from the store"),
        ("shard opens", f"{stats.shard_opens:,}"),
        (
            "first record",
            f"mean {stats.first_record_mean_s:.3f} s, max {stats.first_record_max_s:.3f} s",
        ),
        ("retries", f"{sum(stats.retries.values())} ({retries})"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}", file=ctx.stdout)


# --------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------


def _demo(ctx: Context) -> None:
    from syvain_training_data.demo import run_demo

    run_demo(ctx.args.root, ctx.args.records, s3=ctx.args.s3)


if __name__ == "__main__":
    sys.exit(main())
