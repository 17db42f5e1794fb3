"""Signing in without a provider: static keys with a session token, unsigned requests, and the
AWS default chain (environment, web identity, container credentials, instance metadata, each
refreshed before it expires). Providers and profiles: test_credential_providers.py.

Sources that can sign for SeaweedFS are tested against it; the container credentials and
instance metadata services are played by ``credential_servers.FakeAws`` on 127.0.0.1, which
also verifies the SigV4 signature of every store request with the credentials it handed out
(``signers``: the access key, secret and session token that signed it)."""

from __future__ import annotations

import datetime
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from credential_servers import (
    GOOD_ANSWER,
    IMDS_TOKEN,
    ROLE,
    FakeAws,
    FakeSts,
    certificate_authority,
    returns_answer,
)
from syvain_training_data import SyvainTrainingData
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    native_storage,
    put_object,
)

START_METHODS = ["fork", "spawn", "forkserver"]
UTC = datetime.UTC


# --- 1. session tokens ------------------------------------------------------------------------


def test_session_token_is_sent_as_x_amz_security_token(clean_env):
    """Static keys with a session token sign with the secret and send the token signed; without
    a token none is sent."""
    with FakeAws() as fake:
        fake.trust("AKIDTOKEN", "secret-value", "session-token-value")
        fake.trust("AKIDPLAIN", "s")
        client = SyvainTrainingData(
            s3_base_url=fake.url,
            access_key_id="AKIDTOKEN",
            secret_access_key="secret-value",
            session_token="session-token-value",
        )
        fake.read(client.storage_config)
        plain = SyvainTrainingData(
            s3_base_url=fake.url + "/", access_key_id="AKIDPLAIN", secret_access_key="s"
        )
        fake.read(plain.storage_config)
    assert fake.signers() == [
        ("AKIDTOKEN", "secret-value", "session-token-value"),
        ("AKIDPLAIN", "s", None),
    ]


def test_retry_warnings_and_errors_hold_no_credential(clean_env, caplog):
    from syvain_training_data.testing import storage_policy

    with FakeAws() as fake, storage_policy(backoff_base_s=0.001, backoff_cap_s=0.002):
        client = SyvainTrainingData(
            s3_base_url=fake.url,
            access_key_id="AKIDLOGS",
            secret_access_key="secret-in-no-log",
            session_token="token-in-no-log",
        )
        fake.trust("AKIDLOGS", "secret-in-no-log", "token-in-no-log")
        fake.fail_next = 2
        with caplog.at_level("WARNING", logger="syvain_training_data"):
            fake.read(client.storage_config)
    retries = [r.getMessage() for r in caplog.records if "Retrying" in r.getMessage()]
    assert len(retries) == 2
    for text in [*retries, repr(client), str(client.storage_config)]:
        assert "secret-in-no-log" not in text and "token-in-no-log" not in text
    assert fake.signers() == [("AKIDLOGS", "secret-in-no-log", "token-in-no-log")] * 3


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
        (
            StorageConfig.create(s3_base_url=base, credential_provider=returns_answer(GOOD_ANSWER)),
            "provider",
        ),
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
        fake.read(client.storage_config, times=2)
        assert head_object("s3://bucket/x", storage_config=client.storage_config).size == 5
        monkeypatch.setenv("AWS_SKIP_SIGNATURE", "true")
        monkeypatch.setenv("AWS_ENDPOINT_URL", fake.url)
        from_env = SyvainTrainingData.from_env()
        assert from_env.storage_config.skip_signature
        assert from_env.storage_config.access_key_id is None
        assert "skip_signature=True" in repr(from_env)
    assert fake.signers() == [None] * 3
    for _, _, headers in fake.s3_requests():
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
        fake.trust("AKIDENV", "env-secret", "env-token")
        client = SyvainTrainingData(s3_base_url=fake.url)
        assert client.storage_config.credential_source == "chain"
        fake.read(client.storage_config)
    assert fake.signers() == [("AKIDENV", "env-secret", "env-token")]
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
            fake.read(client.storage_config)
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
    with FakeSts(cert, key, expires_in=expires_in) as sts, FakeAws(issuers=(sts,)) as fake:
        monkeypatch.setenv("SSL_CERT_FILE", ca)
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
        monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/reader")
        monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "syvain-test")
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
        client = SyvainTrainingData(s3_base_url=fake.url, region=f"web-{expires_in}")
        fake.read(client.storage_config)
        token_file.write_text("jwt-2")  # the token is rotated: read again for every call
        fake.read(client.storage_config)
    assert fake.signers() == [(k, f"web-secret-{k[-1]}", f"web-token-{k[-1]}") for k in keys]
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
        fake.read(client.storage_config, times=2)
        # The agent rotates the token: the file is read again for every fetch.
        fake.container_token = "second-token"
        write_token(token_file, "second-token")
        fake.read(client.storage_config)
    # Already due for refresh when issued: every signed request fetched new credentials.
    assert fake.signers() == [(f"KEY{n}", f"secret-{n}", f"token-{n}") for n in (1, 2, 3)]
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
        fake.read(client.storage_config, times=3)
    assert fake.signers() == [("KEY1", "secret-1", "token-1")] * 3
    assert len(fake.credential_requests()) == 1


def test_container_credentials_errors_fail_at_once(clean_env, monkeypatch):
    with FakeAws(container_token="expected") as fake:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", f"{fake.url}/creds")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "wrong-token-value")
        client = SyvainTrainingData(s3_base_url=fake.url)
        with pytest.raises(ValueError) as info:
            fake.read(client.storage_config)
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
        fake.read(client.storage_config, times=2)
    assert fake.signers() == [(k, f"secret-{k[-1]}", f"token-{k[-1]}") for k in keys]
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
        fake.read(client.storage_config)
        context = multiprocessing.get_context(method)
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            pool.submit(_read_from, client.storage_config).result()
        fake.read(client.storage_config)
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
        fake.read(client.storage_config)
    assert [path for _, path, _ in fake.credential_requests()] == ["/creds"]
