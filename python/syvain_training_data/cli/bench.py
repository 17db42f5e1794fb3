"""``syvain-data bench``: read a split with SplitDataLoader as training does, and print the
rates and the loader's counters."""

from __future__ import annotations

import argparse
import time
from typing import Final

from syvain_training_data.cli.arguments import (
    add_manifest,
    add_shard_options,
    non_negative,
    positive,
    positive_seconds,
)
from syvain_training_data.cli.context import Context, check_schemes, to_uri
from syvain_training_data.cli.output import CountProgress, emit, human_bytes, plural
from syvain_training_data.cli.shards import selected_shards

HELP: Final = "read a split as training does: records/s, MB/s, time to first batch, counters"
DESCRIPTION: Final = (
    "Read a split (or one curriculum stage) with SplitDataLoader, as a training loop does, for "
    "--seconds or to the end of the split, and print records/s, MB/s, the time to the first "
    "batch and the loader's counters (shard opens, time to first record, retries by cause), to "
    "size workers and shards before a run. Needs the torch extra."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_manifest(parser, split=True)
    parser.add_argument(
        "--workers", type=non_negative, default=2, help="DataLoader workers (default 2)"
    )
    parser.add_argument(
        "--seconds",
        type=positive_seconds,
        default=30.0,
        metavar="T",
        help="stop after T seconds if the split lasts longer (default 30)",
    )
    parser.add_argument(
        "--batch-size", type=positive, default=32, metavar="B", help="records per batch (32)"
    )
    add_shard_options(parser)


def _bench_batch(records: list[object]) -> list[object]:
    """The batch as a list of records (module level: spawned workers import it)."""
    return records


def run(ctx: Context) -> None:
    from syvain_training_data.loading.split_loader import SplitDataLoader

    args = ctx.args
    uri = to_uri(args.manifest)
    manifest = ctx.client.load_manifest(uri)
    split, shards = selected_shards(ctx, manifest)
    check_schemes(ctx, uri, shards)
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
    progress = CountProgress(ctx.stderr, "bench", total, enabled=args.progress)
    started = time.perf_counter()
    for batch in loader:
        done += 1
        received += len(batch)
        progress.advance()
        if time.perf_counter() - started >= args.seconds and done < total:
            stopped = f"{args.seconds:g} s"
            break
    elapsed = time.perf_counter() - started
    progress.finish()
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
        emit(ctx.stdout, f"{name:<{width}}  {value}")
