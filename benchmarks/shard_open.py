"""Shard opens: time to the first record of a small shard against a plain read of the
same object, on SeaweedFS (whole GET through our own `get_object`) and on the local store (a
plain file read). 16 shards of 300 text records (~350 KB each); medians of the opens, in turns.

Run: .venv/bin/python benchmarks/shard_open.py  (build with `maturin develop --release` first)
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from seaweed import start_seaweed, storage_options  # noqa: E402
from syvain_training_data import SyvainTrainingData, iter_shard  # noqa: E402
from syvain_training_data.storage import get_object  # noqa: E402

SHARDS = 16
ROUNDS = 5


def records(seed: int) -> list[dict]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(3000)]
    return [{"id": f"{seed}-{i}", "text": " ".join(rng.choices(words, k=220))} for i in range(300)]


def measure(client: SyvainTrainingData, manifest_uri: str, plain) -> dict[str, float]:
    manifest = client.load_manifest(manifest_uri)
    shards = manifest.splits["train"].shards
    opens, reads = [], []
    for _ in range(ROUNDS):
        for shard in shards:
            start = time.perf_counter()
            stream = iter_shard(manifest.data_format, shard, storage_config=client.storage_config)
            next(stream)
            opens.append(time.perf_counter() - start)
            stream.close()
            start = time.perf_counter()
            plain(shard.uri)
            reads.append(time.perf_counter() - start)
    first_record, plain_read = statistics.median(opens), statistics.median(reads)
    return {
        "first_record_ms": round(first_record * 1e3, 3),
        "plain_read_ms": round(plain_read * 1e3, 3),
        "ratio": round(first_record / plain_read, 2),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as root, start_seaweed(buckets=("bench",)) as server:
        s3 = SyvainTrainingData(**storage_options(server))
        local = SyvainTrainingData()
        cases = (
            ("seaweedfs", s3, "s3://bench/open/data-manifest.json"),
            ("local", local, f"file://{root}/open/data-manifest.json"),
        )
        for store, client, uri in cases:
            saver = client.dataset_saver(uri, data_format="msgpack.zstf")
            for seed in range(SHARDS):
                saver.save("train", None, records(seed), shard_id=f"{seed:03d}")
            saver.commit_manifest()

            def plain(shard_uri: str, client: SyvainTrainingData = client) -> bytes:
                if shard_uri.startswith("file://"):
                    return Path(shard_uri.removeprefix("file://")).read_bytes()
                return get_object(shard_uri, storage_config=client.storage_config)

            print(json.dumps({"store": store, **measure(client, uri, plain)}), flush=True)


if __name__ == "__main__":
    main()
