"""`SplitDataLoader.load_tokens`: packing exactness by token id across ranks and workers, and
resume matrices like the record loader's (real worker processes, the local store and
SeaweedFS, a real gloo group)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from loader_data import s3_client  # noqa: E402
from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading.tokens import merge_token_states  # noqa: E402
from token_runs import (  # noqa: E402
    FORMATS,
    make_token_dataset,
    run_ranks,
)


def run(client, uri, ranks, workers, batch, seq_len, stop_after=None, *, state=None, **load):
    """Every rank of a run (see token_runs.run_ranks): the batches per rank, the state."""
    return run_ranks(client, uri, ranks, workers, batch, seq_len, stop_after, state=state, **load)


def tokens_of(received: list[list[Any]]) -> list[int]:
    return [t for batches in received for batch in batches for t in batch.flatten().tolist()]


def assert_exactly_once(tokens: list[int], documents: list[list[int]], most_lost: int) -> None:
    counts = Counter(tokens)
    assert max(counts.values()) == 1, "a token was yielded twice"
    total = sum(len(d) for d in documents)
    assert set(counts) <= set(range(total))
    assert total - len(counts) <= most_lost


@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("ranks,workers", [(1, 0), (2, 2), (3, 1)])
def test_blocks_are_record_tokens_in_epoch_order(token_sets, data_format, ranks, workers):
    client, (uri, documents) = token_sets[0], token_sets[1][data_format]
    seq_len, batch = 16, 3
    received, _ = run(client, uri, ranks, workers, batch, seq_len)
    for batches in received:
        for b in batches:
            assert b.dtype == torch.int64 and b.dim() == 2 and b.shape[1] == seq_len
            assert 1 <= b.shape[0] <= batch
    consumers = ranks * max(workers, 1)
    assert_exactly_once(tokens_of(received), documents, consumers * (seq_len - 1))
    # Without a seed, a consumer's blocks continue one another: within each block, ids that
    # are not consecutive are a record boundary (the next non-empty record of the epoch).
    starts = {d[0] for d in documents if d}
    for batches in received:
        for block in (row for b in batches for row in b.tolist()):
            for before, after in zip(block, block[1:], strict=False):
                assert after == before + 1 or after in starts


def test_eos_after_every_record_and_collate_fn_is_not_needed(token_sets):
    client, (uri, documents) = token_sets[0], token_sets[1]["msgpack.zstf"]
    eos = -1
    loader = client.split_data_loader(uri, None, {"batch_size": 2}).load_tokens(
        "train", seq_len=8, eos_id=eos
    )
    flat = [t for b in loader for t in b.flatten().tolist()]
    expected = [t for d in documents for t in [*d, eos]]
    assert flat == expected[: len(flat)]
    assert len(expected) - len(flat) < 8


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_count_the_records_shards_and_batches(token_sets, workers):
    client, (uri, documents) = token_sets[0], token_sets[1]["msgpack.zstf"]
    args: dict[str, Any] = {"batch_size": 2, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = "fork"
    loader = client.split_data_loader(uri, None, args).load_tokens("train", seq_len=8)
    batches = sum(1 for _ in loader)
    stats = loader.stats()
    manifest = client.load_manifest(uri)
    shards = manifest.splits["train"].shards
    assert stats.records == len(documents)
    assert stats.batches == batches and stats.workers == workers
    # Each worker opens its part of each shard it touches: at least one open per shard.
    assert stats.shard_opens >= len(shards)
    assert stats.bytes >= sum(shard.size_bytes for shard in shards)
    assert sum(stats.retries.values()) == 0


def test_drop_last_and_shuffle(token_sets):
    client, (uri, documents) = token_sets[0], token_sets[1]["jsonl.gz"]
    total = sum(len(d) for d in documents)
    args = {"batch_size": 4, "drop_last": True}
    loader = client.split_data_loader(uri, None, args)
    shuffled = loader.load_tokens("train", seq_len=10, seed=7, shuffle_buffer=1)
    first = [b.flatten().tolist() for b in shuffled]
    again = [b.flatten().tolist() for b in loader.load_tokens("train", seq_len=10, seed=7)]
    assert all(len(b) == 40 for b in first)
    assert total - sum(map(len, first)) < 4 * 10
    assert first != [t for t in range(len(first) * 40)]  # shuffled
    assert [t for b in first for t in b] != [t for b in again for t in b]  # window matters
    twice = [
        b.flatten().tolist()
        for b in loader.load_tokens("train", seq_len=10, seed=7, shuffle_buffer=1)
    ]
    assert twice == first


# (ranks, workers, batch, seq_len, k) -> (ranks, workers, batch, seq_len) to the end.
MATRIX = [
    ((2, 2, 3, 8, 2), (3, 1, 2, 8)),
    ((1, 2, 2, 16, 3), (4, 0, 1, 5)),
    ((3, 0, 1, 12, 4), (1, 2, 4, 12)),
    ((2, 1, 4, 4, 5), (5, 2, 3, 9)),
]


@pytest.mark.parametrize("data_format", ["msgpack.zstf", "jsonl.gz"])
@pytest.mark.parametrize("before,after", MATRIX)
def test_resume_on_another_topology_yields_each_token_once(token_sets, data_format, before, after):
    client, (uri, documents) = token_sets[0], token_sets[1][data_format]
    ranks, workers, batch, seq_len, k = before
    first, state = run(client, uri, ranks, workers, batch, seq_len, k, seed=11)
    assert len(json.dumps(state)) < 4096
    ranks2, workers2, batch2, seq_len2 = after
    second, _ = run(client, uri, ranks2, workers2, batch2, seq_len2, state=state, seed=11)
    consumers = ranks * max(workers, 1) + ranks2 * max(workers2, 1)
    most_lost = consumers * (max(seq_len, seq_len2) - 1)
    assert_exactly_once(tokens_of(first) + tokens_of(second), documents, most_lost)


def test_resume_of_a_resumed_run(token_sets):
    client, (uri, documents) = token_sets[0], token_sets[1]["msgpack.zstf"]
    a, state = run(client, uri, 3, 1, 2, 8, 2, seed=4)
    b, state = run(client, uri, 2, 2, 1, 6, 3, state=state, seed=4)
    c, _ = run(client, uri, 1, 2, 5, 9, state=state, seed=4)
    assert_exactly_once(tokens_of(a) + tokens_of(b) + tokens_of(c), documents, 9 * 8)


@pytest.mark.parametrize("ranks,workers,batch,seq_len,k", [(1, 2, 3, 8, 5), (1, 0, 2, 7, 3)])
def test_same_topology_resume_is_the_uninterrupted_stream(
    token_sets, ranks, workers, batch, seq_len, k
):
    client, (uri, _) = token_sets[0], token_sets[1]["msgpack.zstf"]
    full, _ = run(client, uri, ranks, workers, batch, seq_len, seed=3)
    head, state = run(client, uri, ranks, workers, batch, seq_len, k, seed=3)
    rest, _ = run(client, uri, ranks, workers, batch, seq_len, state=state, seed=3)
    assert [b.tolist() for b in head[0] + rest[0]] == [b.tolist() for b in full[0]]


def test_a_finished_epoch_resumes_at_the_next(token_sets):
    client, (uri, _) = token_sets[0], token_sets[1]["msgpack.zstf"]
    finished, state = run(client, uri, 2, 1, 2, 8, seed=1)
    assert state["epoch"] == 0 and all(entry[2] == 1 for entry in state["interrupts"][-1][4])
    resumed, state = run(client, uri, 1, 0, 2, 8, 1, state=state, seed=1)
    assert state["epoch"] == 1


def test_state_errors(token_sets):
    client, (uri, _) = token_sets[0], token_sets[1]["msgpack.zstf"]
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    _, state = run(client, uri, 2, 0, 2, 8, 1)
    dl = loader.load_tokens("train", seq_len=8)
    alone = dict(state, interrupts=[[*state["interrupts"][0][:4], state["interrupts"][0][4][:1]]])
    with pytest.raises(ValueError, match=r"lacks the positions of rank\(s\) 1 of 2"):
        dl.load_state_dict(alone)
    with pytest.raises(ValueError, match="another selection"):
        loader.load_tokens("train", seq_len=8, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="another selection"):
        loader.load_tokens("train", seq_len=8, eos_id=0).load_state_dict(state)
    with pytest.raises(ValueError, match="Not a token loader state"):
        dl.load_state_dict(loader.load("train").state_dict())
    with pytest.raises(ValueError, match="This is a tokens loader state, not a record"):
        loader.load("train").load_state_dict(state)
    other, _ = run(client, uri, 2, 0, 2, 8, 2, seed=1)
    with pytest.raises(ValueError, match="different runs"):
        merge_token_states([state, run(client, uri, 2, 0, 2, 8, 1, seed=1)[1]])
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        loader.load_tokens("train", seq_len=0)


def test_records_without_int_token_lists_name_the_shard(tmp_path):
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/m.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    saver.save("train", None, [{"tokens": [1, 2]}, {"text": "no tokens"}])
    saver.commit_manifest()
    loader = client.split_data_loader(uri, None, {"batch_size": 1})
    with pytest.raises(ValueError, match="token column 'tokens' of shard .* is not a list of int"):
        list(loader.load_tokens("train", seq_len=2))
    saver = client.dataset_saver(f"file://{tmp_path}/n.json", data_format="msgpack.zstf")
    saver.save("train", None, [{"tokens": ["a", "b"]}])
    saver.commit_manifest()
    loader = client.split_data_loader(f"file://{tmp_path}/n.json", None, {})
    with pytest.raises(ValueError, match="is not a list of int token ids in every record"):
        list(loader.load_tokens("train", seq_len=2))


def test_mixing_and_infinite_iter(tmp_path):
    client = SyvainTrainingData()
    uri = f"file://{tmp_path}/m.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    for stage, base in (("a", 0), ("b", 10_000)):
        records = [{"tokens": [base + 10 * i + j for j in range(10)]} for i in range(60)]
        saver.save("train", stage, records)
    saver.commit_manifest()
    loader = client.split_data_loader(uri, None, {"batch_size": 2})
    mixed = loader.load_tokens(
        "train", seq_len=10, mixing_weights={"a": 3, "b": 1}, mixing_stop="all_exhausted"
    )
    tokens = [t for b in mixed for t in b.flatten().tolist()]
    assert Counter(tokens) == Counter([*range(600), *range(10_000, 10_600)])
    head = tokens[:400]
    assert abs(sum(t < 10_000 for t in head) - 300) <= 20
    endless = loader.load_tokens("train", curriculum_stage="a", seq_len=10, infinite_iter=True)
    firsts = [next(endless) for _ in range(31)]
    assert firsts[30].tolist() == firsts[0].tolist()  # 30 batches per epoch, then epoch 1


def test_resume_over_seaweedfs_with_spawned_workers(s3_env, s3_bucket):
    # Spawned workers build their storage from the environment (no secret is pickled).
    client = s3_client(s3_env)
    uri, documents = make_token_dataset(
        client, f"s3://{s3_bucket}/tokens-{uuid.uuid4().hex}", "jsonl.gz"
    )
    first, state = run(client, uri, 2, 2, 2, 8, 2, seed=5, context="spawn")
    second, _ = run(client, uri, 3, 2, 3, 8, state=state, seed=5, context="spawn")
    assert_exactly_once(tokens_of(first) + tokens_of(second), documents, 10 * 7)


GLOO_RANK = """
import json, sys
import torch.distributed as dist
from syvain_training_data import SyvainTrainingData
rank, init, uri, out, phase = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
loader = SyvainTrainingData().split_data_loader(uri, None, {"batch_size": 2})
dl = loader.load_tokens("train", seq_len=8, seed=2)
if phase == "first":
    it = iter(dl)
    tokens = [t for _ in range(2) for t in next(it).flatten().tolist()]
    state = dl.state_dict()  # a collective: every rank's positions
else:
    state = json.load(open(phase))
    dl = SyvainTrainingData().split_data_loader(uri, None, {"batch_size": 2}).load_tokens(
        "train", seq_len=8, seed=2, rank=rank, world_size=3
    )
    dl.load_state_dict(state)
    tokens = [t for b in dl for t in b.flatten().tolist()]
json.dump({"tokens": tokens, "state": state}, open(out, "w"))
dist.barrier()
dist.destroy_process_group()
"""


def test_a_gloo_group_gathers_every_rank_position(token_sets, tmp_path):
    client, (uri, documents) = token_sets[0], token_sets[1]["msgpack.zstf"]
    init = f"file://{tmp_path}/rendezvous"
    outs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    procs = [
        subprocess.Popen([sys.executable, "-c", GLOO_RANK, str(r), init, uri, str(out), "first"])
        for r, out in enumerate(outs)
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    results = [json.loads(out.read_text()) for out in outs]
    assert results[0]["state"] == results[1]["state"]
    state = results[0]["state"]
    assert [entry[0] for entry in state["interrupts"][-1][4]] == [0, 1]
    # The gathered state alone resumes a 3-rank run (no process group needed to load).
    rest, _ = run(client, uri, 3, 0, 2, 8, state=state, seed=2)
    first = [t for result in results for t in result["tokens"]]
    assert_exactly_once(first + tokens_of(rest), documents, 5 * 7)


@pytest.mark.parametrize("workers", [0, 2])
def test_resumes_on_one_topology_keep_one_entry(token_sets, workers):
    """A token run stopped after one batch per rank and resumed on its topology, again and
    again (with 0 workers past the end of the rank with fewer batches, token counts making
    the ranks' batch counts differ): the state keeps one entry and the streams are the
    uninterrupted ones, per rank."""
    client, (uri, _) = token_sets[0], token_sets[1]["msgpack.zstf"]
    whole, _ = run(client, uri, 2, workers, 2, 8, seed=5)
    fewer, more = sorted(len(batches) for batches in whole)
    resumes = (fewer + more) // 2 if workers == 0 else 4
    if workers == 0:
        assert fewer < resumes < more
    received: list[list[Any]] = [[], []]
    state = None
    for _ in range(resumes):
        part, state = run(client, uri, 2, workers, 2, 8, 1, state=state, seed=5)
        assert len(state["interrupts"]) <= 1 and len(json.dumps(state)) < 4096
        for rank in range(2):
            received[rank] += part[rank]
    rest, _ = run(client, uri, 2, workers, 2, 8, state=state, seed=5)
    for rank in range(2):
        assert [b.tolist() for b in received[rank] + rest[rank]] == [
            b.tolist() for b in whole[rank]
        ]


def test_a_state_of_the_previous_release_resumes_in_its_order(token_sets):
    """The previous release interleaved a window's blocks uniformly: a token state it saved
    resumes that order, block for block."""
    client, (uri, _) = token_sets[0], token_sets[1]["msgpack.zstf"]
    loader = client.split_data_loader(uri, None, {"batch_size": 2})

    def load(previous: bool) -> Any:
        tokens = loader.load_tokens("train", seq_len=8, seed=3)
        if previous:  # what that release's loader planned
            read_plan = tokens.dataset.read_plan
            tokens.dataset.read_plan = dataclasses.replace(read_plan, spread=False)
        return tokens

    whole = [batch.tolist() for batch in load(previous=True)]
    assert whole != [batch.tolist() for batch in load(previous=False)]
    interrupted = load(previous=True)
    batches = iter(interrupted)
    head = [next(batches).tolist() for _ in range(3)]
    del batches
    resumed = load(previous=False)
    resumed.load_state_dict(json.loads(json.dumps(interrupted.state_dict())))
    assert head + [batch.tolist() for batch in resumed] == whole
