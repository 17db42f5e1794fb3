"""`SplitDataLoader.load_tokens`: packing exactness by token id across ranks and workers, and
resume matrices like the record loader's (real worker processes, the local store and
SeaweedFS, a real gloo group)."""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from syvain_training_data import SyvainTrainingData  # noqa: E402
from syvain_training_data.loading import plan, token_plan  # noqa: E402
from syvain_training_data.loading.tokens import merge_token_states  # noqa: E402
from token_runs import run_ranks, simulate_run, token_topology  # noqa: E402

FORMATS = ["msgpack.zstf", "jsonl.gz", "parquet"]


def make_dataset(client: SyvainTrainingData, root: str, data_format: str) -> tuple[str, list]:
    """Shards whose records hold unique token ids (0, 1, 2, ... in manifest order), some
    records empty, some longer than a block. Returns the URI and each record's tokens."""
    uri = f"{root}/{data_format}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format=data_format)
    draw = random.Random(data_format)
    documents: list[list[int]] = []
    next_id = 0
    for shard in range(5):
        records = []
        for _ in range(draw.randint(4, 30)):
            length = draw.choice([0, 1, 3, draw.randint(1, 40), draw.randint(40, 90)])
            tokens = list(range(next_id, next_id + length))
            next_id += length
            documents.append(tokens)
            records.append({"tokens": tokens, "name": f"doc{len(documents)}"})
        saver.save("train", None, records, shard_id=f"{shard:03d}")
    saver.commit_manifest()
    return uri, documents


@pytest.fixture(scope="module")
def local_sets(tmp_path_factory):
    client = SyvainTrainingData()
    root = f"file://{tmp_path_factory.mktemp('tokens')}"
    return client, {fmt: make_dataset(client, root, fmt) for fmt in FORMATS}


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
def test_blocks_are_record_tokens_in_epoch_order(local_sets, data_format, ranks, workers):
    client, (uri, documents) = local_sets[0], local_sets[1][data_format]
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


def test_eos_after_every_record_and_collate_fn_is_not_needed(local_sets):
    client, (uri, documents) = local_sets[0], local_sets[1]["msgpack.zstf"]
    eos = -1
    loader = client.split_data_loader(uri, None, {"batch_size": 2}).load_tokens(
        "train", seq_len=8, eos_id=eos
    )
    flat = [t for b in loader for t in b.flatten().tolist()]
    expected = [t for d in documents for t in [*d, eos]]
    assert flat == expected[: len(flat)]
    assert len(expected) - len(flat) < 8


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_count_the_records_shards_and_batches(local_sets, workers):
    client, (uri, documents) = local_sets[0], local_sets[1]["msgpack.zstf"]
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


def test_drop_last_and_shuffle(local_sets):
    client, (uri, documents) = local_sets[0], local_sets[1]["jsonl.gz"]
    total = sum(len(d) for d in documents)
    args = {"batch_size": 4, "drop_last": True}
    loader = client.split_data_loader(uri, None, args)
    shuffled = loader.load_tokens("train", seq_len=10, seed=7, shuffle_buffer=3)
    first = [b.flatten().tolist() for b in shuffled]
    again = [b.flatten().tolist() for b in loader.load_tokens("train", seq_len=10, seed=7)]
    assert all(len(b) == 40 for b in first)
    assert total - sum(map(len, first)) < 4 * 10
    assert first != [t for t in range(len(first) * 40)]  # shuffled
    assert [t for b in first for t in b] != [t for b in again for t in b]  # window matters
    twice = [
        b.flatten().tolist()
        for b in loader.load_tokens("train", seq_len=10, seed=7, shuffle_buffer=3)
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
def test_resume_on_another_topology_yields_each_token_once(local_sets, data_format, before, after):
    client, (uri, documents) = local_sets[0], local_sets[1][data_format]
    ranks, workers, batch, seq_len, k = before
    first, state = run(client, uri, ranks, workers, batch, seq_len, k, seed=11)
    assert len(json.dumps(state)) < 4096
    ranks2, workers2, batch2, seq_len2 = after
    second, _ = run(client, uri, ranks2, workers2, batch2, seq_len2, state=state, seed=11)
    consumers = ranks * max(workers, 1) + ranks2 * max(workers2, 1)
    most_lost = consumers * (max(seq_len, seq_len2) - 1)
    assert_exactly_once(tokens_of(first) + tokens_of(second), documents, most_lost)


def test_resume_of_a_resumed_run(local_sets):
    client, (uri, documents) = local_sets[0], local_sets[1]["msgpack.zstf"]
    a, state = run(client, uri, 3, 1, 2, 8, 2, seed=4)
    b, state = run(client, uri, 2, 2, 1, 6, 3, state=state, seed=4)
    c, _ = run(client, uri, 1, 2, 5, 9, state=state, seed=4)
    assert_exactly_once(tokens_of(a) + tokens_of(b) + tokens_of(c), documents, 9 * 8)


@pytest.mark.parametrize("ranks,workers,batch,seq_len,k", [(1, 2, 3, 8, 5), (1, 0, 2, 7, 3)])
def test_same_topology_resume_is_the_uninterrupted_stream(
    local_sets, ranks, workers, batch, seq_len, k
):
    client, (uri, _) = local_sets[0], local_sets[1]["msgpack.zstf"]
    full, _ = run(client, uri, ranks, workers, batch, seq_len, seed=3)
    head, state = run(client, uri, ranks, workers, batch, seq_len, k, seed=3)
    rest, _ = run(client, uri, ranks, workers, batch, seq_len, state=state, seed=3)
    assert [b.tolist() for b in head[0] + rest[0]] == [b.tolist() for b in full[0]]


def test_a_finished_epoch_resumes_at_the_next(local_sets):
    client, (uri, _) = local_sets[0], local_sets[1]["msgpack.zstf"]
    finished, state = run(client, uri, 2, 1, 2, 8, seed=1)
    assert state["epoch"] == 0 and all(entry[2] == 1 for entry in state["interrupts"][-1][4])
    resumed, state = run(client, uri, 1, 0, 2, 8, 1, state=state, seed=1)
    assert state["epoch"] == 1


def test_state_errors(local_sets):
    client, (uri, _) = local_sets[0], local_sets[1]["msgpack.zstf"]
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


def test_resume_over_seaweedfs_with_spawned_workers(seaweed, s3_bucket, monkeypatch):
    client = SyvainTrainingData(
        s3_base_url=seaweed.endpoint,
        region=seaweed.region,
        access_key_id=seaweed.access_key_id,
        secret_access_key=seaweed.secret_access_key,
    )
    # Spawned workers build their storage from the environment (no secret is pickled).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_access_key)
    uri, documents = make_dataset(client, f"s3://{s3_bucket}/tokens-{uuid.uuid4().hex}", "jsonl.gz")
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


def test_a_gloo_group_gathers_every_rank_position(local_sets, tmp_path):
    client, (uri, documents) = local_sets[0], local_sets[1]["msgpack.zstf"]
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


def test_token_layout_cuts_carry_through_a_chain():
    # A 1-consumer run stopped inside record 4 at token 7 leaves the rest of record 4 first.
    one = plan.Topology(1, 1, 1, False)
    stop = token_plan.TokenInterrupt(one, (((4, 7),),), (0,), (False,))
    layout, cuts = token_plan.token_layout(10, [stop], plan.Topology(2, 1, 1, False))
    assert layout[0][0] == [(4, 7)] and layout[1][0] == [(7, 10)] and cuts == {4: 7}
    again = token_plan.TokenInterrupt(
        plan.Topology(2, 1, 1, False), (((0, 9),), ((1, 0),)), (0, 0), (False, False)
    )
    layout, cuts = token_plan.token_layout(10, [stop, again], one)
    assert layout[0][0] == [(4, 7), (8, 10)] and cuts == {4: 9}
    with pytest.raises(ValueError, match="went back inside record 4"):
        bad = token_plan.TokenInterrupt(
            plan.Topology(2, 1, 1, False), (((0, 3),), ((0, 0),)), (0, 0), (False, False)
        )
        token_plan.token_layout(10, [stop, bad], one)


# --- the token plan alone, over random data and topologies (no I/O) ------------------------


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    runs=st.lists(st.tuples(token_topology, st.integers(0, 6)), min_size=1, max_size=3),
    last=token_topology,
    seq_len=st.integers(1, 12),
    repeat=st.booleans(),
)
def test_token_chains_yield_each_token_once(lengths, runs, last, seq_len, repeat):
    if repeat:
        last = runs[-1][0]
    interrupts: list[token_plan.TokenInterrupt] = []
    received: list[int] = []
    consumers = 0
    for topology, taken in runs:
        tokens, interrupt, _ = simulate_run(lengths, interrupts, topology, seq_len, taken)
        received += tokens
        interrupts.append(interrupt)
    tokens, _, _ = simulate_run(lengths, interrupts, last, seq_len, None)
    received += tokens
    consumers = sum(t.world_size * t.workers for t, _ in runs) + last.world_size * last.workers
    counts = Counter(received)
    assert not counts or max(counts.values()) == 1
    # Each consumer of each run leaves out fewer than seq_len tokens, or a smaller last batch
    # with drop_last (fewer than batch_size blocks).
    slack = max(t.batch_size for t, _ in [*runs, (last, 0)]) * seq_len
    assert sum(lengths) - len(counts) <= consumers * slack


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    topology=token_topology,
    seq_len=st.integers(1, 12),
    taken=st.integers(0, 8),
)
def test_same_topology_token_resume_is_the_uninterrupted_stream(lengths, topology, seq_len, taken):
    _, _, whole = simulate_run(lengths, [], topology, seq_len, None)
    _, interrupt, head = simulate_run(lengths, [], topology, seq_len, taken)
    _, _, tail = simulate_run(lengths, [interrupt], topology, seq_len, None)
    for rank in range(topology.world_size):
        assert head[rank] + tail[rank] == whole[rank]


def token_rest(lengths, interrupts):
    """What a run after ``interrupts`` has left: its positions, sorted, and the token each
    one resumes at."""
    layout, cuts = token_plan.token_layout(len(lengths), interrupts, plan.Topology(1, 1, 1, False))
    rest = sorted(p for start, stop in layout[0][0] for p in range(start, stop))
    return rest, {p: cuts[p] for p in rest if p in cuts}


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    before=st.lists(st.tuples(token_topology, st.integers(0, 6)), max_size=2),
    topology=token_topology,
    first=st.integers(0, 8),
    second=st.integers(0, 8),
    seq_len=st.integers(1, 12),
)
def test_two_token_runs_on_one_topology_are_one_run(
    lengths, before, topology, first, second, seq_len
):
    """A token run resumed on its own topology merges with it (token_plan.TokenInterrupt.then): per
    worker the records add up and the later offset wins, a worker that took nothing keeps its
    position, the turns add. The merged state is the one an uninterrupted run that took both
    runs' batches would have saved; it leaves the same records, cuts included; and a later run
    on that topology is laid out and streams exactly as after the two. (After the two, the rest
    lies in the second run's rotated worker order, after the merged one in epoch order, so a
    new topology splits the same records differently.)"""
    earlier: tuple[token_plan.TokenInterrupt, ...] = ()
    for t, taken in before:  # as the loader saves them: merged as they come
        _, interrupt, _ = simulate_run(lengths, list(earlier), t, seq_len, taken)
        earlier = plan.appended(earlier, interrupt)
    _, one, _ = simulate_run(lengths, list(earlier), topology, seq_len, first)
    _, two, _ = simulate_run(lengths, [*earlier, one], topology, seq_len, second)
    composed = [*earlier, one, two]
    merged = list(plan.appended(plan.appended(earlier, one), two))
    assert list(plan.merged_tail(composed)) == merged
    if not earlier or earlier[-1].topology != topology:
        _, whole, _ = simulate_run(lengths, list(earlier), topology, seq_len, first + second)
        assert merged == [*earlier, whole]
    assert token_rest(lengths, composed) == token_rest(lengths, merged)
    (layout, cuts), (merged_layout, merged_cuts) = (
        token_plan.token_layout(len(lengths), chain, topology) for chain in (composed, merged)
    )
    assert layout == merged_layout
    live = {p for parts in layout.values() for part in parts for a, b in part for p in range(a, b)}
    assert {p: c for p, c in cuts.items() if p in live} == {
        p: c for p, c in merged_cuts.items() if p in live
    }
    _, _, streams = simulate_run(lengths, composed, topology, seq_len, None)
    assert simulate_run(lengths, merged, topology, seq_len, None)[2] == streams


@pytest.mark.parametrize("workers", [0, 2])
def test_resumes_on_one_topology_keep_one_entry(local_sets, workers):
    """A token run stopped after one batch per rank and resumed on its topology, again and
    again (with 0 workers past the end of the rank with fewer batches, token counts making
    the ranks' batch counts differ): the state keeps one entry and the streams are the
    uninterrupted ones, per rank."""
    client, (uri, _) = local_sets[0], local_sets[1]["msgpack.zstf"]
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


# --- tensor batches: load(columns=...) ----------------------------------------------------


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
def test_column_batches_are_the_record_loaders_batches(local_sets, workers, batch, load):
    """Bundled, through the ring or by value, a column loader yields the batches the record
    loader yields, in its order; its state resumes on other worker counts like the record
    loader's, every record exactly once."""
    client, (uri, documents) = local_sets[0], local_sets[1]["msgpack.zstf"]
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
def test_worker_batches_come_through_a_batch_ring(local_sets, monkeypatch, persistent, seed):
    """Worker batches arrive through the loader's shared-memory ring, read in place, also after
    a pass left batches in flight (persistent workers drain them; new workers get a new ring);
    a batch the loop keeps holds its slot, and the rest go by value meanwhile."""
    from syvain_training_data.loading import transfer

    taken = []
    take = transfer.BatchRing.take
    monkeypatch.setattr(
        transfer.BatchRing, "take", lambda ring, *a: taken.append(1) or take(ring, *a)
    )
    client, sets = local_sets
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
def test_forkserver_workers_send_batches_through_the_ring(local_sets):
    """Workers that do not fork from the loader map the ring's memory file themselves."""
    client, sets = local_sets
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


# --- batch rings: passes at once, kept batches --------------------------------------------------


@pytest.fixture(scope="module")
def long_set(tmp_path_factory):
    """One jsonl.gz split of 30,000 unique tokens in 4 shards (a few hundred batches of 16)."""
    client = SyvainTrainingData()
    uri = f"file://{tmp_path_factory.mktemp('long')}/data-manifest.json"
    saver = client.dataset_saver(uri, data_format="msgpack.zstf")
    draw = random.Random(5)
    next_id = 0
    for shard in range(4):
        records = []
        while next_id < (shard + 1) * 7_500:
            length = draw.randint(1, 60)
            records.append({"tokens": list(range(next_id, next_id + length))})
            next_id += length
        saver.save("train", None, records, shard_id=f"{shard:03d}")
    saver.commit_manifest()
    return client, uri


def _loader(client, uri, kind: str, persistent: bool = False):
    args = {"batch_size": 2, "num_workers": 2, "multiprocessing_context": "fork"}
    loader = client.split_data_loader(uri, None, {**args, "persistent_workers": persistent})
    if kind == "tokens":
        return loader.load_tokens("train", seq_len=8, seed=1)
    return loader.load("train", columns=["tokens"], seed=1)


def _tensor(batch: Any) -> torch.Tensor:
    return batch if isinstance(batch, torch.Tensor) else batch["tokens"]


def _in_ring(dl, tensor: torch.Tensor) -> bool:
    memory = dl.dataset.ring._bytes
    return memory.data_ptr() <= tensor.data_ptr() < memory.data_ptr() + memory.numel()


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["tokens", "columns"])
def test_two_live_passes_of_one_loader_each_yield_their_epoch(long_set, kind, persistent):
    """Two iterators of one loader alive at once (2 forked workers each), read in turn and
    their batches kept (in place in their rings): each yields exactly its epoch's batches, as
    a loader running that epoch alone does."""
    client, uri = long_set
    alone = []
    for epoch in (0, 1):
        dl = _loader(client, uri, kind)
        dl.set_epoch(epoch)
        alone.append([_tensor(b).clone() for b in dl])
    dl = _loader(client, uri, kind, persistent)
    first, second = iter(dl), iter(dl)
    got: list[list[torch.Tensor]] = [[], []]
    for a, b in itertools.zip_longest(first, second):
        if a is not None:
            got[0].append(_tensor(a))
        if b is not None:
            got[1].append(_tensor(b))
    for epoch in (0, 1):
        assert len(got[epoch]) == len(alone[epoch]) > 100
        wrong = sum(not torch.equal(a, b) for a, b in zip(got[epoch], alone[epoch], strict=True))
        assert wrong == 0, f"epoch {epoch}: {wrong} batches differ"


def _ring_bytes(fd: int) -> int:
    """Bytes of memory a ring's memory file holds (pages written and not released)."""
    return os.fstat(fd).st_blocks * 512


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the ring's memory file is Linux's")
@pytest.mark.parametrize("kind", ["tokens", "columns"])
def test_a_batch_kept_after_its_pass_holds_its_slot_not_the_ring(long_set, kind):
    client, uri = long_set
    dl = _loader(client, uri, kind)
    kept, copy, fd = None, None, -1
    for index, batch in enumerate(dl):
        if index == 0:
            fd = os.dup(dl.dataset.ring._fd)
        if index == 50:
            kept, copy = _tensor(batch), _tensor(batch).clone()
            assert _in_ring(dl, kept)
    try:
        ring = dl.dataset.ring
        written = ring.slot_bytes * ring.workers * ring.per_worker
        held = _ring_bytes(fd)
        # The kept batch's pages and the slots' states: not the slots the pass wrote.
        assert held <= 4 * 4096 + ring.slot_bytes, (held, written)
        assert torch.equal(kept, copy)
        kept.view(-1)[0] = -1  # still its own, writable
        del kept
        assert _ring_bytes(fd) <= 4 * 4096
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["tokens", "columns"])
def test_a_kept_batch_keeps_one_slot_and_the_rest_still_use_the_ring(long_set, kind):
    client, uri = long_set
    dl = _loader(client, uri, kind)
    iterator = iter(dl)
    kept = _tensor(next(iterator))  # kept for the whole pass
    assert _in_ring(dl, kept)
    by_value = total = 0
    for batch in iterator:
        total += 1
        by_value += not _in_ring(dl, _tensor(batch))
    slots = dl.dataset.ring.workers * dl.dataset.ring.per_worker
    per_batch = 1 if kind == "tokens" else 2  # padded tokens and their lengths
    assert total * per_batch > 2 * slots  # every slot was used more than once
    # Only batches a worker sent ahead of the others (while one of them is done) go by value.
    assert by_value <= total // 10, (by_value, total)
