"""The arguments several commands share (a manifest and the split to read, the options of a
command that reads shards) and the argument types that check numbers."""

from __future__ import annotations

import argparse


def add_manifest(parser: argparse.ArgumentParser, *, split: bool = False) -> None:
    """The MANIFEST argument; with ``split``, the ``--split`` and ``--stage`` that select
    what to read."""
    parser.add_argument("manifest", metavar="MANIFEST", help="manifest URI or local path")
    if split:
        parser.add_argument("--split", help="split to read (default: the manifest's first split)")
        parser.add_argument("--stage", help="read this curriculum stage of the split")


def add_shard_options(
    parser: argparse.ArgumentParser, *, jobs: int | None = None, progress: bool = True
) -> None:
    """The options of a command that reads shards: ``--jobs`` (shards at once, when the
    command reads several at a time), ``--no-progress`` and ``--allow-mixed-schemes``."""
    if jobs is not None:
        parser.add_argument(
            "-j",
            "--jobs",
            type=positive,
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


def positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_seconds(text: str) -> float:
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
