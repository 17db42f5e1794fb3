"""Crash and restart: a job killed with SIGKILL at seeded points, then run to completion,
publishes the same manifest as an uninterrupted run, and every record reads back once. Plus
the same job as Ray tasks on a local cluster."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from seaweed import config_for
from syvain_training_data import DatasetSaver, storage
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig

JOB = textwrap.dedent(
    """
    import json, os, random, signal, sys

    from syvain_training_data import DatasetSaver
    from syvain_training_data.publish import saver as saver_module
    from syvain_training_data.storage import StorageConfig

    manifest_uri, config_json, kill_kind, kill_at, seed = sys.argv[1:6]
    config = StorageConfig.model_validate_json(config_json) if config_json else StorageConfig()
    kill_at = int(kill_at)
    calls = {"n": 0}

    def maybe_die(kind):
        if kind == kill_kind:
            calls["n"] += 1
            if calls["n"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    real_descriptor = DatasetSaver._create_descriptor
    def create_descriptor(self, uri, data):
        maybe_die("between")            # the data object is written, its descriptor is not
        real_descriptor(self, uri, data)
        maybe_die("after")              # the shard is complete
    DatasetSaver._create_descriptor = create_descriptor
    real_bytes = saver_module.canonical_manifest_bytes
    def manifest_bytes(manifest):
        maybe_die("commit")             # shards scanned, manifest not written yet
        return real_bytes(manifest)
    saver_module.canonical_manifest_bytes = manifest_bytes

    saver = DatasetSaver(manifest_uri, data_format="msgpack.zstf", storage_config=config)
    jobs = []
    for split, stages in (("train", ("easy", "medium", "hard")), ("val", (None,))):
        for stage in stages:
            count = 3 if split == "train" else 3
            ids = [f"{split}-{stage}-{i}" for i in range(count)]
            saver.expect_shards(split, stage, ids)
            jobs += [(split, stage, shard_id) for shard_id in ids]
    random.Random(int(seed)).shuffle(jobs)    # each run saves in another order
    for split, stage, shard_id in jobs:
        metadata = {"stage": stage, "weight": len(stage)} if stage else None
        rows = ({"id": f"{shard_id}/{i}", "n": i} for i in range(40))
        saver.save(split, stage, rows, curriculum_metadata=metadata, shard_id=shard_id)
    saver.commit_manifest()
    """
)


def run_job(tmp_path, manifest_uri, config, kill_kind="none", kill_at=0, seed=0) -> int:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    config_json = config.model_dump_json() if config.s3_base_url else ""
    if config.secret_access_key is not None:
        config_json = json.dumps(
            {
                **json.loads(config_json),
                "secret_access_key": config.secret_access_key.get_secret_value(),
            }
        )
    process = subprocess.run(
        [
            sys.executable,
            str(script),
            manifest_uri,
            config_json,
            kill_kind,
            str(kill_at),
            str(seed),
        ],
        capture_output=True,
        timeout=120,
    )
    if process.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(process.stderr.decode())
    return process.returncode


def wipe(root: str, config: StorageConfig, tmp_dir) -> None:
    if root.startswith("file://"):
        shutil.rmtree(root[len("file://") :], ignore_errors=True)
        return
    for info in storage.list_objects(root, storage_config=config):
        storage.delete_object(info.uri, storage_config=config)


def without_local_etags(data: bytes, local: bool) -> bytes:
    """The manifest's bytes, after checking that a local one records no etag: the local store's
    etags name the file (inode, mtime), not the bytes, so SPEC 4 keeps them out of manifests
    and the manifests of a crashed and an uninterrupted run are byte-identical."""
    if local:
        manifest = json.loads(data)
        for entry in manifest["splits"].values():
            for shard in entry["shards"] + [
                s for st in entry["curriculum"].values() for s in st["shards"]
            ]:
                assert shard["etag"] == ""
    return data


def test_crash_and_restart_publishes_the_uninterrupted_manifest(store_root, tmp_path) -> None:
    root, config = store_root
    manifest_uri = f"{root}/job/data-manifest.json"
    local = root.startswith("file://")
    assert run_job(tmp_path, manifest_uri, config) == 0
    reference = storage.get_object(manifest_uri, storage_config=config)
    reference_normalized = without_local_etags(reference, local)
    wipe(root, config, tmp_path)

    # Seeded kill points: 7 while shards are written (after a completed shard, or between a
    # data object and its descriptor), then 3 during the commit. Each run saves in its own order.
    rng = random.Random(20240611)
    points = [(rng.choice(["between", "after"]), rng.randint(1, 2)) for _ in range(7)]
    points += [("commit", 1)] * 3
    for attempt, (kind, at) in enumerate(points):
        code = run_job(tmp_path, manifest_uri, config, kind, at, seed=attempt + 1)
        assert code == -signal.SIGKILL, (attempt, kind, at)
    assert not any(
        info.uri == manifest_uri for info in storage.list_objects(root, storage_config=config)
    )
    assert run_job(tmp_path, manifest_uri, config, seed=99) == 0
    final = storage.get_object(manifest_uri, storage_config=config)
    if local:
        assert without_local_etags(final, True) == reference_normalized
    else:
        assert final == reference

    manifest = DatasetSaver(
        manifest_uri, data_format="msgpack.zstf", storage_config=config
    ).commit_manifest()
    ids = Counter(
        record["id"]
        for entry in manifest.splits.values()
        for shard in entry.shards
        for record in iter_shard("msgpack.zstf", shard, storage_config=config)
    )
    assert len(ids) == 12 * 40 and set(ids.values()) == {1}
    assert manifest.splits["train"].curriculum["hard"].metadata == {"stage": "hard", "weight": 4}


def test_ray_tasks_publish_through_the_pickled_saver(s3_env, s3_bucket, unique_prefix) -> None:
    ray = pytest.importorskip("ray")
    config = config_for(s3_env)
    saver = DatasetSaver(
        f"s3://{s3_bucket}/{unique_prefix}/ray/data-manifest.json",
        data_format="jsonl.gz",
        storage_config=config,
    )
    # The pickled saver holds no secret: the workers take it from the environment they inherit
    # (s3_env puts it there; not runtime_env, which Ray writes to its log files).
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:

        @ray.remote
        def save_part(saver, split, index):
            import os

            rows = [{"split": split, "index": index, "row": i} for i in range(25)]
            saver.save(split, None, rows, shard_id=f"{split}-{index:03d}")
            return os.getpid()

        pids = ray.get(
            [save_part.remote(saver, split, i) for split in ("train", "val") for i in range(4)]
        )
    finally:
        ray.shutdown()
    assert len(pids) == 8
    manifest = saver.commit_manifest()  # nothing saved in this process: all found in the store
    assert {name: entry.records for name, entry in manifest.splits.items()} == {
        "train": 100,
        "val": 100,
    }
    rows = [
        (r["split"], r["index"], r["row"])
        for entry in manifest.splits.values()
        for shard in entry.shards
        for r in iter_shard("jsonl.gz", shard, storage_config=config)
    ]
    assert sorted(rows) == sorted(
        {(s, i, r) for s in ("train", "val") for i in range(4) for r in range(25)}
    )
