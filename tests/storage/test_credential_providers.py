"""Credential providers (called again when due, from other threads, in worker processes),
AWS profiles through botocore, and the command line's credential options.

Sources that can sign for SeaweedFS are tested against it; the container credentials and
instance metadata services are played by ``credential_servers.FakeAws`` on 127.0.0.1, which
also verifies the SigV4 signature of every store request (``signers``: the key, secret and
session token that signed it)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import multiprocessing
import pickle
import sys
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from credential_servers import (
    ANSWER_SECRET,
    GOOD_ANSWER,
    FakeAws,
    FakeSts,
    certificate_authority,
    returns_answer,
)
from syvain_training_data import SyvainTrainingData
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import (
    StorageConfig,
    get_object,
    head_object,
    put_object,
)

START_METHODS = ["fork", "spawn", "forkserver"]
UTC = datetime.UTC


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
    assert "credential_provider=test_credential_providers.FileProvider" in repr(client)


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
        fake.trust("AKIDTHREADS", "secret", "provided-token")
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
    assert fake.signers() == [("AKIDTHREADS", "secret", "provided-token")] * 4
    assert len(callers) >= 4 and threading.main_thread().name not in callers


@pytest.mark.parametrize(
    "returned, error, message",
    [
        (None, TypeError, "returned NoneType; expected a mapping"),
        ({"access_key_id": "AKID"}, ValueError, "returned no secret_access_key"),
        ({**GOOD_ANSWER, "access_key_id": 12}, TypeError, "returned access_key_id of type int"),
        ({**GOOD_ANSWER, "session_token": b"x"}, TypeError, "returned session_token of type bytes"),
        (
            {**GOOD_ANSWER, "secret_access_key": ""},
            ValueError,
            "returned an empty secret_access_key",
        ),
        ({**GOOD_ANSWER, "expires_at": "tomorrow"}, TypeError, "returned expires_at of type str"),
        (
            {**GOOD_ANSWER, "expires_at": datetime.datetime(2030, 1, 1)},
            ValueError,
            "returned a naive expires_at",
        ),
        (
            {**GOOD_ANSWER, "secret_key": ANSWER_SECRET},
            ValueError,
            "returned unknown keys ['secret_key']",
        ),
    ],
)
def test_bad_provider_answers_are_clear_errors(clean_env, returned, error, message):
    client = SyvainTrainingData(
        s3_base_url="http://127.0.0.1:9", credential_provider=returns_answer(returned)
    )
    with pytest.raises(error) as info:
        get_object("s3://bucket/key", storage_config=client.storage_config)
    assert type(info.value) is error
    text = str(info.value)
    assert text.startswith("s3://bucket/key: credential_provider credential_servers.bad_provider")
    assert message in text
    assert ANSWER_SECRET not in text


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
        fake.trust("AKIDDATACLASS", "secret")
        client = SyvainTrainingData(
            s3_base_url=fake.url, credential_provider=UnhashableProvider("AKIDDATACLASS")
        )
        fake.read(client.storage_config)
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
def test_provider_in_loader_workers(
    seaweed, s3_bucket, unique_prefix, tmp_path, clean_env, method, save_three_parts
):
    """DataLoader workers (started by each method) read with the provider the dataset carries."""
    pytest.importorskip("torch")
    provider = FileProvider(keys_file(seaweed, tmp_path), expires_in=3600)
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint, region=seaweed.region, credential_provider=provider
    )
    uri = f"s3://{s3_bucket}/{unique_prefix}/data-manifest.json"
    save_three_parts(client, uri)
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
        fake.trust("AKIDPROCESS", "process-secret", "process-token")
        client = SyvainTrainingData(s3_base_url=fake.url, profile="proc")
        fake.read(client.storage_config, times=2)
    assert fake.signers() == [("AKIDPROCESS", "process-secret", "process-token")] * 2


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
    with FakeSts(cert, key) as sts, FakeAws(issuers=(sts,)) as fake:
        monkeypatch.setenv("AWS_CA_BUNDLE", ca)
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
        client = SyvainTrainingData(s3_base_url=fake.url, profile="reader")
        fake.read(client.storage_config, times=2)
    assert fake.signers() == [("ROLEKEY1", "web-secret-1", "web-token-1")] * 2
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
    with FakeSts(cert, key) as portal, FakeAws(issuers=(portal,)) as fake:
        monkeypatch.setenv("AWS_CA_BUNDLE", ca)
        monkeypatch.setenv("AWS_ENDPOINT_URL_SSO", portal.url)
        client = SyvainTrainingData(s3_base_url=fake.url, profile="sso")
        fake.read(client.storage_config)
    assert fake.signers() == [("SSOKEY", "sso-secret", "sso-session-token")]
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
        fake.trust("AKIDENV", "env-secret")
        fake.trust("AKIDPROFILE", "s")
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
