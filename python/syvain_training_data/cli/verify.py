"""``syvain-data verify``: HEAD every shard (size, etag); with ``--deep``, read every record."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from syvain_training_data.cli.arguments import add_manifest, add_shard_options
from syvain_training_data.cli.context import Context, check_schemes, to_uri
from syvain_training_data.cli.errors import describe
from syvain_training_data.cli.output import ShardProgress, conclude, plural
from syvain_training_data.cli.shards import unique_shards
from syvain_training_data.formats.registry import FORMATS
from syvain_training_data.loading.shard_indexes import index_problem
from syvain_training_data.manifest import DataManifest, DataManifestDataFormat, ManifestShard
from syvain_training_data.object_check import check_head
from syvain_training_data.shard import iter_shard

HELP: Final = "check every shard: size and etag (HEAD); --deep reads every record and index"
DESCRIPTION: Final = (
    "HEAD every shard of a manifest and compare its size and etag with the manifest. With "
    "--deep, also stream every shard and check its record count, and check every entry of "
    "each record offset index against its shard. Every problem is printed on "
    "its own line; the exit status is 1 if there is any."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest(parser)
    parser.add_argument("--deep", action="store_true", help="stream every shard and count records")
    add_shard_options(parser, jobs=8)


def head_problem(shard: ManifestShard, ctx: Context) -> str | None:
    """What HEAD finds wrong with a shard (missing, size, etag), or None."""
    config = ctx.client.storage_config
    try:
        check = check_head(shard.uri, config, size=shard.size_bytes, etag=shard.etag)
    except FileNotFoundError:
        return f"{shard.uri}: missing (the store has no such object)"
    mismatch = check.mismatch
    if mismatch is None:
        return None
    if mismatch.field == "size":
        return (
            f"{shard.uri}: size mismatch: {mismatch.found:,} bytes in the store, "
            f"{mismatch.expected:,} in the manifest"
        )
    return (
        f"{shard.uri}: etag mismatch: {mismatch.found!r} in the store, {shard.etag!r} in the "
        "manifest (the object was replaced)"
    )


def count_records(
    ctx: Context, data_format: DataManifestDataFormat, shard: ManifestShard, progress: ShardProgress
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
    ctx: Context, data_format: DataManifestDataFormat, shard: ManifestShard, progress: ShardProgress
) -> str | None:
    """What reading the whole shard finds wrong (bytes, record count, format), or None; then
    what is wrong with its index (msgpack.zstf and jsonl.gz), rebuilt from the shard."""
    try:
        count_records(ctx, data_format, shard, progress)
        if FORMATS[data_format].record_index:
            return index_problem(shard, ctx.client.storage_config, data_format=data_format)
    except (RuntimeError, OSError) as error:
        message = describe(error).split(": ", 1)[1]
        return message if shard.uri in message else f"{shard.uri}: {message}"
    return None


def run(ctx: Context) -> None:
    uri = to_uri(ctx.args.manifest)
    manifest = ctx.client.load_manifest(uri)
    shards = unique_shards(manifest)
    check_schemes(ctx, uri, shards)
    problems = _conflicting_descriptions(manifest)
    with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
        found = list(pool.map(lambda shard: head_problem(shard, ctx), shards))
    problems += [problem for problem in found if problem]
    checked = "size and etag"
    if ctx.args.deep:
        checked = "size, etag and records"
        healthy = [shard for shard, problem in zip(shards, found, strict=True) if not problem]
        progress = ShardProgress.of_shards(ctx.stderr, "verify", healthy, enabled=ctx.args.progress)
        with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
            deep = list(
                pool.map(
                    lambda shard: deep_problem(ctx, manifest.data_format, shard, progress),
                    healthy,
                )
            )
        progress.finish()
        problems += [problem for problem in deep if problem]
    records = sum(shard.records for shard in shards)
    size = sum(shard.size_bytes for shard in shards)
    summary = (
        f"{plural(len(shards), 'shard')}, {plural(records, 'record')}, {size:,} bytes "
        f"({checked} checked)"
    )
    conclude(ctx.stdout, problems, summary)


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
