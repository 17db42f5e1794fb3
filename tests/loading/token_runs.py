"""Token runs for the load_tokens tests: a dataset of unique token ids, real runs of every rank
of a loader (``run_ranks``), and runs simulated from the plan and the packer alone, with no
I/O (what each consumer of a run yields, and what a run leaves for the next), for the property
tests of token resumes."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import torch

from loader_data import publish_shards, topologies
from syvain_training_data import SyvainTrainingData
from syvain_training_data.loading import token_plan
from syvain_training_data.loading.packing import TokenPacker
from syvain_training_data.loading.tokens import merge_token_states

# Shard formats of the token tests (each reads its token lists another way).
FORMATS = ["msgpack.zstf", "jsonl.gz", "parquet"]


def make_token_dataset(client: SyvainTrainingData, root: str, data_format: str) -> tuple[str, list]:
    """Shards whose records hold unique token ids (0, 1, 2, ... in manifest order), some
    records empty, some longer than a block. Returns the URI and each record's tokens."""
    uri = f"{root}/{data_format}/data-manifest.json"
    draw = random.Random(data_format)
    documents: list[list[int]] = []
    next_id = 0
    shards = []
    for _ in range(5):
        records = []
        for _ in range(draw.randint(4, 30)):
            length = draw.choice([0, 1, 3, draw.randint(1, 40), draw.randint(40, 90)])
            tokens = list(range(next_id, next_id + length))
            next_id += length
            documents.append(tokens)
            records.append({"tokens": tokens, "name": f"doc{len(documents)}"})
        shards.append(records)
    return publish_shards(client, uri, data_format, shards), documents


def simulate_consumer(lengths, part, cuts, seq_len, batch, drop_last, first_id):
    """What TokenDataset yields for one consumer: (tokens per batch, position after it)."""
    packer = TokenPacker(seq_len, batch)
    out = []
    positions = [p for start, stop in part for p in range(start, stop)]
    for index, position in enumerate(positions):
        tokens = torch.arange(first_id[position], first_id[position] + lengths[position])
        start = cuts.get(position, 0)
        rest = tokens[start:]
        for b, whole, offset in packer.add(index, start, rest, [len(rest)]):
            out.append((b.flatten().tolist(), (whole, offset)))
    for b, whole, offset in packer.finish(drop_last):
        out.append((b.flatten().tolist(), (whole, offset)))
    return out


def simulate_run(lengths, interrupts, topology, seq_len, taken_per_rank, boundaries=None):
    """One run (laid out with a schedule's ``boundaries`` when given): every rank takes
    ``taken_per_rank`` batches (None: all) in torch's in-order round robin. Returns (tokens
    received, the interrupt, streams per rank)."""
    first_id = [0]
    for n in lengths:
        first_id.append(first_id[-1] + n)
    layout, cuts = token_plan.token_layout(len(lengths), interrupts, topology, None, boundaries)
    tokens, positions, turns, finished, streams = [], [], [], [], []
    for rank in range(topology.world_size):
        outs = [
            simulate_consumer(
                lengths,
                layout[rank][w],
                cuts,
                seq_len,
                topology.batch_size,
                topology.drop_last,
                first_id,
            )
            for w in range(topology.workers)
        ]
        counts = [len(o) for o in outs]
        limit = sum(counts) if taken_per_rank is None else min(taken_per_rank, sum(counts))
        taken = [0] * topology.workers
        turn, stream, w = 0, [], 0
        while len(stream) < limit:
            if taken[w] < counts[w]:
                stream.append(outs[w][taken[w]][0])
                taken[w] += 1
                turn = (w + 1) % topology.workers
            w = (w + 1) % topology.workers
        tokens += [t for b in stream for t in b]
        positions.append(
            tuple(outs[w][taken[w] - 1][1] if taken[w] else (0, 0) for w in range(topology.workers))
        )
        turns.append(turn)
        finished.append(limit == sum(counts))
        streams.append(stream)
    interrupt = token_plan.TokenInterrupt(topology, tuple(positions), tuple(turns), tuple(finished))
    return tokens, interrupt, streams


token_topology = topologies(6, 4, 4)


def run_ranks(
    client: Any,
    uri: str,
    ranks: int,
    workers: int,
    batch: int,
    seq_len: int,
    stop_after: int | None = None,
    *,
    state: dict[str, Any] | None = None,
    keep: Callable[[Any], Any] = lambda batch: batch,
    **load: Any,
) -> tuple[list[list[Any]], dict[str, Any]]:
    """Every rank of a ``load_tokens`` run over ``uri`` (fork workers, or ``context``), each
    resuming ``state`` (through JSON, as a checkpoint file would) and taking ``stop_after``
    batches (None: to the end). Returns ``keep`` of each batch per rank and the merged state."""
    args: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    if workers:
        args["multiprocessing_context"] = load.pop("context", "fork")
    loader = client.split_data_loader(uri, None, args)
    received: list[list[Any]] = []
    states = []
    for rank in range(ranks):
        dl = loader.load_tokens("train", seq_len=seq_len, rank=rank, world_size=ranks, **load)
        if state is not None:
            dl.load_state_dict(json.loads(json.dumps(state)))
        kept: list[Any] = []
        iterator = iter(dl)
        for taken, item in enumerate(iterator):
            kept.append(keep(item))
            if stop_after is not None and taken + 1 == stop_after:
                break
        del iterator
        states.append(dl.state_dict())
        received.append(kept)
    return received, merge_token_states(states)
