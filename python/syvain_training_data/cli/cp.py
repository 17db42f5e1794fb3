"""``syvain-data cp``: copy a manifest, and with ``--with-shards`` its shards (verified)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from syvain_training_data.cli.arguments import add_shard_options
from syvain_training_data.cli.context import Context, check_schemes, is_local_path, to_uri
from syvain_training_data.cli.output import ShardProgress, emit, plural
from syvain_training_data.cli.shards import unique_shards
from syvain_training_data.manifest import (
    DataManifest,
    ManifestShard,
    canonical_manifest_bytes,
    parse_manifest,
    read_manifest_bytes,
)
from syvain_training_data.publish.upload import create_or_match
from syvain_training_data.uris import file_path, s3_bucket_key, scheme_of

HELP: Final = "copy a manifest; --with-shards copies and verifies its shards too"
DESCRIPTION: Final = (
    "Copy a manifest (its exact bytes). With --with-shards, copy every shard under the "
    "destination manifest's folder, verify each copy (size, etag, record count), and write a "
    "manifest with the new URIs, last. Shards under the source manifest's folder keep their "
    "relative path; others go to shards/external/{scheme}/{bucket or path}/... . DST may be a "
    "folder (ending in /)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SRC", help="source manifest URI or local path")
    parser.add_argument("destination", metavar="DST", help="destination manifest URI or local path")
    parser.add_argument("--with-shards", action="store_true", help="copy and verify the shards too")
    add_shard_options(parser, jobs=4)


def _parent(uri: str) -> str:
    return uri.rsplit("/", 1)[0]


def _location(uri: str) -> str:
    """``bucket/key`` of an s3:// URI, the path without its root slash of a file:// one."""
    if scheme_of(uri) == "s3":
        bucket, key = s3_bucket_key(uri)
        return f"{bucket}/{key}"
    return file_path(uri).lstrip("/")


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
    return f"{destination_folder}/shards/external/{scheme_of(shard_uri)}/{_location(shard_uri)}"


def _destination(source: str, argument: str) -> str:
    if argument.endswith("/") or (is_local_path(argument) and Path(argument).is_dir()):
        argument = argument.rstrip("/") + "/" + source.rsplit("/", 1)[1]
    return to_uri(argument)


def _publish_manifest(ctx: Context, uri: str, data: bytes) -> None:
    """Writes the manifest create-only; identical bytes already there are fine."""
    config = ctx.client.storage_config

    def holds_this_manifest() -> bool:
        try:
            return read_manifest_bytes(uri, storage_config=config) == data
        except ValueError:  # over the manifest size limit: not this manifest
            return False

    def other_content() -> FileExistsError:
        return FileExistsError(
            f"{uri} already exists with other content; delete it or choose another destination"
        )

    if not create_or_match(uri, data, config, matches=holds_this_manifest, conflict=other_content):
        emit(ctx.stdout, f"{uri} already holds this manifest")


def run(ctx: Context) -> None:
    source = to_uri(ctx.args.source)
    destination = _destination(source, ctx.args.destination)
    config = ctx.client.storage_config
    data = read_manifest_bytes(source, storage_config=config)  # at most 256 MiB, read once
    manifest = parse_manifest(data, source)
    if not ctx.args.with_shards:
        _publish_manifest(ctx, destination, bytes(data))
        emit(ctx.stdout, f"copied {source} -> {destination}")
        return

    shards = unique_shards(manifest)
    check_schemes(ctx, source, shards)
    targets = {shard.uri: copy_layout(source, destination, shard.uri) for shard in shards}
    if len(set(targets.values())) != len(targets) or destination in targets.values():
        raise RuntimeError(f"two objects of {source} would be copied to the same destination URI")
    progress = ShardProgress.of_shards(ctx.stderr, "cp", shards, enabled=ctx.args.progress)

    def copy(shard: ManifestShard) -> ManifestShard:
        from syvain_training_data.publish import copy_shard

        # Verified before it is written (size, etag, descriptor sha256, records), read back
        # after (size, sha256), and deleted again if that fails: see copy_shard.
        copied = copy_shard(
            shard,
            targets[shard.uri],
            data_format=manifest.data_format,
            storage_config=config,
            on_bytes=lambda size: progress.add(bytes_=size),
            on_records=lambda count: progress.add(records=count),
        )
        progress.add(shards=1)
        return copied

    with ThreadPoolExecutor(max_workers=ctx.args.jobs) as pool:
        copies = {
            copied_from.uri: copied
            for copied_from, copied in zip(shards, pool.map(copy, shards), strict=True)
        }
    progress.finish()
    rewritten = _rewrite(manifest, copies)
    _publish_manifest(ctx, destination, canonical_manifest_bytes(rewritten))
    emit(
        ctx.stdout,
        f"copied {source} -> {destination} with {plural(len(shards), 'shard')} "
        f"({progress.bytes:,} bytes, {progress.records:,} records verified)",
    )


def _rewrite(manifest: DataManifest, copies: Mapping[str, ManifestShard]) -> DataManifest:
    """The manifest with every shard replaced by its copy (same structure and metadata)."""
    document = manifest.model_dump(mode="python")
    for entry in document["splits"].values():
        entry["shards"] = [copies[shard["uri"]].model_dump() for shard in entry["shards"]]
        for stage in entry["curriculum"].values():
            stage["shards"] = [copies[shard["uri"]].model_dump() for shard in stage["shards"]]
    return DataManifest.model_validate(document, strict=True)
