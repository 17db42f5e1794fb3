"""DatasetSaver (SPEC section 5) on SeaweedFS and on the local directory store: the URI
layout, saving, completion descriptors, recovery and reuse of a deterministic shard."""

from __future__ import annotations

import gzip
import hashlib
import json
import pickle
import re

import pytest

from saver_helpers import FORMATS, make_saver, read_back, records
from syvain_training_data import (
    DatasetSaver,
    PublicationConflictError,
    SyvainTrainingData,
    storage,
)
from syvain_training_data.publish import (
    DESCRIPTOR_SCHEMA,
    encode_segment,
)
from syvain_training_data.storage import StorageConfig

# --- layout ----------------------------------------------------------------------------------


def test_segment_encoding() -> None:
    assert encode_segment("  a/b c  ") == "a%2Fb%20c"
    assert encode_segment("é") == "%C3%A9"
    assert encode_segment("Az09-_.=+~") == "Az09-_.=+%7E"
    for bad in ["", "   ", ".", ".."]:
        with pytest.raises(ValueError):
            encode_segment(bad)
    with pytest.raises(TypeError):
        encode_segment(3)  # type: ignore[arg-type]


def test_uri_layout() -> None:
    saver = DatasetSaver("s3://b/a/m.json", data_format="parquet", storage_config=StorageConfig())
    digest = hashlib.sha256(b"a/m.json").hexdigest()
    assert saver.shard_uri("tr ain", "st/1", "x y") == (
        f"s3://b/a/shards/by-manifest/{digest}/tr%20ain/curriculum/st%2F1/part-x%20y.parquet"
    )
    assert re.fullmatch(
        r"s3://b/a/shards/train/part-[0-9a-f]{32}\.parquet", saver.shard_uri("train", None, None)
    )
    root = DatasetSaver("s3://b/m.json", storage_config=StorageConfig())
    assert root.shard_uri(" t ", None, "1") == (
        f"s3://b/shards/by-manifest/{hashlib.sha256(b'm.json').hexdigest()}/t/part-1.jsonl.gz"
    )
    local = DatasetSaver("file:///data/x/m.json", data_format="msgpack.zstf")
    assert local.shard_uri("t", None, "é") == (
        f"file:///data/x/shards/by-manifest/{hashlib.sha256(b'data/x/m.json').hexdigest()}"
        "/t/part-%C3%A9.msgpack.zstf"
    )
    for bad in ["s3://b/prefix/", "s3://b", "http://x/y", "file://rel/x"]:
        with pytest.raises(ValueError):
            DatasetSaver(bad)
    with pytest.raises(ValueError, match="Unknown data format"):
        DatasetSaver("s3://b/m.json", data_format="csv")  # type: ignore[arg-type]


def test_client_dataset_saver_and_pickle(store_root) -> None:
    root, config = store_root
    client = SyvainTrainingData(
        s3_base_url=config.s3_base_url,
        region=config.region,
        access_key_id=config.access_key_id,
        secret_access_key=config.secret_access_key,
    )
    saver = client.dataset_saver(f"{root}/m.json")
    assert saver.data_format == "jsonl.gz" and saver.storage_config == config
    copy = pickle.loads(pickle.dumps(saver))
    assert copy.session_id == saver.session_id and copy.manifest_uri == saver.manifest_uri
    shard = copy.save("train", None, records(3), shard_id="0")
    assert read_back(saver, shard) == records(3)


# --- save, descriptors, reuse ----------------------------------------------------------------


@pytest.mark.parametrize("data_format", FORMATS)
def test_save_writes_shard_descriptor_and_attributes(store_root, data_format, seaweed) -> None:
    root, config = store_root
    saver = make_saver(root, config, data_format)
    shard = saver.save(
        "train", "easy", records(100), curriculum_metadata={"w": [1, "é"]}, shard_id="s/1"
    )
    assert shard.uri == saver.shard_uri("train", "easy", "s/1") and "part-s%2F1" in shard.uri
    assert shard.records == 100
    data = storage.get_object(shard.uri, storage_config=config)
    assert len(data) == shard.size_bytes
    assert read_back(saver, shard) == records(100)
    descriptor = storage.get_object(shard.uri + ".metadata.json", storage_config=config)
    expected = {
        "curriculum_metadata": {"w": [1, "é"]},
        "curriculum_stage": "easy",
        "data_format": data_format,
        "schema": DESCRIPTOR_SCHEMA,
        "sha256": hashlib.sha256(data).hexdigest(),
        "shard": {
            "etag": shard.etag,
            "records": 100,
            "size_bytes": shard.size_bytes,
            "uri": shard.uri,
        },
        "split": "train",
    }
    assert (
        descriptor == (json.dumps(expected, sort_keys=True, separators=(",", ":")) + "\n").encode()
    )
    assert b"\\u00e9" in descriptor
    if root.startswith("s3://"):
        key = shard.uri.split("/", 3)[3]
        response = seaweed.request("HEAD", f"/{root.split('/')[2]}/{key}")
        content_type = {"jsonl.gz": "application/gzip", "msgpack.zstf": "application/msgpack"}
        assert response.header("content-type") == content_type[data_format]
        fmt = {"jsonl.gz": ("jsonl", "gzip"), "msgpack.zstf": ("msgpack.zstf", "zstd-framed")}
        assert response.header("x-amz-meta-content-format") == fmt[data_format][0]
        assert response.header("x-amz-meta-compression") == fmt[data_format][1]
        response = seaweed.request("HEAD", f"/{root.split('/')[2]}/{key}.metadata.json")
        assert response.header("content-type") == "application/json"


def test_jsonl_gz_bytes_are_the_codec_bytes(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config, "jsonl.gz")
    shard = saver.save("t", None, records(3), shard_id="a")
    data = storage.get_object(shard.uri, storage_config=config)
    lines = gzip.decompress(data).decode().splitlines()
    assert [json.loads(line) for line in lines] == records(3)


def test_recover_and_reuse_without_consuming(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    assert saver.recover("train", None, shard_id="a") is None
    shard = saver.save("train", None, records(5), shard_id="a")
    other = make_saver(root, config)

    def exploding():
        raise AssertionError("records were consumed")
        yield {}

    assert other.save("train", None, exploding(), shard_id="a") == shard
    assert other.recover("train", None, shard_id="a") == shard
    assert other.recover("train", None, shard_id="a", curriculum_metadata=None) == shard
    with pytest.raises(PublicationConflictError, match="metadata"):
        other.recover("train", None, shard_id="a", curriculum_metadata={"x": 1})
    # A crash between the data object and its descriptor: identical bytes are reused.
    storage.delete_object(shard.uri + ".metadata.json", storage_config=config)
    again = make_saver(root, config).save("train", None, records(5), shard_id="a")
    assert again.uri == shard.uri and again.size_bytes == shard.size_bytes
    # Different bytes under the same shard ID: conflict, nothing replaced.
    storage.delete_object(shard.uri + ".metadata.json", storage_config=config)
    with pytest.raises(PublicationConflictError, match="different bytes"):
        make_saver(root, config).save("train", None, records(6), shard_id="a")
    assert storage.get_object(shard.uri, storage_config=config) == storage.get_object(
        again.uri, storage_config=config
    )


def test_existing_descriptor_with_other_bytes_is_a_conflict(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    uri = saver.shard_uri("t", None, "a")
    storage.put_object(uri + ".metadata.json", b"{}\n", storage_config=config)
    with pytest.raises(PublicationConflictError):
        saver.save("t", None, records(2), shard_id="a")


def test_empty_shard_and_argument_rules(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    with pytest.raises(ValueError, match="^Cannot save an empty record shard$"):
        saver.save("train", None, [], shard_id="e")
    with pytest.raises(ValueError, match="^Cannot save an empty record shard$"):
        saver.save("train", None, iter(()))
    assert storage.list_objects(root, storage_config=config) == []
    with pytest.raises(ValueError, match="split"):
        saver.save("  ", None, records(1))
    with pytest.raises(ValueError, match="curriculum_stage"):
        saver.save("t", "", records(1))
    with pytest.raises(ValueError, match="requires a curriculum_stage"):
        saver.save("t", None, records(1), curriculum_metadata={"a": 1})
    with pytest.raises(ValueError, match="JSON object"):
        saver.save("t", "s", records(1), curriculum_metadata={"a": float("nan")})
    with pytest.raises(ValueError, match="shard_id"):
        saver.save("t", None, records(1), shard_id=" ")
    with pytest.raises(ValueError, match="no saved shards"):
        saver.commit_manifest()


def test_segments_with_slash_space_and_unicode(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save(" tr/ain ", "stage é/1", records(4), shard_id="id with/slash ü")
    assert "/%20" not in shard.uri and "/tr%2Fain/curriculum/stage%20%C3%A9%2F1/" in shard.uri
    assert shard.uri.endswith("/part-id%20with%2Fslash%20%C3%BC.msgpack.zstf")
    manifest = make_saver(root, config).commit_manifest()
    assert list(manifest.splits) == [" tr/ain "]
    assert list(manifest.splits[" tr/ain "].curriculum) == ["stage é/1"]
    assert read_back(saver, manifest.splits[" tr/ain "].shards[0]) == records(4)
