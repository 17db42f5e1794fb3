"""What a command runs with (`cli/context.py`): local paths as file:// URIs, credentials from
flags, files, stdin and the environment, secrets never printed, and shard schemes confined to
the manifest's."""

from __future__ import annotations

import io
import json

import pytest

from cli_support import file_store, publish, run
from syvain_training_data import SyvainTrainingData


def test_local_paths_are_accepted_as_file_uris(tmp_path, monkeypatch):
    manifest_uri = publish(file_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = run("inspect", "dataset/data-manifest.json")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == f"manifest  {manifest_uri}"


def test_flags_override_the_environment(s3_store):
    manifest_uri = publish(s3_store)
    env = s3_store.env
    wrong = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "nobody"}
    flags = ["--endpoint-url", env["AWS_ENDPOINT_URL"], "--access-key-id", env["AWS_ACCESS_KEY_ID"]]
    result = run(*flags, "inspect", manifest_uri, env=wrong)
    assert result.code == 0, result.err
    # After the subcommand too; the secret from the flag, nothing from the environment.
    secret = [f"--secret-access-key={env['AWS_SECRET_ACCESS_KEY']}"]
    result = run("inspect", manifest_uri, *flags, *secret)
    assert result.code == 0, result.err


def test_secret_beginning_with_a_dash_and_secret_files(s3_store, tmp_path):
    manifest_uri = publish(s3_store)
    env = dict(s3_store.env)
    secret = env.pop("AWS_SECRET_ACCESS_KEY")
    dashed = "-" + secret[1:]  # any user's secret may begin with "-"
    # Taken as the secret (the store refuses it: exit 1), not as a missing value (exit 2).
    for argv in (
        [f"--secret-access-key={dashed}", "inspect", manifest_uri],
        ["inspect", manifest_uri, f"--secret-access-key={dashed}"],
    ):
        result = run(*argv, env=env)
        assert result.code == 1 and "PermissionError" in result.err, result.err
        assert dashed not in result.out + result.err
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    result = run("inspect", manifest_uri, "--secret-access-key-file", str(secret_file), env=env)
    assert result.code == 0, result.err
    dashed_file = tmp_path / "dashed"
    dashed_file.write_text(dashed + "\n")
    result = run("--secret-access-key-file", str(dashed_file), "inspect", manifest_uri, env=env)
    assert result.code == 1 and "PermissionError" in result.err
    missing = run("inspect", manifest_uri, "--secret-access-key-file", str(tmp_path / "none"))
    assert missing.code == 2 and "cannot read the secret key" in missing.err
    both = ["--secret-access-key-file", str(secret_file), f"--secret-access-key={secret}"]
    assert run("inspect", manifest_uri, *both, env=env).code == 2


def test_secret_from_stdin(s3_store, monkeypatch):
    manifest_uri = publish(s3_store)
    env = dict(s3_store.env)
    monkeypatch.setattr("sys.stdin", io.StringIO(env.pop("AWS_SECRET_ACCESS_KEY") + "\n"))
    result = run("inspect", manifest_uri, "--secret-access-key-file", "-", env=env)
    assert result.code == 0, result.err


def test_secrets_never_appear_in_output(s3_store):
    manifest_uri = publish(s3_store)
    env = s3_store.env
    secret = env["AWS_SECRET_ACCESS_KEY"]
    bad_secret = "wrong-secret-" + "x" * 20
    runs = [
        run("inspect", manifest_uri, env=env),
        run("verify", "--deep", manifest_uri, env=env),
        run("head", manifest_uri, env=env),
        run("--debug", "inspect", f"{manifest_uri}.missing", env=env),
        run("--debug", "inspect", manifest_uri, env={**env, "AWS_SECRET_ACCESS_KEY": bad_secret}),
        run("--debug", f"--secret-access-key={bad_secret}", "verify", manifest_uri, env=env),
        run("--debug", "inspect", manifest_uri, f"--secret-access-key={secret}", env=env),
    ]
    assert [r.code for r in runs] == [0, 0, 0, 1, 1, 1, 0]
    assert "PermissionError" in runs[4].err
    for result in runs:
        assert secret not in result.out + result.err
        assert bad_secret not in result.out + result.err


def publish_pointing_at(manifest_uri: str, shard_uri: str, client: SyvainTrainingData) -> None:
    """A hostile manifest: one jsonl.gz shard, ``shard_uri``, wherever it points."""
    shard = {"uri": shard_uri, "records": 1, "size_bytes": 1}
    client.save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "jsonl.gz",
            "splits": {"a": {"records": 1, "shards": [shard]}},
        },
    )


@pytest.mark.parametrize("command", [["verify"], ["verify", "--deep"], ["head"], ["cp"]])
def test_s3_manifest_cannot_point_at_local_files(s3_store, tmp_path, command):
    store = s3_store
    local = tmp_path / "private.txt"
    local.write_bytes(b"not for the manifest's author" * 1000)
    manifest_uri = f"{store.root}/hostile/data-manifest.json"
    shard_uri = f"file://{local}"
    publish_pointing_at(manifest_uri, shard_uri, store.client)
    argv = [*command, manifest_uri]
    if command == ["cp"]:
        argv += [f"{tmp_path}/copy/", "--with-shards"]
    result = run(*argv, env=store.env)
    assert result.code == 1
    assert f"ValueError: Manifest {manifest_uri} names shard {shard_uri}" in result.err
    assert str(local.stat().st_size) not in result.out + result.err  # nothing about the file
    assert not (tmp_path / "copy").exists()


def test_local_manifest_cannot_point_at_s3_unless_allowed(s3_store, tmp_path):
    store = s3_store
    source = publish(store)
    shard = store.client.load_manifest(source).splits["val"].shards[0]
    manifest_uri = f"file://{tmp_path}/mixed/data-manifest.json"
    store.client.save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "msgpack.zstf",
            "splits": {"val": {"records": shard.records, "shards": [shard.model_dump()]}},
        },
    )
    refused = run("head", "-n", "1", manifest_uri, env=store.env)
    assert refused.code == 1 and "may name only file:// shards" in refused.err
    allowed = run("head", "-n", "1", "--allow-mixed-schemes", manifest_uri, env=store.env)
    assert allowed.code == 0, allowed.err
    assert json.loads(allowed.out)["id"] == "val-0/0"
