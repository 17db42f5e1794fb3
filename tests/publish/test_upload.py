"""Uploading a saver's shards (SPEC sections 4 and 5): the 5 GiB rule for deterministic
shards, spooling to a removed temporary file, multipart uploads, create-only put_file."""

from __future__ import annotations

from pathlib import Path

import pytest

from saver_helpers import make_saver, read_back
from seaweed import config_for
from syvain_training_data import (
    PublicationConflictError,
    storage,
)
from syvain_training_data.publish import (
    size_limits,
)
from syvain_training_data.storage import StorageConfig

# --- sizes: the 5 GiB rule, spooling, multipart ------------------------------------------------


def big_records(n: int, seed: int = 1) -> list[dict]:
    import random

    rng = random.Random(seed)
    return [{"id": i, "blob": rng.randbytes(2048).hex()} for i in range(n)]


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "parquet"])
def test_deterministic_single_put_formats_must_stay_under_the_limit(
    store_root, data_format
) -> None:
    if data_format == "parquet":
        pytest.importorskip("syvain_training_data.formats.parquet")
    root, config = store_root
    saver = make_saver(root, config, data_format)
    with (
        size_limits(deterministic_single_put_bytes=64 * 1024),
        pytest.raises(ValueError, match="smaller than 65536 bytes.*more shard IDs"),
    ):
        saver.save("t", None, big_records(200), shard_id="big")
    assert storage.list_objects(root, storage_config=config) == []
    # Shards without shard_id are not bound by it; nor is a small deterministic one.
    with size_limits(deterministic_single_put_bytes=64 * 1024):
        shard = saver.save("t", None, big_records(200))
        small = saver.save("t", None, big_records(5), shard_id="small")
    assert read_back(saver, shard) == big_records(200)
    assert read_back(saver, small) == big_records(5)


def test_message_names_5_gib() -> None:
    from syvain_training_data.publish.saver import _format_bytes

    assert _format_bytes(5 * 1024**3) == "5 GiB"


def test_spooled_shards_go_through_a_removed_temporary_file(
    store_root, tmp_path, monkeypatch
) -> None:
    import tempfile

    root, config = store_root
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    saver = make_saver(root, config, "jsonl.gz")
    with size_limits(spill_bytes=100 * 1024):
        shard = saver.save("t", None, big_records(300), shard_id="spooled")
        random_shard = saver.save("t", None, big_records(300))
        with pytest.raises(ValueError):
            saver.save("t", None, [*big_records(300), {"bad": object()}], shard_id="bad")
    assert list(spool_dir.iterdir()) == []
    assert shard.size_bytes > 100 * 1024
    assert read_back(saver, shard) == big_records(300)
    assert read_back(saver, random_shard) == big_records(300)
    assert not storage.list_objects(
        saver.shard_uri("t", None, "bad").rsplit("/", 1)[0] + "/part-bad", storage_config=config
    )


def test_multipart_uploads_and_create_only_over_the_single_put_limit(
    seaweed, s3_bucket, unique_prefix
) -> None:
    """Lowered limits: a random shard streams as multipart; a deterministic jsonl.gz shard over
    the single-PUT limit goes up as multipart after a HEAD, and is reused or refused after."""
    config = config_for(seaweed)
    root = f"s3://{s3_bucket}/{unique_prefix}"
    saver = make_saver(root, config, "jsonl.gz")
    rows = big_records(2500)  # about 3 MiB compressed
    limits = {
        "spill_bytes": 256 * 1024,
        "multipart_threshold": 1024 * 1024,
        "part_size": 1024 * 1024,  # raised to S3's 5 MiB minimum by put_file
        "deterministic_single_put_bytes": 1024 * 1024,
    }
    with size_limits(**limits):
        random_shard = saver.save("t", None, rows)
        shard = saver.save("t", None, rows, shard_id="big")
        assert "-" in shard.etag  # a multipart etag
        storage.delete_object(shard.uri + ".metadata.json", storage_config=config)
        assert make_saver(root, config, "jsonl.gz").save("t", None, rows, shard_id="big") == shard
        storage.delete_object(shard.uri + ".metadata.json", storage_config=config)
        with pytest.raises(PublicationConflictError):
            make_saver(root, config, "jsonl.gz").save("t", None, rows[:-1], shard_id="big")
    assert "-" in random_shard.etag
    assert read_back(saver, shard) == rows
    assert read_back(saver, random_shard) == rows


def test_put_file_local_create_only(tmp_path) -> None:
    from syvain_training_data import _native
    from syvain_training_data.storage import native_storage

    client = native_storage(StorageConfig())
    source = tmp_path / "src.bin"
    source.write_bytes(b"abc" * 1000)
    uri = f"file://{tmp_path}/dest/d.bin"
    size, etag = _native.put_file(client, uri, str(source), create_only=True)
    assert size == 3000 and etag == storage.head_object(uri).etag
    with pytest.raises(FileExistsError):
        _native.put_file(client, uri, source, create_only=True)
    source.write_bytes(b"xyz")
    _native.put_file(client, uri, source)
    assert storage.get_object(uri) == b"xyz"
    assert sorted(p.name for p in Path(tmp_path, "dest").iterdir()) == ["d.bin"]
