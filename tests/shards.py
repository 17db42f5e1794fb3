"""Shards for the tests that read them: the native formats, records of text and tokens, a
shard encoded by the native encoder, and one put into a store as a ManifestShard."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from syvain_training_data import ManifestShard, _native, storage
from syvain_training_data.storage import StorageConfig

#: The formats read and written in Rust (Parquet goes through pyarrow).
NATIVE_FORMATS = ["msgpack.zstf", "jsonl.gz"]


def text_records(count: int, seed: int = 1, *, words: int = 200) -> list[dict[str, Any]]:
    """Records of ``words`` words of text (some non-ASCII), 64 tokens of up to 41 bits and a
    nested map with a float, a list (empty for every third record) and an empty string."""
    rng = random.Random(seed)
    vocabulary = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "ζ", "eta", "θ"]
    return [
        {
            "id": f"r{index}",
            "text": " ".join(rng.choice(vocabulary) for _ in range(words)),
            "tokens": [rng.randrange(-(2**40), 2**40) for _ in range(64)],
            "meta": {"i": index, "score": rng.random(), "tags": ["a"] * (index % 3), "empty": ""},
        }
        for index in range(count)
    ]


def encode_shard(data_format: str, records: Iterable[Mapping[str, Any]], batch: int = 512) -> bytes:
    """The shard's bytes, from the native encoder fed ``batch`` records at a time."""
    encoder = _native.ShardEncoder(data_format)
    pieces: list[bytes] = []
    pending: list[Mapping[str, Any]] = []
    for record in records:
        pending.append(record)
        if len(pending) == batch:
            pieces.append(encoder.encode(pending))
            pending = []
    pieces.append(encoder.encode(pending))
    pieces.append(encoder.finish())
    return b"".join(pieces)


def publish(uri: str, data: bytes, config: StorageConfig, records: int) -> ManifestShard:
    """Puts ``data`` at ``uri`` and returns it as a shard declaring ``records`` records."""
    info = storage.put_object(uri, data, storage_config=config)
    return ManifestShard(uri=uri, records=records, size_bytes=info.size, etag=info.etag)


def small_records(count: int) -> list[dict[str, Any]]:
    """Small records that tell their index: ``i``, a short text and a short list."""
    return [
        {"i": i, "text": f"record {i} " * (i % 5), "list": list(range(i % 7))} for i in range(count)
    ]
