"""Tokens per second into int tensors, one run, the same bytes for every path:

(a) dicts: `iter_shard` records, then `torch.tensor` over each batch's token ids (a collate);
(b) columnar: `iter_shard_batches(columns=["tokens"])`, each batch's values to a tensor without
    a copy (`int_list_buffers` + `torch.frombuffer`);
(c) floor: the same shard bytes decompressed and parsed in Rust, nothing built or handed to
    Python (`_native._decode_only`, benchmark-only).

Records hold 256-2048 token ids (uniform) below 50,257, msgpack.zstf and jsonl.gz, on the local
store. Goals: (b) >= 10x (a), (b) >= 0.5x (c).

Run: .venv/bin/python benchmarks/tokens.py [records]  (build with `maturin develop --release`)
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import torch

from syvain_training_data import SyvainTrainingData, _native, iter_shard, iter_shard_batches

RECORDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
ROUNDS = 3
BATCH = 64
# A read-only buffer gives a read-only tensor; torch warns once about it.
warnings.filterwarnings("ignore", message="The given buffer is not writable")


def records(seed: int):
    rng = random.Random(seed)
    for i in range(RECORDS):
        yield {"id": i, "tokens": [rng.randrange(50_257) for _ in range(rng.randint(256, 2048))]}


def dict_path(data_format: str, shard) -> int:
    tokens = 0
    batch: list[list[int]] = []
    for record in iter_shard(data_format, shard):
        batch.append(record["tokens"])
        if len(batch) == BATCH:
            tokens += torch.tensor(list(itertools.chain.from_iterable(batch))).numel()
            batch = []
    if batch:
        tokens += torch.tensor(list(itertools.chain.from_iterable(batch))).numel()
    return tokens


def columnar_path(data_format: str, shard) -> int:
    tokens = 0
    for batch in iter_shard_batches(data_format, shard, columns=["tokens"]):
        _, values = batch.int_list_buffers("tokens")
        tokens += torch.frombuffer(values, dtype=torch.int64).numel()
    return tokens


def timed(run) -> tuple[float, int]:
    times, result = [], 0
    for _ in range(ROUNDS):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        client = SyvainTrainingData()
        for data_format in ("msgpack.zstf", "jsonl.gz"):
            saver = client.dataset_saver(
                f"file://{root}/{data_format}/m.json", data_format=data_format
            )
            shard = saver.save("train", None, records(1))
            data = Path(shard.uri.removeprefix("file://")).read_bytes()
            total = sum(len(r["tokens"]) for r in records(1))
            dicts, got_a = timed(partial(dict_path, data_format, shard))
            columns, got_b = timed(partial(columnar_path, data_format, shard))
            floor, found = timed(partial(_native._decode_only, data_format, data))
            assert got_a == got_b == total and found == RECORDS
            rate = {
                name: total / seconds
                for name, seconds in (("dicts", dicts), ("columnar", columns), ("floor", floor))
            }
            print(
                json.dumps(
                    {
                        "format": data_format,
                        "records": RECORDS,
                        "tokens": total,
                        "shard_mb": round(len(data) / 1e6, 1),
                        "dicts_mtok_s": round(rate["dicts"] / 1e6, 1),
                        "columnar_mtok_s": round(rate["columnar"] / 1e6, 1),
                        "floor_mtok_s": round(rate["floor"] / 1e6, 1),
                        "columnar_vs_dicts": round(rate["columnar"] / rate["dicts"], 1),
                        "columnar_vs_floor": round(rate["columnar"] / rate["floor"], 2),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
