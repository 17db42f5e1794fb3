"""`load_tokens(text_column=, tokenizer=)`: text records tokenized where they are read.

Tokenizers are trained here with `tokenizers` on generated text (no download): a BPE one for
"the ids are those of each record tokenized alone", and a word-level one over words that occur
once in the whole dataset, so that every token id names one place in it and "each token once"
can be checked after resumes on other topologies, as tests/loading/test_load_tokens.py does
with token ids stored in the shards.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from loader_data import publish_shards  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from token_runs import FORMATS, run_ranks  # noqa: E402

EOS = -1


def words(count: int, draw: random.Random) -> list[str]:
    """``count`` distinct words of 1 to 8 letters, in a random order."""
    found: set[str] = set()
    while len(found) < count:
        found.add("".join(draw.choices(string.ascii_lowercase, k=draw.randint(1, 8))))
    return draw.sample(sorted(found), count)


def texts_of(vocabulary: list[str], draw: random.Random, records: int, reuse: bool) -> list[str]:
    """Record texts, some empty, some long; words drawn from ``vocabulary`` (each used once
    unless ``reuse``)."""
    pool = iter(vocabulary)
    texts = []
    for _ in range(records):
        length = draw.choice([0, 1, 3, draw.randint(1, 30), draw.randint(30, 70)])
        chosen = [draw.choice(vocabulary) if reuse else next(pool) for _ in range(length)]
        texts.append(" ".join(chosen))
    return texts


def bpe_tokenizer(texts: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", "[BOS]"])
    tokenizer.train_from_iterator(texts, trainer)
    # A post-processor that adds [BOS]: load_tokens encodes without special tokens.
    bos = tokenizer.token_to_id("[BOS]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", bos)]
    )
    return tokenizer


def word_tokenizer(vocabulary: list[str]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=len(vocabulary) + 1, special_tokens=["[UNK]"])
    tokenizer.train_from_iterator(vocabulary, trainer)
    return tokenizer


def alone(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    return ids


def char_codes(texts: list[str]) -> list[list[int]]:
    """A plain Python tokenizer: a token per character, its code point (picklable by name)."""
    return [[ord(c) for c in text] for text in texts]


def save(client: SyvainTrainingData, uri: str, data_format: str, texts: list[str]) -> str:
    """``texts`` as records {"text", "n"} in shards of 7 to 40 records."""
    draw = random.Random(uri)
    shards, at = [], 0
    while at < len(texts):
        size = draw.randint(7, 40)
        shards.append([{"text": t, "n": at + k} for k, t in enumerate(texts[at : at + size])])
        at += size
    return publish_shards(client, uri, data_format, shards)


@pytest.fixture(scope="module")
def text_sets(tmp_path_factory) -> dict[str, Any]:
    """Per format a dataset of unique words (the word tokenizer's ids are unique) and one of
    reused words (for the BPE tokenizer), with the tokenizers and texts."""
    seed = random.randrange(2**32)  # any draw: the assertions hold for all
    print(f"text_sets seed {seed}")  # shown with a failure, to replay it
    draw = random.Random(seed)
    root = f"file://{tmp_path_factory.mktemp('text')}"
    client = SyvainTrainingData()
    vocabulary = words(250 * 70, draw)  # enough for the longest draw of texts
    unique = texts_of(vocabulary, draw, 250, reuse=False)
    common = words(400, draw)
    reused = texts_of(common, draw, 200, reuse=True)
    sets: dict[str, Any] = {
        "client": client,
        "words": word_tokenizer(vocabulary),
        "bpe": bpe_tokenizer(reused, 300),
        "unique": unique,
        "reused": reused,
    }
    for data_format in FORMATS:
        sets[f"unique {data_format}"] = save(
            client, f"{root}/u/{data_format}/m.json", data_format, unique
        )
        sets[f"reused {data_format}"] = save(
            client, f"{root}/r/{data_format}/m.json", data_format, reused
        )
    return sets


def tokens_of(received: list[list[Any]]) -> list[int]:
    return [t for batches in received for b in batches for t in b.flatten().tolist() if t != EOS]


def assert_each_token_once(tokens: list[int], expected: set[int], most_lost: int) -> None:
    counts = Counter(tokens)
    assert counts and max(counts.values()) == 1, "a token was yielded twice"
    assert set(counts) <= expected
    assert len(expected) - len(counts) <= most_lost


def word_ids(sets: dict[str, Any]) -> set[int]:
    ids = {t for text in sets["unique"] for t in alone(sets["words"], text)}
    unk = sets["words"].token_to_id("[UNK]")
    assert unk not in ids and len(ids) == sum(len(t.split()) for t in sets["unique"])
    return ids


def loader(sets: dict[str, Any], key: str, workers: int = 0, **args: Any) -> Any:
    dataloader_args: dict[str, Any] = {"batch_size": 2, "num_workers": workers, **args}
    if workers and "multiprocessing_context" not in dataloader_args:
        dataloader_args["multiprocessing_context"] = "fork"
    return sets["client"].split_data_loader(sets[key], None, dataloader_args)


# --- the tokens are each record's, tokenized alone -------------------------------------------


@pytest.mark.parametrize("data_format", FORMATS)
def test_the_stream_is_each_record_tokenized_alone_then_eos(text_sets, data_format):
    tokenizer, texts = text_sets["bpe"], text_sets["reused"]
    blocks = loader(text_sets, f"reused {data_format}").load_tokens(
        "train", seq_len=16, eos_id=EOS, text_column="text", tokenizer=tokenizer
    )
    flat = [t for b in blocks for t in b.flatten().tolist()]
    expected = [t for text in texts for t in [*alone(tokenizer, text), EOS]]
    assert len(expected) - 16 < len(flat) <= len(expected)
    assert flat == expected[: len(flat)]
    # No [BOS] from the post-processor: special tokens are not added.
    assert tokenizer.token_to_id("[BOS]") not in flat


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_are_records_tokenized_alone_in_workers(text_sets, workers):
    """pack=False with a seed: one row per record, in workers, each its record's tokens."""
    tokenizer, texts = text_sets["bpe"], text_sets["reused"]
    rows = loader(text_sets, "reused msgpack.zstf", workers).load_tokens(
        "train",
        seq_len=1024,
        pack=False,
        pad_id=-7,
        text_column="text",
        tokenizer=tokenizer,
        seed=3,
    )
    got = []
    for batch in rows:
        for row, length in zip(batch["tokens"].tolist(), batch["lengths"].tolist(), strict=True):
            assert all(t == -7 for t in row[length:])
            got.append(tuple(row[:length]))
    assert Counter(got) == Counter(tuple(alone(tokenizer, text)) for text in texts)


def test_documents_positions_count_each_record_tokens(text_sets):
    tokenizer, texts = text_sets["bpe"], text_sets["reused"]
    blocks = loader(text_sets, "reused jsonl.gz").load_tokens(
        "train", seq_len=32, documents=True, text_column="text", tokenizer=tokenizer
    )
    lengths = [len(alone(tokenizer, text)) for text in texts]
    expected = [p for n in lengths for p in range(n)]
    positions = [p for b in blocks for p in b["positions"].flatten().tolist()]
    assert positions == expected[: len(positions)] and len(expected) - len(positions) < 32


def test_a_plain_python_callable_with_its_name(text_sets):
    texts = text_sets["reused"]
    blocks = loader(text_sets, "reused parquet").load_tokens(
        "train", seq_len=64, text_column="text", tokenizer=char_codes, tokenizer_name="code points"
    )
    flat = [t for b in blocks for t in b.flatten().tolist()]
    expected = [ord(c) for text in texts for c in text]
    assert flat == expected[: len(flat)] and len(expected) - len(flat) < 64
    assert blocks.state_dict()["tokenizer"] == "code points"


# --- exact resume on other topologies, every worker start method ----------------------------

# (ranks, workers, batch, seq_len, k) -> (ranks, workers, batch, seq_len) to the end.
MATRIX = [
    ((2, 2, 3, 8, 2), (3, 1, 2, 8)),
    ((1, 2, 2, 16, 3), (4, 0, 1, 5)),
    ((3, 0, 1, 12, 4), (1, 2, 4, 12)),
]


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "jsonl.gz"])
@pytest.mark.parametrize("before,after", MATRIX)
def test_resume_on_another_topology_yields_each_token_once(text_sets, data_format, before, after):
    uri, tokenizer = text_sets[f"unique {data_format}"], text_sets["words"]
    tokenize = {"text_column": "text", "tokenizer": tokenizer, "eos_id": EOS, "seed": 11}
    ranks, workers, batch, seq_len, k = before
    client = text_sets["client"]
    first, state = run_ranks(client, uri, ranks, workers, batch, seq_len, k, **tokenize)
    assert len(json.dumps(state)) < 4096
    assert state["tokenizer"].startswith("sha256:") and state["interrupts"]
    ranks2, workers2, batch2, seq_len2 = after
    second, _ = run_ranks(client, uri, ranks2, workers2, batch2, seq_len2, state=state, **tokenize)
    consumers = ranks * max(workers, 1) + ranks2 * max(workers2, 1)
    most_lost = consumers * (max(seq_len, seq_len2) - 1)
    assert_each_token_once(tokens_of(first) + tokens_of(second), word_ids(text_sets), most_lost)


def test_same_topology_resume_is_the_uninterrupted_stream(text_sets):
    uri, client = text_sets["unique parquet"], text_sets["client"]
    tokenize = {"text_column": "text", "tokenizer": text_sets["words"], "seed": 2}
    whole, _ = run_ranks(client, uri, 1, 2, 3, 8, **tokenize)
    first, state = run_ranks(client, uri, 1, 2, 3, 8, 4, **tokenize)
    rest, _ = run_ranks(client, uri, 1, 2, 3, 8, state=state, **tokenize)
    assert tokens_of(first) + tokens_of(rest) == tokens_of(whole)
    assert len(tokens_of(first)) == 4 * 3 * 8


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_worker_start_methods_resume_exactly(text_sets, context):
    """Workers get the tokenizer by pickle under spawn and forkserver; a run interrupted there
    resumes on another topology with each token once."""
    uri, client = text_sets["unique msgpack.zstf"], text_sets["client"]
    tokenize = {"text_column": "text", "tokenizer": text_sets["words"], "seed": 5}
    first, state = run_ranks(client, uri, 1, 2, 2, 8, 3, context=context, **tokenize)
    second, _ = run_ranks(client, uri, 2, 2, 3, 8, state=state, context=context, **tokenize)
    assert_each_token_once(tokens_of(first) + tokens_of(second), word_ids(text_sets), 6 * 7)


def test_a_callable_in_spawned_workers(text_sets):
    texts = text_sets["reused"]
    rows = loader(text_sets, "reused jsonl.gz", 2, multiprocessing_context="spawn").load_tokens(
        "train",
        seq_len=1024,
        pack=False,
        pad_id=0,
        text_column="text",
        tokenizer=char_codes,
        tokenizer_name="code points",
    )
    got = [
        tuple(row[:length])
        for batch in rows
        for row, length in zip(batch["tokens"].tolist(), batch["lengths"].tolist(), strict=True)
    ]
    assert Counter(got) == Counter(tuple(ord(c) for c in text) for text in texts)


# --- a state names its tokenizer ----------------------------------------------------------


def interrupted_state(sets: dict[str, Any], **load: Any) -> dict[str, Any]:
    blocks = loader(sets, "reused msgpack.zstf").load_tokens("train", seq_len=8, **load)
    batches = iter(blocks)
    next(batches)
    state: dict[str, Any] = json.loads(json.dumps(blocks.state_dict()))
    return state


def test_resuming_with_another_tokenizer_names_both(text_sets):
    bpe = text_sets["bpe"]
    state = interrupted_state(text_sets, text_column="text", tokenizer=bpe)
    other = bpe_tokenizer(text_sets["reused"], 280)  # another vocabulary
    resumed = loader(text_sets, "reused msgpack.zstf").load_tokens(
        "train", seq_len=8, text_column="text", tokenizer=other
    )
    with pytest.raises(ValueError, match="made with tokenizer") as error:
        resumed.load_state_dict(state)
    assert state["tokenizer"] in str(error.value)
    # A tokenizers.Tokenizer is named by the sha256 of its serialized form.
    other_name = f"sha256:{hashlib.sha256(other.to_str().encode()).hexdigest()[:32]}"
    assert other_name != state["tokenizer"] and other_name in str(error.value)
    # The same tokenizer (a copy, through its serialized form) resumes it.
    copy = tokenizers.Tokenizer.from_str(bpe.to_str())
    again = loader(text_sets, "reused msgpack.zstf").load_tokens(
        "train", seq_len=8, text_column="text", tokenizer=copy
    )
    again.load_state_dict(state)
    assert sum(b.numel() for b in again) > 0


def test_callable_names_and_token_columns_refuse_each_other(text_sets):
    by_name = {"text_column": "text", "tokenizer": char_codes}
    state = interrupted_state(text_sets, tokenizer_name="code points v1", **by_name)
    renamed = loader(text_sets, "reused msgpack.zstf").load_tokens(
        "train", seq_len=8, tokenizer_name="code points v2", **by_name
    )
    with pytest.raises(ValueError, match="'code points v1'.*'code points v2'"):
        renamed.load_state_dict(state)
    # A token column loader (the shards hold no "tokens": it is never read here).
    column = loader(text_sets, "reused msgpack.zstf").load_tokens("train", seq_len=8)
    with pytest.raises(ValueError, match="'code points v1'.*reads token ids from a column"):
        column.load_state_dict(state)
    del state["tokenizer"]  # as a token column loader's state
    same = loader(text_sets, "reused msgpack.zstf").load_tokens(
        "train", seq_len=8, tokenizer_name="code points v1", **by_name
    )
    with pytest.raises(ValueError, match="reading token ids from a column.*'code points v1'"):
        same.load_state_dict(state)


# --- arguments checked at the call --------------------------------------------------------


@pytest.mark.parametrize(
    "arguments,error,words",
    [
        ({"tokenizer": char_codes, "tokenizer_name": "c"}, ValueError, "needs text_column"),
        ({"text_column": "text"}, ValueError, "text_column needs tokenizer"),
        (
            {"text_column": "text", "tokenizer": char_codes, "tokenizer_name": "c", "column": "t"},
            ValueError,
            "column and text_column are alternatives",
        ),
        (
            {"text_column": "text", "tokenizer": char_codes, "tokenizer_name": "c"}
            | {"loss_mask_column": "mask"},
            ValueError,
            "loss_mask_column is for token columns",
        ),
        ({"text_column": "text", "tokenizer": char_codes}, ValueError, "needs tokenizer_name"),
        (
            {"text_column": "text", "tokenizer": char_codes, "tokenizer_name": ""},
            TypeError,
            "tokenizer_name must be a str of 1 to 64",
        ),
        (
            {"text_column": "text", "tokenizer": char_codes, "tokenizer_name": "x" * 65},
            TypeError,
            "tokenizer_name must be a str of 1 to 64",
        ),
        ({"text_column": "text", "tokenizer": "gpt2"}, TypeError, "tokenizer must be a"),
        ({"text_column": 3, "tokenizer": char_codes}, TypeError, "text_column must be"),
        ({"tokenizer_name": "c"}, ValueError, "pass it with tokenizer="),
    ],
)
def test_arguments_are_checked_at_the_call(text_sets, arguments, error, words):
    with pytest.raises(error, match=words):
        loader(text_sets, "reused jsonl.gz").load_tokens("train", seq_len=8, **arguments)


def test_a_tokenizers_tokenizer_takes_no_name(text_sets):
    with pytest.raises(ValueError, match="named by the sha256"):
        loader(text_sets, "reused jsonl.gz").load_tokens(
            "train", seq_len=8, text_column="text", tokenizer=text_sets["bpe"], tokenizer_name="b"
        )


# --- errors name the shard and the record -------------------------------------------------


def broken_set(client: SyvainTrainingData, root: Any, data_format: str, records: list) -> str:
    good = [{"text": f"w{k} x"} for k in range(5)]
    uri = f"file://{root}/{data_format}/m.json"
    return publish_shards(client, uri, data_format, [good, records])


def read_all(client: SyvainTrainingData, uri: str, workers: int = 0, **load: Any) -> None:
    args: dict[str, Any] = {"batch_size": 1, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    blocks = client.split_data_loader(uri, None, args).load_tokens(
        "train", seq_len=4, text_column="text", **load
    )
    for _ in blocks:
        pass


BAD_TEXTS = [
    ("missing", [{"text": "a"}, {"text": "b"}, {"other": "c"}], "has no text column 'text'"),
    ("null", [{"text": "a"}, {"text": "b"}, {"text": None}], "has no text column 'text'"),
    ("int among str", [{"text": "a"}, {"text": "b"}, {"text": 4}], "holds int in text column"),
    ("all ints", [{"text": 1}, {"text": 2}, {"text": 4}], "holds int in text column"),
    ("list", [{"text": "a"}, {"text": "b"}, {"text": ["c"]}], "holds list in text column"),
]


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "jsonl.gz", "parquet"])
@pytest.mark.parametrize("case,records,words", BAD_TEXTS, ids=[c[0] for c in BAD_TEXTS])
def test_a_record_without_text_is_named(tmp_path, text_sets, data_format, case, records, words):
    if data_format == "parquet" and case in ("int among str", "list"):
        records = [{"text": "a"}, {"text": "b"}, {"other": "c"}]  # Parquet types each column
        words = "has no text column 'text'"
    client = text_sets["client"]
    uri = broken_set(client, tmp_path, data_format, records)
    with pytest.raises(ValueError, match=words) as error:
        read_all(client, uri, tokenizer=char_codes, tokenizer_name="c")
    record = 0 if case == "all ints" else 2
    assert f"Record {record} of shard " in str(error.value)
    assert "part-001" in str(error.value)


def returns_a_dict(texts: list[str]) -> Any:
    return {"input_ids": [[1] for _ in texts]}


def returns_one_list_short(texts: list[str]) -> Any:
    return [[1] for _ in texts[1:]]


def returns_a_str_token(texts: list[str]) -> Any:
    return [["1"] if "w3" in text else [1] for text in texts]


def returns_a_bool_token(texts: list[str]) -> Any:
    return [[True] if "w3" in text else [1] for text in texts]


def returns_a_float_token(texts: list[str]) -> Any:
    return [[1.0] if "w3" in text else [1] for text in texts]


def returns_a_str_per_text(texts: list[str]) -> Any:
    return ["12" if "w3" in text else [1] for text in texts]


def returns_an_id_beyond_int64(texts: list[str]) -> Any:
    return [[2**63] if "w3" in text else [1, 2] for text in texts]


def returns_a_negative_id_beyond_int64(texts: list[str]) -> Any:
    return [[-(2**63) - 1] if "w3" in text else [1, 2] for text in texts]


BAD_ANSWERS = [
    (returns_a_dict, "returned dict for the 5 texts of records 0 to 4 of shard .* its backend"),
    (returns_one_list_short, "returned list of 4 items for the 5 texts of records 0 to 4"),
    (returns_a_str_token, "returned str '1' among the token ids of record 3 of shard"),
    (returns_a_bool_token, "returned bool True among the token ids of record 3 of shard"),
    (returns_a_float_token, "returned float 1.0 among the token ids of record 3 of shard"),
    (returns_a_str_per_text, "returned str for record 3 of shard"),
    (returns_an_id_beyond_int64, "token id 9223372036854775808 for record 3 of shard"),
    (returns_a_negative_id_beyond_int64, "token id -9223372036854775809 for record 3"),
]


@pytest.mark.parametrize("tokenizer,words", BAD_ANSWERS, ids=[f.__name__ for f, _ in BAD_ANSWERS])
def test_a_wrong_tokenizer_answer_is_named(tmp_path, text_sets, tokenizer, words):
    client = text_sets["client"]
    uri = broken_set(client, tmp_path, "msgpack.zstf", [{"text": "y"}])
    with pytest.raises(ValueError, match=words) as error:
        read_all(client, uri, tokenizer=tokenizer, tokenizer_name="bad")
    assert "part-000" in str(error.value)


def test_an_error_in_a_worker_reaches_the_loop_named(tmp_path, text_sets):
    client = text_sets["client"]
    uri = broken_set(client, tmp_path, "jsonl.gz", [{"text": "a"}, {"other": 1}])
    with pytest.raises(ValueError, match="Record 1 of shard .*part-001.* has no text column"):
        read_all(client, uri, 2, tokenizer=text_sets["bpe"])


def returns_a_str_for_the_marker(texts: list[str]) -> Any:
    return ["bad" if text == "marker" else [len(text)] for text in texts]


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "parquet"])
def test_a_large_shard_is_tokenized_in_chunks(tmp_path, text_sets, data_format):
    """A decoded batch of more records than a tokenizer call takes: the ids are still each
    record's, and an error names the record past the first call."""
    from syvain_training_data.loading.text_tokens import TOKENIZE_RECORDS

    client, tokenizer = text_sets["client"], text_sets["bpe"]
    texts = (text_sets["reused"] * 4)[: 2 * TOKENIZE_RECORDS + 90]
    uri = publish_shards(
        client, f"file://{tmp_path}/big/m.json", data_format, [[{"text": t} for t in texts]]
    )
    blocks = client.split_data_loader(uri, None, {"batch_size": 4}).load_tokens(
        "train", seq_len=16, text_column="text", tokenizer=tokenizer
    )
    flat = [t for b in blocks for t in b.flatten().tolist()]
    expected = [t for text in texts for t in alone(tokenizer, text)]
    assert flat == expected[: len(flat)] and len(expected) - len(flat) < 16
    bad = TOKENIZE_RECORDS + 37
    marked = [{"text": "marker" if k == bad else t} for k, t in enumerate(texts)]
    uri = publish_shards(client, f"file://{tmp_path}/marked/m.json", data_format, [marked])
    with pytest.raises(ValueError, match=f"returned str for record {bad} of shard"):
        read_all(client, uri, tokenizer=returns_a_str_for_the_marker, tokenizer_name="m")
