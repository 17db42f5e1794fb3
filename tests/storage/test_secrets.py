"""Secrets travel to worker processes through multiprocessing's own pickler (process start,
pool queues, DataLoader workers), so explicit credentials work under fork, spawn and forkserver
with no AWS_* variables; they do not travel in plain pickles or cloudpickles (Ray tasks, whose
object store may spill them to disk) unless the user opts in, and such copies authenticate from
their own environment; a secret of the wrong type is not echoed in validation errors."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from credential_servers import FakeAws
from syvain_training_data import SyvainTrainingData
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig, get_object, native_storage

START_METHODS = ["fork", "spawn", "forkserver"]
README = Path(__file__).resolve().parents[2] / "README.md"


class SubclassedConfig(StorageConfig):
    pass


def cloudpickle_dumps() -> Any:
    """``cloudpickle.dumps`` (Ray's copy if cloudpickle itself is not installed), or None."""
    try:
        import cloudpickle
    except ModuleNotFoundError:
        try:
            from ray import cloudpickle
        except ModuleNotFoundError:
            return None
    return cloudpickle.dumps


def explicit_client(seaweed) -> SyvainTrainingData:
    return SyvainTrainingData(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )


def remove_aws_environment(monkeypatch) -> None:
    """No AWS_* variable in this process, so none in its fork and spawn children either (but
    conftest's AWS_EC2_METADATA_DISABLED: no test reaches the instance metadata service)."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        if name != "AWS_EC2_METADATA_DISABLED":
            monkeypatch.delenv(name)


def forking_dumps(value: Any, protocol: int | None = None) -> bytes:
    """What multiprocessing sends to a worker for ``value``."""
    return bytes(ForkingPickler.dumps(value, protocol))


CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
FORKSERVER_NOTE = (
    "a forkserver's children inherit the environment it started with: an earlier test "
    "started it with AWS credentials in its environment"
)


def _credential_variables() -> list[str]:
    """The credential variables this process has (an unpickled config could fall back on)."""
    return [name for name in CREDENTIAL_VARIABLES if name in os.environ]


def worker_credential_variables(method: str) -> list[str]:
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_credential_variables).result()


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
    cloudpickled = cloudpickle_dumps()
    for client in (SyvainTrainingData.from_env(), explicit):
        saver = client.dataset_saver(f"s3://{s3_bucket}/{unique_prefix}/m.json")
        for value in (client, client.storage_config, saver):
            for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
                assert secret not in pickle.dumps(value, protocol=protocol)
            if cloudpickled is not None:
                assert secret not in cloudpickled(value)
        # Unpickled here, the secret comes back from the environment: the same config.
        assert pickle.loads(pickle.dumps(client.storage_config)) == client.storage_config
        assert pickle.loads(pickle.dumps(saver)).storage_config == saver.storage_config


def test_multiprocessing_pickles_carry_the_secret(seaweed, s3_bucket, unique_prefix, monkeypatch):
    remove_aws_environment(monkeypatch)
    secret = seaweed.secret_access_key.encode()
    client = explicit_client(seaweed)
    saver = client.dataset_saver(f"s3://{s3_bucket}/{unique_prefix}/m.json")
    for value in (client, client.storage_config, saver):
        assert secret in forking_dumps(value)
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            assert secret in forking_dumps(value, protocol=protocol)
    copy = ForkingPickler.loads(forking_dumps(saver))
    assert copy.storage_config == saver.storage_config
    assert copy.storage_config.secret_access_key is not None
    native_storage(copy.storage_config)  # no "was not pickled" error
    # What a worker got from multiprocessing and pickles again with plain pickle holds no secret.
    assert secret not in pickle.dumps(copy)
    # ForkingPickler dispatches by exact type: subclasses are registered too.
    config = SubclassedConfig(**dict(client.storage_config))
    assert secret in forking_dumps(config) and secret not in pickle.dumps(config)


def test_picklable_secret_is_an_explicit_opt_in(aws_env):
    secret = aws_env["AWS_SECRET_ACCESS_KEY"]
    client = SyvainTrainingData.from_env(picklable_secret=True)
    data = pickle.dumps(client.storage_config)
    assert secret.encode() in data
    config = StorageConfig.create(
        access_key_id=aws_env["AWS_ACCESS_KEY_ID"], secret_access_key=secret, picklable_secret=True
    )
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
    # A config unpickled without its secret stays without it through multiprocessing's pickler,
    # and the next process looks in its own environment again.
    withheld = pickle.loads(data)
    assert secret_bytes(aws_env) not in forking_dumps(withheld)
    with pytest.raises(ValueError, match="was not pickled"):
        native_storage(ForkingPickler.loads(forking_dumps(withheld)))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, aws_env[name])
    assert ForkingPickler.loads(forking_dumps(withheld)) == config
    assert pickle.loads(pickle.dumps(withheld)) == config


def secret_bytes(env: dict[str, str]) -> bytes:
    return env["AWS_SECRET_ACCESS_KEY"].encode()


def _save_pickled_in_worker(pickled: bytes, part: int):
    saver = pickle.loads(pickled)
    return saver.save("train", None, [{"id": part, "text": "x"}], shard_id=f"p{part}")


def test_plain_pickles_authenticate_from_the_workers_environment(aws_env, s3_bucket, unique_prefix):
    client = SyvainTrainingData.from_env()
    saver = client.dataset_saver(
        f"s3://{s3_bucket}/{unique_prefix}/data-manifest.json", data_format="msgpack.zstf"
    )
    pickled = pickle.dumps(saver)  # no secret: each spawned worker takes it from its environment
    assert secret_bytes(aws_env) not in pickled
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        shards = list(pool.map(_save_pickled_in_worker, [pickled, pickled], [0, 1]))
    manifest = saver.commit_manifest()
    assert manifest.splits["train"].shards == sorted(shards, key=lambda shard: shard.uri)
    rows = [
        row
        for shard in manifest.splits["train"].shards
        for row in iter_shard("msgpack.zstf", shard, storage_config=client.storage_config)
    ]
    assert sorted(row["id"] for row in rows) == [0, 1]


def readme_block(marker: str) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)
    [block] = [block for block in blocks if marker in block]
    return block


@pytest.mark.parametrize("method", START_METHODS)
def test_readme_process_pool_example_with_explicit_credentials(seaweed, monkeypatch, method):
    """The README's example verbatim but for its start method: the workers save with the
    explicit credentials and no AWS_* variables, the parent commits, the manifest loads."""
    code = readme_block("ProcessPoolExecutor(")
    spawn = 'multiprocessing.get_context("spawn")'
    assert code.count(spawn) == 1
    code = code.replace(spawn, f'multiprocessing.get_context("{method}")')
    remove_aws_environment(monkeypatch)
    # What the example reads, then removes, from the environment.
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_access_key)
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    exec(compile(code, f"README.md process-pool example ({method})", "exec"), namespace)
    assert _credential_variables() == []  # the example took them out
    if method == "forkserver":  # fork and spawn children copy this process's environment
        assert worker_credential_variables(method) == [], FORKSERVER_NOTE
    shards, manifest, saver = namespace["shards"], namespace["manifest"], namespace["saver"]
    assert len(shards) == 4  # every job saved in a worker
    client = explicit_client(seaweed)
    assert client.load_manifest(saver.manifest_uri) == manifest
    ids = [
        record["id"]
        for split in manifest.splits.values()
        for shard in split.shards
        for record in iter_shard("msgpack.zstf", shard, storage_config=client.storage_config)
    ]
    assert sorted(ids) == sorted(f"{part}-{i}" for part in range(4) for i in range(100))


def _ids_and_worker_credentials(batch: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    return [record["id"] for record in batch], _credential_variables()


@pytest.mark.parametrize("method", START_METHODS)
def test_loader_workers_read_with_explicit_credentials(
    seaweed, s3_bucket, unique_prefix, monkeypatch, method, save_three_parts
):
    pytest.importorskip("torch")
    remove_aws_environment(monkeypatch)
    client = explicit_client(seaweed)
    uri = f"s3://{s3_bucket}/{unique_prefix}/data-manifest.json"
    save_three_parts(client, uri)
    args = {"num_workers": 2, "batch_size": 4, "multiprocessing_context": method}
    loader = client.split_data_loader(uri, _ids_and_worker_credentials, args).load("train")
    secret = seaweed.secret_access_key.encode()
    assert secret not in pickle.dumps(loader.dataset)
    assert secret in forking_dumps(loader.dataset)  # how spawn/forkserver workers get it
    ids: list[str] = []
    for batch_ids, worker_credentials in loader:
        # Nothing to fall back on in the worker: the secret came with the dataset.
        assert worker_credentials == [], FORKSERVER_NOTE
        ids.extend(batch_ids)
    assert sorted(ids) == sorted(f"{part}-{i}" for part in range(3) for i in range(5))


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


# --- session tokens: a secret exactly like the secret key ---------------------------------------

TOKEN = "session-token-value-0123456789"


def token_client(seaweed, **extra: Any) -> SyvainTrainingData:
    return SyvainTrainingData(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
        session_token=TOKEN,
        **extra,
    )


def test_session_tokens_stay_out_of_reprs_and_plain_pickles(
    seaweed, s3_bucket, unique_prefix, monkeypatch
):
    remove_aws_environment(monkeypatch)
    client = token_client(seaweed)
    saver = client.dataset_saver(f"s3://{s3_bucket}/{unique_prefix}/m.json")
    token = TOKEN.encode()
    assert TOKEN not in repr(client) and "session_token=***" in repr(client)
    assert TOKEN not in repr(client.storage_config) and TOKEN not in str(client.storage_config)
    assert TOKEN not in repr(native_storage(client.storage_config))
    cloudpickled = cloudpickle_dumps()
    for value in (client, client.storage_config, saver):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            assert token not in pickle.dumps(value, protocol=protocol)
            # multiprocessing's pickler carries it, exactly as it carries the secret.
            assert token in forking_dumps(value, protocol=protocol)
        if cloudpickled is not None:
            assert token not in cloudpickled(value)
    copy = ForkingPickler.loads(forking_dumps(saver))
    assert copy.storage_config == saver.storage_config
    assert token not in pickle.dumps(copy)  # and a worker's plain pickle holds none again
    assert token in pickle.dumps(token_client(seaweed, picklable_secret=True).storage_config)


def test_an_unpickled_token_comes_back_from_the_environment(seaweed, monkeypatch):
    remove_aws_environment(monkeypatch)
    config = token_client(seaweed).storage_config
    data = pickle.dumps(config)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_access_key)
    # The secret alone is not enough for a config that had a token.
    withheld = pickle.loads(data)
    with pytest.raises(ValueError, match="AWS_SESSION_TOKEN") as info:
        native_storage(withheld)
    assert "secret access key and session token" in str(info.value)
    assert TOKEN not in str(info.value) and seaweed.secret_access_key not in str(info.value)
    # Withheld stays withheld through both picklers, and asks for the token again.
    assert TOKEN.encode() not in forking_dumps(withheld)
    with pytest.raises(ValueError, match="AWS_SESSION_TOKEN"):
        native_storage(ForkingPickler.loads(forking_dumps(withheld)))
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    assert pickle.loads(data) == config
    assert pickle.loads(pickle.dumps(withheld)) == config
    assert ForkingPickler.loads(forking_dumps(withheld)) == config
    # A config without a token does not pick one up from the environment.
    plain = explicit_client(seaweed).storage_config
    assert pickle.loads(pickle.dumps(plain)).session_token is None


def test_a_token_of_the_wrong_type_is_not_echoed():
    for build in (
        lambda: StorageConfig.create(
            access_key_id="a",
            secret_access_key="b",
            session_token=b"bytes-token-value-1234",  # type: ignore[arg-type]
        ),
        lambda: SyvainTrainingData(
            access_key_id="a",
            secret_access_key="b",
            session_token=b"bytes-token-value-1234",  # type: ignore[arg-type]
        ),
    ):
        with pytest.raises(ValidationError) as info:
            build()
        assert "bytes-token-value-1234" not in str(info.value)
        assert "session_token" in str(info.value)


def _read_in_worker(config: StorageConfig, part: int) -> list[str]:
    assert get_object(f"s3://bucket/worker-{part}", storage_config=config) == b"hello"
    return _credential_variables()


@pytest.mark.parametrize("method", START_METHODS)
def test_session_tokens_reach_workers_under_every_start_method(monkeypatch, method):
    """Workers get the token with the config through multiprocessing's pickler, with no AWS_*
    variables, and sign with it. (SeaweedFS refuses a token it did not issue, so a recording
    server on 127.0.0.1 plays the store and shows each request's headers.)"""
    remove_aws_environment(monkeypatch)
    with FakeAws() as fake:
        client = SyvainTrainingData(
            s3_base_url=fake.url,
            access_key_id="AKIDWORKER",
            secret_access_key="worker-secret",
            session_token=TOKEN,
        )
        fake.trust("AKIDWORKER", "worker-secret", TOKEN)
        context = multiprocessing.get_context(method)
        with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
            configs = [client.storage_config] * 2
            for worker_credentials in pool.map(_read_in_worker, configs, [0, 1]):
                assert worker_credentials == [], FORKSERVER_NOTE
    assert fake.signing_keys() == ["AKIDWORKER", "AKIDWORKER"]
    assert [headers["x-amz-security-token"] for _, _, headers in fake.s3_requests()] == [
        TOKEN,
        TOKEN,
    ]
