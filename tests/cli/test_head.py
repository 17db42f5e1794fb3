"""`syvain-data head`: records as JSON lines, across shards, by split and stage, into a pipe."""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

from cli_support import RECORDS_PER_SHARD, console_script, file_store, publish, records_of, run
from syvain_training_data import SyvainTrainingData


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
    assert "Unknown split 'test'; available splits: train, val" in result.err
    result = run("head", manifest_uri, "--split", "val", "--stage", "x")
    assert result.code == 2 and "available stages: (none)" in result.err


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
