"""``load(filter=)``: every record the filter keeps arrives exactly once per epoch across ranks
and workers, seeded or not; a state counts source records consumed, so a run stopped part way
resumes on another topology with exactly the kept records it had not yet received; the state
names the filter; the argument checks, ``equal_batches`` and ``len()`` as documented (real
worker processes, the local store)."""

from __future__ import annotations

import functools
import json
import pickle
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from loader_data import SHARD_RECORDS, publish_shards  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading.tokens import merge_token_states  # noqa: E402

SHARDS = {"msgpack.zstf": [37, 5, 61, 18, 44], "jsonl.gz": [23, 71, 9, 50]}


def score(shard: int, i: int) -> int:
    return (i * 7 + shard * 3) % 10


def make_dataset(client: SyvainTrainingData, root: str, data_format: str) -> tuple[str, list[dict]]:
    uri = f"{root}/{data_format}/data-manifest.json"
    shards = [
        [
            {"id": f"{shard}-{i}", "score": score(shard, i), "tokens": [i] * (1 + i % 4)}
            for i in range(n)
        ]
        for shard, n in enumerate(SHARDS[data_format])
    ]
    return publish_shards(client, uri, data_format, shards), [r for s in shards for r in s]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('filters')}"
    return client, {fmt: make_dataset(client, root, fmt) for fmt in SHARDS}


# Filters are module-level functions (picklable, as spawned workers need).
def keep_high(record: dict[str, Any], threshold: int = 5) -> bool:
    return record["score"] >= threshold


def keep_low(record: dict[str, Any]) -> bool:
    return record["score"] < 5


def fail_on_shard_2(record: dict[str, Any]) -> bool:
    if record["id"] == "2-4":
        raise KeyError("no such column")
    return True


def record_ids(batch: list[dict[str, Any]]) -> list[str]:
    return [record["id"] for record in batch]


def kept(records: list[dict[str, Any]], predicate=keep_high) -> Counter[str]:
    return Counter(record["id"] for record in records if predicate(record))


def run(client, uri, ranks, workers, batch, stop_after, *, state=None, context="fork", **load):
    """Every rank of a run; each takes ``stop_after`` batches (None: to the end). Returns the
    record ids received and the ranks' states merged into one."""
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = context
    loader = client.split_data_loader(uri, record_ids, args)
    load.setdefault("filter", keep_high)
    received: list[str] = []
    states = []
    for rank in range(ranks):
        dl = loader.load("train", rank=rank, world_size=ranks, **load)
        if state is not None:
            dl.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint file would
        batches = iter(dl)
        for taken, batch_ids in enumerate(batches):
            assert len(batch_ids) <= batch
            received += batch_ids
            if stop_after is not None and taken + 1 == stop_after:
                break
        states.append(dl.state_dict())
        del batches
    return received, merge_token_states(states)


@pytest.mark.parametrize("data_format", list(SHARDS))
@pytest.mark.parametrize("seed", [None, 7])
@pytest.mark.parametrize(("ranks", "workers"), [(1, 0), (3, 0), (1, 2), (2, 2)])
def test_every_kept_record_once_across_ranks_and_workers(sets, data_format, seed, ranks, workers):
    client, datasets = sets
    uri, records = datasets[data_format]
    received, _ = run(client, uri, ranks, workers, 4, None, seed=seed)
    assert Counter(received) == kept(records)
    assert 0 < len(received) < len(records)  # the filter drops some, keeps some


def test_spawned_workers_get_the_filter_by_pickle(sets):
    client, datasets = sets
    uri, records = datasets["msgpack.zstf"]
    predicate = functools.partial(keep_high, threshold=8)
    received, _ = run(client, uri, 2, 2, 3, None, context="spawn", seed=1, filter=predicate)
    assert Counter(received) == kept(records, predicate)


def test_the_unseeded_order_is_the_epoch_order_less_dropped_records(sets):
    client, datasets = sets
    uri, records = datasets["jsonl.gz"]
    received, _ = run(client, uri, 1, 0, 5, None)
    assert received == [r["id"] for r in records if keep_high(r)]


# (ranks, workers, batch, batches taken per rank) -> (ranks, workers, batch) to the end.
MATRIX = [
    ((2, 2, 4, 3), (3, 1, 5)),  # more ranks, fewer workers
    ((4, 0, 3, 2), (1, 2, 8)),  # shrink ranks, grow workers
    ((1, 2, 8, 2), (5, 2, 2)),  # grow both
    ((3, 2, 2, 4), (2, 0, 16)),  # shrink both
]


@pytest.mark.parametrize("data_format", list(SHARDS))
@pytest.mark.parametrize("seed", [None, 11])
@pytest.mark.parametrize(("before", "after"), MATRIX)
def test_resume_on_another_topology_yields_the_rest_exactly_once(
    sets, data_format, seed, before, after
):
    client, datasets = sets
    uri, records = datasets[data_format]
    first, state = run(client, uri, *before, seed=seed)
    assert len(json.dumps(state)) <= 4096
    assert state["kind"] == "filtered" and state["interrupts"]
    rest, _ = run(client, uri, *after, None, state=state, seed=seed)
    assert 0 < len(first) < len(first + rest)  # stopped part way
    assert Counter(first + rest) == kept(records)


def test_state_counts_source_records_not_records_yielded(sets):
    # One rank, no workers: the position after a batch is the source records read through
    # its last record, dropped ones included.
    client, datasets = sets
    uri, records = datasets["jsonl.gz"]
    first, state = run(client, uri, 1, 0, 3, 2)
    [[_, _, _, _, [entry]]] = state["interrupts"]
    last = first[-1]
    assert entry[3] == [r["id"] for r in records].index(last) + 1
    assert entry[3] > len(first)


def test_same_topology_resume_is_the_uninterrupted_stream(sets):
    client, datasets = sets
    uri, _ = datasets["msgpack.zstf"]
    whole, _ = run(client, uri, 1, 2, 4, None, seed=8)
    first, state = run(client, uri, 1, 2, 4, 5, seed=8)
    rest, _ = run(client, uri, 1, 2, 4, None, state=state, seed=8)
    assert first + rest == whole


def test_resume_of_a_resumed_run(sets):
    client, datasets = sets
    uri, records = datasets["jsonl.gz"]
    first, state = run(client, uri, 3, 1, 4, 2, seed=2)
    second, state = run(client, uri, 2, 2, 5, 2, state=state, seed=2)
    assert len(state["interrupts"]) == 2
    rest, _ = run(client, uri, 4, 0, 3, None, state=state, seed=2)
    assert Counter(first + second + rest) == kept(records)


def test_the_next_epoch_follows_a_finished_one(sets):
    client, datasets = sets
    uri, records = datasets["msgpack.zstf"]
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 4})
    dl = loader.load("train", seed=3, filter=keep_high)
    epoch0 = [i for batch in dl for i in batch]
    state = dl.state_dict()
    assert state["epoch"] == 1 and state["interrupts"] == []
    resumed = loader.load("train", seed=3, filter=keep_high)
    resumed.load_state_dict(state)
    epoch1 = [i for batch in resumed for i in batch]
    assert Counter(epoch0) == Counter(epoch1) == kept(records)
    assert epoch0 != epoch1  # another epoch, another order


def test_a_filter_that_raises_names_the_shard_and_the_record(sets):
    client, datasets = sets
    uri, _ = datasets["msgpack.zstf"]
    shard_uri = client.load_manifest(uri).splits["train"].shards[2].uri
    for workers in (0, 2):
        loader = client.split_data_loader(uri, record_ids, {"num_workers": workers})
        with pytest.raises(RuntimeError) as raised:
            list(loader.load("train", filter=fail_on_shard_2))
        message = str(raised.value)
        assert f"record 4 of shard {shard_uri}" in message
        assert "KeyError" in message and "no such column" in message


def test_wrong_filters_are_refused_at_the_call(sets):
    client, datasets = sets
    uri, _ = datasets["jsonl.gz"]
    loader = client.split_data_loader(uri, record_ids)
    with pytest.raises(TypeError, match="filter must be a callable.*not int"):
        loader.load("train", filter=5)
    with pytest.raises(TypeError, match="filter must be picklable.*or give this one a filter_name"):
        loader.load("train", filter=lambda record: True)
    with pytest.raises(TypeError, match="filter_name must be a str of 1 to 64"):
        loader.load("train", filter=keep_high, filter_name="x" * 65)
    with pytest.raises(TypeError, match="filter_name must be a str"):
        loader.load("train", filter=keep_high, filter_name=3)
    with pytest.raises(ValueError, match="filter_name names a filter"):
        loader.load("train", filter_name="quality")


def test_equal_batches_with_a_filter_is_refused(sets):
    client, datasets = sets
    uri, _ = datasets["jsonl.gz"]
    loader = client.split_data_loader(uri, record_ids)
    with pytest.raises(ValueError, match=r"equal_batches=True and filter="):
        loader.load("train", filter=keep_high, equal_batches=True)


def test_len_of_a_filtered_loader_is_a_type_error(sets):
    client, datasets = sets
    uri, _ = datasets["jsonl.gz"]
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 4})
    with pytest.raises(TypeError, match="A filtered loader has no len"):
        len(loader.load("train", filter=keep_high))
    # list() takes len() as a hint only: a TypeError there is no failure.
    batches = list(loader.load("train", filter=keep_high))
    assert sum(map(len, batches)) == sum(kept(datasets["jsonl.gz"][1]).values())


def test_resuming_with_another_filter_names_both(sets):
    client, datasets = sets
    uri, _ = datasets["jsonl.gz"]
    _, state = run(client, uri, 1, 0, 4, 2, filter=keep_high, filter_name="quality>=5")
    assert state["filter"] == "quality>=5"
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 4})
    other = loader.load("train", filter=keep_low, filter_name="quality<5")
    with pytest.raises(ValueError, match=r"filter 'quality>=5'.*filter 'quality<5'"):
        other.load_state_dict(state)
    unfiltered = loader.load("train")
    with pytest.raises(ValueError, match=r"filter 'quality>=5'.*this loader has no filter"):
        unfiltered.load_state_dict(state)
    plain_state = _unfiltered_state(loader)
    filtered = loader.load("train", filter=keep_high)
    with pytest.raises(ValueError, match=r"without a filter.*filter 'sha256:"):
        filtered.load_state_dict(plain_state)
    # The same name resumes: the caller says the two keep the same records.
    same = loader.load("train", filter=keep_high, filter_name="quality>=5")
    same.load_state_dict(state)


def _unfiltered_state(loader) -> dict[str, Any]:
    dl = loader.load("train")
    batches = iter(dl)
    next(batches)
    return dl.state_dict()


def test_default_names_are_digests_of_the_pickled_filter(sets):
    client, datasets = sets
    uri, _ = datasets["msgpack.zstf"]
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 4})
    at_5 = functools.partial(keep_high, threshold=5)
    _, state = run(client, uri, 1, 0, 4, 2, filter=at_5)
    assert state["filter"].startswith("sha256:") and len(state["filter"]) <= 64
    same = loader.load("train", filter=functools.partial(keep_high, threshold=5))
    same.load_state_dict(state)  # equal pickles, equal names
    at_6 = loader.load("train", filter=functools.partial(keep_high, threshold=6))
    with pytest.raises(ValueError, match="made with filter 'sha256:"):
        at_6.load_state_dict(state)
    assert pickle.loads(pickle.dumps(at_5))({"score": 5})


def keep_long_tokens(record: dict[str, Any]) -> bool:
    # With columns=, the record holds those columns only; list columns are int64 tensors.
    assert set(record) == {"tokens", "score"}
    assert isinstance(record["tokens"], torch.Tensor)
    return len(record["tokens"]) >= 3


@pytest.mark.parametrize("workers", [0, 2])
def test_columns_loads_filter_dicts_of_the_chosen_columns(sets, workers):
    client, datasets = sets
    uri, records = datasets["msgpack.zstf"]
    loader = client.split_data_loader(uri, None, {"batch_size": 4, "num_workers": workers})
    scores: list[int] = []
    lengths: list[int] = []
    for rank in range(2):
        dl = loader.load(
            "train",
            rank=rank,
            world_size=2,
            seed=5,
            columns=["tokens", "score"],
            filter=keep_long_tokens,
        )
        for batch in dl:
            assert batch["tokens"].shape[0] == len(batch["score"]) <= 4
            scores += batch["score"].tolist()
            lengths += batch["tokens_lengths"].tolist()
    wanted = [r for r in records if len(r["tokens"]) >= 3]
    assert sorted(lengths) == sorted(len(r["tokens"]) for r in wanted)
    assert Counter(scores) == Counter(r["score"] for r in wanted)


def test_without_batching_each_kept_record_comes_alone(sets):
    client, datasets = sets
    uri, records = datasets["jsonl.gz"]
    loader = client.split_data_loader(uri, None, {"batch_size": None})
    received = [record["id"] for record in loader.load("train", filter=keep_high)]
    assert Counter(received) == kept(records)


def test_unfiltered_loads_keep_their_state_format(sets):
    client, datasets = sets
    uri, _ = datasets["jsonl.gz"]
    state = _unfiltered_state(client.split_data_loader(uri, record_ids, {"batch_size": 4}))
    assert set(state) == {"version", "selection", "epoch", "interrupts"}
    assert state["interrupts"] == [[1, 1, 4, 0, 1]]


def test_a_named_lambda_runs_in_forked_workers(sets):
    client, datasets = sets
    uri, records = datasets["jsonl.gz"]
    received, state = run(
        client, uri, 2, 2, 4, None, filter=lambda r: r["score"] >= 5, filter_name="score>=5"
    )
    assert Counter(received) == kept(records)
    assert state["filter"] == "score>=5"


def keep_even_i(record: dict[str, Any]) -> bool:
    return record["i"] % 2 == 0


def staged_keys(batch: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(record["shard"], record["i"]) for record in batch]


@pytest.mark.parametrize("schedule", [False, True])
def test_mixed_stages_filtered_resume_on_another_topology(local_dataset, schedule):
    # Stages easy (shards 0, 1, 2) and hard (2, 3, 4) mixed until every stage is exhausted, by
    # weights or by a schedule that turns mid-epoch; stopped on 2 ranks x 2 workers, resumed
    # on 3 ranks without workers: every kept record of the union once.
    client, uri = local_dataset
    mixing: dict[str, Any] = {"mixing_weights": {"easy": 1, "hard": 2}}
    if schedule:
        mixing = {"mixing_schedule": [(0, {"easy": 1, "hard": 2}), (12, {"easy": 2, "hard": 1})]}
    load = {"seed": 4, "mixing_stop": "all_exhausted", "filter": keep_even_i, **mixing}

    def run_ranks(ranks, workers, batch, stop_after, state=None):
        args = {"batch_size": batch, "num_workers": workers}
        if workers:
            args["multiprocessing_context"] = "fork"
        loader = client.split_data_loader(uri, staged_keys, args)
        received, states = [], []
        for rank in range(ranks):
            dl = loader.load("train", rank=rank, world_size=ranks, **load)
            if state is not None:
                dl.load_state_dict(json.loads(json.dumps(state)))
            batches = iter(dl)
            for taken, keys in enumerate(batches):
                received += keys
                if stop_after is not None and taken + 1 == stop_after:
                    break
            states.append(dl.state_dict())
            del batches
        return received, merge_token_states(states)

    union = [(s, i) for s in range(5) for i in range(SHARD_RECORDS[s])]
    expected = Counter(key for key in union if key[1] % 2 == 0)
    whole, _ = run_ranks(1, 0, 4, None)
    assert Counter(whole) == expected
    first, state = run_ranks(2, 2, 2, 2)
    rest, _ = run_ranks(3, 0, 3, None, state)
    assert 0 < len(first) < len(whole)
    assert Counter(first + rest) == expected


def test_persistent_workers_run_epoch_after_epoch(sets):
    client, datasets = sets
    uri, records = datasets["msgpack.zstf"]
    args = {"batch_size": 4, "num_workers": 2, "persistent_workers": True}
    args["multiprocessing_context"] = "fork"
    dl = client.split_data_loader(uri, record_ids, args).load("train", seed=6, filter=keep_high)
    epochs = [[i for batch in dl for i in batch] for _ in range(3)]
    for epoch in epochs:
        assert Counter(epoch) == kept(records)
    assert epochs[0] != epochs[1] != epochs[2]


def keep_none(record: dict[str, Any]) -> bool:
    return False


def test_an_endless_loader_whose_filter_keeps_nothing_says_so(sets):
    client, datasets = sets
    uri, _ = datasets["jsonl.gz"]
    loader = client.split_data_loader(uri, record_ids, {"batch_size": 4})
    batches = loader.load("train", infinite_iter=True, filter=keep_none)
    with pytest.raises(RuntimeError, match="train split produced no batches"):
        next(batches)
