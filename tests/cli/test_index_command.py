"""``syvain-data index``: the missing record offset indexes of a msgpack.zstf dataset, beside
the shards or under another prefix (``--to``, read by ``load(index_root=...)``), each checked
against its shard; re-runs keep what is right and replace what is stale; and the loader then
fetches each byte about once."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

from cli_support import Store, every_shard_list, publish, run, tamper
from syvain_training_data.formats.shard_index import ShardIndex, index_uri, version_tag
from syvain_training_data.storage import delete_object, get_object, head_object


def shards_of(store: Store, manifest_uri: str) -> list[Any]:
    manifest = store.client.load_manifest(manifest_uri)
    return [shard for entry in manifest.splits.values() for shard in entry.shards]


def assert_indexed(store: Store, shard: Any, root: str | None = None) -> None:
    version = version_tag(shard.uri, head_object(shard.uri, storage_config=store.config).etag)
    data = get_object(index_uri(shard.uri, root), storage_config=store.config)
    ShardIndex.parse(data, shard.records, shard.size_bytes, version)


def test_index_writes_missing_indexes_keeps_right_ones_and_replaces_stale_ones(store):
    manifest_uri = publish(store)
    shards = shards_of(store, manifest_uri)
    for shard in shards[:3]:
        delete_object(index_uri(shard.uri), storage_config=store.config)
    result = run("index", manifest_uri, "--no-progress", env=store.env)
    assert result.code == 0, result.out + result.err
    assert "OK: 4 shards: 3 indexed, 0 replaced (stale), 1 already indexed" in result.out
    for shard in shards:
        assert_indexed(store, shard)
    # A shard rewritten (same bytes, a new version): its index names the old one.
    if store.kind == "file":
        path = shards[0].uri.removeprefix("file://")
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
        again = run("index", manifest_uri, "--no-progress", env=store.env)
        assert "1 replaced (stale), 3 already indexed" in again.out, again.out
        assert_indexed(store, shards[0])
    again = run("index", manifest_uri, "--no-progress", env=store.env)
    assert "0 indexed, 0 replaced (stale), 4 already indexed" in again.out


def test_index_to_another_prefix_is_read_with_index_root(s3_store, tmp_path):
    pytest.importorskip("torch")
    manifest_uri = f"{s3_store.root}/big/data-manifest.json"
    saver = s3_store.client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    rng = random.Random(1)
    for part in range(2):  # two shards of about 10 MB: several blocks each
        records = ({"p": part, "i": i, "b": rng.randbytes(1000)} for i in range(10_000))
        saver.save("train", None, records, shard_id=str(part))
    shards = saver.commit_manifest().splits["train"].shards
    for shard in shards:  # as another writer made them
        delete_object(index_uri(shard.uri), storage_config=s3_store.config)
    root = f"{s3_store.root}/indexes"
    result = run("index", manifest_uri, "--to", root, "--jobs", "2", env=s3_store.env)
    assert result.code == 0, result.out + result.err
    assert "2 indexed" in result.out and "index" in result.err  # the progress line
    for shard in shards:
        assert_indexed(s3_store, shard, root)
    loader = s3_store.client.split_data_loader(manifest_uri, list, {"batch_size": 32})
    fetched = {}
    for where in (None, root):
        batches = loader.load("train", seed=2, index_root=where)
        keys = sorted((r["p"], r["i"]) for batch in batches for r in batch)
        assert keys == [(p, i) for p in range(2) for i in range(10_000)]
        fetched[where] = batches.stats().bytes
    total = sum(shard.size_bytes for shard in shards)
    # Without indexes the dataset is not indexed: whole shards, each read once.
    assert fetched[None] <= 1.01 * total
    # With them: blocks of about 4 MiB, each fetched once, plus the index entries around them.
    print(f"fetched {fetched[None] / total:.4f}x unindexed, {fetched[root] / total:.4f}x indexed")
    assert fetched[root] <= 1.05 * total, fetched[root] / total


def test_index_refuses_other_formats_and_reports_a_shard_that_lies(store):
    parquet = publish(store, "pq", data_format="parquet")
    result = run("index", parquet, "--no-progress", env=store.env)
    assert result.code == 1
    assert "parquet shards have no indexes (only jsonl.gz, msgpack.zstf do)" in result.out
    manifest_uri = publish(store)
    shard = shards_of(store, manifest_uri)[0]
    delete_object(index_uri(shard.uri), storage_config=store.config)

    def one_more_record(document: dict[str, Any]) -> None:
        for listed in every_shard_list(document):
            for entry in listed:
                entry["records"] += entry["uri"] == shard.uri
        for split in document["splits"].values():
            split["records"] = sum(s["records"] for s in split["shards"])
            for stage in split["curriculum"].values():
                stage["records"] = sum(s["records"] for s in stage["shards"])

    tamper(store, manifest_uri, one_more_record)
    lying = manifest_uri
    result = run("index", lying, "--no-progress", env=store.env)
    assert result.code == 1
    assert f"problem: Unreadable msgpack.zstf shard {shard.uri}: declared" in result.out
