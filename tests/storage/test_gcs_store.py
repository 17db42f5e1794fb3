"""The gs:// store (SPEC section 4, v2) against fake-gcs-server on loopback, reached through
``STORAGE_EMULATOR_HOST`` as Google's clients reach an emulator: datasets in all three formats
load, mix and resume; reads are held by If-Match to the object's etag; listings; a gs://
manifest names gs:// shards only. Writes are refused before any request in this release (the
emulator does not serve the XML API object_store writes with, so they are not tested here)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gcs_emulator import FakeGcs, start_fake_gcs
from resumed_reads import interrupted_and_resumed
from syvain_training_data import SyvainTrainingData, iter_shard
from syvain_training_data.errors import ObjectChangedError
from syvain_training_data.storage import (
    delete_object,
    get_object,
    head_object,
    list_objects,
    open_stream,
    put_object,
)

FORMATS = ["msgpack.zstf", "jsonl.gz", "parquet"]
RECORDS = [{"i": i, "text": "g" * (i % 61)} for i in range(300)]


@pytest.fixture(scope="module")
def gcs() -> Iterator[tuple[FakeGcs, str]]:
    with start_fake_gcs() as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", server.url)
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        server.create_bucket(bucket)
        yield server, bucket


def publish(server: FakeGcs, bucket: str, tmp: Path, data_format: str) -> str:
    """A dataset the saver wrote locally, uploaded under gs://bucket/{format}/ with its
    manifest's shard URIs there: the manifest's URI."""
    client = SyvainTrainingData()
    root = tmp / data_format
    saver = client.dataset_saver(f"file://{root}/data-manifest.json", data_format=data_format)  # type: ignore[arg-type]
    for shard in range(3):
        saver.save("train", None, RECORDS[shard::3], shard_id=f"s{shard}")
    saver.commit_manifest()
    base = f"gs://{bucket}/{data_format}"
    for path in root.rglob("*"):
        if path.is_file() and path.name != "data-manifest.json":
            server.upload(bucket, f"{data_format}/{path.relative_to(root)}", path.read_bytes())
    manifest = (root / "data-manifest.json").read_text().replace(f"file://{root}", base)
    server.upload(bucket, f"{data_format}/data-manifest.json", manifest.encode())
    return f"{base}/data-manifest.json"


def as_list(batch: list[Any]) -> list[Any]:
    return batch


@pytest.mark.parametrize("data_format", FORMATS)
def test_a_dataset_on_gcs_loads_mixes_and_resumes(gcs, tmp_path, data_format):
    server, bucket = gcs
    uri = publish(server, bucket, tmp_path, data_format)
    client = SyvainTrainingData()
    shards = client.load_manifest(uri).splits["train"].shards
    assert [r["i"] for r in iter_shard(data_format, shards[2])] == [r["i"] for r in RECORDS[2::3]]
    seen = interrupted_and_resumed(client, uri, "i", seed=7, batches_before=7, ranks_after=3)
    assert sorted(seen) == list(range(len(RECORDS)))


def test_reads_are_held_to_the_etag_and_listings_name_every_object(gcs):
    server, bucket = gcs
    etag = server.upload(bucket, "pin/a.bin", bytes(range(256)) * 40)
    uri = f"gs://{bucket}/pin/a.bin"
    info = head_object(uri)
    assert info.size == 256 * 40 and info.etag.strip('"') == etag.strip('"')
    with open_stream(uri, size_bytes=info.size, etag=info.etag, start=1000) as stream:
        assert b"".join(stream) == (bytes(range(256)) * 40)[1000:]
    server.upload(bucket, "pin/a.bin", bytes(256 * 40))  # replaced, same size
    with (
        pytest.raises(ObjectChangedError, match=uri),
        open_stream(uri, size_bytes=info.size, etag=info.etag) as stream,
    ):
        b"".join(stream)
    server.upload(bucket, "pin/b.bin", b"b")
    listed = list_objects(f"gs://{bucket}/pin")
    assert [(o.uri, o.size) for o in listed] == [(uri, 256 * 40), (f"gs://{bucket}/pin/b.bin", 1)]
    with pytest.raises(FileNotFoundError, match=f"gs://{bucket}/pin/none"):
        get_object(f"gs://{bucket}/pin/none")


def test_writes_are_refused_before_any_request(gcs):
    _, bucket = gcs
    uri = f"gs://{bucket}/w/a.json"
    for write in (lambda: put_object(uri, b"{}"), lambda: delete_object(uri)):
        with pytest.raises(ValueError, match="gs:// is read-only"):
            write()
    with pytest.raises(ValueError, match="read-only"):
        SyvainTrainingData().dataset_saver(uri).save("train", None, [{"i": 1}])
    with pytest.raises(FileNotFoundError):
        head_object(uri)  # nothing was written


def test_a_gcs_manifest_names_gcs_shards_only(gcs, tmp_path):
    server, bucket = gcs
    uri = publish(server, bucket, tmp_path, "jsonl.gz")
    body = get_object(uri).decode().replace(f"gs://{bucket}/", "s3://elsewhere/")
    server.upload(bucket, "mixed/data-manifest.json", body.encode())
    loader = SyvainTrainingData().split_data_loader(
        f"gs://{bucket}/mixed/data-manifest.json", as_list, {"batch_size": 4}
    )
    with pytest.raises(ValueError, match="may name only gs:// shards"):
        list(loader.load("train"))
