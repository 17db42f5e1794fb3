"""DatasetSaver.commit_manifest (SPEC section 5): idempotent and create-only, shards found
from workers and threads, expected shard sets, curriculum metadata and ordering rules."""

from __future__ import annotations

import pickle

import pytest

from saver_helpers import make_saver, read_back, records
from syvain_training_data import (
    DatasetSaver,
    ManifestShard,
    PublicationConflictError,
    storage,
)

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
