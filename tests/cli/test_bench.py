"""`syvain-data bench`: a split read as training reads it, its rates and the loader's counters."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from cli_support import console_script, file_store, publish, run


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
    assert unknown.code == 2 and "Unknown split 'nope'" in unknown.err
    for seconds in ("0", "-1", "nan", "soon"):
        result = run("bench", manifest_uri, "--seconds", seconds)
        assert result.code == 2 and "--seconds" in result.err
