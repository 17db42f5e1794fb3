"""DatasetSaver (SPEC section 5) on SeaweedFS and on the local directory store: layout,
descriptors, conflicts, metadata and ordering rules, the 5 GiB rule, uploads."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from seaweed import config_for
from syvain_training_data import (
    DatasetSaver,
    ManifestShard,
    PublicationConflictError,
    SyvainTrainingData,
    storage,
)
from syvain_training_data.publish import (
    DESCRIPTOR_SCHEMA,
    encode_segment,
    size_limits,
)
from syvain_training_data.shard import iter_shard
from syvain_training_data.storage import StorageConfig

FORMATS = ["jsonl.gz", "msgpack.zstf"]


@pytest.fixture(params=["s3", "file"])
def store_root(request, tmp_path, monkeypatch) -> tuple[str, StorageConfig]:
    """A writable prefix URI and its config, on SeaweedFS and on the local directory store.

    For SeaweedFS the credentials are also in the environment, where pickled copies of a saver
    (in this process or a spawned worker) take the secret from, as workers do in production."""
    if request.param == "s3":
        server = request.getfixturevalue("seaweed")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        prefix = request.getfixturevalue("unique_prefix")
        return f"s3://{request.getfixturevalue('s3_bucket')}/{prefix}", config_for(server)
    return f"file://{tmp_path}/store", StorageConfig()


def make_saver(root: str, config: StorageConfig, data_format: str = "msgpack.zstf") -> DatasetSaver:
    return DatasetSaver(
        f"{root}/ds/data-manifest.json", data_format=data_format, storage_config=config
    )


def records(n: int, start: int = 0) -> list[dict]:
    return [{"id": start + i, "text": f"record {start + i} é"} for i in range(n)]


def read_back(saver: DatasetSaver, shard: ManifestShard) -> list[dict]:
    return list(iter_shard(saver.data_format, shard, storage_config=saver.storage_config))


# --- layout ----------------------------------------------------------------------------------


def test_segment_encoding() -> None:
    assert encode_segment("  a/b c  ") == "a%2Fb%20c"
    assert encode_segment("é") == "%C3%A9"
    assert encode_segment("Az09-_.=+~") == "Az09-_.=+%7E"
    for bad in ["", "   ", ".", ".."]:
        with pytest.raises(ValueError):
            encode_segment(bad)
    with pytest.raises(TypeError):
        encode_segment(3)  # type: ignore[arg-type]


def test_uri_layout() -> None:
    saver = DatasetSaver("s3://b/a/m.json", data_format="parquet", storage_config=StorageConfig())
    digest = hashlib.sha256(b"a/m.json").hexdigest()
    assert saver.shard_uri("tr ain", "st/1", "x y") == (
        f"s3://b/a/shards/by-manifest/{digest}/tr%20ain/curriculum/st%2F1/part-x%20y.parquet"
    )
    assert re.fullmatch(
        r"s3://b/a/shards/train/part-[0-9a-f]{32}\.parquet", saver.shard_uri("train", None, None)
    )
    root = DatasetSaver("s3://b/m.json", storage_config=StorageConfig())
    assert root.shard_uri(" t ", None, "1") == (
        f"s3://b/shards/by-manifest/{hashlib.sha256(b'm.json').hexdigest()}/t/part-1.jsonl.gz"
    )
    local = DatasetSaver("file:///data/x/m.json", data_format="msgpack.zstf")
    assert local.shard_uri("t", None, "é") == (
        f"file:///data/x/shards/by-manifest/{hashlib.sha256(b'data/x/m.json').hexdigest()}"
        "/t/part-%C3%A9.msgpack.zstf"
    )
    for bad in ["s3://b/prefix/", "s3://b", "http://x/y", "file://rel/x"]:
        with pytest.raises(ValueError):
            DatasetSaver(bad)
    with pytest.raises(ValueError, match="Unknown data format"):
        DatasetSaver("s3://b/m.json", data_format="csv")  # type: ignore[arg-type]


def test_client_dataset_saver_and_pickle(store_root) -> None:
    root, config = store_root
    client = SyvainTrainingData(
        s3_base_url=config.s3_base_url,
        region=config.region,
        access_key_id=config.access_key_id,
        secret_access_key=config.secret_access_key,
    )
    saver = client.dataset_saver(f"{root}/m.json")
    assert saver.data_format == "jsonl.gz" and saver.storage_config == config
    copy = pickle.loads(pickle.dumps(saver))
    assert copy.session_id == saver.session_id and copy.manifest_uri == saver.manifest_uri
    shard = copy.save("train", None, records(3), shard_id="0")
    assert read_back(saver, shard) == records(3)


# --- save, descriptors, reuse ----------------------------------------------------------------


@pytest.mark.parametrize("data_format", FORMATS)
def test_save_writes_shard_descriptor_and_attributes(store_root, data_format, seaweed) -> None:
    root, config = store_root
    saver = make_saver(root, config, data_format)
    shard = saver.save(
        "train", "easy", records(100), curriculum_metadata={"w": [1, "é"]}, shard_id="s/1"
    )
    assert shard.uri == saver.shard_uri("train", "easy", "s/1") and "part-s%2F1" in shard.uri
    assert shard.records == 100
    data = storage.get_object(shard.uri, storage_config=config)
    assert len(data) == shard.size_bytes
    assert read_back(saver, shard) == records(100)
    descriptor = storage.get_object(shard.uri + ".metadata.json", storage_config=config)
    expected = {
        "curriculum_metadata": {"w": [1, "é"]},
        "curriculum_stage": "easy",
        "data_format": data_format,
        "schema": DESCRIPTOR_SCHEMA,
        "sha256": hashlib.sha256(data).hexdigest(),
        "shard": {
            "etag": shard.etag,
            "records": 100,
            "size_bytes": shard.size_bytes,
            "uri": shard.uri,
        },
        "split": "train",
    }
    assert (
        descriptor == (json.dumps(expected, sort_keys=True, separators=(",", ":")) + "\n").encode()
    )
    assert b"\\u00e9" in descriptor
    if root.startswith("s3://"):
        key = shard.uri.split("/", 3)[3]
        response = seaweed.request("HEAD", f"/{root.split('/')[2]}/{key}")
        content_type = {"jsonl.gz": "application/gzip", "msgpack.zstf": "application/msgpack"}
        assert response.header("content-type") == content_type[data_format]
        fmt = {"jsonl.gz": ("jsonl", "gzip"), "msgpack.zstf": ("msgpack.zstf", "zstd-framed")}
        assert response.header("x-amz-meta-content-format") == fmt[data_format][0]
        assert response.header("x-amz-meta-compression") == fmt[data_format][1]
        response = seaweed.request("HEAD", f"/{root.split('/')[2]}/{key}.metadata.json")
        assert response.header("content-type") == "application/json"


def test_jsonl_gz_bytes_are_the_codec_bytes(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config, "jsonl.gz")
    shard = saver.save("t", None, records(3), shard_id="a")
    data = storage.get_object(shard.uri, storage_config=config)
    lines = gzip.decompress(data).decode().splitlines()
    assert [json.loads(line) for line in lines] == records(3)


def test_recover_and_reuse_without_consuming(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    assert saver.recover("train", None, shard_id="a") is None
    shard = saver.save("train", None, records(5), shard_id="a")
    other = make_saver(root, config)

    def exploding():
        raise AssertionError("records were consumed")
        yield {}

    assert other.save("train", None, exploding(), shard_id="a") == shard
    assert other.recover("train", None, shard_id="a") == shard
    assert other.recover("train", None, shard_id="a", curriculum_metadata=None) == shard
    with pytest.raises(PublicationConflictError, match="metadata"):
        other.recover("train", None, shard_id="a", curriculum_metadata={"x": 1})
    # A crash between the data object and its descriptor: identical bytes are reused.
    storage.delete_object(shard.uri + ".metadata.json", storage_config=config)
    again = make_saver(root, config).save("train", None, records(5), shard_id="a")
    assert again.uri == shard.uri and again.size_bytes == shard.size_bytes
    # Different bytes under the same shard ID: conflict, nothing replaced.
    storage.delete_object(shard.uri + ".metadata.json", storage_config=config)
    with pytest.raises(PublicationConflictError, match="different bytes"):
        make_saver(root, config).save("train", None, records(6), shard_id="a")
    assert storage.get_object(shard.uri, storage_config=config) == storage.get_object(
        again.uri, storage_config=config
    )


def test_existing_descriptor_with_other_bytes_is_a_conflict(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    uri = saver.shard_uri("t", None, "a")
    storage.put_object(uri + ".metadata.json", b"{}\n", storage_config=config)
    with pytest.raises(PublicationConflictError):
        saver.save("t", None, records(2), shard_id="a")


def test_empty_shard_and_argument_rules(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    with pytest.raises(ValueError, match="^Cannot save an empty record shard$"):
        saver.save("train", None, [], shard_id="e")
    with pytest.raises(ValueError, match="^Cannot save an empty record shard$"):
        saver.save("train", None, iter(()))
    assert storage.list_objects(root, storage_config=config) == []
    with pytest.raises(ValueError, match="split"):
        saver.save("  ", None, records(1))
    with pytest.raises(ValueError, match="curriculum_stage"):
        saver.save("t", "", records(1))
    with pytest.raises(ValueError, match="requires a curriculum_stage"):
        saver.save("t", None, records(1), curriculum_metadata={"a": 1})
    with pytest.raises(ValueError, match="JSON object"):
        saver.save("t", "s", records(1), curriculum_metadata={"a": float("nan")})
    with pytest.raises(ValueError, match="shard_id"):
        saver.save("t", None, records(1), shard_id=" ")
    with pytest.raises(ValueError, match="no saved shards"):
        saver.commit_manifest()


def test_segments_with_slash_space_and_unicode(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save(" tr/ain ", "stage é/1", records(4), shard_id="id with/slash ü")
    assert "/%20" not in shard.uri and "/tr%2Fain/curriculum/stage%20%C3%A9%2F1/" in shard.uri
    assert shard.uri.endswith("/part-id%20with%2Fslash%20%C3%BC.msgpack.zstf")
    manifest = make_saver(root, config).commit_manifest()
    assert list(manifest.splits) == [" tr/ain "]
    assert list(manifest.splits[" tr/ain "].curriculum) == ["stage é/1"]
    assert read_back(saver, manifest.splits[" tr/ain "].shards[0]) == records(4)


# --- tampering -----------------------------------------------------------------------------

TAMPER = {
    "curriculum_metadata": lambda d: d.update(curriculum_metadata={"w": 2}),
    "curriculum_stage": lambda d: d.update(curriculum_stage="other"),
    "data_format": lambda d: d.update(data_format="jsonl.gz"),
    "schema": lambda d: d.update(schema="syvain-training-data-shard-v2"),
    # A digest that does not match: caught where the sha256 is recomputed (no etag to compare).
    "sha256": lambda d: d.update(sha256="0" * 64) or d["shard"].update(etag=""),
    "sha256 not hex": lambda d: d.update(sha256="xyz"),
    "shard.etag": lambda d: d["shard"].update(etag='"0123"'),
    "shard.size_bytes": lambda d: d["shard"].update(size_bytes=d["shard"]["size_bytes"] + 1),
    "shard.uri": lambda d: d["shard"].update(uri=d["shard"]["uri"].replace("part-a", "part-b")),
    "shard extra key": lambda d: d["shard"].update(extra=1),
    "split": lambda d: d.update(split="val"),
    "extra key": lambda d: d.update(extra=None),
    "missing key": lambda d: d.pop("sha256"),
}


@pytest.mark.parametrize("field", list(TAMPER))
def test_tampered_descriptor_is_a_conflict(store_root, field) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save("train", "easy", records(3), curriculum_metadata={"w": 1}, shard_id="a")
    uri = shard.uri + ".metadata.json"
    document = json.loads(storage.get_object(uri, storage_config=config))
    TAMPER[field](document)
    tampered = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    storage.put_object(uri, tampered, storage_config=config)
    fresh = make_saver(root, config)
    if field == "shard.etag" and root.startswith("file://"):
        # SPEC 4: a local etag in a descriptor is not enforced (the sha256 guards the bytes).
        assert fresh.recover("train", "easy", shard_id="a", curriculum_metadata={"w": 1}) == shard
        return
    with pytest.raises(PublicationConflictError):
        fresh.recover("train", "easy", shard_id="a", curriculum_metadata={"w": 1})
    with pytest.raises(PublicationConflictError):
        fresh.save("train", "easy", records(3), curriculum_metadata={"w": 1}, shard_id="a")
    if field != "curriculum_metadata":  # a consistent other metadata is only caught when passed
        with pytest.raises(PublicationConflictError):
            fresh.commit_manifest()


def test_a_descriptor_etag_without_quotes_still_names_its_object(store_root) -> None:
    # Another writer may record the etag without the quotes S3 puts around it.
    root, config = store_root
    shard = make_saver(root, config).save("train", None, records(3), shard_id="a")
    uri = shard.uri + ".metadata.json"
    document = json.loads(storage.get_object(uri, storage_config=config))
    document["shard"]["etag"] = document["shard"]["etag"].strip('"')
    rewritten = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    storage.put_object(uri, rewritten, storage_config=config)
    recovered = make_saver(root, config).recover("train", None, shard_id="a")
    assert recovered.model_copy(update={"etag": shard.etag}) == shard


def test_non_canonical_descriptor_and_replaced_or_missing_data(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save("train", None, records(3), shard_id="a")
    uri = shard.uri + ".metadata.json"
    original = storage.get_object(uri, storage_config=config)
    storage.put_object(
        uri, json.dumps(json.loads(original), indent=1).encode(), storage_config=config
    )
    with pytest.raises(PublicationConflictError, match="canonical"):
        make_saver(root, config).recover("train", None, shard_id="a")
    storage.put_object(uri, original, storage_config=config)
    assert make_saver(root, config).recover("train", None, shard_id="a") == shard
    # Replaced data object (same size, other bytes): the etag (or the digest) gives it away.
    data = bytearray(storage.get_object(shard.uri, storage_config=config))
    data[-1] ^= 1
    storage.put_object(shard.uri, bytes(data), storage_config=config)
    with pytest.raises(PublicationConflictError):
        make_saver(root, config).recover("train", None, shard_id="a")
    # The same with no etag in the descriptor: the sha256 is recomputed.
    document = json.loads(original)
    document["shard"]["etag"] = ""
    storage.put_object(
        uri,
        (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode(),
        storage_config=config,
    )
    with pytest.raises(PublicationConflictError, match="sha256"):
        make_saver(root, config).recover("train", None, shard_id="a")
    # A descriptor without its data object.
    storage.delete_object(shard.uri, storage_config=config)
    with pytest.raises(PublicationConflictError, match="does not exist"):
        make_saver(root, config).recover("train", None, shard_id="a")
    with pytest.raises(PublicationConflictError):
        make_saver(root, config).commit_manifest()


# --- local etags (SPEC 4) ---------------------------------------------------------------------


def test_a_restored_local_dataset_recovers_commits_and_reads(tmp_path) -> None:
    root = tmp_path / "store"
    saver = make_saver(f"file://{root}", StorageConfig(), "parquet")
    saved = [saver.save("train", None, records(50, 50 * i), shard_id=f"s{i}") for i in range(3)]
    manifest = saver.commit_manifest()
    descriptors = [json.loads(storage.get_object(shard.uri + ".metadata.json")) for shard in saved]
    assert {shard.etag for shard in manifest.splits["train"].shards} == {""}
    assert {document["shard"]["etag"] for document in descriptors} == {""}

    # A backup and a restore: the same paths, new files with new mtimes (so new local etags).
    shutil.copytree(root, tmp_path / "backup")
    before = {shard.uri: storage.head_object(shard.uri).etag for shard in saved}
    shutil.rmtree(root)
    shutil.copytree(tmp_path / "backup", root)
    for path in root.rglob("*"):
        if path.is_file():
            later = path.stat().st_mtime_ns + 10**9
            os.utime(path, ns=(later, later))
    assert all(storage.head_object(uri).etag != etag for uri, etag in before.items())

    again = make_saver(f"file://{root}", StorageConfig(), "parquet")
    assert again.recover("train", None, shard_id="s0") == saved[0]
    assert again.commit_manifest() == manifest
    rows = [row for shard in manifest.splits["train"].shards for row in read_back(again, shard)]
    assert rows == records(150)


def test_a_local_etag_written_by_an_older_saver_is_not_enforced(tmp_path) -> None:
    saver = make_saver(f"file://{tmp_path}", StorageConfig(), "parquet")
    shard = saver.save("train", None, records(5), shard_id="a")
    descriptor_uri = shard.uri + ".metadata.json"
    document = json.loads(storage.get_object(descriptor_uri))
    document["shard"]["etag"] = "1234-1700000000000000000"  # an inode and mtime long gone
    old = (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()
    storage.put_object(descriptor_uri, old)
    fresh = make_saver(f"file://{tmp_path}", StorageConfig(), "parquet")
    assert fresh.recover("train", None, shard_id="a") == shard  # published without the etag
    assert fresh.commit_manifest().splits["train"].shards == [shard]
    stale = shard.model_copy(update={"etag": "1234-1700000000000000000"})
    assert read_back(fresh, stale) == records(5)


# --- commit ----------------------------------------------------------------------------------


def test_commit_is_idempotent_and_conflicts(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    saver.save("train", None, records(3), shard_id="b")
    saver.save("train", None, records(2, 3), shard_id="a")
    random_shard = saver.save("val", None, records(1, 5))
    first = saver.commit_manifest()
    data = storage.get_object(saver.manifest_uri, storage_config=config)
    assert saver.commit_manifest() == first
    assert pickle.loads(pickle.dumps(saver)).commit_manifest() == first
    assert storage.get_object(saver.manifest_uri, storage_config=config) == data
    assert [s.uri for s in first.splits["train"].shards] == sorted(
        s.uri for s in first.splits["train"].shards
    )
    assert first.splits["val"].shards == [random_shard]
    # A later saver instance does not see the first one's random shard: different manifest.
    with pytest.raises(PublicationConflictError, match="different manifest"):
        make_saver(root, config).commit_manifest()
    # An invalid manifest in the way.
    other = DatasetSaver(f"{root}/ds2/m.json", data_format="msgpack.zstf", storage_config=config)
    other.save("t", None, records(1))
    storage.put_object(other.manifest_uri, b"not json", storage_config=config)
    with pytest.raises(PublicationConflictError, match="invalid manifest"):
        other.commit_manifest()


def test_workers_shards_are_found_from_the_store(store_root) -> None:
    root, config = store_root
    parent = make_saver(root, config)
    worker = pickle.loads(pickle.dumps(parent))
    det = worker.save("train", None, records(2), shard_id="w")
    rnd = worker.save("train", None, records(2, 2))
    stale = make_saver(root, config)  # an abandoned instance
    stale_random = stale.save("train", None, records(1, 9))
    manifest = parent.commit_manifest()
    uris = {s.uri for s in manifest.splits["train"].shards}
    assert uris == {det.uri, rnd.uri}
    assert stale_random.uri not in uris


def test_saving_from_threads(store_root) -> None:
    """One saver shared by threads: every shard, deterministic or not, is published once."""
    from concurrent.futures import ThreadPoolExecutor

    root, config = store_root
    saver = make_saver(root, config)

    def save(part: int) -> ManifestShard:
        stage = "hard" if part % 2 else "easy"
        shard_id = f"part-{part}" if part < 6 else None
        return saver.save("train", stage, records(50, 50 * part), shard_id=shard_id)

    with ThreadPoolExecutor(4) as pool:
        shards = list(pool.map(save, range(8)))
    manifest = saver.commit_manifest()
    train = manifest.splits["train"]
    assert sorted(s.uri for s in train.shards) == sorted(s.uri for s in shards)
    assert {name: stage.records for name, stage in train.curriculum.items()} == {
        "easy": 200,
        "hard": 200,
    }
    ids = sorted(r["id"] for shard in train.shards for r in read_back(saver, shard))
    assert ids == list(range(400))


def test_expected_shards(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    saver.expect_shards("train", None, ["a", "b", "c"])
    saver.expect_shards("train", "hard", ["h"])
    saver.save("train", None, records(1), shard_id="a")
    with pytest.raises(ValueError, match=r"stage None is missing shard IDs \['b', 'c'\]") as error:
        saver.commit_manifest()
    assert "stage 'hard' is missing shard IDs ['h']" in str(error.value)
    assert not storage.list_objects(root, storage_config=config) or not any(
        o.uri == saver.manifest_uri for o in storage.list_objects(root, storage_config=config)
    )
    saver.save("train", None, records(1, 1), shard_id="b")
    saver.save("train", None, records(1, 2), shard_id="c")
    saver.save("train", None, records(1, 3), shard_id="d")
    saver.save("train", "hard", records(1, 4), shard_id="h")
    with pytest.raises(ValueError, match="unexpected shards"):
        saver.commit_manifest()
    with pytest.raises(PublicationConflictError):
        saver.expect_shards("train", None, ["a"])
    fresh = make_saver(root, config)
    fresh.expect_shards("train", None, ["a", "b", "c", "d"])
    fresh.expect_shards("train", "hard", ["h"])
    assert fresh.commit_manifest().splits["train"].records == 5


def test_two_commits_at_once(store_root) -> None:
    """Two processes commit the same dataset at once: both succeed, one manifest object."""
    import multiprocessing

    root, config = store_root
    saver = make_saver(root, config)
    for i in range(4):
        saver.save("train", None, records(2, 2 * i), shard_id=str(i))
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [
        context.Process(target=_commit_after, args=(saver, barrier, results)) for _ in range(2)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
    assert outcomes[0] == outcomes[1] and outcomes[0].startswith(b"{")
    manifest_objects = [
        o
        for o in storage.list_objects(f"{root}/ds", storage_config=config)
        if o.uri == saver.manifest_uri
    ]
    assert len(manifest_objects) == 1
    assert storage.get_object(saver.manifest_uri, storage_config=config) == outcomes[0]


def _commit_after(saver: DatasetSaver, barrier, results) -> None:
    from syvain_training_data.manifest import canonical_manifest_bytes

    fresh = DatasetSaver(
        saver.manifest_uri, data_format=saver.data_format, storage_config=saver.storage_config
    )
    barrier.wait()
    try:
        results.put(canonical_manifest_bytes(fresh.commit_manifest()))
    except Exception as error:  # reported to the parent
        results.put(repr(error).encode())


# --- curriculum metadata and ordering --------------------------------------------------------


def test_curriculum_metadata_rules(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    saver.save("t", "none", records(1), shard_id="n1")
    saver.save("t", "none", records(1, 1), shard_id="n2")
    saver.save("t", "same", records(1, 2), curriculum_metadata={"k": [1]}, shard_id="s1")
    saver.save("t", "same", records(1, 3), curriculum_metadata={"k": [1]}, shard_id="s2")
    manifest = saver.build_manifest()
    assert manifest.splits["t"].curriculum["none"].metadata == {}
    assert manifest.splits["t"].curriculum["same"].metadata == {"k": [1]}
    assert list(manifest.splits["t"].curriculum) == ["none", "same"]
    saver.save("t", "partial", records(1, 4), curriculum_metadata={"k": 1}, shard_id="p1")
    saver.save("t", "partial", records(1, 5), shard_id="p2")
    with pytest.raises(ValueError, match="^Partial curriculum metadata for stage 'partial'$"):
        saver.build_manifest()
    other = DatasetSaver(f"{root}/o/m.json", data_format="msgpack.zstf", storage_config=config)
    other.save("t", "mixed", records(1), curriculum_metadata={"k": 1}, shard_id="m1")
    other.save("t", "mixed", records(1, 1), curriculum_metadata={"k": 2}, shard_id="m2")
    with pytest.raises(ValueError, match="^Inconsistent curriculum metadata for stage 'mixed'$"):
        other.commit_manifest()


def test_register_curriculum_and_split_order(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    a = saver.save("t", None, records(1), shard_id="a")
    b = saver.save("t", None, records(1, 1), shard_id="b")
    c = saver.save("t", "hard", records(1, 2), curriculum_metadata={"level": 3}, shard_id="c")
    d = saver.save("t", "hard", records(1, 3), curriculum_metadata={"level": 3}, shard_id="d")
    v = saver.save("v", None, records(1, 4), shard_id="v")
    saver.register_curriculum("t", "warmup", [b, a.uri], curriculum_metadata={"lr": 0.1})
    saver.register_curriculum("t", "warmup", [b, a], curriculum_metadata={"lr": 0.1})  # same: fine
    with pytest.raises(PublicationConflictError):
        saver.register_curriculum("t", "warmup", [a, b], curriculum_metadata={"lr": 0.1})
    saver.register_curriculum("t", "hard", [d, c])
    with pytest.raises(ValueError, match="contradicts"):
        saver.register_curriculum("t", "hard", [c])
    saver.register_curriculum("t", "hard2", [c, d])  # stages may overlap
    with pytest.raises(ValueError, match="Inconsistent"):
        saver.register_curriculum("t", "hard", [d, c], curriculum_metadata={"level": 4})
    with pytest.raises(ValueError, match="repeats"):
        saver.register_curriculum("t", "x", [a, a])
    with pytest.raises(ValueError, match="at least one"):
        saver.register_curriculum("t", "x", [])
    with pytest.raises(ValueError, match="not saved"):
        saver.register_curriculum("t", "x", [v])
    with pytest.raises(ValueError, match="leaves out"):
        saver.register_split_order("t", [d, c, b])
    with pytest.raises(ValueError, match="not saved"):
        saver.register_split_order("t", [d, c, b, a, v])
    saver.register_split_order("t", [d, c, b, a])
    with pytest.raises(PublicationConflictError):
        saver.register_split_order("t", [a, b, c, d])
    manifest = saver.commit_manifest()
    split = manifest.splits["t"]
    assert [s.uri for s in split.shards] == [d.uri, c.uri, b.uri, a.uri]
    assert list(split.curriculum) == ["hard", "hard2", "warmup"]
    assert split.curriculum["warmup"].shards == [b, a]
    assert split.curriculum["warmup"].metadata == {"lr": 0.1}
    assert split.curriculum["hard"].shards == [d, c]
    assert split.curriculum["hard"].metadata == {"level": 3}
    assert manifest.splits["v"].shards == [v]


def test_registration_names_shards_from_workers(store_root) -> None:
    root, config = store_root
    parent = make_saver(root, config)
    worker = pickle.loads(pickle.dumps(parent))
    x = worker.save("t", None, records(1), shard_id="x")
    y = worker.save("t", None, records(1, 1), shard_id="y")
    parent.register_split_order("t", [y.uri, x.uri])
    assert [s.uri for s in parent.commit_manifest().splits["t"].shards] == [y.uri, x.uri]


def test_same_uri_registered_with_other_content(store_root) -> None:
    root, config = store_root
    saver = make_saver(root, config)
    shard = saver.save("t", None, records(2), shard_id="a")
    from syvain_training_data.publish.builder import Saved

    with pytest.raises(PublicationConflictError, match="registered twice"):
        saver._register(Saved("t", None, None, shard.model_copy(update={"records": 3}), True))


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
