"""``syvain-data adopt``: a manifest for shard files that already exist
(``publish.adopt``)."""

from __future__ import annotations

import argparse
from typing import Final

from syvain_training_data.cli.arguments import positive
from syvain_training_data.cli.context import Context, to_uri
from syvain_training_data.cli.output import CountProgress, emit, human_bytes, plural
from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.publish.adopt import adopt, expand_sources

HELP: Final = "write a manifest for shard files that already exist"
DESCRIPTION: Final = (
    "Write a manifest for Parquet, jsonl.gz or msgpack.zstf files another tool wrote, so that "
    "every loader reads, mixes and resumes them. SOURCE is one object's URI, a prefix ending "
    "in '/' (every object under it with the format's suffix), a glob (*, ?, [...]), or @FILE "
    "(a local file of sources, one a line); an https:// or hf:// source names objects one by "
    "one, as those stores cannot list. Each object is HEADed and its records counted (Parquet "
    "from its footer, the others by one streaming pass of the loader's decoder); the manifest "
    "is written create-only, last (an equal one already there is accepted)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", metavar="SOURCE", nargs="+", help="objects to adopt")
    parser.add_argument("--format", required=True, choices=list(FORMATS), dest="data_format")
    parser.add_argument("--split", required=True, help="the split the objects form")
    parser.add_argument("--stage", help="the curriculum stage they form within the split")
    parser.add_argument("--out", required=True, metavar="MANIFEST", help="manifest to write")
    parser.add_argument(
        "--allow-schema-drift",
        action="store_true",
        help="adopt Parquet files whose schemas differ from the first file's",
    )
    parser.add_argument(
        "-j", "--jobs", type=positive, default=8, help="objects counted at once (default 8)"
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress on stderr"
    )


def run(ctx: Context) -> None:
    args = ctx.args
    config = ctx.client.storage_config
    sources = [s if s.startswith("@") else to_uri(s) for s in args.sources]
    uris = expand_sources(sources, args.data_format, config)
    progress = CountProgress(ctx.stderr, "adopt", len(uris), enabled=args.progress)

    def counted(_: ManifestShard) -> None:
        progress.advance()

    manifest = adopt(
        uris,
        data_format=args.data_format,
        split=args.split,
        stage=args.stage,
        out=to_uri(args.out),
        storage_config=config,
        jobs=args.jobs,
        allow_schema_drift=args.allow_schema_drift,
        on_object=counted,
    )
    progress.finish()
    split = manifest.splits[args.split]
    size = sum(shard.size_bytes for shard in split.shards)
    emit(
        ctx.stdout,
        f"OK: {plural(len(split.shards), 'shard')}, {split.records:,} records, "
        f"{human_bytes(size)} adopted as split {args.split!r}"
        + (f" stage {args.stage!r}" if args.stage else "")
        + f" of {to_uri(args.out)}",
    )
