"""``load_tokens(filter=)``: the predicate sees each whole record before it is tokenized and
packed; a record it drops adds nothing (not even ``eos_id``) but counts as consumed, so a state
resumes exactly on another topology; the state names the filter (real worker processes, the
local store)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("torch")

from loader_data import publish_shards  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from token_runs import FORMATS, run_ranks  # noqa: E402

EOS = -1
PAD = -2
SHARDS = [23, 4, 41, 17, 30]


def tokens_of(n: int) -> list[int]:
    """Record n's tokens: 1 to 7 ids, unique in the dataset, the first n * 100."""
    return [n * 100 + j for j in range(1 + n % 7)]


def make_dataset(client: SyvainTrainingData, root: str, data_format: str) -> str:
    shards, n = [], 0
    for size in SHARDS:
        records = []
        for _ in range(size):
            text = " ".join(f"w{n}x{j}" for j in range(1 + n % 5))
            mask = [j % 2 for j in range(len(tokens_of(n)))]
            records.append(
                {"n": n, "tokens": tokens_of(n), "text": text, "score": n * 37 % 10, "mask": mask}
            )
            n += 1
        shards.append(records)
    return publish_shards(client, f"{root}/{data_format}/data-manifest.json", data_format, shards)


RECORDS = sum(SHARDS)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('token-filters')}"
    return client, {fmt: make_dataset(client, root, fmt) for fmt in FORMATS}


def keep_high(record: dict[str, Any]) -> bool:
    return record["score"] >= 5  # about half


def keep_odd(record: dict[str, Any]) -> bool:
    return record["n"] % 2 == 1


def keep_all(record: dict[str, Any]) -> bool:
    return True


def keep_positive(record: dict[str, Any]) -> bool:
    return record["n"] > 0


def raise_on_30(record: dict[str, Any]) -> bool:
    if record["n"] == 30:
        raise ValueError("bad score")
    return True


def kept_numbers(predicate=keep_high) -> set[int]:
    return {n for n in range(RECORDS) if predicate({"n": n, "score": n * 37 % 10})}


def row_numbers(batch: Any) -> list[int]:
    """Each row's record (pack=False: a row per record, its first token n * 100)."""
    return [int(row[0]) // 100 for row in batch["tokens"]]


def first_tokens(received: list[list[list[int]]]) -> list[int]:
    return [n for rank in received for batch in rank for n in batch]


def rows(client, uri, ranks, workers, batch, stop_after=None, **load):
    return run_ranks(
        client,
        uri,
        ranks,
        workers,
        batch,
        16,
        stop_after,
        keep=row_numbers,
        pack=False,
        pad_id=PAD,
        eos_id=EOS,
        **load,
    )


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize(("ranks", "workers"), [(1, 0), (3, 0), (2, 2)])
def test_every_kept_record_once_across_ranks_and_workers(sets, data_format, seed, ranks, workers):
    client, uris = sets
    received, _ = rows(client, uris[data_format], ranks, workers, 3, seed=seed, filter=keep_high)
    assert Counter(first_tokens(received)) == Counter(kept_numbers())


MATRIX = [
    ((2, 2, 3, 2), (3, 1, 4)),
    ((3, 0, 2, 3), (1, 2, 5)),
    ((1, 2, 4, 2), (2, 0, 2)),
]


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "parquet"])
@pytest.mark.parametrize("seed", [None, 9])
@pytest.mark.parametrize(("before", "after"), MATRIX)
def test_resume_on_another_topology_gives_every_kept_record_once(
    sets, data_format, seed, before, after
):
    client, uris = sets
    uri = uris[data_format]
    first, state = rows(client, uri, *before, seed=seed, filter=keep_high)
    assert state["filter"].startswith("sha256:") and state["interrupts"]
    rest, _ = rows(client, uri, *after[:3], state=state, seed=seed, filter=keep_high)
    consumed = first_tokens(first)
    assert 0 < len(consumed) < len(kept_numbers())
    assert Counter(consumed + first_tokens(rest)) == Counter(kept_numbers())


def packed(batch: Any) -> list[int]:
    return batch.flatten().tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_packed_blocks_hold_only_kept_records_each_token_once(sets, workers):
    # Packed across a resume on another topology: no token twice, none of a dropped record,
    # no eos_id for a dropped record, fewer than seq_len tokens lost per consumer.
    client, uris = sets
    uri = uris["jsonl.gz"]
    args = {"eos_id": EOS, "filter": keep_odd, "seed": 3}
    first, state = run_ranks(client, uri, 2, workers, 2, 8, 2, keep=packed, **args)
    rest, _ = run_ranks(client, uri, 3, 1, 3, 8, None, state=state, keep=packed, **args)
    tokens = [t for rank in first + rest for batch in rank for t in batch]
    counts = Counter(t for t in tokens if t != EOS)
    expected = {t for n in kept_numbers(keep_odd) for t in tokens_of(n)}
    assert max(counts.values()) == 1
    assert set(counts) <= expected
    consumers = 2 * max(workers, 1) + 3
    assert len(expected) - len(counts) < 8 * consumers
    # An eos_id ends each kept record, none a dropped one (a tail of fewer than 8 tokens per
    # consumer of the last run is lost, eos_id included).
    eos = tokens.count(EOS)
    assert len(kept_numbers(keep_odd)) - 8 * 3 <= eos <= len(kept_numbers(keep_odd))


def words_per_text(texts: list[str]) -> list[list[int]]:
    """A callable tokenizer: each word's number after its "x" (w{n}x{j} -> n * 100 + j)."""
    return [
        [int(w[1:].split("x")[0]) * 100 + int(w.split("x")[1]) for w in t.split()] for t in texts
    ]


def wrong_for_31(texts: list[str]) -> list[Any]:
    return [["x"] if t.startswith("w31x") else [1] for t in texts]


@pytest.mark.parametrize("workers", [0, 2])
def test_text_records_are_filtered_then_tokenized(sets, workers):
    client, uris = sets
    received, _ = run_ranks(
        client,
        uris["msgpack.zstf"],
        2,
        workers,
        3,
        16,
        keep=row_numbers,
        text_column="text",
        tokenizer=words_per_text,
        tokenizer_name="words",
        pack=False,
        pad_id=PAD,
        filter=keep_high,
        seed=1,
    )
    assert Counter(first_tokens(received)) == Counter(kept_numbers())


def test_a_tokenizer_error_names_the_record_among_kept_ones(sets):
    client, uris = sets
    uri = uris["parquet"]
    # Records 1 to 255 are kept and tokenized in one call, across shards 0 to 2: the error
    # still names record 31, record 4 of shard 2 (records 27 to 67).
    shard_uri = client.load_manifest(uri).splits["train"].shards[2].uri
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    dl = loader.load_tokens(
        "train",
        seq_len=8,
        text_column="text",
        tokenizer=wrong_for_31,
        tokenizer_name="wrong",
        filter=keep_positive,
    )
    with pytest.raises(ValueError, match=re.escape(f"record 4 of shard {shard_uri};")):
        list(dl)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_filter_that_raises_names_the_shard_and_the_record(sets, workers):
    client, uris = sets
    uri = uris["jsonl.gz"]
    shard_uri = client.load_manifest(uri).splits["train"].shards[2].uri  # records 27 to 67
    loader = client.split_data_loader(uri, None, {"batch_size": 2, "num_workers": workers})
    words = f"ValueError on record 3 of shard {shard_uri}: bad score"
    with pytest.raises(RuntimeError, match=re.escape(words)):
        list(loader.load_tokens("train", seq_len=8, filter=raise_on_30))


def test_a_record_without_its_token_column_is_named(sets):
    client, uris = sets
    uri = uris["msgpack.zstf"]
    shard_uri = client.load_manifest(uri).splits["train"].shards[0].uri
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    dl = loader.load_tokens("train", seq_len=8, column="text", filter=keep_high)
    words = f"Record 1 of shard {shard_uri} holds str in its token column 'text'"
    with pytest.raises(ValueError, match=re.escape(words)):
        list(dl)


def test_resuming_with_another_filter_names_both(sets):
    client, uris = sets
    uri = uris["msgpack.zstf"]
    _, state = run_ranks(client, uri, 1, 0, 2, 8, 2, filter=keep_high, filter_name="high")
    assert state["filter"] == "high"
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    other = loader.load_tokens("train", seq_len=8, filter=keep_odd, filter_name="odd")
    with pytest.raises(ValueError, match=r"filter 'high'.*filter 'odd'"):
        other.load_state_dict(state)
    unfiltered = loader.load_tokens("train", seq_len=8)
    with pytest.raises(ValueError, match=r"filter 'high'.*this loader has no filter"):
        unfiltered.load_state_dict(state)
    _, plain = run_ranks(client, uri, 1, 0, 2, 8, 2)
    assert "filter" not in plain
    filtered = loader.load_tokens("train", seq_len=8, filter=keep_high, filter_name="high")
    with pytest.raises(ValueError, match=r"without a filter.*filter 'high'"):
        filtered.load_state_dict(plain)
    filtered.load_state_dict(state)  # its own filter resumes


def test_filter_arguments_are_checked_at_the_call(sets):
    client, uris = sets
    loader = client.split_data_loader(uris["parquet"], None, {"batch_size": 2})
    with pytest.raises(TypeError, match="filter must be a callable"):
        loader.load_tokens("train", seq_len=8, filter="score > 5")
    with pytest.raises(TypeError, match="filter must be picklable"):
        loader.load_tokens("train", seq_len=8, filter=lambda record: True)
    with pytest.raises(ValueError, match="filter_name names a filter"):
        loader.load_tokens("train", seq_len=8, filter_name="x")
    with pytest.raises(TypeError, match="no len"):
        len(loader.load_tokens("train", seq_len=8, filter=keep_high))


@pytest.mark.parametrize("workers", [0, 2])
def test_documents_and_loss_masks_of_kept_records(sets, workers):
    # Token n * 100 + j is token j of record n: its position in its document is j and its
    # loss mask j % 2, wherever a block cuts the record; an eos_id has mask 1.
    client, uris = sets
    received, _ = run_ranks(
        client,
        uris["parquet"],
        2,
        workers,
        2,
        8,
        keep=lambda batch: batch,
        eos_id=EOS,
        documents=True,
        loss_mask_column="mask",
        filter=keep_high,
        seed=2,
    )
    seen = set()
    for rank in received:
        for batch in rank:
            tokens = batch["tokens"].flatten().tolist()
            positions = batch["positions"].flatten().tolist()
            masks = batch["loss_mask"].flatten().tolist()
            for token, position, mask in zip(tokens, positions, masks, strict=True):
                if token == EOS:
                    assert mask
                    continue
                assert (position, mask) == (token % 100, bool(token % 100 % 2))
                seen.add(token // 100)
    assert seen <= kept_numbers() and len(seen) > len(kept_numbers()) - 2 * 2 * 8


def test_a_token_id_beyond_int64_is_named(tmp_path):
    client = SyvainTrainingData()
    uri = publish_shards(
        client,
        f"file://{tmp_path}/big/data-manifest.json",
        "msgpack.zstf",
        [[{"tokens": [1, 2]}, {"tokens": [3, 2**63]}]],
    )
    shard_uri = client.load_manifest(uri).splits["train"].shards[0].uri
    dl = client.split_data_loader(uri, None).load_tokens("train", seq_len=2, filter=keep_all)
    with pytest.raises(ValueError, match=re.escape(f"Record 1 of shard {shard_uri} holds a value")):
        list(dl)
