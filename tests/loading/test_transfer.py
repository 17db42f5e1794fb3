"""loading/transfer.py: tensors a worker sends travel through a batch ring or by value and come
back whole."""

from __future__ import annotations

import io
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest

torch = pytest.importorskip("torch")

from syvain_training_data.loading import transfer  # noqa: E402


def through_pipe(value: object) -> object:
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return pickle.loads(buffer.getvalue())


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(16 * 8, dtype=torch.int64).view(16, 8),
        torch.tensor([True, False, True]),
        torch.linspace(0, 1, 7, dtype=torch.float32),
        torch.empty((3, 0), dtype=torch.int64),
        torch.arange(12, dtype=torch.int32).view(3, 4).t(),  # not contiguous
    ],
)
def test_small_tensors_come_back_equal_and_writable(tensor):
    got = through_pipe(transfer._wrap({"a": tensor, "n": [tensor, 3], "s": "text"}, None))
    for value in (got["a"], got["n"][0]):
        assert isinstance(value, torch.Tensor)
        assert value.dtype == tensor.dtype and value.shape == tensor.shape
        assert torch.equal(value, tensor)
        if value.numel():
            value.view(-1)[0] = value.view(-1)[1]  # its own, writable memory
    assert got["n"][1] == 3 and got["s"] == "text"


def test_large_tensors_are_left_to_torch():
    large = torch.zeros(transfer.BY_VALUE_BYTES // 8 + 1, dtype=torch.int64)
    assert transfer._wrap(large, None) is large
    small = torch.zeros(transfer.BY_VALUE_BYTES // 8, dtype=torch.int64)
    assert isinstance(transfer._wrap(small, None), transfer._ByValue)


def test_the_main_process_keeps_its_batches_as_they_are():
    batch = {"tokens": torch.ones(2, 2)}
    assert transfer.for_transfer(batch) is batch


class RingBatches(torch.utils.data.IterableDataset):
    """Each worker sends ``count`` tensors of its own values, some larger than a slot."""

    def __init__(self, ring: transfer.BatchRing | None, count: int, slot_elements: int) -> None:
        self.ring, self.count, self.slot_elements = ring, count, slot_elements

    def __iter__(self):
        worker = torch.utils.data.get_worker_info().id
        for index in range(self.count):
            size = (
                self.slot_elements + 1 if index % 7 == 3 else 1 + (index * 5) % self.slot_elements
            )
            tensor = torch.arange(size, dtype=torch.int64) + 1000 * index + 10**6 * worker
            yield transfer.for_transfer((worker, index, tensor.view(1, -1)), self.ring)


def expected(worker: int, index: int, slot_elements: int) -> torch.Tensor:
    size = slot_elements + 1 if index % 7 == 3 else 1 + (index * 5) % slot_elements
    return (torch.arange(size, dtype=torch.int64) + 1000 * index + 10**6 * worker).view(1, -1)


def ring_pass(monkeypatch, ring, prefetch: int, context: str = "fork", count: int = 60):
    """Every tensor of a 2-worker DataLoader, checked, and how many came out of ring slots."""
    taken = []
    take = transfer.BatchRing.take

    def counted(self, *args):
        taken.append(args[0])
        return take(self, *args)

    monkeypatch.setattr(transfer.BatchRing, "take", counted)
    loader = torch.utils.data.DataLoader(
        RingBatches(ring, count, 64),
        batch_size=None,
        num_workers=2,
        prefetch_factor=prefetch,
        multiprocessing_context=context,
    )
    seen = set()
    for worker, index, tensor in loader:
        assert torch.equal(tensor, expected(worker, index, 64))
        tensor.view(-1)[0] = -1  # its own, writable memory
        seen.add((worker, index))
    assert seen == {(w, i) for w in range(2) for i in range(count)}
    return taken


def test_batches_come_through_the_ring_slots_in_turn(monkeypatch):
    ring = transfer.BatchRing.for_batches(2, 2 * 2, 64 * 8)
    assert ring is not None and ring.per_worker == 5
    taken = ring_pass(monkeypatch, ring, prefetch=2)
    # Every tensor that fits a slot came through one (the loader's in-flight bound holds).
    assert len(taken) == sum(1 for i in range(60) if i % 7 != 3) * 2
    assert set(taken) == set(range(10))


def test_more_batches_in_flight_than_slots_go_by_value(monkeypatch):
    ring = transfer.BatchRing(2, 2, 64 * 8)
    taken = ring_pass(monkeypatch, ring, prefetch=16)
    assert 0 < len(taken) <= 2 * 60


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_workers_map_the_ring_through_its_memory_file(monkeypatch, context):
    ring = transfer.BatchRing.for_batches(2, 2 * 2, 64 * 8)
    assert ring is not None
    taken = ring_pass(monkeypatch, ring, prefetch=2, context=context, count=8)
    if not hasattr(os, "memfd_create"):  # no memory file to hand over: by value
        assert taken == []
        return
    assert len(taken) == sum(1 for i in range(8) if i % 7 != 3) * 2


def test_a_ring_pickled_other_than_for_a_new_worker_is_no_ring():
    ring = transfer.BatchRing.for_batches(2, 4, 64 * 8)
    assert pickle.loads(pickle.dumps(ring)) is None
    assert through_pipe(ring) is None


def test_a_ring_is_bounded_and_refuses_what_it_cannot_hold():
    assert transfer.BatchRing.for_batches(0, 4, 1024) is None
    assert transfer.BatchRing.for_batches(2, 4, transfer.RING_MAX_BYTES // 2) is None
    capped = transfer.BatchRing.for_batches(4, 64, 8 << 20)
    assert capped is not None and capped.per_worker == transfer.RING_MAX_BYTES // (4 * (8 << 20))
    ring = transfer.BatchRing(1, 2, 64)
    assert ring.put(torch.zeros(4)) is None  # the main process sends nothing
    with pytest.raises(RuntimeError, match="slot 1 cannot be read: it is free"):
        ring.take(1, 4, torch.int64, (8,))
    claimed = ring._states.claim(0, 0, 2)
    assert claimed is not None
    slot, tag = claimed
    with pytest.raises(RuntimeError, match="sent but not written"):
        ring.take(slot, tag, torch.int64, (8,))
    assert ring._states.send(slot, tag) and not ring._states.send(slot, tag)
    with pytest.raises(RuntimeError, match="another claim holds it"):
        ring.take(slot, tag + 4, torch.int64, (8,))
    with pytest.raises(ValueError, match="do not fit a 64-byte slot"):
        ring._states.lend(slot, tag, 65)
    with pytest.raises(IndexError, match="slot 2 of a ring of 2 slots"):
        ring._states.is_free(2)
    with pytest.raises(IndexError, match="slots 0..3"):
        ring._states.claim(0, 0, 3)
    with pytest.raises(ValueError, match="writable contiguous buffer"):
        transfer._native.SlotStates(b"\0" * 256, 2, 64, 64)
    with pytest.raises(ValueError, match="writable contiguous buffer"):
        transfer._native.SlotStates(bytearray(256), 2, 8, 64)  # no room for the counter
    with pytest.raises(ValueError, match="writable contiguous buffer"):
        transfer._native.SlotStates(bytearray(191), 2, 64, 64)
    del ring
    with pytest.raises(RuntimeError, match="no longer exists"):
        transfer._take(10**9, 0, 4, "int64", (1,))


def test_a_retired_ring_claims_nothing_and_gives_back_each_slot_as_its_batch_goes(monkeypatch):
    ring = transfer.BatchRing(1, 3, 64 << 10)  # slots of 16 pages
    monkeypatch.setattr(transfer, "get_worker_info", lambda: InWorker(0, 1))
    sent = [ring.put(torch.full((8 << 10,), k, dtype=torch.int64)) for k in range(3)]
    monkeypatch.setattr(transfer, "get_worker_info", lambda: None)
    kept = through_pipe(sent[0])
    unsent = ring._states.claim(2, 0, 3)  # all taken: nothing to claim
    assert unsent is None
    ring.retire()
    assert ring._states.retired
    with pytest.raises(RuntimeError, match="slot 1 cannot be read: the ring was retired"):
        through_pipe(sent[1])
    monkeypatch.setattr(transfer, "get_worker_info", lambda: InWorker(0, 1))
    assert ring.reserve(torch.int64, (8,)) is None
    monkeypatch.setattr(transfer, "get_worker_info", lambda: None)
    if hasattr(os, "memfd_create"):
        assert ring._fd is not None
        slot_pages = (64 << 10) // 512
        assert os.fstat(ring._fd).st_blocks <= slot_pages + 8  # the kept slot and the header
    assert torch.equal(kept, torch.full((8 << 10,), 0, dtype=torch.int64))
    del kept
    if hasattr(os, "memfd_create"):
        assert os.fstat(ring._fd).st_blocks <= 8


class InWorker:
    """get_worker_info() of DataLoader worker ``id`` of ``num_workers``."""

    def __init__(self, id: int, num_workers: int) -> None:
        self.id, self.num_workers = id, num_workers


def test_a_batch_built_in_its_slot_travels_without_a_copy_and_holds_it_until_gone(monkeypatch):
    ring = transfer.BatchRing(1, 3, 8 * 16)
    monkeypatch.setattr(transfer, "get_worker_info", lambda: InWorker(0, 1))
    built = ring.reserve(torch.int64, (2, 8))
    assert built is not None
    built.copy_(torch.arange(16).view(2, 8))
    sent = ring.put(built)
    assert isinstance(sent, transfer._InSlot) and sent.slot == 0
    copied = ring.put(torch.arange(100, 116).view(4, 4))  # not reserved: copied into slot 1
    assert copied is not None and copied.slot == 1
    assert ring.reserve(torch.int64, (17,)) is None  # larger than a slot
    # A reserved tensor keeps its slot from the next reservation until it is put or dropped.
    two = transfer.BatchRing(1, 2, 64)
    first, second = two.reserve(torch.int64, (8,)), two.reserve(torch.int64, (8,))
    assert first is not None and second is not None and two.reserve(torch.int64, (8,)) is None
    del first
    assert two.reserve(torch.int64, (8,)) is not None
    monkeypatch.setattr(transfer, "get_worker_info", lambda: None)

    got = through_pipe(sent)
    assert torch.equal(got, torch.arange(16).view(2, 8))
    assert got.data_ptr() == built.data_ptr()  # read in place
    again = through_pipe(copied)
    assert torch.equal(again, torch.arange(100, 116).view(4, 4))
    # The slot stays held while the tensor or any view of it lives.
    view = got[1]
    del got
    assert not ring._states.is_free(0)
    view[0] = -1  # writable
    del view
    assert ring._states.is_free(0)
    del again
    assert ring._states.is_free(1)


def test_two_rings_over_one_memory_never_claim_one_slot_twice(monkeypatch):
    """Two workers that both think they own a slot (two DataLoaders whose workers share a
    ring) cannot both claim it: claiming is a compare-and-swap, not a check then a write."""
    ring = transfer.BatchRing(1, 2, 64)
    twin = transfer.BatchRing.__new__(transfer.BatchRing)
    twin._layout(1, 2, 64)
    twin._map(ring._memory)  # the same shared memory, as a second worker group sees it
    twin.key = ring.key
    monkeypatch.setattr(transfer, "get_worker_info", lambda: InWorker(0, 1))
    claimed = [ring.reserve(torch.int64, (8,)), twin.reserve(torch.int64, (8,))]
    claimed += [ring.reserve(torch.int64, (8,)), twin.reserve(torch.int64, (8,))]
    pointers = [t.data_ptr() for t in claimed if t is not None]
    assert len(pointers) == 2 and len(set(pointers)) == 2  # the ring's 2 slots, once each


def test_a_slot_is_read_once_and_a_stale_release_frees_no_newer_claim(monkeypatch):
    ring = transfer.BatchRing(1, 1, 64)  # one slot: every claim is of slot 0
    monkeypatch.setattr(transfer, "get_worker_info", lambda: InWorker(0, 1))
    sent = ring.put(torch.arange(8))
    assert sent is not None
    monkeypatch.setattr(transfer, "get_worker_info", lambda: None)
    message = through_pipe_bytes(sent)
    got = pickle.loads(message)
    # The same message read again (a stale or repeated reference) gets nothing of the slot,
    # and so cannot free it under the first reader.
    with pytest.raises(RuntimeError, match="batch ring slot 0"):
        pickle.loads(message)
    assert not ring._states.is_free(0) and torch.equal(got, torch.arange(8))
    del got
    assert ring._states.is_free(0)
    # The slot claimed again (a newer generation): the old message still takes nothing.
    monkeypatch.setattr(transfer, "get_worker_info", lambda: InWorker(0, 1))
    newer = ring.reserve(torch.int64, (8,))
    assert newer is not None
    monkeypatch.setattr(transfer, "get_worker_info", lambda: None)
    with pytest.raises(RuntimeError, match="batch ring slot 0"):
        pickle.loads(message)
    assert not ring._states.is_free(0)


def through_pipe_bytes(value: object) -> bytes:
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def test_two_loaders_whose_workers_share_a_ring_get_their_own_batches():
    """Two DataLoaders (2 forked workers each) over datasets that hold one ring, read at once:
    each gets exactly its own tensors (a worker of each has the same id, so the same slots)."""
    ring = transfer.BatchRing.for_batches(2, 2 * 2, TAGGED * 8)
    assert ring is not None
    loaders = [
        torch.utils.data.DataLoader(
            TaggedBatches(ring, 300, tag),
            batch_size=None,
            num_workers=2,
            prefetch_factor=2,
            multiprocessing_context="fork",
        )
        for tag in (1, 2)
    ]
    seen: list[set[tuple[int, int]]] = [set(), set()]
    wrong = 0
    for pair in zip(*loaders, strict=True):
        for k, (tag, worker, index, tensor) in enumerate(pair):
            wrong += not torch.equal(tensor, tagged(tag, worker, index))
            seen[k].add((worker, index))
            del tensor
        del pair
    assert wrong == 0
    assert seen[0] == seen[1] == {(w, i) for w in range(2) for i in range(300)}


class TaggedBatches(torch.utils.data.IterableDataset):
    """Each worker sends ``count`` tensors of values of its own and of ``tag``."""

    def __init__(self, ring: transfer.BatchRing, count: int, tag: int) -> None:
        self.ring, self.count, self.tag = ring, count, tag

    def __iter__(self):
        worker = torch.utils.data.get_worker_info().id
        for index in range(self.count):
            tensor = tagged(self.tag, worker, index)
            yield transfer.for_transfer((self.tag, worker, index, tensor), self.ring)


TAGGED = 4096  # int64 values of a tensor: a copy into a slot takes a while


def tagged(tag: int, worker: int, index: int) -> torch.Tensor:
    return torch.arange(TAGGED, dtype=torch.int64) + 10**9 * tag + 10**6 * worker + 1000 * index
