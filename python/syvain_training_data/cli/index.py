"""``syvain-data index``: the indexes of the msgpack.zstf or jsonl.gz shards of a dataset that
lack one (``publish.indexing``)."""

from __future__ import annotations

import argparse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from syvain_training_data.cli.arguments import add_manifest, add_shard_options
from syvain_training_data.cli.context import Context, check_schemes, to_uri
from syvain_training_data.cli.errors import CommandFailed, describe
from syvain_training_data.cli.output import ShardProgress, conclude, emit, plural
from syvain_training_data.cli.shards import unique_shards
from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.manifest import ManifestShard
from syvain_training_data.publish.indexing import index_shard

HELP: Final = "write the missing indexes of a msgpack.zstf or jsonl.gz dataset"
DESCRIPTION: Final = (
    "Write an index (record offsets for msgpack.zstf, gzip access points for jsonl.gz) for "
    "every shard of a manifest that has none "
    "naming its current version (datasets other writers made have none), from one streaming "
    "pass over each shard checked against the manifest's size, etag and record count. With "
    "--to, the indexes go under another prefix (for shards in a bucket you cannot write); "
    "pass the same prefix to load(index_root=...). An index already right is kept, so a "
    "re-run after an interruption does only what is left. Problems are printed one a line; "
    "the exit status is 1 if there is any."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest(parser)
    parser.add_argument(
        "--to",
        metavar="PREFIX",
        help="write the indexes under PREFIX instead of beside the shards",
    )
    add_shard_options(parser, jobs=4)


def run(ctx: Context) -> None:
    uri = to_uri(ctx.args.manifest)
    manifest = ctx.client.load_manifest(uri)
    if not FORMATS[manifest.data_format].record_index:
        emit(
            ctx.stdout,
            f"FAILED: {manifest.data_format} shards have no indexes (only "
            f"{', '.join(n for n, kind in FORMATS.items() if kind.record_index)} do); {uri} is "
            f"{manifest.data_format}",
        )
        raise CommandFailed
    shards = unique_shards(manifest)
    check_schemes(ctx, uri, shards)
    root = None if ctx.args.to is None else to_uri(ctx.args.to)
    progress = ShardProgress.of_shards(ctx.stderr, "index", shards, enabled=ctx.args.progress)

    def one(shard: ManifestShard) -> tuple[str, str | None]:
        """(what was done, the problem found)."""
        try:
            outcome = index_shard(
                shard,
                ctx.client.storage_config,
                data_format=manifest.data_format,
                index_root=root,
                on_bytes=lambda n: progress.add(bytes_=n),
            )
        except (RuntimeError, OSError) as error:
            return "failed", describe(error).split(": ", 1)[1]
        finally:
            progress.add(records=shard.records, shards=1)
        return outcome, None

    with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
        outcomes = list(pool.map(one, shards))
    progress.finish()
    done = Counter(outcome for outcome, _ in outcomes)
    summary = (
        f"{plural(len(shards), 'shard')}: {done['written']} indexed, {done['replaced']} "
        f"replaced (stale), {done['kept']} already indexed"
    )
    conclude(ctx.stdout, [problem for _, problem in outcomes if problem], summary)
