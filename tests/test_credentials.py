"""Every way to sign in: static keys with a session token, unsigned requests, the AWS default
chain (environment, web identity, container credentials, instance metadata, each refreshed
before it expires), a credential provider, and AWS profiles through botocore.

Sources that can sign for SeaweedFS are tested against it; the container credentials and
instance metadata services are played by ``credential_servers.FakeAws`` on 127.0.0.1, which
also records the headers of every store request (who signed it, with which token)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import multiprocessing
import os
import pickle
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from credential_servers import IMDS_TOKEN, ROLE, FakeAws, FakeSts, certificate_authority
from syvain_training_data import SyvainTrainingData
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    native_storage,
    put_object,
)

START_METHODS = ["fork", "spawn", "forkserver"]
UTC = datetime.UTC


@pytest.fixture
def clean_env(monkeypatch) -> None:
    """No AWS_* variable but AWS_EC2_METADATA_DISABLED, and no cached native client."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    native_storage.cache_clear()
    yield
    native_storage.cache_clear()


def read(fake: FakeAws, config: StorageConfig, times: int = 1) -> None:
    for i in range(times):
        assert get_object(f"s3://bucket/key-{i}", storage_config=config) == b"hello"


# --- 1. session tokens ------------------------------------------------------------------------


def test_session_token_is_sent_as_x_amz_security_token(clean_env):
    with FakeAws() as fake:
        client = SyvainTrainingData(
            s3_base_url=fake.url,
            access_key_id="AKIDTOKEN",
            secret_access_key="secret-value",
            session_token="session-token-value",
        )
        read(fake, client.storage_config)
        plain = SyvainTrainingData(
            s3_base_url=fake.url + "/", access_key_id="AKIDPLAIN", secret_access_key="s"
        )
        read(fake, plain.storage_config)
    [(_, _, with_token), (_, _, without)] = fake.s3_requests()
    assert with_token["x-amz-security-token"] == "session-token-value"
    assert "Credential=AKIDTOKEN/" in with_token["authorization"]
    assert "x-amz-security-token" not in without
    assert "Credential=AKIDPLAIN/" in without["authorization"]


def test_retry_warnings_and_errors_hold_no_credential(clean_env, caplog):
    from syvain_training_data.testing import storage_policy

    with FakeAws() as fake, storage_policy(backoff_base_s=0.001, backoff_cap_s=0.002):
        client = SyvainTrainingData(
            s3_base_url=fake.url,
            access_key_id="AKIDLOGS",
            secret_access_key="secret-in-no-log",
            session_token="token-in-no-log",
        )
        fake.fail_next = 2
        with caplog.at_level("WARNING", logger="syvain_training_data"):
            read(fake, client.storage_config)
    retries = [r.getMessage() for r in caplog.records if "Retrying" in r.getMessage()]
    assert len(retries) == 2
    for text in [*retries, repr(client), str(client.storage_config)]:
        assert "secret-in-no-log" not in text and "token-in-no-log" not in text
    assert [h["x-amz-security-token"] for _, _, h in fake.s3_requests()] == ["token-in-no-log"] * 3


def test_from_env_reads_the_session_token(clean_env, monkeypatch):
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "the-token",
    }
    config = SyvainTrainingData.from_env(env).storage_config
    assert config.session_token is not None
    assert config.session_token.get_secret_value() == "the-token"
    assert config.credential_source == "static"
    with pytest.raises(ValueError, match="session_token needs access_key_id"):
        StorageConfig.create(session_token="orphan-token")


def test_the_native_client_names_its_source_never_a_secret(clean_env):
    base = "http://127.0.0.1:9"
    for config, kind in [
        (
            StorageConfig.create(
                s3_base_url=base,
                access_key_id="AKID",
                secret_access_key="secret-value-1",
                session_token="token-value-1",
            ),
            "static",
        ),
        (StorageConfig.create(s3_base_url=base, skip_signature=True), "unsigned"),
        (StorageConfig.create(s3_base_url=base, credential_provider=_returns(GOOD)), "provider"),
        (StorageConfig.create(s3_base_url=base), "chain"),
    ]:
        text = repr(native_storage(config))
        assert f'credentials="{kind}"' in text
        assert "secret-value-1" not in text and "token-value-1" not in text


# --- 2. unsigned requests ---------------------------------------------------------------------


def test_skip_signature_sends_no_authorization(clean_env, monkeypatch):
    # Credentials in the environment are not used either.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    with FakeAws() as fake:
        client = SyvainTrainingData(s3_base_url=fake.url, skip_signature=True)
        read(fake, client.storage_config, times=2)
        assert head_object("s3://bucket/x", storage_config=client.storage_config).size == 5
        monkeypatch.setenv("AWS_SKIP_SIGNATURE", "true")
        monkeypatch.setenv("AWS_ENDPOINT_URL", fake.url)
        from_env = SyvainTrainingData.from_env()
        assert from_env.storage_config.skip_signature
        assert from_env.storage_config.access_key_id is None
        assert "skip_signature=True" in repr(from_env)
    for _, _, headers in fake.s3_requests():
        assert "authorization" not in headers
        assert "x-amz-security-token" not in headers
    with pytest.raises(ValueError, match="one source of credentials"):
        StorageConfig.create(skip_signature=True, access_key_id="a", secret_access_key="b")


# --- 3. the default chain ---------------------------------------------------------------------


def test_nothing_found_names_every_source_tried(clean_env, tmp_path):
    client = SyvainTrainingData(s3_base_url="http://127.0.0.1:9")
    # file:// needs no credentials at all.
    put_object(f"file://{tmp_path}/x", b"local", storage_config=client.storage_config)
    with pytest.raises(ValueError) as info:
        get_object("s3://bucket/key", storage_config=client.storage_config)
    message = str(info.value)
    assert message.startswith("s3://bucket/key: no credentials found")
    for source in (
        "AWS_ACCESS_KEY_ID",
        "web identity",
        "container credentials",
        "instance metadata (disabled by AWS_EC2_METADATA_DISABLED)",
        "credential_provider",
        "skip_signature",
    ):
        assert source in message


def test_the_chain_takes_keys_from_the_environment_first(clean_env, monkeypatch):
    with FakeAws() as fake:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
        monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
        client = SyvainTrainingData(s3_base_url=fake.url)
        assert client.storage_config.credential_source == "chain"
        read(fake, client.storage_config)
    assert fake.signing_keys() == ["AKIDENV"]
    assert fake.s3_requests()[0][2]["x-amz-security-token"] == "env-token"
    assert fake.credential_requests() == []


def test_web_identity_comes_before_container_credentials(clean_env, monkeypatch, tmp_path):
    missing = tmp_path / "no-such-token"
    with FakeAws() as fake:
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(missing))
        monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/test")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "https://127.0.0.1:9")
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        client = SyvainTrainingData(s3_base_url=fake.url)
        with pytest.raises(ValueError) as info:
            read(fake, client.storage_config)
    message = str(info.value)
    assert "could not get credentials from web identity" in message
    assert str(missing) in message
    assert fake.requests == []  # the token file is read before any request


@pytest.mark.parametrize("expires_in, keys", [(0, ["WEBKEY1", "WEBKEY2"]), (3600, ["WEBKEY1"] * 2)])
def test_web_identity_assumes_the_role_and_refreshes(
    clean_env, monkeypatch, tmp_path, expires_in, keys
):
    """AssumeRoleWithWebIdentity against an STS of ours over HTTPS on 127.0.0.1 (its CA is
    trusted through SSL_CERT_FILE), reading the rotated token file for every call."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    ca, cert, key = certificate_authority(str(tmp_path))
    token_file = tmp_path / "web-identity-token"
    token_file.write_text("jwt-1")  # sent as read (object_store does not strip it)
    with FakeSts(cert, key, expires_in=expires_in) as sts, FakeAws() as fake:
        monkeypatch.setenv("SSL_CERT_FILE", ca)
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
        monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/reader")
        monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "syvain-test")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
        client = SyvainTrainingData(s3_base_url=fake.url, region=f"web-{expires_in}")
        read(fake, client.storage_config)
        token_file.write_text("jwt-2")  # the token is rotated: read again for every call
        read(fake, client.storage_config)
    assert fake.signing_keys() == keys
    assert fake.s3_requests()[0][2]["x-amz-security-token"] == "web-token-1"
    assert [call["WebIdentityToken"] for call in sts.calls] == ["jwt-1", "jwt-2"][: len(set(keys))]
    assert {call["Action"] for call in sts.calls} == {"AssumeRoleWithWebIdentity"}
    assert {call["RoleArn"] for call in sts.calls} == {"arn:aws:iam::123456789012:role/reader"}
    assert {call["RoleSessionName"] for call in sts.calls} == {"syvain-test"}


def write_token(path: Path, token: str) -> None:
    path.write_text(token + "\n", encoding="utf-8")


def test_container_credentials_with_a_token_file_refresh_when_due(clean_env, monkeypatch, tmp_path):
    token_file = tmp_path / "eks-pod-identity-token"
    write_token(token_file, "first-token")
    with FakeAws(expires_in=0, container_token="first-token") as fake:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(token_file))
        client = SyvainTrainingData(s3_base_url=fake.url)
        read(fake, client.storage_config, times=2)
        # The agent rotates the token: the file is read again for every fetch.
        fake.container_token = "second-token"
        write_token(token_file, "second-token")
        read(fake, client.storage_config)
    # Already due for refresh when issued: every signed request fetched new credentials.
    assert fake.signing_keys() == ["KEY1", "KEY2", "KEY3"]
    assert [h["x-amz-security-token"] for _, _, h in fake.s3_requests()] == [
        "token-1",
        "token-2",
        "token-3",
    ]
    assert [h["authorization"] for _, _, h in fake.credential_requests()] == [
        "first-token",
        "first-token",
        "second-token",
    ]


def test_container_credentials_with_a_token_value_are_cached_until_due(clean_env, monkeypatch):
    with FakeAws(expires_in=3600, container_token="token-from-the-environment") as fake:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "token-from-the-environment")
        client = SyvainTrainingData(s3_base_url=fake.url)
        read(fake, client.storage_config, times=3)
    assert fake.signing_keys() == ["KEY1", "KEY1", "KEY1"]
    assert len(fake.credential_requests()) == 1


def test_container_credentials_errors_fail_at_once(clean_env, monkeypatch):
    with FakeAws(container_token="expected") as fake:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "wrong-token-value")
        client = SyvainTrainingData(s3_base_url=fake.url)
        with pytest.raises(ValueError) as info:
            read(fake, client.storage_config)
    assert f"container credentials ({fake.url}/creds)" in str(info.value)
    assert "401" in str(info.value)
    assert "wrong-token-value" not in str(info.value)
    assert fake.s3_requests() == []


def test_container_credentials_over_http_must_stay_local(clean_env, monkeypatch):
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://example.invalid/creds")
    client = SyvainTrainingData(s3_base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="must be https, or http to a loopback address"):
        get_object("s3://bucket/key", storage_config=client.storage_config)


@pytest.mark.parametrize("expires_in, keys", [(0, ["KEY1", "KEY2"]), (3600, ["KEY1", "KEY1"])])
def test_instance_metadata_imdsv2(clean_env, monkeypatch, expires_in, keys):
    with FakeAws(expires_in=expires_in) as fake:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url)
        client = SyvainTrainingData(s3_base_url=fake.url, region=f"imds-{expires_in}")
        read(fake, client.storage_config, times=2)
    assert fake.signing_keys() == keys
    fetch = [
        ("PUT", "/latest/api/token"),
        ("GET", "/latest/meta-data/iam/security-credentials/"),
        ("GET", f"/latest/meta-data/iam/security-credentials/{ROLE}"),
    ]
    requests = fake.credential_requests()
    assert [(method, path) for method, path, _ in requests] == fetch * len(set(keys))
    assert "x-aws-ec2-metadata-token-ttl-seconds" in requests[0][2]
    assert all(h["x-aws-ec2-metadata-token"] == IMDS_TOKEN for _, _, h in requests[1:3])


def _read_from(config: StorageConfig) -> None:
    assert get_object("s3://bucket/worker", storage_config=config) == b"hello"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_each_process_resolves_the_chain_itself(clean_env, monkeypatch, method):
    """A worker (forked or spawned) fetches its own credentials from its own environment and
    connections; the parent keeps its cached ones. (Not forkserver: its children inherit the
    environment the fork server started with, not this test's.)"""
    with FakeAws(expires_in=3600) as fake:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        client = SyvainTrainingData(s3_base_url=fake.url, region=f"per-process-{method}")
        read(fake, client.storage_config)
        context = multiprocessing.get_context(method)
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            pool.submit(_read_from, client.storage_config).result()
        read(fake, client.storage_config)
    assert fake.signing_keys() == ["KEY1", "KEY2", "KEY1"]


def test_unreachable_instance_metadata_names_every_source_tried(clean_env, monkeypatch):
    import socket

    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", endpoint)
    client = SyvainTrainingData(s3_base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError) as info:
        get_object("s3://bucket/key", storage_config=client.storage_config)
    message = str(info.value)
    assert message.startswith("s3://bucket/key: no credentials found; tried environment")
    assert "web identity" in message and "container credentials" in message
    assert f"could not get credentials from instance metadata (IMDSv2 at {endpoint})" in message


def test_container_credentials_come_before_instance_metadata(clean_env, monkeypatch):
    with FakeAws() as fake:
        monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url)
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        client = SyvainTrainingData(s3_base_url=fake.url)
        read(fake, client.storage_config)
    assert [path for _, path, _ in fake.credential_requests()] == ["/creds"]


# --- 4. credential providers ------------------------------------------------------------------


class FileProvider:
    """Reads the key pair from a JSON file, like a secret manager would: it pickles as its
    path, so every process reads the file itself. Counts its calls in this process."""

    calls = 0

    def __init__(self, path: str, expires_in: float | None = None) -> None:
        self.path = path
        self.expires_in = expires_in

    def __call__(self) -> Mapping[str, Any]:
        type(self).calls += 1
        with open(self.path, encoding="utf-8") as file:
            keys = json.load(file)
        result: dict[str, Any] = {
            "access_key_id": keys["id"],
            "secret_access_key": keys["secret"],
        }
        if self.expires_in is not None:
            expires_at = datetime.datetime.now(UTC) + datetime.timedelta(seconds=self.expires_in)
            result["expires_at"] = expires_at
        return result

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileProvider) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((self.path, self.expires_in))


def keys_file(seaweed, tmp_path: Path) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"id": seaweed.access_key_id, "secret": seaweed.secret_access_key}))
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("expires_in, calls", [(None, 1), (3600, 1), (0, 3), (-60, 3)])
def test_provider_signs_for_seaweedfs_and_is_called_again_when_due(
    seaweed, s3_bucket, unique_prefix, tmp_path, clean_env, expires_in, calls
):
    provider = FileProvider(keys_file(seaweed, tmp_path), expires_in)
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint, region=seaweed.region, credential_provider=provider
    )
    FileProvider.calls = 0
    uri = f"s3://{s3_bucket}/{unique_prefix}/provided.bin"
    put_object(uri, b"provided", storage_config=client.storage_config)
    assert get_object(uri, storage_config=client.storage_config) == b"provided"
    assert head_object(uri, storage_config=client.storage_config).size == 8
    assert FileProvider.calls == calls
    assert "credential_provider=test_credentials.FileProvider" in repr(client)


def test_provider_is_called_from_other_threads_without_the_gil(clean_env):
    """Requests from several threads at once: the provider runs on the native client's
    blocking threads, which take the GIL only for the call, while the callers wait without
    it (a provider that waits for another Python thread would deadlock otherwise)."""
    release = threading.Event()
    callers: list[str] = []

    def provider() -> Mapping[str, Any]:
        callers.append(threading.current_thread().name)
        assert release.wait(timeout=60)  # set by the main thread, which needs the GIL
        return {
            "access_key_id": "AKIDTHREADS",
            "secret_access_key": "secret",
            "session_token": "provided-token",
            "expires_at": datetime.datetime.now(UTC),  # due at once: called for every request
        }

    with FakeAws() as fake:
        config = SyvainTrainingData(s3_base_url=fake.url, credential_provider=provider)
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                get_object(f"s3://bucket/t{i}", storage_config=config.storage_config)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        release.set()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
    assert fake.signing_keys() == ["AKIDTHREADS"] * 4
    assert all(h["x-amz-security-token"] == "provided-token" for _, _, h in fake.s3_requests())
    assert len(callers) >= 4 and threading.main_thread().name not in callers


def _returns(value: Any):
    def provider() -> Any:
        return value

    provider.__qualname__ = "bad_provider"
    return provider


SECRET = "do-not-echo-this-secret"
GOOD = {"access_key_id": "AKID", "secret_access_key": SECRET}


@pytest.mark.parametrize(
    "returned, error, message",
    [
        (None, TypeError, "returned NoneType; expected a mapping"),
        ({"access_key_id": "AKID"}, ValueError, "returned no secret_access_key"),
        ({**GOOD, "access_key_id": 12}, TypeError, "returned access_key_id of type int"),
        ({**GOOD, "session_token": b"x"}, TypeError, "returned session_token of type bytes"),
        ({**GOOD, "secret_access_key": ""}, ValueError, "returned an empty secret_access_key"),
        ({**GOOD, "expires_at": "tomorrow"}, TypeError, "returned expires_at of type str"),
        (
            {**GOOD, "expires_at": datetime.datetime(2030, 1, 1)},
            ValueError,
            "returned a naive expires_at",
        ),
        ({**GOOD, "secret_key": SECRET}, ValueError, "returned unknown keys ['secret_key']"),
    ],
)
def test_bad_provider_answers_are_clear_errors(clean_env, returned, error, message):
    client = SyvainTrainingData(
        s3_base_url="http://127.0.0.1:9", credential_provider=_returns(returned)
    )
    with pytest.raises(error) as info:
        get_object("s3://bucket/key", storage_config=client.storage_config)
    assert type(info.value) is error
    text = str(info.value)
    assert text.startswith("s3://bucket/key: credential_provider test_credentials.bad_provider")
    assert message in text
    assert SECRET not in text


def test_a_failing_provider_is_named(clean_env):
    def failing() -> Mapping[str, Any]:
        raise RuntimeError("the vault is sealed")

    client = SyvainTrainingData(s3_base_url="http://127.0.0.1:9", credential_provider=failing)
    with pytest.raises(ValueError, match="failing raised RuntimeError: the vault is sealed"):
        get_object("s3://bucket/key", storage_config=client.storage_config)


@dataclasses.dataclass
class UnhashableProvider:
    key_id: str

    def __call__(self) -> Mapping[str, Any]:
        return {"access_key_id": self.key_id, "secret_access_key": "secret"}


def test_an_unhashable_provider_works(clean_env):
    with FakeAws() as fake:
        client = SyvainTrainingData(
            s3_base_url=fake.url, credential_provider=UnhashableProvider("AKIDDATACLASS")
        )
        read(fake, client.storage_config)
        same = StorageConfig.create(
            s3_base_url=fake.url, credential_provider=UnhashableProvider("AKIDDATACLASS")
        )
        assert same == client.storage_config and hash(same) == hash(client.storage_config)
    assert fake.signing_keys() == ["AKIDDATACLASS"]


def test_a_provider_pickles_as_itself(tmp_path, clean_env):
    provider = FileProvider(str(tmp_path / "keys.json"), 60)
    config = StorageConfig.create(s3_base_url="http://127.0.0.1:9", credential_provider=provider)
    assert pickle.loads(pickle.dumps(config)) == config
    assert pickle.loads(pickle.dumps(config)).credential_provider == provider
    with pytest.raises(ValueError, match="one source of credentials"):
        StorageConfig.create(credential_provider=provider, access_key_id="a", secret_access_key="b")


def _save_in_worker(saver, part: int):
    return saver.save("train", None, [{"id": part}], shard_id=f"p{part}")


def _save_pickled_in_worker(pickled: bytes, part: int):
    return _save_in_worker(pickle.loads(pickled), part)


@pytest.mark.parametrize("method", START_METHODS)
def test_provider_in_worker_processes(
    seaweed, s3_bucket, unique_prefix, tmp_path, clean_env, method
):
    """Each worker resolves its own credentials: the provider reaches it inside the saver,
    through multiprocessing's pickler and through a plain pickle alike, with no AWS_*
    variables anywhere."""
    provider = FileProvider(keys_file(seaweed, tmp_path), expires_in=3600)
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint, region=seaweed.region, credential_provider=provider
    )
    saver = client.dataset_saver(
        f"s3://{s3_bucket}/{unique_prefix}/data-manifest.json", data_format="msgpack.zstf"
    )
    pickled = pickle.dumps(saver)
    assert seaweed.secret_access_key.encode() not in pickled
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        direct = list(pool.map(_save_in_worker, [saver, saver], [0, 1]))
        plain = list(pool.map(_save_pickled_in_worker, [pickled, pickled], [2, 3]))
    manifest = saver.commit_manifest()
    assert manifest.splits["train"].shards == sorted(direct + plain, key=lambda s: s.uri)
    ids = [
        row["id"]
        for shard in manifest.splits["train"].shards
        for row in iter_shard("msgpack.zstf", shard, storage_config=client.storage_config)
    ]
    assert sorted(ids) == [0, 1, 2, 3]


def _ids(batch: list[dict[str, Any]]) -> list[str]:
    return [record["id"] for record in batch]


@pytest.mark.parametrize("method", START_METHODS)
def test_provider_in_loader_workers(seaweed, s3_bucket, unique_prefix, tmp_path, clean_env, method):
    """DataLoader workers (started by each method) read with the provider the dataset carries."""
    pytest.importorskip("torch")
    provider = FileProvider(keys_file(seaweed, tmp_path), expires_in=3600)
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint, region=seaweed.region, credential_provider=provider
    )
    uri = f"s3://{s3_bucket}/{unique_prefix}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    for part in range(3):
        records = [{"id": f"{part}-{i}"} for i in range(5)]
        saver.save("train", None, records, shard_id=f"part-{part}")
    saver.commit_manifest()
    args = {"num_workers": 2, "batch_size": 4, "multiprocessing_context": method}
    loader = client.split_data_loader(uri, _ids, args).load("train")
    ids = [record_id for batch in loader for record_id in batch]
    assert sorted(ids) == sorted(f"{part}-{i}" for part in range(3) for i in range(5))


# --- 5. AWS profiles --------------------------------------------------------------------------


def write_aws_files(tmp_path: Path, monkeypatch, config: str, credentials: str = "") -> None:
    (tmp_path / "config").write_text(config, encoding="utf-8")
    (tmp_path / "credentials").write_text(credentials, encoding="utf-8")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))


def test_profile_with_static_keys_signs_for_seaweedfs(
    seaweed, s3_bucket, unique_prefix, tmp_path, clean_env, monkeypatch
):
    pytest.importorskip("botocore")
    write_aws_files(
        tmp_path,
        monkeypatch,
        "[profile data]\nregion = us-east-1\n",
        f"[data]\naws_access_key_id = {seaweed.access_key_id}\n"
        f"aws_secret_access_key = {seaweed.secret_access_key}\n",
    )
    client = SyvainTrainingData(s3_base_url=seaweed.endpoint, region=seaweed.region, profile="data")
    uri = f"s3://{s3_bucket}/{unique_prefix}/profile.bin"
    put_object(uri, b"from a profile", storage_config=client.storage_config)
    assert get_object(uri, storage_config=client.storage_config) == b"from a profile"
    assert "profile='data'" in repr(client)
    # AWS_PROFILE: from_env picks it, and so does the chain of a client without keys.
    monkeypatch.setenv("AWS_PROFILE", "data")
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    assert SyvainTrainingData.from_env().storage_config.profile == "data"
    chain = SyvainTrainingData(s3_base_url=seaweed.endpoint, region=seaweed.region)
    assert get_object(uri, storage_config=chain.storage_config) == b"from a profile"


def test_profile_with_credential_process_sends_its_token(tmp_path, clean_env, monkeypatch):
    pytest.importorskip("botocore")
    answer = {
        "Version": 1,
        "AccessKeyId": "AKIDPROCESS",
        "SecretAccessKey": "process-secret",
        "SessionToken": "process-token",
        "Expiration": (datetime.datetime.now(UTC) + datetime.timedelta(hours=1)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        ),
    }
    script = tmp_path / "credential_process.py"
    script.write_text(f"import json\nprint(json.dumps({answer!r}))\n", encoding="utf-8")
    write_aws_files(
        tmp_path, monkeypatch, f"[profile proc]\ncredential_process = {sys.executable} {script}\n"
    )
    with FakeAws() as fake:
        client = SyvainTrainingData(s3_base_url=fake.url, profile="proc")
        read(fake, client.storage_config, times=2)
    assert fake.signing_keys() == ["AKIDPROCESS", "AKIDPROCESS"]
    assert all(h["x-amz-security-token"] == "process-token" for _, _, h in fake.s3_requests())


def test_profile_assuming_a_role_through_botocore(clean_env, monkeypatch, tmp_path):
    """An assume-role profile: botocore signs AssumeRole with the source profile's keys (at an
    STS of ours over HTTPS on 127.0.0.1) and the store requests carry the role's credentials."""
    pytest.importorskip("botocore")
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    ca, cert, key = certificate_authority(str(tmp_path))
    write_aws_files(
        tmp_path,
        monkeypatch,
        "[profile base]\nregion = us-east-1\n"
        "[profile reader]\nregion = us-east-1\nsource_profile = base\n"
        "role_arn = arn:aws:iam::123456789012:role/reader\n",
        "[base]\naws_access_key_id = AKIDBASE\naws_secret_access_key = base-secret\n",
    )
    with FakeSts(cert, key) as sts, FakeAws() as fake:
        monkeypatch.setenv("AWS_CA_BUNDLE", ca)
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
        client = SyvainTrainingData(s3_base_url=fake.url, profile="reader")
        read(fake, client.storage_config, times=2)
    assert fake.signing_keys() == ["ROLEKEY1", "ROLEKEY1"]
    assert fake.s3_requests()[0][2]["x-amz-security-token"] == "web-token-1"
    [call] = sts.calls
    assert call["Action"] == "AssumeRole"
    assert call["RoleArn"] == "arn:aws:iam::123456789012:role/reader"
    assert "Credential=AKIDBASE/" in (sts.authorizations[0] or "")


def test_sso_profile_through_botocore(clean_env, monkeypatch, tmp_path):
    """An SSO profile: botocore takes the cached SSO token (what `aws sso login` leaves) to the
    SSO portal (ours, over HTTPS on 127.0.0.1) for the role's credentials."""
    pytest.importorskip("botocore")
    import hashlib
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    ca, cert, key = certificate_authority(str(tmp_path))
    start_url = "https://example.awsapps.com/start"
    write_aws_files(
        tmp_path,
        monkeypatch,
        f"[profile sso]\nsso_start_url = {start_url}\nsso_region = us-east-1\n"
        "sso_account_id = 123456789012\nsso_role_name = reader\nregion = us-east-1\n",
    )
    cache = tmp_path / "sso-cache"
    cache.mkdir(parents=True)
    token = {
        "startUrl": start_url,
        "region": "us-east-1",
        "accessToken": "sso-access-token",
        "expiresAt": "2099-01-01T00:00:00Z",
    }
    name = hashlib.sha1(start_url.encode()).hexdigest()
    (cache / f"{name}.json").write_text(json.dumps(token), encoding="utf-8")
    # botocore fixes the token cache's directory (under ~) when it is imported.
    import botocore.credentials

    monkeypatch.setattr(botocore.credentials.SSOProvider, "_SSO_TOKEN_CACHE_DIR", str(cache))
    with FakeSts(cert, key) as portal, FakeAws() as fake:
        monkeypatch.setenv("AWS_CA_BUNDLE", ca)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", portal.url)
        client = SyvainTrainingData(s3_base_url=fake.url, profile="sso")
        read(fake, client.storage_config)
    assert fake.signing_keys() == ["SSOKEY"]
    assert fake.s3_requests()[0][2]["x-amz-security-token"] == "sso-session-token"
    [call] = portal.calls
    assert call == {
        "path": "/federation/credentials",
        "role_name": "reader",
        "account_id": "123456789012",
    }
    assert portal.authorizations == ["sso-access-token"]


def test_profiles_without_botocore_name_the_extra(clean_env, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "botocore", None)
    monkeypatch.setitem(sys.modules, "botocore.session", None)
    with pytest.raises(ModuleNotFoundError) as info:
        SyvainTrainingData(s3_base_url="http://127.0.0.1:9", profile="data")
    assert "'aws' extra" in str(info.value)
    assert "pip install 'syvain-training-data[aws]'" in str(info.value)
    # AWS_PROFILE set: local files still work; the first s3:// request names the extra.
    monkeypatch.setenv("AWS_PROFILE", "data")
    client = SyvainTrainingData(s3_base_url="http://127.0.0.1:9", region="no-botocore")
    put_object(f"file://{tmp_path}/x", b"local", storage_config=client.storage_config)
    with pytest.raises(ValueError, match=r"AWS_PROFILE=data.*syvain-training-data\[aws\]"):
        get_object("s3://bucket/key", storage_config=client.storage_config)
    # from_env takes AWS_PROFILE as the client's profile: the same, lazily.
    from_env = SyvainTrainingData.from_env(
        {"AWS_PROFILE": "data", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    )
    assert from_env.storage_config.profile == "data"
    with pytest.raises(ValueError, match=r"profile 'data'.*'aws' extra"):
        get_object("s3://bucket/key", storage_config=from_env.storage_config)


# --- 6. the command line ----------------------------------------------------------------------

MANIFEST = {
    "version": 1,
    "data_format": "jsonl.gz",
    "splits": {
        "train": {
            "records": 1,
            "shards": [{"uri": "s3://bucket/shard.jsonl.gz", "records": 1, "size_bytes": 1}],
        }
    },
}


def cli(*argv: str, env: Mapping[str, str]) -> tuple[int, str, str]:
    import io

    from syvain_training_data.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=dict(env), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_no_sign_request_and_profile(clean_env, monkeypatch, tmp_path):
    with FakeAws() as fake:
        fake.objects["/bucket/m.json"] = json.dumps(MANIFEST).encode()
        keys = {
            "AWS_ENDPOINT_URL": fake.url,
            "AWS_ACCESS_KEY_ID": "AKIDENV",
            "AWS_SECRET_ACCESS_KEY": "env-secret",
        }
        code, out, err = cli("--no-sign-request", "inspect", "s3://bucket/m.json", env=keys)
        assert (code, err) == (0, "") and "train" in out
        code, _, _ = cli("inspect", "s3://bucket/m.json", env=keys)
        assert code == 0
        pytest.importorskip("botocore")
        write_aws_files(
            tmp_path,
            monkeypatch,
            "",
            "[cli]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = s\n",
        )
        code, _, err = cli("inspect", "s3://bucket/m.json", "--profile", "cli", env=keys)
        assert (code, err) == (0, "")
    # Unsigned, then the environment's keys, then the profile (which wins over them); each
    # manifest read is a HEAD (its size against the limit) then one GET.
    assert fake.signing_keys() == [None, None, "AKIDENV", "AKIDENV", "AKIDPROFILE", "AKIDPROFILE"]


def test_cli_credential_usage_errors(clean_env):
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    code, _, err = cli("--profile", "a", "--no-sign-request", "inspect", "s3://b/m.json", env=env)
    assert code == 2 and "give one of --profile, --no-sign-request" in err
    code, _, err = cli("inspect", "s3://b/m.json", env=env)
    assert code == 2 and "no credentials found; tried" in err
