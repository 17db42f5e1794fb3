"""Wrong arguments fail at the call with a TypeError or ValueError that names the argument,
never accepted silently or failing late with words that name nothing the caller wrote."""

from __future__ import annotations

from typing import Any

import pytest

from syvain_training_data import DatasetSaver, SyvainTrainingData, iter_shard
from syvain_training_data.shard import iter_shard_batches
from syvain_training_data.storage import StorageConfig


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[SyvainTrainingData, str, Any]:
    root = tmp_path_factory.mktemp("arguments")
    client = SyvainTrainingData()
    manifest_uri = f"file://{root}/data-manifest.json"
    saver = client.dataset_saver(manifest_uri, data_format="msgpack.zstf")
    shard = saver.save("train", None, ({"i": i, "tokens": [i, i]} for i in range(40)))
    saver.commit_manifest()
    return client, manifest_uri, shard


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"shuffle_buffer": 8}, ValueError, "shuffle_buffer needs seed"),
        ({"equal_batches": "y"}, TypeError, "equal_batches must be True or False"),
        ({"infinite_iter": "y"}, TypeError, "infinite_iter must be True or False"),
        ({"stateful": 3}, TypeError, "stateful must be True or False"),
        ({"indexes": 1}, TypeError, "indexes must be True or False"),
        ({"pad_value": "x", "columns": ["tokens"]}, TypeError, "pad_value must be an int"),
        ({"truncate": "yes", "columns": ["tokens"]}, TypeError, "truncate must be True or False"),
        ({"index_root": 5, "seed": 1}, TypeError, "index_root must be a URI str"),
        ({"index_root": "/tmp/x", "seed": 1}, ValueError, "index_root must be an s3://"),
    ],
)
def test_load_checks_its_options_at_the_call(dataset, options, error, words):
    pytest.importorskip("torch")
    client, manifest_uri, _ = dataset
    loader = client.split_data_loader(manifest_uri, None, {"batch_size": 4})
    with pytest.raises(error, match=words):
        loader.load("train", **options)


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"documents": "yes"}, TypeError, "documents must be True or False"),
        ({"pack": "no"}, TypeError, "pack must be True or False"),
        ({"shuffle_buffer": 2}, ValueError, "shuffle_buffer needs seed"),
    ],
)
def test_load_tokens_checks_its_options_at_the_call(dataset, options, error, words):
    pytest.importorskip("torch")
    client, manifest_uri, _ = dataset
    loader = client.split_data_loader(manifest_uri, None, {"batch_size": 4})
    with pytest.raises(error, match=words):
        loader.load_tokens("train", seq_len=4, **options)


def test_the_loader_checks_collate_fn_and_dataloader_args(dataset):
    pytest.importorskip("torch")
    client, manifest_uri, _ = dataset
    with pytest.raises(TypeError, match="collate_fn must be a callable or None, not int"):
        client.split_data_loader(manifest_uri, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dataloader_args must be a mapping"):
        client.split_data_loader(manifest_uri, None, [1])  # type: ignore[arg-type]


def test_iter_shard_checks_the_shard_and_storage_config_at_the_call(dataset):
    _, _, shard = dataset
    with pytest.raises(TypeError, match="shard must be a ManifestShard, not str"):
        iter_shard("msgpack.zstf", shard.uri)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="storage_config must be a StorageConfig"):
        iter_shard("msgpack.zstf", shard, storage_config={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shard must be a ManifestShard"):
        iter_shard_batches("msgpack.zstf", {"uri": shard.uri})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown data format"):
        iter_shard("csv", shard)  # type: ignore[arg-type]
    # Nothing is opened before the first record is asked for.
    records = iter_shard("msgpack.zstf", shard)
    assert next(records)["i"] == 0
    records.close()


@pytest.mark.parametrize(
    ("records", "words"),
    [
        (None, "records must be an iterable of mappings, not NoneType"),
        ({"i": 1}, "not one mapping"),
        ("abc", "records must be an iterable of mappings, not str"),
        (5, "records must be an iterable of mappings, not int"),
    ],
)
def test_save_checks_its_records_at_the_call(tmp_path, records, words):
    saver = DatasetSaver(f"file://{tmp_path}/m.json", data_format="jsonl.gz")
    with pytest.raises(TypeError, match=words):
        saver.save("train", None, records)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"s3_base_url": "ftp://x"}, 'Invalid s3_base_url "ftp://x"'),
        ({"access_key_id": "AKIAEXAMPLE"}, "access_key_id needs secret_access_key"),
        ({"secret_access_key": "-secret"}, "secret_access_key needs access_key_id"),
    ],
)
def test_storage_config_checks_its_fields_when_created(options, words):
    with pytest.raises(ValueError, match=words) as info:
        StorageConfig.create(**options)
    assert "-secret" not in str(info.value)
