"""``syvain-data head``: the first records of a split as JSON lines."""

from __future__ import annotations

import argparse
import base64
from typing import Final

from syvain_training_data.cli.arguments import add_manifest, add_shard_options, non_negative
from syvain_training_data.cli.context import Context, check_schemes, to_uri
from syvain_training_data.cli.output import json_line
from syvain_training_data.cli.shards import selected_shards
from syvain_training_data.shard import iter_shard

HELP: Final = "the first records of a split, as JSON lines"
DESCRIPTION: Final = (
    "Print the first records of a split (or of one curriculum stage) as JSON lines. bytes "
    'values are printed as {"$base64": "..."}.'
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest(parser, split=True)
    parser.add_argument(
        "-n", "--records", type=non_negative, default=10, metavar="N", help="default 10"
    )
    add_shard_options(parser, progress=False)


def _json_default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def run(ctx: Context) -> None:
    uri = to_uri(ctx.args.manifest)
    manifest = ctx.client.load_manifest(uri)
    _, shards = selected_shards(ctx, manifest)
    check_schemes(ctx, uri, shards)
    left = ctx.args.records
    for shard in shards:
        if left <= 0:
            break
        records = iter_shard(manifest.data_format, shard, storage_config=ctx.client.storage_config)
        try:
            for record in records:
                ctx.stdout.write(json_line(record, default=_json_default))
                left -= 1
                if left <= 0:
                    break
        finally:
            records.close()  # stops the stream of a shard left unfinished
    ctx.stdout.flush()
