"""The main job of the README, on the embedded local directory store (no server, no credentials).

It generates text records, encodes them as a msgpack.zstf shard with the native encoder, writes
the shard create-only and a manifest naming it, then reads the manifest back and streams the
shard through ``iter_shard``, checking every record. It prints what it did as it goes.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from syvain_training_data import _native
from syvain_training_data.client import SyvainTrainingData
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import head_object, put_object

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "as",
    "with",
    "by",
    "at",
    "from",
    "that",
    "this",
    "which",
    "be",
    "are",
    "or",
    "an",
    "data",
    "model",
    "train",
    "shard",
    "record",
    "token",
    "stream",
    "store",
    "byte",
    "resume",
    "loader",
    "split",
    "stage",
]


def generate_records(count: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Text-shaped records: an id, ~220 words, 256 token ids and a small meta map."""
    rng = random.Random(seed)
    for index in range(count):
        yield {
            "id": f"doc-{index:08d}",
            "text": " ".join(rng.choice(WORDS) for _ in range(220)),
            "tokens": [rng.randrange(50_000) for _ in range(256)],
            "meta": {"source": "demo", "index": index, "score": rng.random()},
        }


def run_demo(root: Path | None = None, records: int = 20_000) -> None:
    root = Path(root or tempfile.mkdtemp(prefix="syvain-demo-")).resolve()
    client = SyvainTrainingData()
    manifest_uri = f"file://{root}/datasets/demo/data-manifest-v1.json"
    shard_uri = f"file://{root}/datasets/demo/shards/train/part-00000.msgpack.zstf"
    print(f"local directory store: {root}")

    started = time.perf_counter()
    encoder = _native.ShardEncoder("msgpack.zstf")
    pieces: list[bytes] = []
    batch: list[dict[str, Any]] = []
    for record in generate_records(records):
        batch.append(record)
        if len(batch) == 1024:
            pieces.append(encoder.encode(batch))
            batch.clear()
    pieces.append(encoder.encode(batch))
    pieces.append(encoder.finish())
    shard_bytes = b"".join(pieces)
    put_object(shard_uri, shard_bytes, create_only=True, content_type="application/msgpack")
    info = head_object(shard_uri)
    write_s = time.perf_counter() - started
    print(
        f"wrote {encoder.records} records as msgpack.zstf: {info.size:,} bytes "
        f"in {write_s:.2f} s -> {shard_uri}"
    )

    manifest = client.save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "msgpack.zstf",
            "splits": {
                "train": {
                    "records": records,
                    "shards": [
                        {
                            "uri": shard_uri,
                            "records": records,
                            "size_bytes": info.size,
                            "etag": info.etag,
                        }
                    ],
                }
            },
        },
    )
    print(f"saved manifest {manifest_uri}")

    started = time.perf_counter()
    loaded = client.load_manifest(manifest_uri)
    assert loaded == manifest
    shard = loaded.splits["train"].shards[0]
    streamed = list(iter_shard(loaded.data_format, shard))
    read_s = time.perf_counter() - started
    print(
        f"streamed back {len(streamed)} records in {read_s:.2f} s "
        f"({info.size / read_s / 1e6:.1f} MB/s, {len(streamed) / read_s:,.0f} records/s)"
    )
    for index, (read_back, original) in enumerate(
        zip(streamed, generate_records(records), strict=True)
    ):
        if read_back != original:
            raise AssertionError(f"record {index} differs after the round trip")
    print("every record identical to what was written")
