"""``syvain-data inspect``: a manifest's splits and stages with their records, bytes and shards."""

from __future__ import annotations

import argparse
from typing import Final

from syvain_training_data.cli.arguments import add_manifest
from syvain_training_data.cli.context import Context, to_uri
from syvain_training_data.cli.output import emit, human_bytes, table
from syvain_training_data.cli.shards import unique_shards

HELP: Final = "splits, stages, records, bytes and shard counts, as a table"
DESCRIPTION: Final = (
    "Print a manifest's splits and curriculum stages with their records, bytes and shard counts."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest(parser)


def run(ctx: Context) -> None:
    uri = to_uri(ctx.args.manifest)
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
    unique = unique_shards(manifest)
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
    emit(ctx.stdout, f"manifest  {uri}")
    emit(ctx.stdout, f"format    {manifest.data_format}")
    emit(ctx.stdout, f"splits    {len(manifest.splits)}")
    emit(ctx.stdout)
    for line in table(rows, right={2, 3, 4, 5}):
        emit(ctx.stdout, line)
