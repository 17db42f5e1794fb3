"""Ray Data: read_dataset (a real Datasource) and SyvainDatasink on a local two-worker cluster,
against the session's SeaweedFS and the local directory store."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import ray.data
from pydantic import SecretStr
from ray import cloudpickle
from ray.exceptions import RayError

from seaweed import config_for
from syvain_training_data import DatasetSaver, iter_shard
from syvain_training_data.manifest import (
    canonical_manifest_bytes,
    parse_manifest,
    validate_manifest,
)
from syvain_training_data.ray import SyvainDatasink, SyvainDatasource, read_dataset
from syvain_training_data.storage import StorageConfig, get_object, list_objects, put_object

SOURCE_SHARDS = 5
RECORDS_PER_SHARD = 120


@pytest.fixture(scope="module")
def ray_cluster(seaweed) -> Iterator[str]:
    """One local cluster for the module, two worker processes and a small object store; yields
    its session directory. The workers inherit the S3 credentials from this process's
    environment (pickles carry no secret; Ray's runtime_env would write them to its logs), and
    take this module's functions by value."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in seaweed.env().items():
            patch.setenv(name, value)
        ray.init(
            num_cpus=2,
            object_store_memory=200 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield ray._private.worker._global_node.get_session_dir_path()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()


@pytest.fixture
def s3_config(seaweed) -> StorageConfig:
    return config_for(seaweed)


def publish_source(manifest_uri: str, config: StorageConfig | None) -> DatasetSaver:
    """A curriculum dataset: train with stages easy (shards 0-2) and hard (3-4), and valid."""
    saver = DatasetSaver(manifest_uri, data_format="msgpack.zstf", storage_config=config)
    for part in range(SOURCE_SHARDS):
        stage = "easy" if part < 3 else "hard"
        records = [
            {"id": f"{part}-{i}", "text": f"Doc {part} {i} " + "w " * (i % 5), "n": i}
            for i in range(RECORDS_PER_SHARD)
        ]
        saver.save("train", stage, records, shard_id=f"train-{part}")
    saver.save(
        "valid", None, [{"id": f"v-{i}", "text": "v", "n": i} for i in range(7)], shard_id="v"
    )
    saver.commit_manifest()
    return saver


def expected_rows(manifest_uri: str, split: str, stage: str | None, config) -> list[dict]:
    manifest = parse_manifest(get_object(manifest_uri, storage_config=config), manifest_uri)
    entry = manifest.splits[split]
    shards = entry.curriculum[stage].shards if stage else entry.shards
    return [
        dict(r) for s in shards for r in iter_shard(manifest.data_format, s, storage_config=config)
    ]


def by_id(rows) -> dict[str, dict]:
    ids = Counter(row["id"] for row in rows)
    assert set(ids.values()) == {1}, "every record exactly once"
    return {row["id"]: row for row in rows}


def test_read_split_from_s3_in_record_ranges(ray_cluster, s3_config, s3_bucket, unique_prefix):
    uri = f"s3://{s3_bucket}/{unique_prefix}/source/data-manifest.json"
    publish_source(uri, s3_config)
    source = SyvainDatasource(uri, "train", storage_config=s3_config, records_per_task=50)
    # 120-record shards in ranges of 50: [0, 50), [50, 100), [100, 120) per shard.
    assert len(source.get_read_tasks(1)) == SOURCE_SHARDS * 3
    assert source.estimate_inmemory_data_size() > 0

    rows = read_dataset(uri, "train", storage_config=s3_config, records_per_task=50).take_all()
    assert by_id(rows) == by_id(expected_rows(uri, "train", None, s3_config))
    assert len(rows) == SOURCE_SHARDS * RECORDS_PER_SHARD


def test_read_curriculum_stages_from_the_local_store(ray_cluster, tmp_path):
    uri = f"file://{tmp_path}/source/data-manifest.json"
    publish_source(uri, None)
    easy = read_dataset(uri, "train", curriculum_stage="easy").take_all()
    assert by_id(easy) == by_id(expected_rows(uri, "train", "easy", None))
    both = read_dataset(uri, "train", curriculum_stages=["hard", "easy"]).take_all()
    assert by_id(both) == by_id(expected_rows(uri, "train", None, None))
    with pytest.raises(
        ValueError, match="Unknown curriculum stage 'medium'.*available stages: easy, hard"
    ):
        read_dataset(uri, "train", curriculum_stage="medium")
    with pytest.raises(ValueError, match="Unknown split 'test'; available splits: train, valid"):
        read_dataset(uri, "test")
    with pytest.raises(ValueError, match="records_per_task must be a positive int"):
        read_dataset(uri, "train", records_per_task=0)


def test_records_arrow_cannot_hold_in_one_column_name_the_shard(ray_cluster, tmp_path):
    uri = f"file://{tmp_path}/mixed/data-manifest.json"
    saver = DatasetSaver(uri, data_format="msgpack.zstf")
    saver.save("train", None, [{"a": 1}, {"a": "one"}], shard_id="mixed")
    shard = saver.commit_manifest().splits["train"].shards[0]
    with pytest.raises(ValueError, match=f"Records 0..2 of shard {shard.uri} do not fit one Arrow"):
        read_dataset(uri, "train").take_all()


def test_a_manifest_cannot_point_ray_at_another_scheme(
    ray_cluster, tmp_path, s3_config, s3_bucket, unique_prefix
):
    local = f"file://{tmp_path}/source/data-manifest.json"
    manifest = publish_source(local, None).build_manifest()
    uri = f"s3://{s3_bucket}/{unique_prefix}/foreign/data-manifest.json"
    put_object(uri, canonical_manifest_bytes(manifest), storage_config=s3_config)
    with pytest.raises(ValueError, match="may name only s3:// shards"):
        read_dataset(uri, "valid", storage_config=s3_config)


def clean(row: dict) -> dict:
    return {
        "id": row["id"],
        "text": " ".join(row["text"].split()).upper(),
        "words": len(row["text"].split()),
    }


def easy_sink(uri: str, config: StorageConfig) -> SyvainDatasink:
    """A sink of stage easy of split train, level 1, in shards of 100 records."""
    return SyvainDatasink(
        uri,
        data_format="jsonl.gz",
        split="train",
        curriculum_stage="easy",
        curriculum_metadata={"level": 1},
        storage_config=config,
        records_per_shard=100,
    )


def test_map_and_save_a_derived_dataset_then_load_it_back(
    ray_cluster, s3_config, s3_bucket, unique_prefix
):
    source_uri = f"s3://{s3_bucket}/{unique_prefix}/source/data-manifest.json"
    derived_uri = f"s3://{s3_bucket}/{unique_prefix}/derived/data-manifest.json"
    publish_source(source_uri, s3_config)
    sink = easy_sink(derived_uri, s3_config)
    ds = read_dataset(source_uri, "train", curriculum_stage="easy", storage_config=s3_config)
    ds.map(clean).write_datasink(sink)

    assert sink.summary is not None and sink.summary.manifest is not None
    manifest = sink.summary.manifest
    assert sink.summary.records == 3 * RECORDS_PER_SHARD
    assert sink.summary.shards_reused == 0
    # One write task per source shard (read, map and write are fused): 120 rows = 100 + 20.
    assert sink.summary.shards_written == len(manifest.splits["train"].shards) == 6
    assert sorted(s.records for s in manifest.splits["train"].shards) == [20] * 3 + [100] * 3
    assert manifest.splits["train"].curriculum["easy"].metadata == {"level": 1}
    expected = {
        row["id"]: clean(row) for row in expected_rows(source_uri, "train", "easy", s3_config)
    }
    loaded = read_dataset(derived_uri, "train", storage_config=s3_config).take_all()
    assert by_id(loaded) == expected

    # Written again, identical rows: every shard is reused and the same manifest returned.
    again = easy_sink(derived_uri, s3_config)
    read_dataset(source_uri, "train", curriculum_stage="easy", storage_config=s3_config).map(
        clean
    ).write_datasink(again)
    assert again.summary is not None
    assert (again.summary.shards_written, again.summary.shards_reused) == (0, 6)
    assert again.summary.manifest == manifest


def interrupted_clean(marker: str, how: str):
    """``clean``, but the first run dies on the last source shard, raising or killing its worker
    process (the marker file says which run this is: present means it was interrupted once)."""

    def transform(row: dict) -> dict:
        if row["id"] == f"{SOURCE_SHARDS - 1}-60" and not os.path.exists(marker):
            open(marker, "w").close()
            if how == "exit":
                os._exit(1)
            raise RuntimeError("interrupted on purpose")
        return clean(row)

    return transform


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_rerun_after_an_interruption_reuses_finished_shards(
    ray_cluster, s3_config, s3_bucket, unique_prefix, tmp_path, how
):
    source_uri = f"s3://{s3_bucket}/{unique_prefix}/source/data-manifest.json"
    derived_uri = f"s3://{s3_bucket}/{unique_prefix}/derived/data-manifest.json"
    publish_source(source_uri, s3_config)
    marker = str(tmp_path / "interrupted")

    def run() -> SyvainDatasink:
        sink = SyvainDatasink(
            derived_uri, data_format="msgpack.zstf", split="train", storage_config=s3_config
        )
        # No retry of a task whose worker died: the job itself stops, as a crash would stop it.
        no_retry = {"max_retries": 0}
        ds = read_dataset(source_uri, "train", storage_config=s3_config, ray_remote_args=no_retry)
        ds = ds.map(interrupted_clean(marker, how), **no_retry)
        ds.write_datasink(sink, ray_remote_args=no_retry)
        return sink

    with pytest.raises(RayError) as interruption:
        run()
    if how == "raise":
        assert "interrupted on purpose" in str(interruption.value)
    derived_prefix = derived_uri.rsplit("/", 1)[0]
    stored = list_objects(derived_prefix, storage_config=s3_config)
    finished = [o for o in stored if o.uri.endswith(".metadata.json")]
    assert not any(o.uri == derived_uri for o in stored), "no manifest after the interruption"
    assert 1 <= len(finished) < SOURCE_SHARDS

    sink = run()
    assert sink.summary is not None and sink.summary.manifest is not None
    print(f"{how}: shards reused after the interruption: {sink.summary.shards_reused} of 5")
    assert sink.summary.shards_reused == len(finished)
    assert sink.summary.shards_written == SOURCE_SHARDS - len(finished)
    # The finished shards were not written again (same objects, same etags).
    after = {o.uri: o.etag for o in list_objects(derived_prefix, storage_config=s3_config)}
    assert all(after[o.uri] == o.etag for o in finished)
    expected = {
        row["id"]: clean(row) for row in expected_rows(source_uri, "train", None, s3_config)
    }
    rows = [
        dict(r)
        for s in sink.summary.manifest.splits["train"].shards
        for r in iter_shard("msgpack.zstf", s, storage_config=s3_config)
    ]
    assert by_id(rows) == expected


def test_several_splits_are_written_then_committed_once(ray_cluster, tmp_path):
    source_uri = f"file://{tmp_path}/source/data-manifest.json"
    derived_uri = f"file://{tmp_path}/derived/data-manifest.json"
    publish_source(source_uri, None)
    valid = SyvainDatasink(derived_uri, split="valid", commit=False)
    read_dataset(source_uri, "valid").write_datasink(valid)
    assert valid.summary is not None and valid.summary.manifest is None
    with pytest.raises(FileNotFoundError):
        get_object(derived_uri)
    hard = SyvainDatasink(derived_uri, split="train", curriculum_stage="hard")
    read_dataset(source_uri, "train", curriculum_stage="hard").write_datasink(hard)
    assert hard.summary is not None and hard.summary.manifest is not None
    manifest = hard.summary.manifest
    assert {name: entry.records for name, entry in manifest.splits.items()} == {
        "valid": 7,
        "train": 2 * RECORDS_PER_SHARD,
    }
    assert list(manifest.splits["train"].curriculum) == ["hard"]


def test_leftover_shards_of_another_run_fail_the_commit(ray_cluster, tmp_path):
    source_uri = f"file://{tmp_path}/source/data-manifest.json"
    derived_uri = f"file://{tmp_path}/derived/data-manifest.json"
    publish_source(source_uri, None)
    # An interrupted run whose rows differ (another transform) left a finished shard behind.
    DatasetSaver(derived_uri).save("valid", None, [{"id": "stale"}], shard_id="000000-000000-x")
    sink = SyvainDatasink(derived_uri, split="valid")
    with pytest.raises(ValueError, match="has unexpected shards.*000000-000000-x"):
        read_dataset(source_uri, "valid").write_datasink(sink)


def test_pickles_sent_to_workers_hold_no_secret(
    ray_cluster, s3_config, s3_bucket, unique_prefix, seaweed
):
    uri = f"s3://{s3_bucket}/{unique_prefix}/source/data-manifest.json"
    publish_source(uri, s3_config)
    source = SyvainDatasource(uri, "valid", storage_config=s3_config)
    sink = SyvainDatasink(uri.replace("source", "derived"), split="valid", storage_config=s3_config)
    secret = seaweed.secret_access_key.encode()
    for shipped in (source, sink, *source.get_read_tasks(2)):
        assert secret not in cloudpickle.dumps(shipped)
    assert secret not in pickle.dumps(sink)
    # The workers read with the secret of their environment, and no file of Ray's holds it.
    assert len(read_dataset(uri, "valid", storage_config=s3_config).take_all()) == 7
    for path in Path(ray_cluster).rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path


def test_an_explicit_secret_the_workers_lack_fails_in_the_driver(
    ray_cluster, seaweed, s3_config, s3_bucket, unique_prefix, tmp_path
):
    """Ray's pickles hold no secret, so workers need it in their environment; where they lack it
    (here they hold another access key's), the driver says so before any read or write task."""
    secret = "another-secret-value-0123456789"
    config = StorageConfig.create(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id="SYVAINOTHERKEY",
        secret_access_key=secret,
    )
    uri = f"s3://{s3_bucket}/{unique_prefix}/derived/data-manifest.json"
    for build in (
        # Raised before the manifest is read (that GET would be a PermissionError).
        lambda: read_dataset(uri, "train", storage_config=config),
        lambda: SyvainDatasource(uri, "train", storage_config=config),
        lambda: SyvainDatasink(uri, split="train", storage_config=config),
    ):
        with pytest.raises(
            ValueError,
            match=r"Ray workers of 1 of 1 node\(s\) have no secret access key for access key id "
            r"'SYVAINOTHERKEY'.*AWS_SECRET_ACCESS_KEY.*picklable_secret=True",
        ) as info:
            build()
        assert secret not in str(info.value)
    # Built before Ray runs, they have no workers to ask yet: they ask when Ray Data plans their
    # tasks. (A local manifest naming s3:// shards reads them with the config's credentials.)
    local = f"file://{tmp_path}/mixed/data-manifest.json"
    shard = {
        "uri": f"s3://{s3_bucket}/{unique_prefix}/x.msgpack.zstf",
        "records": 1,
        "size_bytes": 1,
    }
    manifest = {
        "version": 1,
        "data_format": "msgpack.zstf",
        "splits": {"train": {"records": 1, "shards": [shard]}},
    }
    put_object(local, canonical_manifest_bytes(validate_manifest(manifest)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "is_initialized", lambda: False)
        source = SyvainDatasource(local, "train", storage_config=config, allow_mixed_schemes=True)
        sink = SyvainDatasink(uri, split="train", storage_config=config)
    with pytest.raises(ValueError, match="have no secret access key"):
        ray.data.read_datasource(source).take_all()
    with pytest.raises(ValueError, match="have no secret access key"):
        ray.data.from_items([{"id": 1}]).write_datasink(sink)
    assert list_objects(uri.rsplit("/", 1)[0], storage_config=s3_config) == []
    # Opted in, the secret travels in the pickle: nothing to ask the workers.
    SyvainDatasink(
        uri, split="train", storage_config=config.model_copy(update={"picklable_secret": True})
    )
    # The session's own key is in the workers' environment: the question passes.
    SyvainDatasink(uri, split="train", storage_config=s3_config)


class CountingFileProvider:
    """Reads the key pair from a JSON file and notes each calling process in another file: it
    pickles as itself (its two paths), so each Ray worker resolves its own credentials."""

    def __init__(self, keys: str, calls: str) -> None:
        self.keys, self.calls = keys, calls

    def __call__(self) -> dict[str, str]:
        with open(self.calls, "a", encoding="utf-8") as calls:
            calls.write(f"{os.getpid()}\n")
        with open(self.keys, encoding="utf-8") as file:
            keys = json.load(file)
        return {"access_key_id": keys["id"], "secret_access_key": keys["secret"]}


def test_a_credential_provider_resolves_in_each_worker(
    ray_cluster, seaweed, s3_config, s3_bucket, unique_prefix, tmp_path
):
    keys, calls = tmp_path / "keys.json", tmp_path / "calls"
    keys.write_text(json.dumps({"id": seaweed.access_key_id, "secret": seaweed.secret_access_key}))
    provider = CountingFileProvider(str(keys), str(calls))
    config = StorageConfig.create(
        s3_base_url=seaweed.endpoint, region=seaweed.region, credential_provider=provider
    )
    uri = f"s3://{s3_bucket}/{unique_prefix}/source/data-manifest.json"
    publish_source(uri, s3_config)
    assert seaweed.secret_access_key.encode() not in cloudpickle.dumps(
        SyvainDatasource(uri, "valid", storage_config=config)
    )
    assert len(read_dataset(uri, "valid", storage_config=config).take_all()) == 7
    callers = set(calls.read_text().split())
    assert callers - {str(os.getpid())}, "the read tasks called the provider in their workers"


def test_a_session_token_the_workers_lack_fails_in_the_driver(
    ray_cluster, s3_config, s3_bucket, unique_prefix
):
    """The workers have the session's key pair but no AWS_SESSION_TOKEN: a config with a token
    fails in the driver, naming the variable."""
    config = s3_config.model_copy(update={"session_token": SecretStr("token-the-workers-lack")})
    uri = f"s3://{s3_bucket}/{unique_prefix}/derived/data-manifest.json"
    with pytest.raises(ValueError, match="AWS_SESSION_TOKEN") as info:
        SyvainDatasink(uri, split="train", storage_config=config)
    assert "token-the-workers-lack" not in str(info.value)


def test_without_ray_the_import_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['ray'] = None\n"
        "try:\n"
        "    import syvain_training_data.ray\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "the 'ray' extra" in done.stdout
    assert "pip install 'syvain-training-data[ray]'" in done.stdout
