"""The `syvain-data` command: every subcommand on the local store and on SeaweedFS, the problems
`verify` finds, exit statuses, secrets, and the installed console script."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syvain_training_data import DataManifest, SyvainTrainingData, storage
from syvain_training_data.cli import Progress, copy_layout, main
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig

RECORDS_PER_SHARD = 50
# (split, stage, shard id) of the test dataset: train has two stages, val none.
LAYOUT = [
    ("train", "easy", "train-0"),
    ("train", "easy", "train-1"),
    ("train", "hard", "train-2"),
    ("val", None, "val-0"),
]


@dataclass
class Result:
    code: int
    out: str
    err: str


def run(*argv: str, env: Mapping[str, str] | None = None) -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), environ=dict(env or {}), stdout=out, stderr=err)
    return Result(code, out.getvalue(), err.getvalue())


def records_of(shard_id: str, blob: bool = True) -> list[dict[str, Any]]:
    """Records of one test shard; ``blob`` adds a bytes field (not in JSON shards)."""
    return [
        {"id": f"{shard_id}/{i}", "text": f"record {i} of {shard_id}"}
        | ({"blob": bytes([i, 255])} if blob else {})
        for i in range(RECORDS_PER_SHARD)
    ]


@dataclass
class Store:
    kind: str
    root: str  # URI prefix, no trailing slash
    env: dict[str, str]
    config: StorageConfig

    @property
    def client(self) -> SyvainTrainingData:
        return SyvainTrainingData.from_env(self.env)


def s3_store(seaweed: Any, bucket: str, prefix: str) -> Store:
    env = seaweed.env()
    return Store(
        "s3", f"s3://{bucket}/{prefix}", env, SyvainTrainingData.from_env(env).storage_config
    )


def file_store(path: Path) -> Store:
    return Store("file", f"file://{path}", {}, StorageConfig())


@pytest.fixture(params=["file", "s3"])
def store(request, seaweed, s3_bucket, unique_prefix, tmp_path) -> Store:
    if request.param == "s3":
        return s3_store(seaweed, s3_bucket, unique_prefix)
    return file_store(tmp_path / "store")


def publish(store: Store, name: str = "dataset", data_format: Any = "msgpack.zstf") -> str:
    manifest_uri = f"{store.root}/{name}/data-manifest.json"
    saver = store.client.dataset_saver(manifest_uri, data_format=data_format)
    for split, stage, shard_id in LAYOUT:
        saver.save(split, stage, records_of(shard_id, data_format != "jsonl.gz"), shard_id=shard_id)
    saver.commit_manifest()
    return manifest_uri


def tamper(store: Store, manifest_uri: str, edit: Any) -> None:
    """Rewrites the manifest after ``edit`` changed its JSON document in place."""
    document = store.client.load_manifest(manifest_uri).model_dump()
    edit(document)
    storage.delete_object(manifest_uri, storage_config=store.config)
    store.client.save_manifest(manifest_uri, document)


def every_shard_list(document: dict[str, Any]) -> list[list[dict[str, Any]]]:
    lists = []
    for entry in document["splits"].values():
        lists.append(entry["shards"])
        lists += [stage["shards"] for stage in entry["curriculum"].values()]
    return lists


# --------------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------------


def test_inspect_prints_splits_stages_records_bytes_and_shards(store):
    manifest_uri = publish(store)
    manifest = store.client.load_manifest(manifest_uri)
    result = run("inspect", manifest_uri, env=store.env)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == f"manifest  {manifest_uri}"
    assert lines[1] == "format    msgpack.zstf"
    table = [line.split() for line in lines[lines.index("") + 1 :]]
    assert table[0] == ["split", "stage", "records", "bytes", "size", "shards"]
    train = manifest.splits["train"]
    easy = train.curriculum["easy"]
    size = sum(shard.size_bytes for shard in train.shards)
    assert table[1][:4] == ["train", "(all)", "150", f"{size:,}"] and table[1][-1] == "3"
    easy_size = sum(shard.size_bytes for shard in easy.shards)
    assert table[2][:3] == ["easy", "100", f"{easy_size:,}"] and table[2][-1] == "2"
    assert table[3][0] == "hard" and table[3][-1] == "1"
    assert table[4][:3] == ["val", "(all)", "50"]
    total = size + manifest.splits["val"].shards[0].size_bytes
    assert table[5][:3] == ["total", "200", f"{total:,}"] and table[5][-1] == "4"


def test_local_paths_are_accepted_as_file_uris(tmp_path, monkeypatch):
    manifest_uri = publish(file_store(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = run("inspect", "dataset/data-manifest.json")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0] == f"manifest  {manifest_uri}"


# --------------------------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deep", [False, True])
def test_verify_passes_a_sound_dataset(store, deep):
    manifest_uri = publish(store)
    result = run("verify", manifest_uri, *(["--deep"] if deep else []), env=store.env)
    assert result.code == 0, result.out + result.err
    assert result.out.startswith("OK: 4 shards, 200 records")
    if deep:
        progress = result.err.strip().splitlines()[-1]
        assert progress.startswith("verify: ")
        assert "200 / 200 records" in progress and "4 / 4 shards" in progress
        assert "(100%)" in progress and "records/s" in progress and "B/s" in progress


def test_verify_finds_a_missing_shard(store):
    manifest_uri = publish(store)
    shard = store.client.load_manifest(manifest_uri).splits["val"].shards[0]
    storage.delete_object(shard.uri, storage_config=store.config)
    result = run("verify", manifest_uri, env=store.env)
    assert result.code == 1
    assert f"problem: {shard.uri}: missing" in result.out
    assert "FAILED: 1 problem in 4 shards" in result.out


def test_verify_finds_a_size_mismatch(store):
    manifest_uri = publish(store)

    def grow(document: dict[str, Any]) -> None:
        for shards in every_shard_list(document):
            for shard in shards:
                if shard["uri"].endswith("part-val-0.msgpack.zstf"):
                    shard["size_bytes"] += 1

    tamper(store, manifest_uri, grow)
    result = run("verify", manifest_uri, "--deep", env=store.env)
    assert result.code == 1
    (problem,) = [line for line in result.out.splitlines() if line.startswith("problem:")]
    assert "part-val-0.msgpack.zstf: size mismatch" in problem
    assert "in the store" in problem and "in the manifest" in problem


def test_verify_finds_a_wrong_etag(seaweed, s3_bucket, unique_prefix):
    store = s3_store(seaweed, s3_bucket, unique_prefix)
    manifest_uri = publish(store)
    shard = store.client.load_manifest(manifest_uri).splits["val"].shards[0]
    assert storage.head_object(shard.uri, storage_config=store.config).etag  # the store has one

    def replace_etag(document: dict[str, Any]) -> None:
        for shards in every_shard_list(document):
            for described in shards:
                if described["uri"] == shard.uri:
                    described["etag"] = '"0123456789abcdef"'

    tamper(store, manifest_uri, replace_etag)
    result = run("verify", manifest_uri, env=store.env)
    assert result.code == 1
    assert f"problem: {shard.uri}: etag mismatch" in result.out


def test_verify_ignores_a_recorded_local_etag(tmp_path):
    # SPEC 4: a file:// etag (inode and mtime) is not enforced, so a copied dataset verifies.
    store = file_store(tmp_path / "store")
    manifest_uri = publish(store)
    shards = store.client.load_manifest(manifest_uri).splits["val"].shards
    assert [shard.etag for shard in shards] == [""]  # the saver records none

    def old_local_etag(document: dict[str, Any]) -> None:
        for shards in every_shard_list(document):
            for described in shards:
                described["etag"] = "12345-1700000000000000000"

    tamper(store, manifest_uri, old_local_etag)
    result = run("verify", manifest_uri, env=store.env)
    assert result.code == 0, result.out + result.err


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
def test_s3_manifest_cannot_point_at_local_files(
    seaweed, s3_bucket, unique_prefix, tmp_path, command
):
    store = s3_store(seaweed, s3_bucket, unique_prefix)
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


def test_local_manifest_cannot_point_at_s3_unless_allowed(
    seaweed, s3_bucket, unique_prefix, tmp_path
):
    store = s3_store(seaweed, s3_bucket, unique_prefix)
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


def test_verify_deep_finds_a_wrong_record_count(store):
    manifest_uri = publish(store)

    def undercount(document: dict[str, Any]) -> None:
        for entry in document["splits"].values():
            for shards in [entry["shards"]] + [s["shards"] for s in entry["curriculum"].values()]:
                for shard in shards:
                    if shard["uri"].endswith("part-train-2.msgpack.zstf"):
                        shard["records"] -= 1
            entry["records"] = sum(shard["records"] for shard in entry["shards"])
            for stage in entry["curriculum"].values():
                stage["records"] = sum(shard["records"] for shard in stage["shards"])

    tamper(store, manifest_uri, undercount)
    assert run("verify", manifest_uri, env=store.env).code == 0  # HEAD cannot see it
    result = run("verify", manifest_uri, "--deep", "--no-progress", env=store.env)
    assert result.code == 1
    (problem,) = [line for line in result.out.splitlines() if line.startswith("problem:")]
    assert "part-train-2.msgpack.zstf" in problem
    assert "declared 49 records but found more" in problem
    assert result.err == ""  # --no-progress


def test_verify_deep_reads_parquet_and_jsonl(tmp_path):
    local = file_store(tmp_path)
    for data_format in ("parquet", "jsonl.gz"):
        manifest_uri = publish(local, name=data_format, data_format=data_format)
        result = run("verify", manifest_uri, "--deep")
        assert result.code == 0, result.out + result.err
        assert "200 records" in result.out


def test_progress_line_shows_bytes_records_and_rates():
    stream = io.StringIO()
    now = [100.0]
    progress = Progress(
        stream,
        label="verify",
        total_bytes=2_000_000,
        total_records=10,
        total_shards=2,
        interval_s=1.0,
        clock=lambda: now[0],
    )
    progress.add(bytes_=1000, records=1)
    assert stream.getvalue() == ""  # not a terminal: a line every interval_s at most
    now[0] = 101.0
    progress.add(bytes_=999_000, records=4, shards=1)
    assert stream.getvalue().splitlines() == [
        "verify: 1.0 MB / 2.0 MB (50%), 5 / 10 records, 1 / 2 shards, 1.0 MB/s, 5 records/s, 1.0 s"
    ]
    now[0] = 102.0
    progress.add(bytes_=1_000_000, records=5, shards=1)
    progress.finish()
    assert stream.getvalue().splitlines()[-1] == (
        "verify: 2.0 MB / 2.0 MB (100%), 10 / 10 records, 2 / 2 shards, 1.0 MB/s, 5 records/s, "
        "2.0 s"
    )


# --------------------------------------------------------------------------------------------
# head
# --------------------------------------------------------------------------------------------


def expected_json(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "blob": {"$base64": base64.b64encode(record["blob"]).decode()}}


def test_head_prints_json_lines(store):
    manifest_uri = publish(store)
    result = run("head", manifest_uri, "-n", "3", env=store.env)
    assert result.code == 0, result.err
    assert [json.loads(line) for line in result.out.splitlines()] == [
        expected_json(record) for record in records_of("train-0")[:3]
    ]


def test_head_spans_shards_and_selects_split_and_stage(store):
    manifest_uri = publish(store)
    result = run("head", manifest_uri, "--split", "train", "-n", "120", env=store.env)
    ids = [json.loads(line)["id"] for line in result.out.splitlines()]
    assert result.code == 0 and len(ids) == 120
    assert ids[:50] == [r["id"] for r in records_of("train-0")]
    assert ids[100:] == [r["id"] for r in records_of("train-2")[:20]]
    hard = run(
        "head", manifest_uri, "--split", "train", "--stage", "hard", "-n", "1", env=store.env
    )
    assert json.loads(hard.out)["id"] == "train-2/0"
    val = run("head", manifest_uri, "--split", "val", "-n", "1000", env=store.env)
    assert len(val.out.splitlines()) == RECORDS_PER_SHARD
    assert run("head", manifest_uri, "-n", "0", env=store.env).out == ""


def test_head_unknown_split_or_stage_is_a_usage_error(tmp_path):
    manifest_uri = publish(file_store(tmp_path))
    result = run("head", manifest_uri, "--split", "test")
    assert result.code == 2
    assert "unknown split 'test'; available splits: train, val" in result.err
    result = run("head", manifest_uri, "--split", "val", "--stage", "x")
    assert result.code == 2 and "available stages: (none)" in result.err


# --------------------------------------------------------------------------------------------
# cp
# --------------------------------------------------------------------------------------------


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
    seaweed, s3_bucket, unique_prefix, tmp_path, source_kind, destination_kind
):
    stores = {
        "s3": s3_store(seaweed, s3_bucket, unique_prefix),
        "file": file_store(tmp_path / "local"),
    }
    source, destination = stores[source_kind], stores[destination_kind]
    env = seaweed.env()
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


# --------------------------------------------------------------------------------------------
# demo, exit statuses, credentials, secrets, --debug
# --------------------------------------------------------------------------------------------


def test_demo_publishes_reads_back_and_reuses_on_a_rerun(tmp_path, capsys):
    assert run("demo", "--root", str(tmp_path), "--records", "300").code == 0
    out = capsys.readouterr().out
    assert "every record read exactly once" in out and "summary: 300 records" in out
    assert "reused" not in out
    manifest = tmp_path / "datasets" / "demo" / "data-manifest-v1.json"
    published = DataManifest.model_validate_json(manifest.read_bytes())
    assert published.splits["train"].records == 240
    assert sorted(published.splits["train"].curriculum) == ["main", "warmup"]
    assert run("demo", "--root", str(tmp_path), "--records", "300").code == 0
    assert "reused 10 shards finished by an earlier run" in capsys.readouterr().out
    assert manifest.read_bytes() == published.model_dump_json(indent=2).encode() + b"\n"


def test_demo_against_seaweedfs(capsys):
    assert run("demo", "--s3", "--records", "100").code == 0
    out = capsys.readouterr().out
    assert (
        "store: SeaweedFS at http://127.0.0.1:" in out and "every record read exactly once" in out
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["inspect"],
        ["head", "m.json", "-n", "-1"],
        ["verify", "m.json", "--jobs", "0"],
        ["inspect", "http://host/m.json"],
        ["inspect", "s3://bucket-only"],
        ["inspect", "s3://bucket/m.json"],  # no credentials
        ["--endpoint-url", "ftp://host", "inspect", "m.json"],
    ],
)
def test_usage_errors_exit_2(argv):
    result = run(*argv)
    assert result.code == 2
    assert "Traceback" not in result.err and result.err.strip()


def test_help_exits_0():
    assert run("--help").code == 0
    assert run("verify", "--help").code == 0


def test_flags_override_the_environment(seaweed, s3_bucket, unique_prefix):
    manifest_uri = publish(s3_store(seaweed, s3_bucket, unique_prefix))
    env = seaweed.env()
    wrong = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "nobody"}
    flags = ["--endpoint-url", env["AWS_ENDPOINT_URL"], "--access-key-id", env["AWS_ACCESS_KEY_ID"]]
    result = run(*flags, "inspect", manifest_uri, env=wrong)
    assert result.code == 0, result.err
    # After the subcommand too; the secret from the flag, nothing from the environment.
    secret = [f"--secret-access-key={env['AWS_SECRET_ACCESS_KEY']}"]
    result = run("inspect", manifest_uri, *flags, *secret)
    assert result.code == 0, result.err


def test_secret_beginning_with_a_dash_and_secret_files(seaweed, s3_bucket, unique_prefix, tmp_path):
    manifest_uri = publish(s3_store(seaweed, s3_bucket, unique_prefix))
    env = seaweed.env()
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


def test_secret_from_stdin(seaweed, s3_bucket, unique_prefix, monkeypatch):
    manifest_uri = publish(s3_store(seaweed, s3_bucket, unique_prefix))
    env = seaweed.env()
    monkeypatch.setattr("sys.stdin", io.StringIO(env.pop("AWS_SECRET_ACCESS_KEY") + "\n"))
    result = run("inspect", manifest_uri, "--secret-access-key-file", "-", env=env)
    assert result.code == 0, result.err


def test_secrets_never_appear_in_output(seaweed, s3_bucket, unique_prefix):
    manifest_uri = publish(s3_store(seaweed, s3_bucket, unique_prefix))
    env = seaweed.env()
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


def test_failures_print_one_line_and_debug_adds_the_traceback(tmp_path):
    missing = f"file://{tmp_path}/nothing/data-manifest.json"
    plain = run("inspect", missing)
    assert plain.code == 1
    assert plain.err.splitlines() == [
        f"syvain-data: error: FileNotFoundError: {plain_reason(plain)}"
    ]
    assert missing in plain.err
    debug = run("--debug", "inspect", missing)
    assert debug.code == 1
    assert debug.err.startswith("Traceback (most recent call last):")
    assert debug.err.splitlines()[-1] == plain.err.splitlines()[0]


def plain_reason(result: Result) -> str:
    return result.err.strip().split("FileNotFoundError: ", 1)[1]


# --------------------------------------------------------------------------------------------
# The installed command, as a real process
# --------------------------------------------------------------------------------------------


def console_script() -> str:
    script = shutil.which("syvain-data", path=str(Path(sys.executable).parent))
    assert script is not None, "the syvain-data console script is not installed (./dev setup)"
    return script


def test_console_script_runs_as_a_process(tmp_path):
    manifest_uri = publish(file_store(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [console_script(), "verify", "--deep", manifest_uri],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("OK: 4 shards, 200 records")
    failed = subprocess.run(
        [console_script(), "head", f"{manifest_uri}.missing"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert failed.returncode == 1
    assert len(failed.stderr.splitlines()) == 1 and "FileNotFoundError" in failed.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "syvain_training_data", "head"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert usage.returncode == 2 and "usage: syvain-data" in usage.stderr


def test_head_into_a_closed_pipe_exits_quietly(tmp_path):
    manifest_uri = f"file://{tmp_path}/big/data-manifest.json"
    saver = SyvainTrainingData().dataset_saver(manifest_uri)
    saver.save("train", None, ({"id": i, "text": "x" * 200} for i in range(5000)), shard_id="0")
    saver.commit_manifest()
    # 5000 lines of ~220 bytes overflow the pipe's buffer: the writer meets a closed pipe.
    done = subprocess.run(
        f"'{console_script()}' head -n 5000 '{manifest_uri}' | head -n 1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(done.stdout)["id"] == 0
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------


def bench_rows(stdout: str) -> dict[str, str]:
    """bench's rows: a name, two or more spaces, a value."""
    rows = [line.split("  ", 1) for line in stdout.splitlines()]
    return {name: value.strip() for name, value in rows}


@pytest.mark.parametrize(("workers", "stage"), [(0, None), (2, "easy")])
def test_bench_reads_a_split_and_prints_rates_and_counters(store, workers, stage):
    manifest_uri = publish(store)
    train = store.client.load_manifest(manifest_uri).splits["train"]
    shards = train.curriculum[stage].shards if stage else train.shards
    records = sum(shard.records for shard in shards)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | store.env
    argv = ["bench", manifest_uri, "--split", "train", "--workers", str(workers)]
    argv += ["--seconds", "600", "--batch-size", "16"] + (["--stage", stage] if stage else [])
    done = subprocess.run(
        [console_script(), *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = bench_rows(done.stdout)
    assert list(rows) == [
        "manifest",
        "split",
        "loader",
        "read",
        "stopped at",
        "records/s",
        "MB/s",
        "first batch",
        "waited",
        "records",
        "bytes",
        "shard opens",
        "first record",
        "retries",
    ]
    assert rows["manifest"] == manifest_uri
    assert rows["split"].startswith(
        f"train{', stage ' + stage if stage else ''}: {records} records"
    )
    assert rows["loader"] == f"{workers} worker{'s' * (workers != 1)}, batch size 16"
    # Two workers split the stage's two equal shards at the shard boundary.
    batches = -(-records // 16) if workers == 0 else 2 * -(-(records // 2) // 16)
    assert rows["read"].startswith(f"{records} records in {batches} batches, ")
    assert rows["stopped at"] == "the end of the split"
    # Rates and seconds are numbers (their values depend on the machine).
    assert re.fullmatch(r"[\d,]+", rows["records/s"])
    assert re.fullmatch(r"[\d,]+\.\d\d", rows["MB/s"])
    assert re.fullmatch(r"\d+\.\d{3} s", rows["first batch"])
    assert re.fullmatch(r"\d+\.\d\d s for batches", rows["waited"])
    assert rows["records"] == f"{records} read by the loader (prefetched included)"
    size = sum(shard.size_bytes for shard in shards)
    assert rows["bytes"] == f"{size:,} received from the store"
    assert rows["shard opens"] == str(len(shards))
    assert rows["retries"] == "0 (connection 0, timeout 0, status 0, ended_early 0, other 0)"
    assert f"bench    [{'#' * 30}] {batches}/{batches}" in done.stderr
    for secret in (store.env.get("AWS_SECRET_ACCESS_KEY"),):
        assert not secret or secret not in done.stdout + done.stderr


def test_bench_usage_errors(tmp_path):
    manifest_uri = publish(file_store(tmp_path))
    unknown = run("bench", manifest_uri, "--split", "nope")
    assert unknown.code == 2 and "unknown split 'nope'" in unknown.err
    for seconds in ("0", "-1", "nan", "soon"):
        result = run("bench", manifest_uri, "--seconds", seconds)
        assert result.code == 2 and "--seconds" in result.err


# --------------------------------------------------------------------------------------------
# Terminal escape injection: values from manifests are printed with control characters escaped
# --------------------------------------------------------------------------------------------

EVIL = "\x1b[31mred\x1b]0;title\x07\r\n\u202eevil\x9b2J\x7f\u2066\x00\t"
# What may reach the terminal: printable text and the line breaks the CLI itself writes.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_manifest_values_are_printed_with_control_characters_escaped(tmp_path):
    from syvain_training_data.cli.output import printable

    assert printable(EVIL) == (
        "\\x1b[31mred\\x1b]0;title\\x07\\r\\n\\u202eevil\\x9b2J\\x7f\\u2066\\x00\\t"
    )
    assert printable(printable(EVIL)) == printable(EVIL)
    local = file_store(tmp_path / "store")
    saved = publish(local, data_format="jsonl.gz")
    real = local.client.load_manifest(saved).splits["val"].shards[0]
    # A key may not hold ASCII control characters (no store could read it), but it may hold
    # C1 controls and bidi overrides, which must be escaped as well.
    evil_key = re.sub("[\x00-\x1f\x7f]", "", EVIL)
    evil_shard = {"uri": f"{local.root}/part{evil_key}.jsonl.gz", "records": 1, "size_bytes": 9}
    good_shard = real.model_dump()
    manifest_uri = f"{local.root}/evil.json"
    local.client.save_manifest(
        manifest_uri,
        {
            "version": 1,
            "data_format": "jsonl.gz",
            "splits": {
                f"split{EVIL}": {
                    "records": 1 + real.records,
                    "shards": [good_shard, evil_shard],
                    "curriculum": {
                        f"stage{EVIL}": {
                            "records": 1,
                            "shards": [evil_shard],
                            "metadata": {f"key{EVIL}": f"value{EVIL}", "weight": 1},
                        }
                    },
                }
            },
        },
    )
    results = {
        "inspect": run("inspect", manifest_uri),
        "verify": run("verify", manifest_uri),
        "verify --deep": run("verify", "--deep", "--progress", manifest_uri),
        "head": run("head", "-n", "1000", manifest_uri),
        "head --stage": run("head", "--stage", "nope", manifest_uri),
        "head --split": run("head", "--split", "nope", manifest_uri),
        "cp": run("cp", "--with-shards", manifest_uri, str(tmp_path / "copy") + "/"),
        "debug": run("head", "--debug", "-n", "1000", manifest_uri),
    }
    for command, result in results.items():
        for text in (result.out, result.err):
            assert not UNSAFE.findall(text), (command, text)
    shown = printable(EVIL)
    assert f"split{shown}" in results["inspect"].out
    assert f"stage{shown}" in results["inspect"].out
    assert f"available splits: split{shown}" in results["head --split"].err
    shard_name = printable(evil_key)
    # verify reports the missing shard as a problem (stdout); head fails on it (stderr).
    assert f"part{shard_name}" in results["verify"].out and results["verify"].code == 1
    assert f"part{shard_name}" in results["head"].err and results["head"].code == 1
    assert "Traceback" in results["debug"].err
    # Records are JSON lines whose control characters are JSON escapes (DEL included).
    records = [json.loads(line) for line in results["head"].out.splitlines()]
    assert len(records) == real.records


def test_log_lines_are_escaped():
    import logging

    from syvain_training_data.cli.output import EscapingFormatter

    formatter = EscapingFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "GET %s", (EVIL,), None)
    line = formatter.format(record)
    assert "\n" not in line and not UNSAFE.findall(line)
    assert line.startswith("WARNING GET \\x1b[31mred")


# --------------------------------------------------------------------------------------------
# cp --with-shards verifies before it writes and leaves nothing behind on failure
# --------------------------------------------------------------------------------------------


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

        def drop_etag(document: dict[str, Any]) -> None:
            for shards in every_shard_list(document):
                for shard in shards:
                    if shard["uri"] == victim.uri:
                        shard["etag"] = ""

        tamper(store, manifest_uri, drop_etag)
    return victim


@pytest.mark.parametrize("how", ["header", "swap"])
@pytest.mark.parametrize(
    ("source_kind", "destination_kind"), [("file", "file"), ("file", "s3"), ("s3", "file")]
)
def test_cp_with_shards_writes_nothing_for_a_corrupted_source_shard(
    seaweed, s3_bucket, unique_prefix, tmp_path, source_kind, destination_kind, how
):
    stores = {
        "s3": s3_store(seaweed, s3_bucket, unique_prefix),
        "file": file_store(tmp_path / "local"),
    }
    source, destination = stores[source_kind], stores[destination_kind]
    manifest_uri = publish(source)
    victim = _corrupt(source, manifest_uri, how)
    copied_manifest = f"{destination.root}/copied/data-manifest.json"
    target = copy_layout(manifest_uri, copied_manifest, victim.uri)
    for attempt in range(2):  # a re-run meets nothing it could take for a good copy
        result = run(
            "cp", "--with-shards", "--jobs", "1", manifest_uri, copied_manifest, env=seaweed.env()
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
