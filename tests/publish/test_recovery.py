"""Shards a DatasetSaver finds in the store (SPEC section 5): tampered, non-canonical or
replaced descriptors and data objects are conflicts; local etags are not enforced (SPEC 4)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from saver_helpers import make_saver, read_back, records
from syvain_training_data import (
    PublicationConflictError,
    storage,
)
from syvain_training_data.storage import StorageConfig

# --- tampering -----------------------------------------------------------------------------

TAMPER = {
    "curriculum_metadata": lambda d: d.update(curriculum_metadata={"w": 2}),
    "curriculum_stage": lambda d: d.update(curriculum_stage="other"),
    "data_format": lambda d: d.update(data_format="jsonl.gz"),
    "schema": lambda d: d.update(schema="syvain-training-data-shard-v2"),
    # A digest that does not match: caught where the sha256 is recomputed (no etag to compare).
    "sha256": lambda d: d.update(sha256="0" * 64) or d["shard"].update(etag=""),
    "sha256 not hex": lambda d: d.update(sha256="xyz"),
    "shard.etag": lambda d: d["shard"].update(etag='"0123"'),
    "shard.size_bytes": lambda d: d["shard"].update(size_bytes=d["shard"]["size_bytes"] + 1),
    "shard.uri": lambda d: d["shard"].update(uri=d["shard"]["uri"].replace("part-a", "part-b")),
    "shard extra key": lambda d: d["shard"].update(extra=1),
    "split": lambda d: d.update(split="val"),
    "extra key": lambda d: d.update(extra=None),
    "missing key": lambda d: d.pop("sha256"),
}


@pytest.mark.parametrize("field", list(TAMPER))
def test_tampered_descriptor_is_a_conflict(store_root, field) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save("train", "easy", records(3), curriculum_metadata={"w": 1}, shard_id="a")
    uri = shard.uri + ".metadata.json"
    document = json.loads(storage.get_object(uri, storage_config=config))
    TAMPER[field](document)
    tampered = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    storage.put_object(uri, tampered, storage_config=config)
    fresh = make_saver(root, config)
    if field == "shard.etag" and root.startswith("file://"):
        # SPEC 4: a local etag in a descriptor is not enforced (the sha256 guards the bytes).
        assert fresh.recover("train", "easy", shard_id="a", curriculum_metadata={"w": 1}) == shard
        return
    with pytest.raises(PublicationConflictError):
        fresh.recover("train", "easy", shard_id="a", curriculum_metadata={"w": 1})
    with pytest.raises(PublicationConflictError):
        fresh.save("train", "easy", records(3), curriculum_metadata={"w": 1}, shard_id="a")
    if field != "curriculum_metadata":  # a consistent other metadata is only caught when passed
        with pytest.raises(PublicationConflictError):
            fresh.commit_manifest()


def test_a_descriptor_etag_without_quotes_still_names_its_object(store_root) -> None:
    # Another writer may record the etag without the quotes S3 puts around it.
    root, config = store_root
    shard = make_saver(root, config).save("train", None, records(3), shard_id="a")
    uri = shard.uri + ".metadata.json"
    document = json.loads(storage.get_object(uri, storage_config=config))
    document["shard"]["etag"] = document["shard"]["etag"].strip('"')
    rewritten = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    storage.put_object(uri, rewritten, storage_config=config)
    recovered = make_saver(root, config).recover("train", None, shard_id="a")
    assert recovered.model_copy(update={"etag": shard.etag}) == shard


def test_non_canonical_descriptor_and_replaced_or_missing_data(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save("train", None, records(3), shard_id="a")
    uri = shard.uri + ".metadata.json"
    original = storage.get_object(uri, storage_config=config)
    storage.put_object(
        uri, json.dumps(json.loads(original), indent=1).encode(), storage_config=config
    )
    with pytest.raises(PublicationConflictError, match="canonical"):
        make_saver(root, config).recover("train", None, shard_id="a")
    storage.put_object(uri, original, storage_config=config)
    assert make_saver(root, config).recover("train", None, shard_id="a") == shard
    # Replaced data object (same size, other bytes): the etag (or the digest) gives it away.
    data = bytearray(storage.get_object(shard.uri, storage_config=config))
    data[-1] ^= 1
    storage.put_object(shard.uri, bytes(data), storage_config=config)
    with pytest.raises(PublicationConflictError):
        make_saver(root, config).recover("train", None, shard_id="a")
    # The same with no etag in the descriptor: the sha256 is recomputed.
    document = json.loads(original)
    document["shard"]["etag"] = ""
    storage.put_object(
        uri,
        (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode(),
        storage_config=config,
    )
    with pytest.raises(PublicationConflictError, match="sha256"):
        make_saver(root, config).recover("train", None, shard_id="a")
    # A descriptor without its data object.
    storage.delete_object(shard.uri, storage_config=config)
    with pytest.raises(PublicationConflictError, match="does not exist"):
        make_saver(root, config).recover("train", None, shard_id="a")
    with pytest.raises(PublicationConflictError):
        make_saver(root, config).commit_manifest()


# --- local etags (SPEC 4) ---------------------------------------------------------------------


def test_a_restored_local_dataset_recovers_commits_and_reads(tmp_path) -> None:
    root = tmp_path / "store"
    saver = make_saver(f"file://{root}", StorageConfig(), "parquet")
    saved = [saver.save("train", None, records(50, 50 * i), shard_id=f"s{i}") for i in range(3)]
    manifest = saver.commit_manifest()
    descriptors = [json.loads(storage.get_object(shard.uri + ".metadata.json")) for shard in saved]
    assert {shard.etag for shard in manifest.splits["train"].shards} == {""}
    assert {document["shard"]["etag"] for document in descriptors} == {""}

    # A backup and a restore: the same paths, new files with new mtimes (so new local etags).
    shutil.copytree(root, tmp_path / "backup")
    before = {shard.uri: storage.head_object(shard.uri).etag for shard in saved}
    shutil.rmtree(root)
    shutil.copytree(tmp_path / "backup", root)
    for path in root.rglob("*"):
        if path.is_file():
            later = path.stat().st_mtime_ns + 10**9
            os.utime(path, ns=(later, later))
    assert all(storage.head_object(uri).etag != etag for uri, etag in before.items())

    again = make_saver(f"file://{root}", StorageConfig(), "parquet")
    assert again.recover("train", None, shard_id="s0") == saved[0]
    assert again.commit_manifest() == manifest
    rows = [row for shard in manifest.splits["train"].shards for row in read_back(again, shard)]
    assert rows == records(150)


def test_a_local_etag_written_by_an_older_saver_is_not_enforced(tmp_path) -> None:
    saver = make_saver(f"file://{tmp_path}", StorageConfig(), "parquet")
    shard = saver.save("train", None, records(5), shard_id="a")
    descriptor_uri = shard.uri + ".metadata.json"
    document = json.loads(storage.get_object(descriptor_uri))
    document["shard"]["etag"] = "1234-1700000000000000000"  # an inode and mtime long gone
    old = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    storage.put_object(descriptor_uri, old)
    fresh = make_saver(f"file://{tmp_path}", StorageConfig(), "parquet")
    assert fresh.recover("train", None, shard_id="a") == shard  # published without the etag
    assert fresh.commit_manifest().splits["train"].shards == [shard]
    stale = shard.model_copy(update={"etag": "1234-1700000000000000000"})
    assert read_back(fresh, stale) == records(5)
