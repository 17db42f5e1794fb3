"""`SplitDataLoader.load(columns=...)`: tensor batches, the record loader's batches as
tensors, and worker batches through the batch ring."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")


from syvain_training_data import SyvainTrainingData  # noqa: E402
from token_runs import FORMATS  # noqa: E402


@pytest.mark.parametrize("data_format,workers", [(f, 0) for f in FORMATS] + [("jsonl.gz", 2)])
def test_columns_become_tensor_batches(tmp_path, data_format, workers):
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/m.json"
    saver = client.dataset_saver(uri, data_format=data_format)
    records = [
        {"tokens": list(range(i % 5)), "label": i, "score": i / 2, "ok": i % 2 == 0, "text": str(i)}
        for i in range(30)
    ]
    saver.save("train", None, records)
    saver.commit_manifest()
    args = {"batch_size": 4, "num_workers": workers}
    loader = client.split_data_loader(uri, None, args)
    batches = list(
        loader.load("train", columns=["tokens", "label", "score", "ok", "text"], pad_value=-1)
    )
    assert len(batches) == 8
    labels = []
    for batch in batches:
        assert set(batch) == {"tokens", "tokens_lengths", "label", "score", "ok", "text"}
        assert batch["label"].dtype == torch.int64 and batch["score"].dtype == torch.float32
        assert batch["ok"].dtype == torch.bool and isinstance(batch["text"], list)
        for row, length, label in zip(
            batch["tokens"].tolist(),
            batch["tokens_lengths"].tolist(),
            batch["label"].tolist(),
            strict=True,
        ):
            assert row[:length] == list(range(label % 5))
            assert set(row[length:]) <= {-1}
        labels += batch["label"].tolist()
    assert sorted(labels) == list(range(30))
    with pytest.raises(ValueError, match="Pass collate_fn=None"):
        client.split_data_loader(uri, list, {}).load("train", columns=["label"])
    with pytest.raises(ValueError, match="no column 'missing'"):
        list(loader.load("train", columns=["missing"]))
    with pytest.raises(ValueError, match="would collide"):
        loader.load("train", columns=["tokens", "tokens_lengths"])


def column_pass(client, uri, workers, batch, *, state=None, stop_after=None, **load):
    """(names per batch, tokens per batch, state) of a load(columns=) pass; each batch's
    padded rows are checked against its lengths."""
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    args.update(load.pop("args", {}))
    if workers:
        args["multiprocessing_context"] = "fork"
    dl = client.split_data_loader(uri, None, args).load("train", columns=["tokens"], **load)
    if state is not None:
        dl.load_state_dict(json.loads(json.dumps(state)))
    tokens = []
    in_ring = 0
    iterator = iter(dl)
    for taken, got in enumerate(iterator):
        if workers:
            memory = dl.dataset.ring._bytes
            start = memory.data_ptr()
            in_ring += start <= got["tokens"].data_ptr() < start + memory.numel()
        rows = got["tokens"].tolist()
        lengths = got["tokens_lengths"].tolist()
        assert all(set(row[n:]) <= {-7} for row, n in zip(rows, lengths, strict=True))
        tokens.append([row[:n] for row, n in zip(rows, lengths, strict=True)])
        if stop_after is not None and taken + 1 == stop_after:
            break
    del iterator
    # Worker batches come through the ring (by value only when a worker runs ahead of its
    # slots, as one can once the others are done).
    assert in_ring >= len(tokens) // 2 if workers else in_ring == 0
    return tokens, dl.state_dict()


def record_pass(client, uri, workers, batch, *, state=None, stop_after=None, **load):
    """The same pass through the record loader (a list of token lists per batch)."""
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    args.update(load.pop("args", {}))
    if workers:
        args["multiprocessing_context"] = "fork"
    dl = client.split_data_loader(uri, _token_lists, args).load("train", **load)
    if state is not None:
        dl.load_state_dict(json.loads(json.dumps(state)))
    batches = []
    for taken, got in enumerate(dl):
        batches.append(got)
        if stop_after is not None and taken + 1 == stop_after:
            break
    return batches, dl.state_dict()


def _token_lists(records: list[dict[str, Any]]) -> list[list[int]]:
    return [r["tokens"] for r in records]


@pytest.mark.parametrize(
    "workers,batch,load",
    [
        (0, 3, {}),
        (2, 3, {}),
        (2, 2, {"seed": 4, "shuffle_buffer": 5}),
        (3, 4, {"args": {"drop_last": True}}),
        (2, 1, {"args": {"persistent_workers": True, "prefetch_factor": 1}}),
    ],
)
def test_column_batches_are_the_record_loaders_batches(token_sets, workers, batch, load):
    """Bundled, through the ring or by value, a column loader yields the batches the record
    loader yields, in its order; its state resumes on other worker counts like the record
    loader's, every record exactly once."""
    client, (uri, documents) = token_sets[0], token_sets[1]["msgpack.zstf"]
    got, _ = column_pass(client, uri, workers, batch, pad_value=-7, **dict(load))
    expected, _ = record_pass(client, uri, workers, batch, **dict(load))
    assert got == expected
    head, state = column_pass(client, uri, workers, batch, stop_after=5, pad_value=-7, **load)
    tail, _ = column_pass(client, uri, 1, batch, state=state, pad_value=-7, **dict(load))
    record_head, record_state = record_pass(client, uri, workers, batch, stop_after=5, **load)
    assert state == record_state and head == record_head
    assert tail == record_pass(client, uri, 1, batch, state=record_state, **dict(load))[0]
    seen = [tuple(r) for b in head + tail for r in b]
    if "drop_last" not in load.get("args", {}):
        assert sorted(seen) == sorted(tuple(d) for d in documents)


@pytest.mark.parametrize("data_format", FORMATS)
def test_a_record_without_a_chosen_column_is_named(tmp_path, data_format):
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/m.json"
    saver = client.dataset_saver(uri, data_format=data_format)
    saver.save("train", None, [{"tokens": [1, 2], "label": 0}, {"label": 1}])
    saver.commit_manifest()
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    assert next(iter(loader.load("train", columns=["label"])))["label"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="no column 'tokens'"):
        list(loader.load("train", columns=["tokens", "label"]))


@pytest.mark.parametrize("seed", [None, 3])
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_batches_come_through_a_batch_ring(token_sets, monkeypatch, persistent, seed):
    """Worker batches arrive through the loader's shared-memory ring, read in place, also after
    a pass left batches in flight (persistent workers drain them; new workers get a new ring);
    a batch the loop keeps holds its slot, and the rest go by value meanwhile."""
    from syvain_training_data.loading import transfer

    taken = []
    take = transfer.BatchRing.take
    monkeypatch.setattr(
        transfer.BatchRing, "take", lambda ring, *a: taken.append(1) or take(ring, *a)
    )
    client, sets = token_sets
    uri, _ = sets["msgpack.zstf"]
    args = {"batch_size": 2, "num_workers": 2, "multiprocessing_context": "fork"}
    loader = client.split_data_loader(uri, None, {**args, "persistent_workers": persistent})
    dl = loader.load_tokens("train", seq_len=8, seed=seed)
    iterator = iter(dl)
    next(iterator), next(iterator)  # epoch 0, left with batches in flight
    del iterator
    epoch_1 = []
    for batch in dl:
        assert dl.dataset.ring is not None
        memory = dl.dataset.ring._bytes
        start = memory.data_ptr()
        in_ring = start <= batch.data_ptr() < start + memory.numel()
        epoch_1.append((batch.clone(), in_ring))
    assert all(in_ring for _, in_ring in epoch_1)
    epoch_1 = [batch for batch, _ in epoch_1]
    fresh = client.split_data_loader(uri, None, args).load_tokens("train", seq_len=8, seed=seed)
    fresh.set_epoch(1)
    expected = list(fresh)
    assert len(epoch_1) == len(expected) > 2
    assert all(torch.equal(a, b) for a, b in zip(epoch_1, expected, strict=True))
    assert len(taken) >= len(epoch_1) + len(expected)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the ring's memory file is Linux's")
def test_forkserver_workers_send_batches_through_the_ring(token_sets):
    """Workers that do not fork from the loader map the ring's memory file themselves."""
    client, sets = token_sets
    uri, _ = sets["msgpack.zstf"]
    args = {"batch_size": 2, "num_workers": 2, "multiprocessing_context": "forkserver"}
    dl = client.split_data_loader(uri, None, args).load_tokens("train", seq_len=8)
    got = []
    for batch in dl:
        memory = dl.dataset.ring._bytes
        start = memory.data_ptr()
        assert start <= batch.data_ptr() < start + memory.numel()
        got.append(batch.clone())
    fork = {**args, "multiprocessing_context": "fork"}
    expected = list(client.split_data_loader(uri, None, fork).load_tokens("train", seq_len=8))
    assert len(got) == len(expected) > 2
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    columns = client.split_data_loader(uri, None, args).load("train", columns=["tokens"])
    in_ring = []
    for batch in columns:  # each dropped before the next (a kept one would hold its slot)
        memory = columns.dataset.ring._bytes
        pointer = batch["tokens"].data_ptr()
        if batch["tokens"].numel():
            in_ring.append(memory.data_ptr() <= pointer < memory.data_ptr() + memory.numel())
    assert len(in_ring) > 2 and all(in_ring)
