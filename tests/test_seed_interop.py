"""Interop with the seed implementation, the real thing: ``syvain-training-data==0.0.252``
from the registry, installed in a separate venv, over SeaweedFS (the seed speaks S3 only).

Shard index objects (``{shard_uri}.index``) are new objects next to shards, so: the seed
reads what we write and resumes our half-finished saver runs, and we read and resume its.
The venv is cached in ``.cache/seed-venv`` (or ``SYVAIN_SEED_VENV``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from seaweed import storage_options

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.formats.shard_index import INDEX_SUFFIX  # noqa: E402
from syvain_training_data.storage import head_object  # noqa: E402

SEED_VERSION = "0.0.252"
# The seed reads Parquet through pyarrow, which it does not install (its own dev pin).
SEED_PYARROW = "pyarrow>=23.0.1,<24"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def seed_python() -> str:
    """The Python of a venv holding the seed package (created once, then reused)."""
    venv = Path(os.environ.get("SYVAIN_SEED_VENV", ROOT / ".cache" / "seed-venv"))
    python = venv / "bin" / "python"
    marker = venv / f"seed-{SEED_VERSION}-pyarrow.installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                f"syvain-training-data=={SEED_VERSION}",
                SEED_PYARROW,
            ],
            check=True,
            timeout=600,
        )
        marker.write_text(SEED_VERSION)
    return str(python)


def run_seed(seed_python: str, seaweed, code: str, *args: str) -> Any:
    """Runs ``code`` in the seed's venv with ``client`` (a seed SyvainTrainingData on
    SeaweedFS) and ``args``; returns the JSON it prints last."""
    prologue = textwrap.dedent(
        """
        import json, sys
        import syvain_training_data
        import syvain_training_data.storage as seed_storage
        from syvain_training_data import SyvainTrainingData, iter_shard
        assert syvain_training_data.__file__.find("site-packages") > 0
        # The seed has no option for an http:// endpoint (obstore refuses one unless
        # allow_http): the only change made to it, so it can reach the loopback SeaweedFS.
        real_store = seed_storage.S3Store
        def http_store(*a, client_options=None, **k):
            options = {**(client_options or {}), "allow_http": True}
            return real_store(*a, client_options=options, **k)
        seed_storage.S3Store = http_store
        config = json.loads(sys.stdin.read())
        client = SyvainTrainingData(**config)
        args = sys.argv[1:]
        """
    )
    config = {
        "s3_base_url": seaweed.endpoint,
        "region": seaweed.region,
        "access_key_id": seaweed.access_key_id,
        "secret_access_key": seaweed.secret_access_key,
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [seed_python, "-I", "-c", prologue + textwrap.dedent(code), *args],
        input=json.dumps(config),
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(seaweed) -> SyvainTrainingData:
    return SyvainTrainingData(**storage_options(seaweed))


SEED_SAVE = """
manifest_uri, data_format, first, last, commit = args
saver = client.dataset_saver(manifest_uri, data_format=data_format)
for source in range(int(first), int(last)):
    rows = ({"source": source, "i": i} for i in range(300))
    saver.save("train", None, rows, shard_id=f"{source:02d}")
if commit == "commit":
    saver.commit_manifest()
print(json.dumps("saved"))
"""

SEED_READ = """
(manifest_uri,) = args
manifest = client.load_manifest(manifest_uri)
rows = [
    [r["source"], r["i"]]
    for shard in manifest.splits["train"].shards
    for r in iter_shard(manifest.data_format, shard, storage_config=client._storage_config)
]
print(json.dumps(rows))
"""

EVERY = sorted((s, i) for s in range(16) for i in range(300))


def our_save(
    client: SyvainTrainingData,
    manifest_uri: str,
    first: int,
    last: int,
    data_format: str = "msgpack.zstf",
) -> None:
    saver = client.dataset_saver(manifest_uri, data_format=data_format)  # type: ignore[arg-type]
    for source in range(first, last):
        rows = ({"source": source, "i": i} for i in range(300))
        saver.save("train", None, rows, shard_id=f"{source:02d}")
    if last == 16:
        saver.commit_manifest()


def seeded_keys(client: SyvainTrainingData, manifest_uri: str) -> list[tuple[int, int]]:
    args = {"batch_size": 32, "num_workers": 2, "multiprocessing_context": "fork"}
    loader = client.split_data_loader(manifest_uri, list, args).load("train", seed=3)
    batches = list(loader)
    distinct = sum(len({r["source"] for r in batch}) for batch in batches) / len(batches)
    # 16 whole-shard blocks in one window: about a uniform permutation's 13.9 of 16 sources.
    assert distinct > 0.8 * 13.9, distinct
    return sorted((r["source"], r["i"]) for batch in batches for r in batch)


def test_we_read_and_resume_what_the_seed_wrote(seed_python, seaweed, s3_bucket):
    client = ours(seaweed)
    for data_format in ("msgpack.zstf", "jsonl.gz", "parquet"):
        manifest_uri = f"s3://{s3_bucket}/seed-{uuid.uuid4().hex}/data-manifest.json"
        # The seed's half-finished run, which we finish (its shards have no index).
        run_seed(seed_python, seaweed, SEED_SAVE, manifest_uri, data_format, "0", "8", "-")
        saver = client.dataset_saver(manifest_uri, data_format=data_format)  # type: ignore[arg-type]
        for source in range(16):
            rows = ({"source": source, "i": i} for i in range(300))
            saver.save("train", None, rows, shard_id=f"{source:02d}")
        saver.commit_manifest()
        assert seeded_keys(client, manifest_uri) == EVERY


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "jsonl.gz", "parquet"])
def test_the_seed_reads_and_resumes_what_we_wrote(seed_python, seaweed, s3_bucket, data_format):
    """Ours: index objects beside msgpack.zstf and jsonl.gz shards; Parquet shards with an
    offset index, page CRCs and no dictionary pages inside them."""
    client = ours(seaweed)
    manifest_uri = f"s3://{s3_bucket}/ours-{uuid.uuid4().hex}/data-manifest.json"
    our_save(client, manifest_uri, 0, 8, data_format)  # our half-finished run, with indexes
    run_seed(seed_python, seaweed, SEED_SAVE, manifest_uri, data_format, "0", "16", "commit")
    manifest = client.load_manifest(manifest_uri)
    shards = manifest.splits["train"].shards
    has_index = Counter(_exists(s.uri + INDEX_SUFFIX, client) for s in shards)
    assert has_index == ({False: 16} if data_format == "parquet" else {True: 8, False: 8})
    rows = run_seed(seed_python, seaweed, SEED_READ, manifest_uri)
    assert sorted(map(tuple, rows)) == EVERY
    assert seeded_keys(client, manifest_uri) == EVERY


def test_the_seed_reads_a_dataset_we_wrote_whole(seed_python, seaweed, s3_bucket):
    client = ours(seaweed)
    manifest_uri = f"s3://{s3_bucket}/whole-{uuid.uuid4().hex}/data-manifest.json"
    our_save(client, manifest_uri, 0, 16)
    rows = run_seed(seed_python, seaweed, SEED_READ, manifest_uri)
    assert sorted(map(tuple, rows)) == EVERY
    assert seeded_keys(client, manifest_uri) == EVERY


def _exists(uri: str, client: SyvainTrainingData) -> bool:
    try:
        head_object(uri, storage_config=client.storage_config)
    except FileNotFoundError:
        return False
    return True


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "jsonl.gz"])
def test_the_seeds_dataset_gets_indexes_and_still_reads_in_the_seed(
    seed_python, seaweed, s3_bucket, data_format
):
    """``syvain-data index`` gives a dataset the seed wrote (no indexes) the indexes ours
    have; the seed still reads it, and our seeded loader orders it as an indexed dataset."""
    from syvain_training_data.cli import main

    client = ours(seaweed)
    manifest_uri = f"s3://{s3_bucket}/seed-index-{uuid.uuid4().hex}/data-manifest.json"
    run_seed(seed_python, seaweed, SEED_SAVE, manifest_uri, data_format, "0", "16", "commit")
    shards = client.load_manifest(manifest_uri).splits["train"].shards
    assert not any(_exists(s.uri + INDEX_SUFFIX, client) for s in shards)
    assert main(["index", manifest_uri, "--no-progress"], environ=seaweed.env()) == 0
    assert all(_exists(s.uri + INDEX_SUFFIX, client) for s in shards)
    rows = run_seed(seed_python, seaweed, SEED_READ, manifest_uri)
    assert sorted(map(tuple, rows)) == EVERY
    assert seeded_keys(client, manifest_uri) == EVERY
