"""`syvain-data verify`: a sound dataset passes; each problem HEAD or a deep read can see is
found and printed on its own line."""

from __future__ import annotations

from typing import Any

import pytest

from cli_support import every_shard_list, file_store, publish, run, set_etags, tamper
from syvain_training_data import storage


@pytest.mark.parametrize("deep", [False, True])
def test_verify_passes_a_sound_dataset(store, deep):
    manifest_uri = publish(store)
    result = run("verify", manifest_uri, *(["--deep"] if deep else []), env=store.env)
    assert result.code == 0, result.out + result.err
    assert result.out.startswith("OK: 4 shards, 200 records")
    if deep:
        progress = result.err.strip().splitlines()[-1]
        assert progress.startswith("verify: ")
        assert "200 / 200 records" in progress and "4 / 4 shards" in progress
        assert "(100%)" in progress and "records/s" in progress and "B/s" in progress


def test_verify_finds_a_missing_shard(store):
    manifest_uri = publish(store)
    shard = store.client.load_manifest(manifest_uri).splits["val"].shards[0]
    storage.delete_object(shard.uri, storage_config=store.config)
    result = run("verify", manifest_uri, env=store.env)
    assert result.code == 1
    assert f"problem: {shard.uri}: missing" in result.out
    assert "FAILED: 1 problem in 4 shards" in result.out


def test_verify_finds_a_size_mismatch(store):
    manifest_uri = publish(store)

    def grow(document: dict[str, Any]) -> None:
        for shards in every_shard_list(document):
            for shard in shards:
                if shard["uri"].endswith("part-val-0.msgpack.zstf"):
                    shard["size_bytes"] += 1

    tamper(store, manifest_uri, grow)
    result = run("verify", manifest_uri, "--deep", env=store.env)
    assert result.code == 1
    (problem,) = [line for line in result.out.splitlines() if line.startswith("problem:")]
    assert "part-val-0.msgpack.zstf: size mismatch" in problem
    assert "in the store" in problem and "in the manifest" in problem


def test_verify_finds_a_wrong_etag(s3_store):
    store = s3_store
    manifest_uri = publish(store)
    shard = store.client.load_manifest(manifest_uri).splits["val"].shards[0]
    assert storage.head_object(shard.uri, storage_config=store.config).etag  # the store has one
    set_etags(store, manifest_uri, '"0123456789abcdef"', shard.uri)
    result = run("verify", manifest_uri, env=store.env)
    assert result.code == 1
    assert f"problem: {shard.uri}: etag mismatch" in result.out


def test_verify_ignores_a_recorded_local_etag(tmp_path):
    # SPEC 4: a file:// etag (inode and mtime) is not enforced, so a copied dataset verifies.
    store = file_store(tmp_path / "store")
    manifest_uri = publish(store)
    shards = store.client.load_manifest(manifest_uri).splits["val"].shards
    assert [shard.etag for shard in shards] == [""]  # the saver records none
    set_etags(store, manifest_uri, "12345-1700000000000000000")
    result = run("verify", manifest_uri, env=store.env)
    assert result.code == 0, result.out + result.err


def test_verify_deep_finds_a_wrong_record_count(store):
    manifest_uri = publish(store)

    def undercount(document: dict[str, Any]) -> None:
        for entry in document["splits"].values():
            for shards in [entry["shards"]] + [s["shards"] for s in entry["curriculum"].values()]:
                for shard in shards:
                    if shard["uri"].endswith("part-train-2.msgpack.zstf"):
                        shard["records"] -= 1
            entry["records"] = sum(shard["records"] for shard in entry["shards"])
            for stage in entry["curriculum"].values():
                stage["records"] = sum(shard["records"] for shard in stage["shards"])

    tamper(store, manifest_uri, undercount)
    assert run("verify", manifest_uri, env=store.env).code == 0  # HEAD cannot see it
    result = run("verify", manifest_uri, "--deep", "--no-progress", env=store.env)
    assert result.code == 1
    (problem,) = [line for line in result.out.splitlines() if line.startswith("problem:")]
    assert "part-train-2.msgpack.zstf" in problem
    assert "declared 49 records but found more" in problem
    assert result.err == ""  # --no-progress


def test_verify_deep_reads_parquet_and_jsonl(tmp_path):
    local = file_store(tmp_path)
    for data_format in ("parquet", "jsonl.gz"):
        manifest_uri = publish(local, name=data_format, data_format=data_format)
        result = run("verify", manifest_uri, "--deep")
        assert result.code == 0, result.out + result.err
        assert "200 records" in result.out
