"""Saver throughput: records/s into finished deterministic shards on SeaweedFS, 1 and 2
processes, per format, beside the encode floor (msgspec/orjson + zstandard/zlib in Python)
measured in the same run. Prints one JSON line per case.

    .venv/bin/maturin develop --release && .venv/bin/python benchmarks/saver.py [--records N]

Each figure is the best of --repeat rounds (default 3) that time the floor and every case in turn.
Cases: one process saving shard after shard; two processes; one process saving from two threads
(`save` is thread-safe, and a second thread encodes the next shard while the first uploads).
Targets: one process >= 0.7 of the encode floor; two processes >= 1.6 x one.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import random
import sys
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.synchronize import Barrier
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from seaweed import config_for, start_seaweed  # noqa: E402
from syvain_training_data import DatasetSaver  # noqa: E402
from syvain_training_data.storage import StorageConfig  # noqa: E402

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from").split()  # noqa: SIM905
SHARDS = 8


def make_records(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "id": f"doc-{i:08d}",
            "text": " ".join(rng.choice(WORDS) for _ in range(220)),
            "tokens": [rng.randrange(50_000) for _ in range(256)],
            "meta": {"source": "bench", "index": i, "score": rng.random()},
        }
        for i in range(count)
    ]


def encode_floor(data_format: str, records: list[dict]) -> float:
    """records/s of the plain-Python codec path: serialize each record, compress, frame."""
    import msgspec
    import orjson
    import zstandard

    started = time.perf_counter()
    if data_format == "msgpack.zstf":
        encoder = msgspec.msgpack.Encoder()
        compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
        out = bytearray()
        for record in records:
            frame = compressor.compress(encoder.encode(record))
            out += len(frame).to_bytes(8, "big")
            out += frame
    elif data_format == "jsonl.gz":
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        out = bytearray()
        for record in records:
            out += compressor.compress(orjson.dumps(record) + b"\n")
        out += compressor.flush()
    else:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        table = pa.Table.from_pylist(records)
        pq.write_table(table, sink, compression="zstd")
    return len(records) / (time.perf_counter() - started)


def save_shards(saver: DatasetSaver, shards: dict[int, list[dict]], threads: int) -> None:
    def save(index: int) -> None:
        saver.save("train", None, shards[index], shard_id=f"part-{index:05d}")

    if threads == 1:
        for index in shards:
            save(index)
        return
    # Threads overlap one shard's upload (GIL released) with the next one's encoding.
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(save, shards))


def own_copies(records: list[dict], shard_ids: list[int], per_shard: int) -> dict[int, list[dict]]:
    """A private copy of the worker's shards: a forked child that only reads the parent's
    records still writes their reference counts, copying every page it touches on first use;
    that belongs to the benchmark, not the saver, so it happens before the timing starts."""
    return {
        index: pickle.loads(pickle.dumps(records[index * per_shard : (index + 1) * per_shard]))
        for index in shard_ids
    }


def worker(
    saver: DatasetSaver, records: list[dict], shard_ids: list[int], per_shard: int, start: Barrier
) -> None:
    shards = own_copies(records, shard_ids, per_shard)
    start.wait()
    save_shards(saver, shards, threads=1)


def run_case(saver: DatasetSaver, records: list[dict], processes: int, threads: int) -> float:
    per_shard = len(records) // SHARDS
    if processes == 1:
        shards = own_copies(records, list(range(SHARDS)), per_shard)
        started = time.perf_counter()
        save_shards(saver, shards, threads)
    else:
        context = multiprocessing.get_context("fork")  # the records are inherited, not sent
        start = context.Barrier(processes + 1)
        workers = [
            context.Process(
                target=worker,
                args=(saver, records, list(range(w, SHARDS, processes)), per_shard, start),
            )
            for w in range(processes)
        ]
        for process in workers:
            process.start()
        start.wait()
        started = time.perf_counter()
        for process in workers:
            process.join()
            assert process.exitcode == 0
    elapsed = time.perf_counter() - started
    manifest = saver.commit_manifest()
    assert manifest.splits["train"].records == per_shard * SHARDS
    return per_shard * SHARDS / elapsed


def warm_up(config: StorageConfig, records: list[dict]) -> None:
    """SeaweedFS grows its first volumes on the first writes; do that before any timing."""
    saver = DatasetSaver(
        f"s3://bench/warm-up-{uuid.uuid4().hex}/data-manifest.json",
        data_format="msgpack.zstf",
        storage_config=config,
    )
    per_shard = len(records) // SHARDS
    save_shards(saver, own_copies(records, list(range(SHARDS)), per_shard), threads=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--formats", default="msgpack.zstf,jsonl.gz,parquet")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best of each is kept")
    args = parser.parse_args()
    records = make_records(args.records)
    with start_seaweed(("bench",)) as server:
        config = config_for(server)
        warm_up(config, records)
        for data_format in args.formats.split(","):
            if data_format == "parquet":
                try:
                    import syvain_training_data.formats.parquet  # noqa: F401
                except ImportError:
                    print(json.dumps({"format": data_format, "skipped": "no parquet writer yet"}))
                    continue
            # Best of --repeat rounds, each round timing the floor and every case in turn, so
            # a noisy neighbour slows one round rather than one side of a ratio.
            cases = ((1, 1), (2, 1), (1, 2))
            floor = 0.0
            best = dict.fromkeys(cases, 0.0)
            for _ in range(args.repeat):
                floor = max(floor, encode_floor(data_format, records))
                for processes, threads in cases:
                    saver = DatasetSaver(
                        f"s3://bench/{uuid.uuid4().hex}/data-manifest.json",
                        data_format=data_format,  # type: ignore[arg-type]
                        storage_config=config,
                    )
                    rate = run_case(saver, records, processes, threads)
                    best[processes, threads] = max(best[processes, threads], rate)
            one = best[1, 1]
            for (processes, threads), rate in best.items():
                print(
                    json.dumps(
                        {
                            "format": data_format,
                            "processes": processes,
                            "threads_per_process": threads,
                            "records": len(records),
                            "rounds": args.repeat,
                            "records_per_s": round(rate),
                            "encode_floor_records_per_s": round(floor),
                            "vs_floor": round(rate / floor, 2),
                            "vs_one_process": round(rate / one, 2),
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
