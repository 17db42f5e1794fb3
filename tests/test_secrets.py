"""Secrets do not travel in pickles (savers go to worker processes and Ray tasks, whose object
store may spill them to disk) unless the user opts in, workers authenticate from their own
environment, and a secret of the wrong type is not echoed in validation errors."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest
from pydantic import ValidationError

from syvain_training_data import SyvainTrainingData
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig, native_storage


@pytest.fixture
def aws_env(seaweed, monkeypatch) -> dict[str, str]:
    """The SeaweedFS credentials in this process's environment (inherited by spawned workers)."""
    env = seaweed.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_pickles_of_clients_configs_and_savers_hold_no_secret(aws_env, s3_bucket, unique_prefix):
    secret = aws_env["AWS_SECRET_ACCESS_KEY"].encode()
    explicit = SyvainTrainingData(
        s3_base_url=aws_env["AWS_ENDPOINT_URL"],
        access_key_id=aws_env["AWS_ACCESS_KEY_ID"],
        secret_access_key=aws_env["AWS_SECRET_ACCESS_KEY"],
    )
    for client in (SyvainTrainingData.from_env(), explicit):
        saver = client.dataset_saver(f"s3://{s3_bucket}/{unique_prefix}/m.json")
        for value in (client, client.storage_config, saver):
            for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
                assert secret not in pickle.dumps(value, protocol=protocol)
        # Unpickled here, the secret comes back from the environment: the same config.
        assert pickle.loads(pickle.dumps(client.storage_config)) == client.storage_config
        assert pickle.loads(pickle.dumps(saver)).storage_config == saver.storage_config


def test_picklable_secret_is_an_explicit_opt_in(aws_env):
    secret = aws_env["AWS_SECRET_ACCESS_KEY"]
    client = SyvainTrainingData.from_env(picklable_secret=True)
    data = pickle.dumps(client.storage_config)
    assert secret.encode() in data
    config = StorageConfig.create(secret_access_key=secret, picklable_secret=True)
    assert pickle.loads(pickle.dumps(config)) == config


def test_an_unpickled_config_without_its_secret_fails_clearly(aws_env, monkeypatch):
    config = SyvainTrainingData.from_env().storage_config
    data = pickle.dumps(config)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ValueError, match="was not pickled") as info:
        native_storage(pickle.loads(data))
    assert aws_env["AWS_SECRET_ACCESS_KEY"] not in str(info.value)
    # Another key's secret in the environment is not paired with this key id.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "another-secret")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ANOTHERKEY")
    with pytest.raises(ValueError, match="was not pickled"):
        native_storage(pickle.loads(data))


def _save_in_worker(saver, part: int):
    return saver.save("train", None, [{"id": part, "text": "x"}], shard_id=f"p{part}")


def test_spawned_workers_authenticate_from_their_environment(aws_env, s3_bucket, unique_prefix):
    client = SyvainTrainingData.from_env()
    saver = client.dataset_saver(
        f"s3://{s3_bucket}/{unique_prefix}/data-manifest.json", data_format="msgpack.zstf"
    )
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        shards = list(pool.map(_save_in_worker, [saver, saver], [0, 1]))
    manifest = saver.commit_manifest()
    assert manifest.splits["train"].shards == sorted(shards, key=lambda shard: shard.uri)
    rows = [
        row
        for shard in manifest.splits["train"].shards
        for row in iter_shard("msgpack.zstf", shard, storage_config=client.storage_config)
    ]
    assert sorted(row["id"] for row in rows) == [0, 1]


@pytest.mark.parametrize(
    "wrong", [b"bytes-secret-value-1234", 12345678901234, ["list-secret-5678"]]
)
def test_a_secret_of_the_wrong_type_is_not_echoed(wrong):
    for build in (
        lambda: StorageConfig.create(secret_access_key=wrong),  # type: ignore[arg-type]
        lambda: SyvainTrainingData(secret_access_key=wrong),  # type: ignore[arg-type]
        lambda: StorageConfig(secret_access_key=wrong),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValidationError) as info:
            build()
        assert str(wrong).strip("[]'b") not in str(info.value)
        assert "secret_access_key" in str(info.value)
