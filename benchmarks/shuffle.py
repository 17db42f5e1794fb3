"""Seeded loading (SPEC section 6, v3) against unseeded, on the same bytes in one run.

1. **Speed**: records/s unseeded and seeded from the local directory store and from SeaweedFS,
   at 0 and 2 workers (fork), with a new loader per epoch as a training script makes one (its
   start-up and its workers' start counted), epochs alternating, the median of --repeat, and
   the spread of the paired ratios; over small shards (64 x 500 records of about 60 bytes: a
   window reads 64 blocks of 250 records per worker) and large ones (16 msgpack.zstf shards of
   --records-per-shard text records, the records of `benchmarks/loader.py`).
2. **Bytes and requests**: per epoch, the bytes the consumers' streams received
   (`loader.stats().bytes`, index reads included) over the shards' bytes, and the range reads
   (`shard_opens`) per GB, at 1, 4 and 16 consumers (ranks of 1 worker), unseeded and seeded,
   from SeaweedFS, for each format (msgpack.zstf and jsonl.gz with the saver's indexes,
   Parquet), over 16 equal shards (2,000 records each) and 16 unequal ones (125 to 8,000
   records); and jsonl.gz over 8 large shards (24,000 records, about 9 MB and 3 blocks each),
   the layout where its access points let a consumer enter a shard mid-stream.
3. **Memory**: a local dataset of 10,000 shards (``--memory-only SHARDS``: that many, alone) x
   40 records of 2 KB (hard links to one shard the saver wrote, see ``many_shards``), loaded
   seeded with 2 spawned workers: each worker's peak resident memory (VmHWM) and the main
   process's, beside the same unseeded.

Run: .venv/bin/python benchmarks/shuffle.py [--records-per-shard 8000] [--repeat 3]
[--bytes-only [--formats jsonl.gz ...] | --speed-only | --memory-only SHARDS]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from seaweed import start_seaweed, storage_options  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402

LINKS_PER_FILE = 50_000
WORDS = [f"w{i}" for i in range(2000)] + ["the", "of", "and", "data", "model", "training"]
SHARDS, BATCH = 16, 32


def collate(records: list[Any]) -> list[Any]:
    return records


def text_records(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {"id": f"doc-{seed}-{i:07d}", "text": " ".join(rng.choice(WORDS) for _ in range(220))}
        for i in range(count)
    ]


def publish(
    client: SyvainTrainingData,
    uri: str,
    shards: list[list[dict[str, Any]]],
    data_format: str = "msgpack.zstf",
) -> int:
    saver = client.dataset_saver(uri, data_format=data_format)  # type: ignore[arg-type]
    for index, records in enumerate(shards):
        saver.save("train", None, records, shard_id=f"{index:05d}")
    manifest = saver.commit_manifest()
    return sum(shard.size_bytes for shard in manifest.splits["train"].shards)


def small_records(count: int, seed: int) -> list[dict[str, Any]]:
    return [{"i": i, "s": seed, "t": "x" * 40} for i in range(count)]


def rates(
    client: SyvainTrainingData, uri: str, workers: int, repeat: int
) -> tuple[float, float, float, float]:
    """Median records/s unseeded and seeded, each epoch with a new loader, the epochs
    alternating (this machine's noise then hits both alike); and the lowest and highest ratio
    of an epoch pair."""
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    runs: list[list[float]] = [[], []]
    for _ in range(repeat):
        for which, seed in enumerate((None, 0)):
            start = time.perf_counter()
            loader = client.split_data_loader(uri, collate, args).load("train", seed=seed)
            records = sum(len(batch) for batch in loader)
            runs[which].append(records / (time.perf_counter() - start))
    ratios = [seeded / plain for plain, seeded in zip(*runs, strict=True)]
    return statistics.median(runs[0]), statistics.median(runs[1]), min(ratios), max(ratios)


def fetched(
    client: SyvainTrainingData, uri: str, consumers: int, seed: int | None
) -> tuple[int, int]:
    """(bytes received, range reads) for one epoch read by ``consumers`` ranks."""
    received = opens = 0
    for rank in range(consumers):
        loader = client.split_data_loader(uri, collate, {"batch_size": BATCH}).load(
            "train", rank=rank, world_size=consumers, seed=seed
        )
        for _ in loader:
            pass
        stats = loader.stats()
        received += stats.bytes
        opens += stats.shard_opens
    return received, opens


def peak_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class PeakCollate:
    """Collates as a list; each worker remembers its own peak as it goes."""

    def __call__(self, records: list[Any]) -> Any:
        return os.getpid(), peak_kib(), len(records)


def many_shards(root: str, shards: int) -> str:
    """A local dataset of ``shards`` shards x 40 records of 2 KB: the saver writes the first
    (with its index) and the others are hard links to it, so 100,000 shards take seconds, not
    the half hour the saver needs here; a shard's records and bytes are what the saver writes
    for each, and a link keeps the mtime and size its index names."""
    folder = Path(root, f"many-{shards}")
    uri = f"file://{folder}/data-manifest.json"
    if Path(folder, "data-manifest.json").exists():
        return uri
    first_uri = f"file://{folder}/first/data-manifest.json"
    saver = SyvainTrainingData().dataset_saver(first_uri, data_format="msgpack.zstf")
    saver.save("train", None, ({"i": i, "text": "x" * 2000} for i in range(40)), shard_id="0")
    first = saver.commit_manifest().splits["train"].shards[0]
    source = Path(first.uri.removeprefix("file://"))
    Path(folder, "shards").mkdir(parents=True)
    entries = []
    for index in range(shards):
        path = Path(folder, "shards", f"part-{index:06d}.msgpack.zstf")
        if index % LINKS_PER_FILE == 0:  # a file takes at most 65,000 links on ext4
            origin = Path(folder, f"origin-{index}.msgpack.zstf")
            shutil.copy2(source, origin)  # the same mtime and size: its index still names it
            shutil.copy2(f"{source}.index", f"{origin}.index")
        os.link(origin, path)
        os.link(f"{origin}.index", f"{path}.index")
        entries.append(
            {"uri": f"file://{path}", "records": 40, "size_bytes": first.size_bytes, "etag": ""}
        )
    manifest = {
        "version": 1,
        "data_format": "msgpack.zstf",
        "splits": {"train": {"records": 40 * shards, "shards": entries}},
    }
    Path(folder, "data-manifest.json").write_text(json.dumps(manifest))
    return uri


def memory(root: str, seed: int | None, shards: int = 10_000) -> dict[str, Any]:
    client = SyvainTrainingData()
    uri = many_shards(root, shards)
    # spawn: a worker's peak is its own, not the memory a fork would share with this process.
    args = {"batch_size": BATCH, "num_workers": 2, "multiprocessing_context": "spawn"}
    started = time.perf_counter()
    loader = client.split_data_loader(uri, PeakCollate(), args).load("train", seed=seed)
    peaks: dict[int, int] = {}
    records = 0
    for pid, peak, count in loader:
        peaks[pid] = max(peaks.get(pid, 0), peak)
        records += count
    return {
        "case": f"memory, {shards:,} shards x 40 records, 2 workers",
        "seed": seed,
        "records": records,
        "seconds": round(time.perf_counter() - started, 1),
        "worker_peak_mib": [round(p / 1024, 1) for p in sorted(peaks.values())],
        "main_peak_mib": round(peak_kib() / 1024, 1),
    }


def bytes_rows(
    client: SyvainTrainingData, root: str, store: str, only: list[str] | None = None
) -> None:
    """Part 2: bytes and range reads per epoch, per format and layout (``only``: these
    formats)."""
    layouts = {
        "equal": [2000] * SHARDS,
        "unequal": [125 * 2 ** (i % 7) for i in range(SHARDS)],  # 125 to 8,000 records
    }
    formats = ("msgpack.zstf", "jsonl.gz", "parquet")
    cases = [(layout, counts, formats) for layout, counts in layouts.items()]
    cases.append(("large", [24_000] * (SHARDS // 2), ("jsonl.gz", "parquet")))
    for layout, counts, data_formats in cases:
        shards = [text_records(count, seed) for seed, count in enumerate(counts)]
        for data_format in data_formats:
            if only and data_format not in only:
                continue
            uri = f"{root}/bytes-{layout}-{data_format}/data-manifest.json"
            size = publish(client, uri, shards, data_format)
            for consumers in (1, 4, 16):
                for seed in (None, 0):
                    received, opens = fetched(client, uri, consumers, seed)
                    line = {
                        "case": f"bytes, {store}, {data_format}, {layout} shards, "
                        f"{consumers} consumers",
                        "seed": seed,
                        "dataset_mb": round(size / 1e6, 1),
                        "fetched_over_shard_bytes": round(received / size, 4),
                        "range_reads_per_gb": round(opens / (size / 1e9)),
                    }
                    print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-per-shard", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--bytes-only", action="store_true", help="only part 2")
    parser.add_argument("--speed-only", action="store_true", help="only part 1")
    parser.add_argument("--formats", nargs="+", help="part 2 for these formats only")
    parser.add_argument(
        "--memory-only", type=int, metavar="SHARDS", help="only part 3, over SHARDS shards"
    )
    options = parser.parse_args()
    if options.memory_only:
        with tempfile.TemporaryDirectory() as root:
            for seed in (None, 0):
                print(json.dumps(memory(root, seed, options.memory_only)), flush=True)
        return
    with tempfile.TemporaryDirectory() as root, start_seaweed(buckets=("bench",)) as server:
        s3 = SyvainTrainingData(**storage_options(server))
        if not options.speed_only:
            bytes_rows(s3, "s3://bench", "seaweedfs", options.formats)
        if options.bytes_only:
            return
        layouts = (
            ("small, 64 x 500", [small_records(500, seed) for seed in range(64)]),
            (
                f"large, {SHARDS} x {options.records_per_shard:,} text",
                [text_records(options.records_per_shard, seed) for seed in range(SHARDS)],
            ),
        )
        for layout, (name, shards) in enumerate(layouts):
            stores = (
                ("local", SyvainTrainingData(), f"file://{root}/speed-{layout}/data-manifest.json"),
                ("seaweedfs", s3, f"s3://bench/speed-{layout}/data-manifest.json"),
            )
            for store, client, uri in stores:
                publish(client, uri, shards)
                for workers in (0, 2):
                    plain, seeded, low, high = rates(client, uri, workers, options.repeat)
                    line = {
                        "case": f"speed, {name}, {store}, {workers} workers",
                        "unseeded_records_per_s": round(plain),
                        "seeded_records_per_s": round(seeded),
                        "seeded_over_unseeded": round(seeded / plain, 3),
                        "pair_ratios": [round(low, 3), round(high, 3)],
                    }
                    print(json.dumps(line), flush=True)
        if options.speed_only:
            return
        for seed in (None, 0):
            print(json.dumps(memory(root, seed)), flush=True)


if __name__ == "__main__":
    main()
