"""SplitDataLoader (SPEC section 6) over SeaweedFS and the local store: selection, ranks and
workers, shuffle, worker start methods, resume, prefetch."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import uuid
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import get_worker_info  # noqa: E402

from loader_data import (  # noqa: E402
    ALL_TRAIN,
    as_list,
    keys,
    make_dataset,
    records_of,
    run_python,
    s3_client,
)
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading.dataset import ShardDataset  # noqa: E402
from syvain_training_data.loading.split_loader import SplitDataLoader  # noqa: E402

# A wait for an event that must come: only a guard against a hang, never a measure of speed.
HANG_GUARD_S = 60.0


def tag_worker(batch: list[Any]) -> tuple[int, list[Any]]:
    info = get_worker_info()
    return (-1 if info is None else info.id), batch


# --- SPEC section 6 -------------------------------------------------------------------------


def test_lazy_export_keeps_torch_out_of_base_import():
    run_python(
        "import sys, syvain_training_data as p",
        "assert 'torch' not in sys.modules",
        "from syvain_training_data import SplitDataLoader",
        "assert 'torch' in sys.modules",
        "assert SplitDataLoader.__module__ == 'syvain_training_data.loading.split_loader'",
    )


def test_split_and_stage_errors(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list)
    with pytest.raises(ValueError, match=r"^Unknown split 'x'; available splits: train, val$"):
        loader.load("x")
    with pytest.raises(
        ValueError,
        match=r"Unknown curriculum stage 'mid'.*available stages: "
        r"easy, hard$",
    ):
        loader.load("train", "mid")
    with pytest.raises(ValueError, match="^Unknown curriculum stage .nope."):
        loader.load("train", curriculum_stages=["hard", "nope"])
    with pytest.raises(ValueError, match="not both"):
        loader.load("train", "easy", curriculum_stages=["hard"])
    with pytest.raises(ValueError, match="not a str"):
        loader.load("train", curriculum_stages="easy")
    with pytest.raises(ValueError, match="must not be empty"):
        loader.load("train", curriculum_stages=[])
    with pytest.raises(ValueError, match="Duplicate curriculum stages: easy$"):
        loader.load("train", curriculum_stages=["easy", "hard", "easy"])


def test_dataloader_args_errors(local_dataset):
    client, uri = local_dataset
    with pytest.raises(ValueError, match="^Pass collate_fn to split_data_loader, not "):
        client.split_data_loader(uri, as_list, {"collate_fn": as_list})
    with pytest.raises(ValueError, match="num_workers must not be negative"):
        client.split_data_loader(uri, as_list, {"num_workers": -1})


def test_manifest_is_read_once_at_construction(tmp_path):
    client = SyvainTrainingData()
    uri = make_dataset(client, f"file://{tmp_path}")
    loader = client.split_data_loader(uri, as_list)
    (tmp_path / "data-manifest.json").unlink()
    assert keys(loader.load("train")) == ALL_TRAIN
    with pytest.raises(FileNotFoundError):
        client.split_data_loader(uri, as_list)


def test_workers_capped_and_worker_only_args_dropped(local_dataset):
    client, uri = local_dataset
    capped = client.split_data_loader(uri, as_list, {"num_workers": 50}).load("train", "easy")
    assert capped.num_workers == 17  # stage easy holds 5 + 9 + 3 records
    assert [s.records for s in capped.dataset.shards] == [5, 9, 3]
    args = {
        "num_workers": 0,
        "persistent_workers": True,
        "prefetch_factor": 4,
        "multiprocessing_context": "spawn",
        "timeout": 30,
        "batch_size": 4,
    }
    loader = client.split_data_loader(uri, as_list, args).load("train")
    assert (loader.num_workers, loader.persistent_workers, loader.timeout) == (0, False, 0)
    assert loader.prefetch_factor is None and loader.multiprocessing_context is None
    assert keys(loader) == ALL_TRAIN


def test_workers_take_contiguous_record_ranges_in_manifest_order(dataset):
    client, uri = dataset
    loader = client.split_data_loader(
        uri, tag_worker, {"num_workers": 3, "batch_size": 2, "multiprocessing_context": "fork"}
    ).load("train")
    by_worker: dict[int, list[tuple[int, int]]] = {}
    for worker, batch in loader:
        by_worker.setdefault(worker, []).extend((r["shard"], r["i"]) for r in batch)
    # 42 records: each worker reads 14 consecutive ones, across shard boundaries.
    for worker in range(3):
        assert by_worker[worker] == ALL_TRAIN[14 * worker : 14 * (worker + 1)]
    assert isinstance(loader.dataset, ShardDataset)


def test_curriculum_union_keeps_stage_order_and_drops_repeats(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": 3})
    union = loader.load("train", curriculum_stages=["hard", "easy"])
    assert [s for s, _ in keys(union)] == sorted(
        [2] * 3 + [3] * 7 + [4] * 4 + [0] * 5 + [1] * 9, key=[2, 3, 4, 0, 1].index
    )
    assert [r["shard"] for b in loader.load("train", "easy") for r in b] == [0] * 5 + [1] * 9 + [
        2
    ] * 3


# --- ranks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_exactly_once_across_ranks_and_workers(dataset, world_size, workers):
    client, uri = dataset
    args = {"num_workers": workers, "batch_size": 4}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(uri, as_list, args)
    seen: list[tuple[int, int]] = []
    parts = []
    for rank in range(world_size):
        part = keys(loader.load("train", rank=rank, world_size=world_size))
        parts.append(set(part))
        seen.extend(part)
    assert Counter(seen) == Counter(ALL_TRAIN)
    assert all(a.isdisjoint(b) for a in parts for b in parts if a is not b)


@pytest.mark.parametrize(("world_size", "workers"), [(3, 0), (4, 2), (8, 0)])
def test_equal_batches_gives_every_rank_the_same_batches(local_dataset, world_size, workers):
    client, uri = local_dataset
    args: dict[str, Any] = {"batch_size": 2, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(uri, as_list, args)
    counts, seen = [], []
    for rank in range(world_size):
        dl = loader.load("train", rank=rank, world_size=world_size, equal_batches=True, seed=1)
        batches = list(dl)
        assert len(dl) == len(batches)
        counts.append(len(batches))
        seen.extend(keys(batches))
    assert len(set(counts)) == 1
    # Fewer than world_size records are left out (42 records: 42 mod R).
    assert len(seen) == len(set(seen)) == 42 - 42 % world_size
    assert set(seen) <= set(ALL_TRAIN)


def test_rank_and_world_size_validation(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list)
    with pytest.raises(ValueError, match="both rank and world_size"):
        loader.load("train", rank=0)
    with pytest.raises(ValueError, match="rank must be in"):
        loader.load("train", rank=2, world_size=2)


# --- infinite_iter, shuffling, epochs, start methods ----------------------------------------


def test_infinite_iter_cycles_epochs(local_dataset):
    client, uri = local_dataset
    batches = client.split_data_loader(uri, as_list, {"batch_size": 10}).load(
        "train", infinite_iter=True
    )
    taken = [next(batches) for _ in range(12)]  # 5 batches per epoch
    assert keys(taken[:5]) == ALL_TRAIN and keys(taken[5:10]) == ALL_TRAIN


def test_infinite_iter_raises_on_an_empty_epoch(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list)
    endless = loader.load("val", infinite_iter=True, rank=0, world_size=2)
    with pytest.raises(RuntimeError, match="^val split produced no batches$"):
        next(endless)


def test_shuffle_is_deterministic_per_seed_and_epoch(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": 4})

    def epoch_keys(seed, epoch):
        dl = loader.load("train", seed=seed, shuffle_buffer=6)
        dl.set_epoch(epoch)
        return keys(dl)

    first = epoch_keys(1, 0)
    assert first == epoch_keys(1, 0)
    assert first != epoch_keys(1, 1) and first != epoch_keys(2, 0)
    assert sorted(first) == ALL_TRAIN and first != ALL_TRAIN
    dl = loader.load("train", seed=1, shuffle_buffer=6)
    assert keys(dl) == first and keys(dl) == epoch_keys(1, 1)  # passes advance the epoch


# fork is the default context of the other worker tests; forkserver once is enough.
@pytest.mark.parametrize(
    ("store", "context"), [("local", "spawn"), ("s3", "spawn"), ("local", "forkserver")]
)
def test_start_methods_with_persistent_workers(request, store, context, monkeypatch):
    client, uri = request.getfixturevalue(f"{store}_dataset")
    # Spawned workers get the explicit secret through multiprocessing's pickler, not from an
    # environment (SPEC section 5): none is set here.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    args = {
        "num_workers": 2,
        "batch_size": 4,
        "multiprocessing_context": context,
        "persistent_workers": True,
    }
    dl = client.split_data_loader(uri, as_list, args).load("train", seed=5)
    epochs = [keys(dl), keys(dl)]
    assert all(sorted(epoch) == ALL_TRAIN for epoch in epochs)
    same_topology = {"num_workers": 2, "batch_size": 4, "multiprocessing_context": "fork"}
    reference = client.split_data_loader(uri, as_list, same_topology).load("train", seed=5)
    reference.set_epoch(1)
    assert epochs[1] == keys(reference) != epochs[0]


def test_split_data_loader_type(local_dataset):
    client, uri = local_dataset
    assert isinstance(client.split_data_loader(uri, as_list), SplitDataLoader)
    assert isinstance(
        client.split_data_loader(uri, as_list).load("val"), torch.utils.data.DataLoader
    )


# --- resumption ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_mid_epoch_loses_and_repeats_nothing(dataset, workers):
    client, uri = dataset
    args = {"num_workers": workers, "batch_size": 3}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(uri, as_list, args)
    rng = random.Random(workers)
    total = len(list(loader.load("train", seed=7, shuffle_buffer=4)))
    for stop in sorted(rng.sample(range(1, total), 5)):
        first = loader.load("train", seed=7, shuffle_buffer=4, stateful=True)
        first.set_epoch(2)
        it = iter(first)
        before = [next(it) for _ in range(stop)]
        state = first.state_dict()
        del it
        resumed = loader.load("train", seed=7, shuffle_buffer=4, stateful=True)
        resumed.load_state_dict(state)
        after = list(resumed)
        assert Counter(keys(before) + keys(after)) == Counter(ALL_TRAIN), stop
        assert sorted(keys(resumed)) == ALL_TRAIN  # the next pass is a whole epoch again


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_does_not_download_finished_shards(local_dataset, workers, monkeypatch, tmp_path):
    """Shards a resumed pass has finished are never opened again (forked workers inherit the
    recording patch and append to a file)."""
    import syvain_training_data.loading.dataset as dataset_module

    client, uri = local_dataset
    opened = tmp_path / "opened.txt"
    real_read_records = dataset_module.read_records

    def recording_read_records(data_format, shard, storage_config, start, stop, *rest):
        name = shard.uri.rsplit("-", 1)[-1].split(".")[0]
        with opened.open("a") as log:
            log.write(f"{int(name)},{start},{shard.records if stop is None else stop}\n")
        return real_read_records(data_format, shard, storage_config, start, stop, *rest)

    monkeypatch.setattr(dataset_module, "read_records", recording_read_records)
    args: dict[str, Any] = {"num_workers": workers, "batch_size": 1}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(uri, as_list, args)
    first = loader.load("train", stateful=True)
    it = iter(first)
    # Without workers: shards 0 (5 records) and 1 (9) are done after 15 records. With two
    # workers taking turns per batch, worker 0 reads records 0-20 (shards 0, 1, 2 and 3's
    # first 4) and worker 1 records 21-41 (shard 3's last 3, 4, 5, 6): after 10 records each,
    # worker 0 finished shard 0 and is 5 into shard 1, worker 1 finished 3 and 4, 3 into 5.
    before = [next(it) for _ in range(15 if workers == 0 else 20)]
    state = first.state_dict()
    del it
    opened.unlink()
    resumed = loader.load("train", stateful=True)
    resumed.load_state_dict(state)
    after = list(resumed)
    assert Counter(keys(before) + keys(after)) == Counter(ALL_TRAIN)
    reopened = {tuple(map(int, line.split(","))) for line in opened.read_text().split()}
    if workers == 0:
        assert reopened == {(2, 1, 3), (3, 0, 7), (4, 0, 4), (5, 0, 6), (6, 0, 8)}
    else:
        assert reopened == {(1, 5, 9), (2, 0, 3), (3, 0, 4), (5, 3, 6), (6, 0, 8)}


def test_torchdata_stateful_dataloader_accepts_the_dataset(local_dataset):
    from torchdata.stateful_dataloader import StatefulDataLoader

    client, uri = local_dataset
    dataset = client.split_data_loader(uri, as_list).load("train", seed=3).dataset
    first = StatefulDataLoader(dataset, batch_size=5, collate_fn=as_list)
    it = iter(first)
    before = [next(it) for _ in range(4)]
    state = first.state_dict()
    again = client.split_data_loader(uri, as_list).load("train", seed=3).dataset
    resumed = StatefulDataLoader(again, batch_size=5, collate_fn=as_list)
    resumed.load_state_dict(state)
    assert Counter(keys(before) + keys(resumed)) == Counter(ALL_TRAIN)


GLOO_RANK = """
import json, sys
import torch.distributed as dist
from syvain_training_data import SyvainTrainingData
rank, init, uri, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
loader = SyvainTrainingData().split_data_loader(uri, list, {"batch_size": 4})
batches = list(loader.load("train", equal_batches=True))
keys = [[r["shard"], r["i"]] for b in loader.load("train") for r in b]
json.dump({"keys": keys, "equal": len(batches)}, open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""


def test_ranks_from_a_real_gloo_group(local_dataset, tmp_path):
    _, uri = local_dataset
    init = f"file://{tmp_path}/rendezvous"
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    procs = [
        subprocess.Popen([sys.executable, "-c", GLOO_RANK, str(rank), init, uri, str(out)])
        for rank, out in enumerate(outs)
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    results = [json.loads(out.read_text()) for out in outs]
    seen = [tuple(k) for result in results for k in result["keys"]]
    assert Counter(seen) == Counter(ALL_TRAIN)
    assert results[0]["equal"] == results[1]["equal"]


def test_next_shard_is_requested_before_the_current_one_ends(s3_dataset, monkeypatch):
    import syvain_training_data.loading.dataset as dataset_module

    client, uri = s3_dataset
    events: list[str] = []
    opened = {name: threading.Event() for name in ("part-001.msgpack.zstf",)}
    real_read_records = dataset_module.read_records

    def recording_read_records(data_format, shard, *rest):
        name = shard.uri.rsplit("/", 1)[-1]
        events.append(f"open {name}")
        if name in opened:
            opened[name].set()
        yield from real_read_records(data_format, shard, *rest)
        if name == "part-000.msgpack.zstf":
            # The current shard ends only once the next one was requested, which only a
            # request made in the background while this one is read can do (no timing: the
            # wait is a hang guard; a loader that requests the next shard only after this one
            # ends fails here).
            assert opened["part-001.msgpack.zstf"].wait(HANG_GUARD_S), "never requested"
        events.append(f"end {name}")

    monkeypatch.setattr(dataset_module, "read_records", recording_read_records)
    dataset = client.split_data_loader(uri, as_list).load("train", "easy").dataset
    for _ in dataset:
        pass
    assert events.index("open part-001.msgpack.zstf") < events.index("end part-000.msgpack.zstf")
    assert events.index("open part-002.msgpack.zstf") > events.index("end part-000.msgpack.zstf")


def test_a_local_shard_is_opened_when_it_is_reached(local_dataset, monkeypatch):
    """A local read costs less than handing its first record over from another thread: no
    read is requested ahead, so each shard opens after the one before it ends."""
    import syvain_training_data.loading.dataset as dataset_module

    client, uri = local_dataset
    events: list[str] = []
    real_read_records = dataset_module.read_records

    def recording_read_records(data_format, shard, *rest):
        events.append(f"open {shard.uri}")
        yield from real_read_records(data_format, shard, *rest)
        events.append(f"end {shard.uri}")

    monkeypatch.setattr(dataset_module, "read_records", recording_read_records)
    dataset = client.split_data_loader(uri, as_list).load("train", "easy").dataset
    assert sum(1 for _ in dataset) and len(events) >= 4
    assert all(
        opened.startswith("open ") and ended == "end " + opened[5:]
        for opened, ended in zip(events[::2], events[1::2], strict=True)
    ), events


# --- after a finished pass, without torch, across schemes ------------------------------------


def test_resume_after_a_finished_pass_starts_the_next_epoch(local_dataset):
    client, uri = local_dataset
    loader = client.split_data_loader(uri, as_list, {"batch_size": 4})
    first = loader.load("train", seed=2, stateful=True)
    epoch0 = keys(first)
    state = first.state_dict()
    resumed = loader.load("train", seed=2, stateful=True)
    resumed.load_state_dict(state)
    reference = loader.load("train", seed=2)
    reference.set_epoch(1)
    assert keys(resumed) == keys(reference) != epoch0


def test_without_torch_the_error_names_the_extra():
    run_python(
        "import sys; sys.modules['torch'] = None",
        "try:",
        "    from syvain_training_data import SplitDataLoader",
        "except ModuleNotFoundError as error:",
        "    assert \"pip install 'syvain-training-data[torch]'\" in str(error), error",
        "else:",
        "    raise SystemExit('no error')",
    )


def test_an_s3_manifest_cannot_point_the_loader_at_local_files(seaweed, s3_bucket, tmp_path):
    client = s3_client(seaweed)
    local = tmp_path / "part.jsonl.gz"
    saver = client.dataset_saver(f"file://{tmp_path}/src/data-manifest.json")
    shard = saver.save("train", None, [{"i": 1}], shard_id="a")
    local.write_bytes((tmp_path / shard.uri.split(str(tmp_path) + "/", 1)[1]).read_bytes())
    uri = f"s3://{s3_bucket}/mixed-{uuid.uuid4().hex}/data-manifest.json"
    entry = {"uri": f"file://{local}", "records": 1, "size_bytes": shard.size_bytes}
    client.save_manifest(
        uri,
        {
            "version": 1,
            "data_format": "jsonl.gz",
            "splits": {"train": {"records": 1, "shards": [entry]}},
        },
    )
    loader = client.split_data_loader(uri, as_list)
    with pytest.raises(ValueError, match=r"^Manifest s3://.* names shard file://"):
        loader.load("train")
    trusted = client.split_data_loader(uri, as_list, allow_mixed_schemes=True)
    assert records_of(trusted.load("train")) == [{"i": 1}]
