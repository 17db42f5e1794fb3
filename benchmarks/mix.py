"""Mixing benchmark: how many sources a seeded batch mixes, beside a uniform
permutation of the same records.

1. **Loaded** (I/O): 64 sources x 500 records written one shard per source (msgpack.zstf, with
   its index, and jsonl.gz) to a local directory store, read with ``load("train", seed=0)`` at
   batch 32 with 0 and 2 workers; per batch, the distinct sources and the largest source's
   share, averaged over the epoch; the bytes fetched over the shards' bytes, and range reads.
2. **Planned** (no I/O): a cluster case, 10,000 shards x 5,000 records (of 2 KiB,
   indexed: blocks of 2,048 records), 64 ranks x 8 workers, 8 records per device batch, computed
   from the plan alone
   (``loading.plan.run_layout`` and the stream order's segments): distinct shards per device
   batch, and per global batch (the k-th batch of every rank: 512 records).

3. **Layouts** (no I/O): the seeded order of one stream over uneven layouts (65 equal shards;
   500 shards of log-normal record counts, and one shard of 1,000,000 records among 10,000 of
   100, each with and without indexes; 100,000 shards of 20, one group; 200,000 of 20, four
   groups), beside one uniform permutation of the same records (a sample, seeded): distinct
   shards per batch of 32, the largest shard's share of a batch, and single-shard batches.
   Without an index a block is a whole shard (Parquet, and msgpack.zstf and jsonl.gz that other
   writers made); with one, a block is a run of records of an indexed msgpack.zstf or jsonl.gz
   shard (the plan depends only on whether there are indexes, not on the format).

Uniform figures of parts 1 and 2 are exact expectations (drawing without replacement), not
samples.

Run: .venv/bin/python benchmarks/mix.py [--steps 16]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.formats.shard_index import block_records  # noqa: E402
from syvain_training_data.loading import plan, record_plan  # noqa: E402
from syvain_training_data.loading.block_order import BlockOrder  # noqa: E402
from uniform import expected_distinct  # noqa: E402

SOURCES, PER_SOURCE, BATCH = 64, 500, 32
CLUSTER_SHARDS, CLUSTER_RECORDS = 10_000, 5_000
# Assumed for the plan-only case: 2 KiB records, indexed msgpack.zstf (blocks of ~4 MiB).
CLUSTER_SHARD_BYTES = CLUSTER_RECORDS * 2048
RANKS, WORKERS, DEVICE_BATCH = 64, 8, 8


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def loaded(workers: int, data_format: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        client = SyvainTrainingData()
        manifest_uri = f"file://{root}/data-manifest.json"
        saver = client.dataset_saver(manifest_uri, data_format=data_format)  # type: ignore[arg-type]
        for source in range(SOURCES):
            records = [{"source": source, "i": i} for i in range(PER_SOURCE)]
            saver.save("train", None, records, shard_id=f"{source:03d}")
        manifest = saver.commit_manifest()
        args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
        if workers:
            args["multiprocessing_context"] = "fork"
        loader = client.split_data_loader(manifest_uri, as_list, args)
        dataloader = loader.load("train", seed=0)
        distinct, largest = [], []
        for batch in dataloader:
            counts = Counter(record["source"] for record in batch)
            distinct.append(len(counts))
            largest.append(max(counts.values()) / len(batch))
        stats = dataloader.stats()
        shard_bytes = sum(shard.size_bytes for shard in manifest.splits["train"].shards)
    return {
        "distinct_sources_per_batch": sum(distinct) / len(distinct),
        "largest_source_share": sum(largest) / len(largest),
        "bytes_over_shard_bytes": stats.bytes / shard_bytes,
        "range_reads": stats.shard_opens,
    }


def planned(steps: int) -> dict[str, float]:
    counts = (CLUSTER_RECORDS,) * CLUSTER_SHARDS
    blocks = (block_records(CLUSTER_RECORDS, CLUSTER_SHARD_BYTES),) * CLUSTER_SHARDS
    read_plan = plan.ReadPlan(
        streams=(counts,), seed=0, window=plan.DEFAULT_WINDOW, blocks=(blocks,), indexed=True
    )
    topology = plan.Topology(RANKS, WORKERS, DEVICE_BATCH, drop_last=True)
    length = plan.epoch_length(read_plan, 0)
    (order,) = read_plan.orders(0)
    assert isinstance(order, BlockOrder)
    layout = record_plan.run_layout(read_plan, length, [], topology)
    device, global_ = [], []
    for step in range(steps):
        # A rank's step-th batch comes from its workers in turn (torch's round robin).
        worker, batch = step % WORKERS, step // WORKERS
        union: set[int] = set()
        for rank in range(RANKS):
            part = plan.Level(layout[rank][worker])
            positions = part.slice(batch * DEVICE_BATCH, (batch + 1) * DEVICE_BATCH)
            shards = {s for a, b in positions for s, _ in order.records(a, b)}
            device.append(len(shards))
            union |= shards
        global_.append(len(union))
    return {
        "distinct_shards_per_device_batch": sum(device) / len(device),
        "distinct_shards_per_global_batch": sum(global_) / len(global_),
    }


def batch_figures(shards: list[int]) -> tuple[float, float, int]:
    """(distinct shards per batch, largest shard's share, single-shard batches) over the full
    batches of ``shards`` (the shard of each position, in order)."""
    distinct, largest, single = [], [], 0
    for first in range(0, len(shards) - BATCH + 1, BATCH):
        counts = Counter(shards[first : first + BATCH])
        distinct.append(len(counts))
        largest.append(max(counts.values()) / BATCH)
        single += len(counts) == 1
    return sum(distinct) / len(distinct), sum(largest) / len(largest), single


def layouts() -> list[dict[str, Any]]:
    rng = random.Random(7)
    lognormal = [max(1, int(rng.lognormvariate(6, 1.2))) for _ in range(500)]
    # "No index": Parquet, and msgpack.zstf and jsonl.gz shards other writers made (blocks are
    # whole shards); "indexed": msgpack.zstf and jsonl.gz shards of this package's saver or
    # `syvain-data index` (blocks are runs of records; the order is the same for both formats).
    cases: list[tuple[str, list[int], bool, int]] = [
        ("65 shards x 500 records", [500] * 65, False, 500),
        ("500 shards, log-normal records, no index", lognormal, False, 500),
        ("500 shards, log-normal records, indexed (blocks of 64)", lognormal, True, 64),
        ("1 shard of 1,000,000 + 10,000 of 100, no index", [1_000_000] + [100] * 10_000, False, 0),
        (
            "1 shard of 1,000,000 + 10,000 of 100, indexed (blocks of 2,048)",
            [1_000_000] + [100] * 10_000,
            True,
            2048,
        ),
        ("100,000 shards x 20 records", [20] * 100_000, False, 20),
        ("200,000 shards x 20 records (4 groups of 50,000 blocks)", [20] * 200_000, False, 20),
    ]
    rows = []
    for name, counts, indexed, block in cases:
        blocks = tuple(min(c, block) if indexed else c for c in counts)
        read_plan = plan.ReadPlan(
            streams=(tuple(counts),),
            seed=0,
            window=plan.DEFAULT_WINDOW,
            blocks=(blocks,),
            indexed=indexed,
        )
        (order,) = read_plan.orders(0)
        assert isinstance(order, BlockOrder)
        ours = batch_figures([shard for shard, _ in order.records(0, order.total)])
        uniform_order = [s for s, count in enumerate(counts) for _ in range(count)]
        random.Random(0).shuffle(uniform_order)
        uniform = batch_figures(uniform_order)
        rows.append(
            {
                "case": f"layout: {name}",
                "distinct_per_batch": round(ours[0], 2),
                "uniform_distinct": round(uniform[0], 2),
                "ratio": round(ours[0] / uniform[0], 3),
                "largest_share": round(ours[1], 3),
                "uniform_largest_share": round(uniform[1], 3),
                "single_shard_batches": ours[2],
                "uniform_single_shard_batches": uniform[2],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="global batches planned")
    parser.add_argument("--layouts-only", action="store_true", help="only part 3")
    options = parser.parse_args()
    for row in layouts():
        print(json.dumps(row), flush=True)
    if options.layouts_only:
        return
    uniform_batch = expected_distinct(SOURCES, PER_SOURCE, BATCH)
    for data_format in ("msgpack.zstf", "jsonl.gz"):
        for workers in (0, 2):
            result = loaded(workers, data_format)
            result["uniform_distinct_sources_per_batch"] = uniform_batch
            ratio = result["distinct_sources_per_batch"] / uniform_batch
            case = f"loaded, {data_format}, {workers} workers"
            print(json.dumps({"case": case, **result, "ratio": ratio}), flush=True)
    result = planned(options.steps)
    uniform_device = expected_distinct(CLUSTER_SHARDS, CLUSTER_RECORDS, DEVICE_BATCH)
    global_batch = RANKS * DEVICE_BATCH
    uniform_global = expected_distinct(CLUSTER_SHARDS, CLUSTER_RECORDS, global_batch)
    print(
        json.dumps(
            {
                "case": f"planned, {RANKS} ranks x {WORKERS} workers",
                **result,
                "uniform_device": uniform_device,
                "uniform_global": uniform_global,
                "global_ratio": result["distinct_shards_per_global_batch"] / uniform_global,
            }
        )
    )


if __name__ == "__main__":
    main()
