"""`syvain-data cp`: the manifest's bytes, or with --with-shards a verified copy of the whole
dataset; it verifies before it writes and leaves nothing behind on failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli_support import Store, file_store, publish, run, set_etags
from syvain_training_data import SyvainTrainingData, storage
from syvain_training_data.cli.cp import copy_layout
from syvain_training_data.shard import iter_shard


def test_cp_copies_the_manifest_bytes(store, tmp_path):
    manifest_uri = publish(store)
    destination = f"{store.root}/copy/data-manifest.json"
    result = run("cp", manifest_uri, destination, env=store.env)
    assert result.code == 0, result.err
    source_bytes = storage.get_object(manifest_uri, storage_config=store.config)
    assert storage.get_object(destination, storage_config=store.config) == source_bytes
    assert run("cp", manifest_uri, destination, env=store.env).code == 0  # idempotent
    other = f"{store.root}/other.json"
    storage.put_object(other, b"{}", storage_config=store.config)
    result = run("cp", manifest_uri, other, env=store.env)
    assert result.code == 1
    assert "already exists with other content" in result.err
    assert storage.get_object(other, storage_config=store.config) == b"{}"


@pytest.mark.parametrize(
    ("source_kind", "destination_kind"), [("s3", "file"), ("file", "s3"), ("s3", "s3")]
)
def test_cp_with_shards_copies_verifies_and_rewrites(
    s3_store, tmp_path, source_kind, destination_kind
):
    stores = {"s3": s3_store, "file": file_store(tmp_path / "local")}
    source, destination = stores[source_kind], stores[destination_kind]
    env = s3_store.env
    manifest_uri = publish(source)
    target = f"{destination.root}/copied/v1/"
    result = run("cp", manifest_uri, target, "--with-shards", env=env)
    assert result.code == 0, result.out + result.err
    copied_uri = f"{destination.root}/copied/v1/data-manifest.json"
    assert result.out.splitlines()[-1].startswith(f"copied {manifest_uri} -> {copied_uri}")
    assert "200 / 200 records" in result.err.splitlines()[-1]

    original = source.client.load_manifest(manifest_uri)
    copied = destination.client.load_manifest(copied_uri)
    assert set(copied.splits) == {"train", "val"}
    assert list(copied.splits["train"].curriculum) == ["easy", "hard"]
    for split, entry in original.splits.items():
        for before, after in zip(entry.shards, copied.splits[split].shards, strict=True):
            relative = before.uri[len(f"{source.root}/dataset/") :]
            assert after.uri == f"{destination.root}/copied/v1/{relative}"
            assert (after.records, after.size_bytes) == (before.records, before.size_bytes)
            assert list(iter_shard("msgpack.zstf", after, storage_config=destination.config)) == (
                list(iter_shard("msgpack.zstf", before, storage_config=source.config))
            )
    assert run("verify", copied_uri, "--deep", env=env).code == 0
    again = run("cp", manifest_uri, target, "--with-shards", "--no-progress", env=env)
    assert again.code == 0, again.err  # a re-run reuses identical objects
    assert "already holds this manifest" in again.out


def test_cp_with_shards_stops_at_a_bad_source_and_writes_no_manifest(tmp_path):
    local = file_store(tmp_path)
    manifest_uri = publish(local)
    shard = local.client.load_manifest(manifest_uri).splits["val"].shards[0]
    path = Path(shard.uri[len("file://") :])
    path.write_bytes(path.read_bytes()[:-1])
    result = run("cp", manifest_uri, str(tmp_path / "copy") + "/", "--with-shards")
    assert result.code == 1
    assert shard.uri in result.err and len(result.err.strip().splitlines()) <= 2
    assert not (tmp_path / "copy" / "data-manifest.json").exists()


def test_cp_with_shards_refuses_two_shards_with_one_destination(tmp_path):
    external = f"file://{tmp_path}/elsewhere/part.jsonl.gz"
    inside = f"file://{tmp_path}/src/shards/external/file{tmp_path}/elsewhere/part.jsonl.gz"
    shards = [{"uri": uri, "records": 1, "size_bytes": 10} for uri in (external, inside)]
    manifest_uri = f"file://{tmp_path}/src/data-manifest.json"
    SyvainTrainingData().save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "jsonl.gz",
            "splits": {"a": {"records": 2, "shards": shards}},
        },
    )
    result = run("cp", "--with-shards", manifest_uri, f"file://{tmp_path}/dst/")
    assert result.code == 1
    assert "would be copied to the same destination URI" in result.err
    assert not (tmp_path / "dst").exists()


def test_copy_layout_keeps_relative_paths_and_files_external_shards():
    source, destination = "s3://a/data/v1/manifest.json", "file:///backup/v1/manifest.json"
    assert (
        copy_layout(source, destination, "s3://a/data/v1/shards/train/part-x.jsonl.gz")
        == "file:///backup/v1/shards/train/part-x.jsonl.gz"
    )
    assert (
        copy_layout(source, destination, "s3://other/k/part%2F1.jsonl.gz")
        == "file:///backup/v1/shards/external/s3/other/k/part%2F1.jsonl.gz"
    )
    assert (
        copy_layout(source, destination, "file:///mnt/x.jsonl.gz")
        == "file:///backup/v1/shards/external/file/mnt/x.jsonl.gz"
    )


def _corrupt(store: Store, manifest_uri: str, how: str) -> Any:
    """Corrupts train-0 in place, keeping its size: ``header`` breaks its first frame length
    (and removes its descriptor, so only decoding can tell); ``swap`` gives it the bytes of
    train-1 (same size, decodes cleanly: only the descriptor's sha256 can tell). An s3:// shard's
    etag is dropped from the manifest, so that the etag check cannot catch it first."""
    manifest = store.client.load_manifest(manifest_uri)
    victim, donor = manifest.splits["train"].shards[:2]
    assert (
        victim.uri.endswith("part-train-0.msgpack.zstf") and victim.size_bytes == donor.size_bytes
    )
    data = storage.get_object(victim.uri, storage_config=store.config)
    if how == "header":
        bad = b"\xff" * 8 + data[8:]
        storage.delete_object(victim.uri + ".metadata.json", storage_config=store.config)
    else:
        bad = storage.get_object(donor.uri, storage_config=store.config)
    assert len(bad) == len(data) and bad != data
    storage.delete_object(victim.uri, storage_config=store.config)
    storage.put_object(victim.uri, bad, storage_config=store.config)
    if store.kind == "s3":
        set_etags(store, manifest_uri, "", victim.uri)
    return victim


@pytest.mark.parametrize("how", ["header", "swap"])
@pytest.mark.parametrize(
    ("source_kind", "destination_kind"), [("file", "file"), ("file", "s3"), ("s3", "file")]
)
def test_cp_with_shards_writes_nothing_for_a_corrupted_source_shard(
    s3_store, tmp_path, source_kind, destination_kind, how
):
    stores = {"s3": s3_store, "file": file_store(tmp_path / "local")}
    source, destination = stores[source_kind], stores[destination_kind]
    manifest_uri = publish(source)
    victim = _corrupt(source, manifest_uri, how)
    copied_manifest = f"{destination.root}/copied/data-manifest.json"
    target = copy_layout(manifest_uri, copied_manifest, victim.uri)
    for attempt in range(2):  # a re-run meets nothing it could take for a good copy
        result = run(
            "cp", "--with-shards", "--jobs", "1", manifest_uri, copied_manifest, env=s3_store.env
        )
        assert result.code == 1, (attempt, result.out, result.err)
        assert f"ShardDataError: Unreadable msgpack.zstf shard {victim.uri}: " in result.err
        reason = "invalid frame length" if how == "header" else "completion descriptor"
        assert reason in result.err
        with pytest.raises(FileNotFoundError):
            storage.head_object(target, storage_config=destination.config)
        with pytest.raises(FileNotFoundError):
            storage.head_object(copied_manifest, storage_config=destination.config)


def test_cp_with_shards_deletes_a_copy_that_fails_its_read_back(tmp_path, monkeypatch):
    from syvain_training_data.publish import upload

    local = file_store(tmp_path / "local")
    manifest_uri = publish(local)
    written: list[str] = []

    def wrong_digest(uri: str, size: int, etag: str, config: Any) -> str:
        written.append(uri)
        return "0" * 64

    monkeypatch.setattr(upload, "stream_sha256", wrong_digest)
    result = run("cp", "--with-shards", manifest_uri, f"{local.root}/copied/")
    assert result.code == 1 and "the copy's sha256 differs" in result.err
    assert written  # every copy written was read back, then deleted
    for uri in written:
        with pytest.raises(FileNotFoundError):
            storage.head_object(uri, storage_config=local.config)
