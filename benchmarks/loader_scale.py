"""The loader's plan at cluster scale, by simulation. Prints one JSON line per case.

1. plan: a manifest of 1,000,000 shards of 10,000 records (10^10 records), 2,048 ranks x 8
   workers, seeded: the time and peak memory (tracemalloc) for one consumer to compute its part
   of an epoch, fresh and after two interrupted runs on other topologies; the state's size.
2. manifest: a real local manifest of 100,000 shard entries (100 small shard files, each named
   by 1,000 entries), loaded by SplitDataLoader with 2 workers under fork and spawn: time to
   the first batch and the resident memory of each worker process (psutil, after the first
   batch).

Run: .venv/bin/python benchmarks/loader_scale.py
"""

from __future__ import annotations

import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import psutil

from syvain_training_data import SyvainTrainingData
from syvain_training_data.formats.shard_index import block_records
from syvain_training_data.loading import plan, record_plan


def plan_case() -> None:
    counts = tuple([10_000] * 1_000_000)
    # Indexed shards of 20 MB (2 KB records): 10 blocks each, 10^7 blocks.
    blocks = (block_records(10_000, 20_000_000),) * 1_000_000
    topology = plan.Topology(2048, 8, 32, False)
    interrupts = (
        plan.Interrupt(plan.Topology(1024, 16, 16, False), 50_000),
        plan.Interrupt(plan.Topology(4096, 4, 8, True), 20_000),
    )
    for name, chain in (("fresh", ()), ("after 2 interrupted runs", interrupts)):
        tracemalloc.start()
        start = time.perf_counter()
        read_plan = plan.ReadPlan(
            streams=(counts,), seed=1, window=plan.DEFAULT_WINDOW, blocks=(blocks,), indexed=True
        )
        length = plan.epoch_length(read_plan, 3)
        part = record_plan.consumer_part(read_plan, length, chain, topology, 1234, 5)
        (order,) = read_plan.orders(3)
        first = part[0][0]
        next(iter(order.records(first, first + 1)))  # its first window, planned
        fingerprint = read_plan.fingerprint()
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        state = {
            "version": 2,
            "selection": fingerprint,
            "epoch": 3,
            "interrupts": [i.to_json() for i in (*chain, plan.Interrupt(topology, 10**6))],
        }
        print(
            json.dumps(
                {
                    "case": f"plan, 10^6 shards, 2048 ranks x 8 workers, {name}",
                    "records": length,
                    "consumer_records": sum(b - a for a, b in part),
                    "seconds": round(seconds, 3),
                    "peak_mib": round(peak / 2**20, 1),
                    "state_bytes": len(json.dumps(state, separators=(",", ":"))),
                }
            ),
            flush=True,
        )


def collate(batch: list[Any]) -> list[Any]:
    return batch


def manifest_case(root: str) -> None:
    client = SyvainTrainingData()
    saver = client.dataset_saver(
        f"file://{root}/src/data-manifest.json", data_format="msgpack.zstf"
    )
    shard = saver.save("train", None, [{"i": i, "text": "x" * 200} for i in range(50)])
    data = Path(shard.uri.removeprefix("file://")).read_bytes()
    shards = Path(root, "big", "shards")
    shards.mkdir(parents=True)
    entries = []
    for k in range(100_000):  # the same bytes under 100,000 names
        path = shards / f"part-{k:06d}.msgpack.zstf"
        path.write_bytes(data)
        entries.append({"uri": f"file://{path}", "records": 50, "size_bytes": len(data)})
    uri = f"file://{root}/big/data-manifest.json"
    client.save_manifest(
        uri,
        {
            "version": 1,
            "data_format": "msgpack.zstf",
            "splits": {"train": {"records": 50 * len(entries), "shards": entries}},
        },
    )
    for context in ("fork", "spawn"):
        args = {"batch_size": 32, "num_workers": 2, "multiprocessing_context": context}
        start = time.perf_counter()
        loader = client.split_data_loader(uri, collate, args).load("train", seed=1)
        batches = iter(loader)
        next(batches)
        first_batch = time.perf_counter() - start
        workers = psutil.Process().children(recursive=True)
        rss = sorted(round(w.memory_info().rss / 2**20) for w in workers)
        print(
            json.dumps(
                {
                    "case": f"100,000-shard manifest, 2 workers, {context}",
                    "time_to_first_batch_s": round(first_batch, 2),
                    "worker_rss_mib": rss,
                }
            ),
            flush=True,
        )
        del batches


def main() -> None:
    plan_case()
    with tempfile.TemporaryDirectory() as root:
        manifest_case(root)


if __name__ == "__main__":
    main()
