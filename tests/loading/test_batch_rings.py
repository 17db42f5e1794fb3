"""Batch rings: passes of one loader at once, and batches kept after their pass."""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")


from syvain_training_data import SyvainTrainingData  # noqa: E402


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
