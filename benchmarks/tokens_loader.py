"""Token loading benchmark: tokens per second into int tensors, in one run on the
same records.

Records are documents of token ids (lists of ints, 256 to 2048 long) in msgpack.zstf shards on
the local directory store. Cases, each at 0 and 2 DataLoader workers (fork), best of --repeat:

- ``dict``: ``load`` with a collate_fn that turns each batch's token lists into one int64
  tensor (``torch.tensor``) - the record path.
- ``load_tokens``: packed (batch, seq_len) int64 blocks.
- ``documents``, ``pack=False``: ``load_tokens`` with ``documents=True`` (a positions tensor
  beside the tokens), and with one record per row padded to seq_len (rate in the records'
  tokens, padding not counted); each against ``load_tokens``.
- ``loss_mask``: ``load_tokens(loss_mask_column="mask")`` over a second copy of the records
  that holds a 0/1 mask per token, against ``load_tokens masked set``: plain ``load_tokens``
  over that same copy.
- ``columns``: ``load(columns=["tokens"])``, padded tensors built in the worker.
- ``load_tokens steady``: one loader (with persistent workers), timed from its second pass on:
  the rate of a long run, without the workers' start (fork, first shard opens) that weighs on
  a pass of a few tens of milliseconds. The 2-worker target compares steady with steady.
- ``columns steady``: ``columns`` likewise.
- ``two processes`` (2 workers only): the ceiling of 2 workers on this machine, two processes
  each running ``load_tokens`` at 0 workers over half the records (rank r of 2), started
  together, no DataLoader between them, timed from their second pass; the rate is both halves'
  tokens over the slower one's time. On 2 cores, where one process at 0 workers already keeps
  a decoder thread and Python busy, this is what any worker design could reach.
- ``floor``: the same shards (already in memory) decompressed and parsed in Rust with nothing
  handed to Python (``_native._decode_only``, a benchmark-only helper).
- ``tokenize``: ``load_tokens(text_column="text", tokenizer=tok)`` over text records (about
  220 words each, Zipf-drawn from 30,000 generated words) in msgpack.zstf shards, ``tok`` a BPE
  ``tokenizers.Tokenizer`` of 8,000 ids trained on them (untimed); ``tokenize steady`` likewise
  with one loader over passes (persistent workers). Against ``tokenize floor``: the
  tokenizer's own ``encode_batch`` (``encode_batch_fast`` where it exists, as the loader calls
  it) over the same texts, already in memory, in one process and one call.
- ``callable``, ``callable steady``: the same with a pure-Python tokenizer (a dict lookup per
  word, which holds the GIL), against ``callable floor``, that tokenizer over the same texts in
  one call (each floor is the best of its measures before, between and after the loader
  cases); ``slow callable steady``, a slower one (an id per two letters), 2 workers over 0.
- ``litdata``: with --peer-python (a Python with litdata, e.g. scripts/peer_env.sh), the same
  tokens optimized for litdata (untimed) and read with its ``TokensLoader`` blocks of seq_len;
  ``litdata steady`` likewise with persistent workers, from the second pass on.

Prints one JSON line per case and a summary of ratios against the dict path (and of the
tokenize cases against their floor). --text-only runs the tokenize and callable cases alone.
Run: .venv/bin/python benchmarks/tokens_loader.py [--records 4000] [--peer-python PATH]
[--text-records 4000] [--text-only]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from syvain_training_data import SyvainTrainingData

SHARDS = 16
SEQ_LEN = 2048
BATCH = 8


def documents(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(50_000) for _ in range(rng.randint(256, 2048))] for _ in range(count)]


def write_dataset(root: str, docs: list[list[int]], masked: bool = False) -> str:
    client = SyvainTrainingData()
    name = "masked" if masked else "tokens"
    uri = f"file://{root}/{name}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    per = -(-len(docs) // SHARDS)
    for shard in range(SHARDS):
        records = [
            {"tokens": d, "mask": [t & 1 for t in d]} if masked else {"tokens": d}
            for d in docs[shard * per : (shard + 1) * per]
        ]
        saver.save("train", None, records, shard_id=f"{shard:03d}")
    saver.commit_manifest()
    return uri


def flat_tokens(records: list[dict[str, Any]]) -> torch.Tensor:
    return torch.tensor([t for r in records for t in r["tokens"]], dtype=torch.int64)


def timed(make_batches: Any, count_tokens: Any, repeat: int) -> tuple[float, int]:
    best, tokens = 0.0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        tokens = sum(count_tokens(batch) for batch in make_batches())
        best = max(best, tokens / (time.perf_counter() - start))
    return best, tokens


def steady_rate(loader: Any, count_tokens: Any, repeat: int) -> tuple[float, int]:
    """``timed`` passes of one loader after an untimed first one (workers start, shards open)."""
    sum(1 for _ in loader)
    return timed(lambda: loader, count_tokens, repeat)


def ours(uri: str, masked_uri: str, workers: int, repeat: int) -> dict[str, tuple[float, int]]:
    client = SyvainTrainingData()
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    records_args = dict(args, batch_size=BATCH * 4)  # about seq_len * BATCH tokens per batch
    dict_loader = client.split_data_loader(uri, flat_tokens, records_args)
    tensor_loader = client.split_data_loader(uri, None, records_args)
    token_loader = client.split_data_loader(uri, None, args)
    cases: dict[str, tuple[float, int]] = {}
    # One loader over several passes (with persistent workers).
    steady_args = dict(args, persistent_workers=True) if workers else args
    steady_records = dict(records_args, persistent_workers=True) if workers else records_args
    cases["load_tokens steady"] = steady_rate(
        client.split_data_loader(uri, None, steady_args).load_tokens("train", seq_len=SEQ_LEN),
        torch.numel,
        repeat,
    )
    cases["columns steady"] = steady_rate(
        client.split_data_loader(uri, None, steady_records).load("train", columns=["tokens"]),
        lambda b: int(b["tokens_lengths"].sum()),
        repeat,
    )
    if workers:
        cases["two processes"] = two_processes(uri, repeat)
    return cases | {
        "dict": timed(lambda: dict_loader.load("train"), len, repeat),
        "columns": timed(
            lambda: tensor_loader.load("train", columns=["tokens"]),
            lambda b: int(b["tokens_lengths"].sum()),
            repeat,
        ),
        "load_tokens": timed(
            lambda: token_loader.load_tokens("train", seq_len=SEQ_LEN), torch.numel, repeat
        ),
        **channel_cases(token_loader, client.split_data_loader(masked_uri, None, args), repeat),
    }


def channel_cases(token_loader: Any, masked_loader: Any, repeat: int) -> dict[str, Any]:
    """``load_tokens`` with positions, with one record per row, and with a loss mask (over
    the masked copy, beside plain ``load_tokens`` over it)."""
    return {
        "documents": timed(
            lambda: token_loader.load_tokens("train", seq_len=SEQ_LEN, documents=True),
            lambda b: b["tokens"].numel(),
            repeat,
        ),
        "pack=False": timed(
            lambda: token_loader.load_tokens("train", seq_len=SEQ_LEN, pack=False, pad_id=0),
            lambda b: int(b["lengths"].sum()),
            repeat,
        ),
        "load_tokens masked set": timed(
            lambda: masked_loader.load_tokens("train", seq_len=SEQ_LEN), torch.numel, repeat
        ),
        "loss_mask": timed(
            lambda: masked_loader.load_tokens("train", seq_len=SEQ_LEN, loss_mask_column="mask"),
            lambda b: b["tokens"].numel(),
            repeat,
        ),
    }


HALF_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from syvain_training_data import SyvainTrainingData

    def main():
        uri, rank, repeat, start_at, seq_len, batch = sys.argv[1:7]
        args = {"batch_size": int(batch)}
        loader = SyvainTrainingData().split_data_loader(uri, None, args).load_tokens(
            "train", seq_len=int(seq_len), rank=int(rank), world_size=2
        )
        sum(b.numel() for b in loader)  # first pass: opens, allocations
        while time.time() < float(start_at):
            time.sleep(0.001)
        start = time.perf_counter()
        tokens = sum(b.numel() for _ in range(int(repeat)) for b in loader)
        print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}))

    main()
    """
)


def two_processes(uri: str, repeat: int) -> tuple[float, int]:
    """Both halves' tokens over the slower half's time, the halves read at once."""
    start_at = time.time() + 8  # after both have imported torch and read a first pass
    halves = [
        subprocess.Popen(
            [sys.executable, "-c", HALF_SCRIPT, uri, str(rank), str(repeat), str(start_at)]
            + [str(SEQ_LEN), str(BATCH)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results = [json.loads(half.communicate()[0].strip().splitlines()[-1]) for half in halves]
    tokens = sum(r["tokens"] for r in results)
    return tokens / max(r["seconds"] for r in results), tokens // repeat


def floor(uri: str, total_tokens: int, repeat: int) -> tuple[float, int] | None:
    """The same shards' bytes decompressed and parsed in Rust, nothing built for Python."""
    from syvain_training_data import _native

    client = SyvainTrainingData()
    shards = client.load_manifest(uri).splits["train"].shards
    data = [Path(shard.uri.removeprefix("file://")).read_bytes() for shard in shards]
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        records = sum(_native._decode_only("msgpack.zstf", blob) for blob in data)
        best = max(best, total_tokens / (time.perf_counter() - start))
    assert records == sum(shard.records for shard in shards)
    return best, total_tokens


PEER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import litdata
    from litdata.streaming.item_loader import TokensLoader

    def main():
        root, docs_file, repeat, workers, seq_len, batch, persistent = sys.argv[1:8]
        repeat, workers, seq_len, batch = int(repeat), int(workers), int(seq_len), int(batch)
        docs = json.load(open(docs_file))
        litdata.optimize(fn=convert, inputs=docs, output_dir=root + "/lit",
                         chunk_size=(seq_len + 1) * 64, item_loader=TokensLoader(),
                         num_workers=1)
        best = 0.0
        fork = {"multiprocessing_context": "fork"} if workers else {}
        if persistent == "1":
            blocks = TokensLoader(block_size=seq_len)
            dataset = litdata.StreamingDataset(root + "/lit", item_loader=blocks)
            loader = litdata.StreamingDataLoader(dataset, batch_size=batch, num_workers=workers,
                                                 persistent_workers=True, **fork)
            sum(b.numel() for b in loader)  # starts the workers
        for _ in range(repeat):
            if persistent != "1":
                blocks = TokensLoader(block_size=seq_len)
                dataset = litdata.StreamingDataset(root + "/lit", item_loader=blocks)
                loader = litdata.StreamingDataLoader(dataset, batch_size=batch,
                                                     num_workers=workers, **fork)
            start = time.perf_counter()
            tokens = sum(b.numel() for b in loader)
            best = max(best, tokens / (time.perf_counter() - start))
        print(json.dumps({"rate": best, "tokens": tokens}))


    def convert(document):
        return torch.tensor(document, dtype=torch.int64)


    if __name__ == "__main__":  # litdata's optimize starts processes that import this file
        main()
    """
)


def litdata_rate(
    python: str, docs: list[list[int]], workers: int, repeat: int, persistent: bool = False
) -> Any:
    with tempfile.TemporaryDirectory() as root:
        Path(f"{root}/docs.json").write_text(json.dumps(docs))
        Path(f"{root}/peer.py").write_text(PEER_SCRIPT)
        done = subprocess.run(
            [
                python,
                f"{root}/peer.py",
                root,
                f"{root}/docs.json",
                str(repeat),
                str(workers),
                str(SEQ_LEN),
                str(BATCH),
                str(int(persistent)),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-3:]}
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return result["rate"], result["tokens"]


def texts(count: int, seed: int = 0) -> list[str]:
    """Text records of 150 to 300 words, Zipf-drawn from 30,000 generated words."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    vocabulary = [
        "".join(rng.choices(letters, weights=range(26, 0, -1), k=rng.randint(2, 10)))
        for _ in range(30_000)
    ]
    weights = [1 / rank for rank in range(1, len(vocabulary) + 1)]
    return [
        " ".join(rng.choices(vocabulary, weights, k=rng.randint(150, 300))) for _ in range(count)
    ]


def write_texts(root: str, records: list[str]) -> str:
    client = SyvainTrainingData()
    uri = f"file://{root}/text/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    per = -(-len(records) // SHARDS)
    for shard in range(SHARDS):
        chunk = records[shard * per : (shard + 1) * per]
        saver.save("train", None, [{"text": t} for t in chunk], shard_id=f"{shard:03d}")
    saver.commit_manifest()
    return uri


def bpe(records: list[str]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        records, trainers.BpeTrainer(vocab_size=8000, special_tokens=["[UNK]"], show_progress=False)
    )
    return tokenizer


class WordIds:
    """A pure-Python tokenizer (picklable): an id per whitespace-separated word."""

    def __init__(self, vocabulary: dict[str, int]) -> None:
        self.vocabulary = vocabulary

    def __call__(self, batch: list[str]) -> list[list[int]]:
        get = self.vocabulary.get
        return [[get(word, 0) for word in text.split()] for text in batch]


class PairIds:
    """A slower pure-Python tokenizer (picklable): an id per two letters of each word."""

    def __call__(self, batch: list[str]) -> list[list[int]]:
        out = []
        for text in batch:
            ids = []
            for word in text.split():
                for i in range(0, len(word), 2):
                    ids.append((ord(word[i]) * 131 + ord(word[min(i + 1, len(word) - 1)])) % 8000)
            out.append(ids)
        return out


def encode_floor(tokenizer: Any, records: list[str], repeat: int) -> tuple[float, int]:
    """The tokenizer's own batch encoding of ``records`` in one call (the loader's method)."""
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    best, tokens = 0.0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        encodings = encode(records, add_special_tokens=False)
        seconds = time.perf_counter() - start
        tokens = sum(map(len, encodings))
        best = max(best, tokens / seconds)
    return best, tokens


def call_floor(tokenizer: Any, records: list[str], repeat: int) -> tuple[float, int]:
    """A callable tokenizer over ``records`` in one call."""
    best, tokens = 0.0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        tokens = sum(map(len, tokenizer(records)))
        best = max(best, tokens / (time.perf_counter() - start))
    return best, tokens


def best_of(cases: dict[str, tuple[float, int]], case: str, found: tuple[float, int]) -> None:
    """Keeps the better of ``cases[case]`` and ``found``."""
    if case not in cases or found[0] > cases[case][0]:
        cases[case] = found


def text_cases(root: str, count: int, repeat: int) -> dict[str, tuple[float, int]]:
    """``tokenize`` (and ``steady``) and ``callable`` at 0 and 2 workers, and their floors."""
    records = texts(count)
    uri = write_texts(root, records)
    tokenizer = bpe(records)
    words = WordIds({w: i for i, w in enumerate(sorted({w for t in records for w in t.split()}))})
    cases: dict[str, tuple[float, int]] = {}

    def floors() -> None:
        # Measured before, between and after the loader cases, the best kept: on a shared
        # machine a floor taken once could fall in a slow moment and flatter the ratios.
        best_of(cases, "tokenize floor", encode_floor(tokenizer, records, repeat))
        best_of(cases, "callable floor", call_floor(words, records, repeat))

    floors()
    client = SyvainTrainingData()
    by_tokenizer = {"text_column": "text", "tokenizer": tokenizer}
    by_callable = {"text_column": "text", "tokenizer": words, "tokenizer_name": "words"}
    by_slow = {"text_column": "text", "tokenizer": PairIds(), "tokenizer_name": "pairs"}
    for workers in (0, 2):
        args: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
        if workers:
            args["multiprocessing_context"] = "fork"
        loader = client.split_data_loader(uri, None, args)
        cases[f"tokenize@{workers}"] = timed(
            lambda loader=loader: loader.load_tokens("train", seq_len=SEQ_LEN, **by_tokenizer),
            torch.numel,
            repeat,
        )
        steady_args = dict(args, persistent_workers=True) if workers else args
        cases[f"tokenize steady@{workers}"] = steady_rate(
            client.split_data_loader(uri, None, steady_args).load_tokens(
                "train", seq_len=SEQ_LEN, **by_tokenizer
            ),
            torch.numel,
            repeat,
        )
        cases[f"callable@{workers}"] = timed(
            lambda loader=loader: loader.load_tokens("train", seq_len=SEQ_LEN, **by_callable),
            torch.numel,
            repeat,
        )
        cases[f"callable steady@{workers}"] = steady_rate(
            client.split_data_loader(uri, None, steady_args).load_tokens(
                "train", seq_len=SEQ_LEN, **by_callable
            ),
            torch.numel,
            repeat,
        )
        cases[f"slow callable steady@{workers}"] = steady_rate(
            client.split_data_loader(uri, None, steady_args).load_tokens(
                "train", seq_len=SEQ_LEN, **by_slow
            ),
            torch.numel,
            repeat,
        )
        floors()
    return cases


def text_summary(cases: dict[str, tuple[float, int]]) -> dict[str, float]:
    floor_rate, callable_floor = cases["tokenize floor"][0], cases["callable floor"][0]
    ratios = {}
    for workers in (0, 2):
        for case in ("tokenize", "tokenize steady"):
            ratios[f"{case}/floor@{workers}"] = round(cases[f"{case}@{workers}"][0] / floor_rate, 2)
        for case in ("callable", "callable steady"):
            ratios[f"{case}/callable floor@{workers}"] = round(
                cases[f"{case}@{workers}"][0] / callable_floor, 2
            )
    for case in (
        "tokenize",
        "tokenize steady",
        "callable",
        "callable steady",
        "slow callable steady",
    ):
        ratios[f"{case} 2 workers/0 workers"] = round(
            cases[f"{case}@2"][0] / cases[f"{case}@0"][0], 2
        )
    return ratios


def print_text_cases(root: str, count: int, repeat: int) -> dict[str, float]:
    cases = text_cases(root, count, repeat)
    for case, (rate, tokens) in cases.items():
        name, _, workers = case.partition("@")
        row: dict[str, Any] = {"case": name, "tokens_per_s": round(rate), "tokens": tokens}
        if workers:
            row["workers"] = int(workers)
        print(json.dumps(row))
    return text_summary(cases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--peer-python")
    parser.add_argument("--text-records", type=int, default=4000)
    parser.add_argument("--text-only", action="store_true")
    options = parser.parse_args()
    if options.text_only:
        with tempfile.TemporaryDirectory() as root:
            ratios = print_text_cases(root, options.text_records, options.repeat)
        print(json.dumps({"summary": ratios}))
        return
    docs = documents(options.records)
    total = sum(map(len, docs))
    print(json.dumps({"records": len(docs), "tokens": total, "shards": SHARDS}))
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        uri = write_dataset(root, docs)
        masked_uri = write_dataset(root, docs, masked=True)
        found = floor(uri, total, options.repeat)
        if found is not None:
            summary["floor"] = found[0]
            print(
                json.dumps({"case": "floor", "tokens_per_s": round(found[0]), "tokens": found[1]})
            )
        for workers in (0, 2):
            for case, (rate, tokens) in ours(uri, masked_uri, workers, options.repeat).items():
                summary[f"{case}@{workers}"] = rate
                print(
                    json.dumps(
                        {
                            "case": case,
                            "workers": workers,
                            "tokens_per_s": round(rate),
                            "tokens": tokens,
                        }
                    )
                )
            peer_cases = (
                {"litdata": False, "litdata steady": True} if workers else {"litdata": False}
            )
            for case, persistent in peer_cases.items() if options.peer_python else ():
                found_peer = litdata_rate(
                    options.peer_python, docs, workers, options.repeat, persistent
                )
                if isinstance(found_peer, dict):
                    print(json.dumps({"case": case, "workers": workers, **found_peer}))
                    continue
                summary[f"{case}@{workers}"] = found_peer[0]
                print(
                    json.dumps(
                        {
                            "case": case,
                            "workers": workers,
                            "tokens_per_s": round(found_peer[0]),
                            "tokens": found_peer[1],
                        }
                    )
                )
        text_ratios = print_text_cases(root, options.text_records, options.repeat)
    ratios = {}
    for workers in (0, 2):
        base = summary[f"dict@{workers}"]
        for case in ("load_tokens", "columns"):
            ratios[f"{case}/dict@{workers}"] = round(summary[f"{case}@{workers}"] / base, 2)
        for case, base_case in (
            ("documents", "load_tokens"),
            ("pack=False", "load_tokens"),
            ("loss_mask", "load_tokens masked set"),
        ):
            ratios[f"{case}/{base_case}@{workers}"] = round(
                summary[f"{case}@{workers}"] / summary[f"{base_case}@{workers}"], 2
            )
        if f"litdata@{workers}" in summary:
            for case in ("load_tokens", "columns"):
                ratios[f"{case}/litdata@{workers}"] = round(
                    summary[f"{case}@{workers}"] / summary[f"litdata@{workers}"], 2
                )
        if "floor" in summary:
            ratios[f"load_tokens/floor@{workers}"] = round(
                summary[f"load_tokens@{workers}"] / summary["floor"], 2
            )
    ratios["load_tokens 2 workers/0 workers"] = round(
        summary["load_tokens@2"] / summary["load_tokens@0"], 2
    )
    for case in ("load_tokens steady", "columns steady"):
        ratios[f"{case} 2 workers/0 workers"] = round(
            summary[f"{case}@2"] / summary[f"{case}@0"], 2
        )
    # What 2 workers could gain here at most, and how much of it load_tokens gets.
    ratios["two processes/load_tokens steady@0"] = round(
        summary["two processes@2"] / summary["load_tokens steady@0"], 2
    )
    ratios["load_tokens steady@2/two processes"] = round(
        summary["load_tokens steady@2"] / summary["two processes@2"], 2
    )
    if "litdata steady@2" in summary:
        for case in ("load_tokens steady", "columns steady"):
            ratios[f"{case}/litdata steady@2"] = round(
                summary[f"{case}@2"] / summary["litdata steady@2"], 2
            )
    print(json.dumps({"summary": ratios | text_ratios}))


if __name__ == "__main__":
    sys.exit(main())
