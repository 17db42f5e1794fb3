"""`load_tokens` for pretraining and finetuning: document positions, loss masks and one record
per row (`pack=False`), read from real shards of every format on the local store, across
ranks and fork workers, and resumed exactly on another topology."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading.documents import cu_seqlens  # noqa: E402
from token_runs import run_ranks  # noqa: E402

FORMATS = ["msgpack.zstf", "jsonl.gz", "parquet"]
EOS = -1


def mask_of(token: int) -> int:
    return int(token % 3 == 0)


def write_set(client, root: str, data_format: str, records: list[dict[str, Any]]) -> str:
    uri = f"{root}/{data_format}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format=data_format)
    shards = min(4, len(records))
    per = -(-len(records) // shards)
    for shard in range(shards):
        saver.save("train", None, records[shard * per : (shard + 1) * per], shard_id=f"{shard}")
    saver.commit_manifest()
    return uri


def documents(seed: str, count: int = 60) -> list[list[int]]:
    """Records of unique, consecutive token ids, some empty, some longer than a row."""
    draw = random.Random(seed)
    docs, next_id = [], 0
    for _ in range(count):
        length = draw.choice([0, 1, 4, draw.randint(1, 30), draw.randint(30, 70)])
        docs.append(list(range(next_id, next_id + length)))
        next_id += length
    return docs


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('channels')}"
    docs = documents("channels")
    records = [{"tokens": d, "mask": [mask_of(t) for t in d]} for d in docs]
    return client, docs, {fmt: write_set(client, root, fmt, records) for fmt in FORMATS}


def run(client, uri, ranks, workers, batch, seq_len, stop_after=None, *, state=None, **load):
    """Every rank of a run (see token_runs.run_ranks): the batches per rank, each a dict of
    its own tensors (a ring slot goes back once its batch is gone), and the merged state."""
    return run_ranks(
        client, uri, ranks, workers, batch, seq_len, stop_after, state=state, keep=owned, **load
    )


def owned(batch: dict[str, Any]) -> dict[str, Any]:
    return {key: value.clone() for key, value in batch.items()}


def token_rows(received):
    """(tokens, positions, mask) per row, over every batch received."""
    for batches in received:
        for b in batches:
            for r in range(len(b["tokens"])):
                yield (
                    b["tokens"][r].tolist(),
                    b["positions"][r].tolist() if "positions" in b else None,
                    b["loss_mask"][r].tolist() if "loss_mask" in b else None,
                )


def where(docs):
    """Token id -> (its document's length, its index in the document)."""
    return {t: (len(d), i) for d in docs for i, t in enumerate(d)}


def check_packed_rows(received, docs, eos_id):
    """Every non-eos token carries its index in its document and its mask; an eos carries
    the position after its document's last token and mask 1."""
    at = where(docs)
    for tokens, positions, mask in token_rows(received):
        for k, token in enumerate(tokens):
            if token == EOS:
                assert eos_id == EOS
                if k > 0 and tokens[k - 1] != EOS:
                    length, index = at[tokens[k - 1]]
                    assert index == length - 1 and positions[k] == length
                if mask is not None:
                    assert mask[k] is True
                continue
            if positions is not None:
                assert positions[k] == at[token][1]
            if mask is not None:
                assert mask[k] == bool(mask_of(token))


def assert_each_token_once(received, docs, most_lost):
    counts = Counter(t for tokens, _, _ in token_rows(received) for t in tokens if t != EOS)
    assert not counts or max(counts.values()) == 1
    total = sum(len(d) for d in docs)
    assert total - len(counts) <= most_lost


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("ranks,workers,seed", [(1, 0, None), (2, 2, None), (1, 2, 5)])
@pytest.mark.parametrize("eos_id", [None, EOS])
def test_documents_and_loss_mask_follow_every_token(
    sets, data_format, ranks, workers, seed, eos_id
):
    client, docs, uris = sets
    seq_len, batch = 16, 3
    load = {"documents": True, "loss_mask_column": "mask", "eos_id": eos_id, "seed": seed}
    received, _ = run(client, uris[data_format], ranks, workers, batch, seq_len, **load)
    for batches in received:
        for b in batches:
            assert set(b) == {"tokens", "positions", "loss_mask"}
            assert b["positions"].dtype == torch.int64 and b["loss_mask"].dtype == torch.bool
            assert b["positions"].shape == b["tokens"].shape == b["loss_mask"].shape
    check_packed_rows(received, docs, eos_id)
    consumers = ranks * max(workers, 1)
    assert_each_token_once(received, docs, consumers * (seq_len - 1) + 1)


def test_cu_seqlens_of_a_batch_bound_its_documents(sets):
    client, docs, uris = sets
    received, _ = run(client, uris["msgpack.zstf"], 1, 0, 2, 32, documents=True)
    at = where(docs)
    for b in received[0]:
        bounds, longest = cu_seqlens(b["positions"])
        flat = b["tokens"].reshape(-1).tolist()
        lengths = [hi - lo for lo, hi in zip(bounds.tolist(), bounds.tolist()[1:], strict=False)]
        assert max(lengths) == longest and bounds[-1] == len(flat)
        for lo, hi in zip(bounds.tolist(), bounds.tolist()[1:], strict=False):
            # One sequence is the tokens of one document.
            assert len({at[t][0] for t in flat[lo:hi]}) == 1
            assert flat[lo:hi] == list(range(flat[lo], flat[lo] + hi - lo))


@pytest.mark.parametrize("before,after", [((1, 0), (2, 2)), ((2, 2), (3, 1)), ((2, 1), (2, 1))])
@pytest.mark.parametrize("eos_id", [None, EOS])
def test_channels_resume_on_another_topology(sets, before, after, eos_id):
    client, docs, uris = sets
    uri = uris["msgpack.zstf"]
    load = {"documents": True, "loss_mask_column": "mask", "eos_id": eos_id}
    first, state = run(client, uri, *before, 2, 8, stop_after=2, **load)
    rest, _ = run(client, uri, *after, 3, 8, state=state, **load)
    both = first + rest
    check_packed_rows(both, docs, eos_id)
    consumers = before[0] * max(before[1], 1) + after[0] * max(after[1], 1)
    assert_each_token_once(both, docs, consumers * 7 + 1)


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("ranks,workers,seed", [(1, 0, None), (2, 2, 3)])
@pytest.mark.parametrize("eos_id", [None, EOS])
def test_rows_hold_one_record_each(sets, data_format, ranks, workers, seed, eos_id):
    client, docs, uris = sets
    seq_len, batch, pad = 24, 4, -7
    load = {
        "pack": False,
        "pad_id": pad,
        "eos_id": eos_id,
        "loss_mask_column": "mask",
        "seed": seed,
    }
    received, _ = run(client, uris[data_format], ranks, workers, batch, seq_len, **load)
    seen = Counter()
    for batches in received:
        for b in batches:
            assert set(b) == {"tokens", "lengths", "loss_mask"} and len(b["tokens"]) <= batch
            for r in range(len(b["tokens"])):
                row, length = b["tokens"][r].tolist(), int(b["lengths"][r])
                assert row[length:] == [pad] * (seq_len - length)
                assert b["loss_mask"][r].tolist()[length:] == [False] * (seq_len - length)
                body = [t for t in row[:length] if t != EOS]
                seen[tuple(body[:1])] += 1
                whole = next(d for d in docs if d[:1] == body[:1]) if body else []
                expected = (whole + ([EOS] if eos_id is not None else []))[:seq_len]
                if body:
                    assert row[:length] == expected
                    assert b["loss_mask"][r].tolist()[:length] == [
                        True if t == EOS else bool(mask_of(t)) for t in expected
                    ]
    # Every record once: each non-empty one by its first token, the empty ones by count.
    assert all(seen[(d[0],)] == 1 for d in docs if d)
    assert seen[()] == sum(1 for d in docs if not d)


def test_rows_refuse_a_long_record_with_truncate_error(sets):
    client, docs, uris = sets
    longest = max(len(d) for d in docs)
    loader = client.split_data_loader(uris["jsonl.gz"], None, {"batch_size": 2})
    dl = loader.load_tokens("train", seq_len=longest - 1, pack=False, pad_id=0, truncate="error")
    with pytest.raises(ValueError, match=r"Record \d+ of shard .*more than seq_len"):
        list(dl)
    fits = loader.load_tokens("train", seq_len=longest, pack=False, pad_id=0, truncate="error")
    assert sum(len(b["tokens"]) for b in fits) == len(docs)


@pytest.mark.parametrize("before,after", [((1, 0), (2, 2)), ((2, 2), (1, 1))])
def test_rows_resume_exactly_once(sets, before, after):
    client, docs, uris = sets
    uri = uris["parquet"]
    load = {"pack": False, "pad_id": 0, "seed": 1}
    first, state = run(client, uri, *before, 3, 16, stop_after=2, **load)
    rest, _ = run(client, uri, *after, 2, 16, state=state, **load)
    rows = sum(len(b["tokens"]) for batches in first + rest for b in batches)
    assert rows == len(docs)
    firsts = Counter(
        int(b["tokens"][r][0])
        for batches in first + rest
        for b in batches
        for r in range(len(b["tokens"]))
        if int(b["lengths"][r])
    )
    assert sorted(firsts) == sorted(d[0] for d in docs if d) and max(firsts.values()) == 1


def test_states_of_rows_and_blocks_do_not_mix(sets):
    client, _, uris = sets
    loader = client.split_data_loader(uris["msgpack.zstf"], None, {"batch_size": 2})
    rows = loader.load_tokens("train", seq_len=8, pack=False, pad_id=0)
    next(iter(rows))
    with pytest.raises(ValueError, match="another selection"):
        loader.load_tokens("train", seq_len=8).load_state_dict(rows.state_dict())
    # Positions and masks are extra channels of one token stream: their states mix.
    plain = loader.load_tokens("train", seq_len=8)
    next(iter(plain))
    loader.load_tokens("train", seq_len=8, documents=True).load_state_dict(plain.state_dict())


def test_bad_masks_and_arguments_are_named(tmp_path):
    client = SyvainTrainingData()
    root = f"file://{tmp_path}"
    short = write_set(
        client,
        root,
        "msgpack.zstf",
        [
            {"tokens": [1, 2, 3], "mask": [1, 1, 1]},
            {"tokens": [4, 5], "mask": [1]},
        ],
    )
    loader = client.split_data_loader(short, None, {"batch_size": 1})
    with pytest.raises(
        ValueError, match=r"Record 0 of shard .*1 loss mask values in 'mask' for its 2 tokens"
    ):
        list(loader.load_tokens("train", seq_len=2, loss_mask_column="mask"))
    odd = write_set(client, f"{root}/odd", "parquet", [{"tokens": [1, 2], "mask": [0, 2]}])
    loader = client.split_data_loader(odd, None, {"batch_size": 1})
    with pytest.raises(ValueError, match=r"Record 0 of shard .*loss mask value 2"):
        list(loader.load_tokens("train", seq_len=2, loss_mask_column="mask"))
    with pytest.raises(ValueError, match="not a list of 0/1"):
        list(loader.load_tokens("train", seq_len=2, loss_mask_column="missing"))
    for bad, message in [
        ({"pack": False}, "pack=False needs pad_id"),
        ({"pad_id": 0}, "pad_id is for pack=False"),
        ({"pack": False, "pad_id": 0, "truncate": "left"}, "truncate must be one of"),
        ({"loss_mask_column": "tokens"}, "loss_mask_column must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            loader.load_tokens("train", seq_len=2, **bad)
