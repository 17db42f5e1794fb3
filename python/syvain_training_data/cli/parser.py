"""The command line: :func:`build_parser`, the connection options and the argument types."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from syvain_training_data.cli.bench import bench_command
from syvain_training_data.cli.cp import cp_command
from syvain_training_data.cli.demo import demo_command
from syvain_training_data.cli.head import head_command
from syvain_training_data.cli.inspect import inspect_command
from syvain_training_data.cli.verify import verify_command

if TYPE_CHECKING:
    from syvain_training_data.cli.context import Context

PROG: Final = "syvain-data"


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
        "--profile",
        default=default,
        metavar="NAME",
        help="AWS profile of ~/.aws/config and credentials (AWS_PROFILE; needs the aws extra)",
    )
    group.add_argument(
        "--no-sign-request",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="send unsigned requests, for a public bucket (AWS_SKIP_SIGNATURE)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="show tracebacks and debug logs",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, verify, read and copy syvain-training-data datasets.",
        parents=[_common_options(suppress=False)],
        epilog="Exit status: 0 success, 1 failure or a problem found, 2 usage error.",
    )
    commands = _Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))

    inspect = commands.add(
        "inspect",
        inspect_command,
        help="splits, stages, records, bytes and shard counts, as a table",
        description="Print a manifest's splits and curriculum stages with their records, bytes "
        "and shard counts.",
    )
    _add_manifest(inspect)

    verify = commands.add(
        "verify",
        verify_command,
        help="check every shard: size and etag (HEAD); --deep reads every record",
        description="HEAD every shard of a manifest and compare its size and etag with the "
        "manifest. With --deep, also stream every shard and check its record count. Every "
        "problem is printed on its own line; the exit status is 1 if there is any.",
    )
    _add_manifest(verify)
    verify.add_argument("--deep", action="store_true", help="stream every shard and count records")
    _add_shard_options(verify, jobs=8)

    head = commands.add(
        "head",
        head_command,
        help="the first records of a split, as JSON lines",
        description="Print the first records of a split (or of one curriculum stage) as JSON "
        'lines. bytes values are printed as {"$base64": "..."}.',
    )
    _add_manifest(head, split=True)
    head.add_argument(
        "-n", "--records", type=_non_negative, default=10, metavar="N", help="default 10"
    )
    _add_shard_options(head, progress=False)

    cp = commands.add(
        "cp",
        cp_command,
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
    _add_shard_options(cp, jobs=4)

    bench = commands.add(
        "bench",
        bench_command,
        help="read a split as training does: records/s, MB/s, time to first batch, counters",
        description="Read a split (or one curriculum stage) with SplitDataLoader, as a training "
        "loop does, for --seconds or to the end of the split, and print records/s, MB/s, the "
        "time to the first batch and the loader's counters (shard opens, time to first record, "
        "retries by cause), to size workers and shards before a run. Needs the torch extra.",
    )
    _add_manifest(bench, split=True)
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
    _add_shard_options(bench)

    demo = commands.add(
        "demo",
        demo_command,
        help="publish a dataset from a process pool and read it back with SplitDataLoader",
        description="The README's main job: publish a curriculum dataset with DatasetSaver from "
        "two processes (deterministic shard ids, so a second run reuses finished shards), then "
        "read one epoch with SplitDataLoader (two workers, shuffled) and check every record.",
    )
    demo.add_argument(
        "--root",
        default=None,
        metavar="DIR",
        help="local directory (default: a fresh temporary one) or s3://bucket/prefix to "
        "publish under",
    )
    demo.add_argument("--records", type=_positive, default=20_000)
    return parser


class _Commands:
    """Adds subcommands that all take the connection options and name the function they run."""

    def __init__(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        self._subparsers = subparsers
        self._common = _common_options(suppress=True)

    def add(
        self, name: str, run: Callable[[Context], None], *, help: str, description: str
    ) -> argparse.ArgumentParser:
        parser = self._subparsers.add_parser(
            name, parents=[self._common], help=help, description=description
        )
        parser.set_defaults(run=run)
        return parser


def _add_manifest(parser: argparse.ArgumentParser, *, split: bool = False) -> None:
    """The MANIFEST argument; with ``split``, the ``--split`` and ``--stage`` that select
    what to read."""
    parser.add_argument("manifest", metavar="MANIFEST", help="manifest URI or local path")
    if split:
        parser.add_argument("--split", help="split to read (default: the manifest's first split)")
        parser.add_argument("--stage", help="read this curriculum stage of the split")


def _add_shard_options(
    parser: argparse.ArgumentParser, *, jobs: int | None = None, progress: bool = True
) -> None:
    """The options of a command that reads shards: ``--jobs`` (shards at once, when the
    command reads several at a time), ``--no-progress`` and ``--allow-mixed-schemes``."""
    if jobs is not None:
        parser.add_argument(
            "-j",
            "--jobs",
            type=_positive,
            default=jobs,
            help=f"shards handled at once (default {jobs})",
        )
    if progress:
        parser.add_argument(
            "--no-progress",
            dest="progress",
            action="store_false",
            help="no progress line on stderr",
        )
    parser.add_argument(
        "--allow-mixed-schemes",
        action="store_true",
        help="read a trusted manifest whose shards use another scheme than the manifest "
        "(by default an s3:// manifest may name only s3:// shards, a file:// one only file://)",
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
