"""How a DataLoader worker's batches reach the training process.

torch hands every tensor a worker sends through shared memory: a segment, a file descriptor
and a mapping per tensor, a fixed cost that dominates for the batches of a training step (8 x
2048 tokens: 128 KiB). Two cheaper ways, measured in benchmarks/tokens_loader.py:

- A :class:`BatchRing`, for a loader whose batches have a known largest size (``load_tokens``):
  shared-memory slots the loader maps before it starts its workers (forked ones inherit the
  mapping; spawned and forkserver ones map the same memory file on Linux). A worker builds a
  batch in its next free slot (:meth:`BatchRing.reserve`), or copies it there, and sends a few
  bytes through the DataLoader's pipe; the training process reads the batch in place, and the
  slot is free again once that tensor and every view of it are gone (``_native.HeldSlot``).
  A worker claims a slot with a compare-and-swap that writes an owner generation into the
  slot's state word (``_native.SlotStates``), and every later step (sent, lent, freed) swaps
  from that exact word: two worker groups that share a ring (two loaders over one dataset
  object) never write one slot at once, a message is read once, and a stale release frees no
  newer claim. Once the workers of its pass are gone the ring is retired: the pages of every
  slot not lent go back to the system, and a batch the training loop kept gives its slot's
  pages back when it goes, so one kept batch holds one slot's memory, not the ring's.
  For batches of a training step this is the fastest way, ahead of by value and far ahead of
  torch's shared memory, even when the training process copies the batches out.
- By value: up to BY_VALUE_BYTES a tensor is cheaper to copy through the pipe than torch's
  per-tensor shared memory (even near 1 MiB), so a worker wraps such tensors to be pickled as
  bytes.

Either way the training process gets writable tensors that no one else writes.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import mmap
import multiprocessing.context
import os
import weakref
from multiprocessing import reduction
from typing import Any

import torch
from torch.utils.data import get_worker_info

from syvain_training_data import _native

__all__ = ["BY_VALUE_BYTES", "BatchRing", "for_transfer", "tensor_for_transfer"]

BY_VALUE_BYTES = 512 << 10
# A ring never maps more than this (batches that find no slot go by value).
RING_MAX_BYTES = 256 << 20
_ALIGN = 64


class _ByValue:
    """A tensor that pickles as its bytes, dtype and shape."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor.contiguous()

    def __reduce__(self) -> tuple[Any, ...]:
        tensor = self.tensor
        data = ctypes.string_at(tensor.data_ptr(), tensor.nbytes) if tensor.nbytes else b""
        return (_rebuild, (data, _dtype_name(tensor.dtype), tuple(tensor.shape)))


def _rebuild(data: bytes, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_rings: weakref.WeakValueDictionary[int, BatchRing] = weakref.WeakValueDictionary()
_ring_keys = itertools.count()


class BatchRing:
    """Shared-memory slots of ``slot_bytes`` each, ``per_worker`` for each of ``workers``
    DataLoader workers (see the module's text).

    Made in the training process before it starts the workers: forked workers inherit the
    mapping; spawned and forkserver workers (on Linux) get the memory's file descriptor with
    the dataset that holds the ring and map it themselves. Worker w uses its slots
    [w * per_worker, (w + 1) * per_worker) in turn, the order in which the training process
    receives its batches, passing over a slot still held (kept by the training loop); each
    slot's state (``_native.SlotStates``, atomics) says who owns it. A tensor travels by value
    instead when it is larger than a slot or not on the CPU, when none of its worker's slots is
    free (more batches in flight than the ring holds, or kept by the training loop), or when its
    worker got no ring (a ring pickled other than while starting a worker is no ring, as is one
    spawned where there is no memfd): the ring never makes a worker wait. The ring must stay
    referenced while its batches may arrive; the memory stays mapped while a batch read from it
    lives, but once the ring is retired (:meth:`bind`) only a kept batch's own pages stay."""

    def __init__(self, workers: int, per_worker: int, slot_bytes: int) -> None:
        self._layout(workers, per_worker, slot_bytes)
        # Shared: forked workers inherit the mapping; spawned ones map the same memory file.
        self._fd = _memory_file(self._size)
        self._map(mmap.mmap(-1 if self._fd is None else self._fd, self._size))
        if self._fd is not None:
            weakref.finalize(self, os.close, self._fd)
        self.key = next(_ring_keys)
        _rings[self.key] = self

    def _layout(self, workers: int, per_worker: int, slot_bytes: int) -> None:
        self.workers = workers
        self.per_worker = per_worker
        self.slot_bytes = -(-slot_bytes // _ALIGN) * _ALIGN
        slots = workers * per_worker
        # The slots' state words, then the generation counter.
        self._header = -(-4 * (slots + 1) // _ALIGN) * _ALIGN
        self._size = self._header + slots * self.slot_bytes

    def _map(self, memory: mmap.mmap) -> None:
        self._memory = memory
        slots = self.workers * self.per_worker
        self._states = _native.SlotStates(memory, slots, self._header, self.slot_bytes)
        self._bytes = torch.frombuffer(memory, dtype=torch.uint8)
        self._turns = [0] * self.workers
        # In a worker: its slots claimed for a tensor not yet put (a weak reference to it, whose
        # end gives the claim back, and the claim's tag).
        self._reserved: dict[int, tuple[weakref.ReferenceType[torch.Tensor], int]] = {}
        self._bound = False

    @classmethod
    def for_batches(cls, workers: int, in_flight: int, batch_bytes: int) -> BatchRing | None:
        """A ring for ``workers`` workers, each with about ``in_flight`` batches of at most
        ``batch_bytes`` on their way (a DataLoader asks each worker for ``prefetch_factor``
        items; one worker may get more when the others are done, and those go by value), within
        RING_MAX_BYTES; None if two slots per worker exceed it."""
        if workers < 1:
            return None
        slot_bytes = max(batch_bytes, 1)
        per_worker = min(in_flight + 1, RING_MAX_BYTES // (workers * slot_bytes))
        if per_worker < 2:
            return None
        return cls(workers, per_worker, slot_bytes)

    def __reduce__(self) -> tuple[Any, ...]:
        # Only a worker being spawned gets the memory (its file descriptor goes with the
        # process); any other copy is no ring, and its batches go by value.
        if self._fd is None or multiprocessing.context.get_spawning_popen() is None:
            return (_no_ring, ())
        layout = (self.workers, self.per_worker, self.slot_bytes)
        return (_attach, (reduction.DupFd(self._fd), *layout, self.key))

    def reserve(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor | None:
        """In a worker: a tensor of ``shape`` in this worker's next free slot (claimed), for a
        batch to be built in place and then :meth:`put` (no copy); None if none is free or it
        does not fit. The slot stays the tensor's until it is put or dropped."""
        info = get_worker_info()
        size = math.prod(shape) * dtype.itemsize
        if info is None or info.id >= self.workers or size > self.slot_bytes:
            return None
        low = info.id * self.per_worker
        claimed = self._states.claim(low + self._turns[info.id], low, low + self.per_worker)
        if claimed is None:
            return None
        slot, tag = claimed
        start = self._header + slot * self.slot_bytes
        tensor = self._bytes[start : start + size].view(dtype).view(shape)
        self._reserved[slot] = (weakref.ref(tensor, _unclaim(self._states, slot, tag)), tag)
        self._turns[info.id] = (slot + 1 - low) % self.per_worker
        return tensor

    def put(self, tensor: torch.Tensor) -> _InSlot | None:
        """In a worker: ``tensor`` in a slot (where :meth:`reserve` placed it, or copied into
        the next free one), as the reference the training process turns back into a tensor;
        None if it does not go by the ring."""
        if tensor.device.type != "cpu" or tensor.is_sparse:
            return None
        slot = self._reserved_slot(tensor)
        if slot is None:
            slotted = self.reserve(tensor.dtype, tuple(tensor.shape))
            if slotted is None:
                return None
            slotted.copy_(tensor)
            slot = self._reserved_slot(slotted)
            assert slot is not None
        _, tag = self._reserved.pop(slot)
        if not self._states.send(slot, tag):  # the ring was retired meanwhile
            return None
        return _InSlot(self.key, slot, tag, _dtype_name(tensor.dtype), tuple(tensor.shape))

    def take(self, slot: int, tag: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """In the training process: the tensor sent in ``slot`` with ``tag``, read in place
        (once: RuntimeError for a slot that holds no such batch); the slot is free again when
        the tensor, and every view of it, is gone."""
        count = math.prod(shape)
        held = self._states.lend(slot, tag, count * dtype.itemsize)
        if not count:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(held, dtype=dtype, count=count).view(shape)

    def bind(self, iterator: object) -> None:
        """In the training process: retires this ring when ``iterator`` (the DataLoader
        iterator whose workers write it, which stops them when it goes) is gone: the slots'
        memory goes back to the system, each lent slot's once its batch is gone. Once per
        ring; a later call (persistent workers' next pass) changes nothing."""
        if not self._bound:
            self._bound = True
            weakref.finalize(iterator, self._states.retire)

    def retire(self) -> None:
        """In the training process, once no worker writes this ring any more (see
        :meth:`bind`): no slot is claimed again, and the memory of every slot whose batch is
        not held goes back to the system now, that of a held one when its batch is gone."""
        self._states.retire()

    def _reserved_slot(self, tensor: torch.Tensor) -> int | None:
        for slot, (reserved, _) in self._reserved.items():
            if reserved() is tensor:
                return slot
        return None


def _no_ring() -> None:
    return None


def _unclaim(states: _native.SlotStates, slot: int, tag: int) -> Any:
    """The callback that gives back claim ``tag`` of ``slot`` when its reserved tensor goes
    unsent (a sent one's claim is no longer a claim, and stays)."""
    return lambda _: states.unclaim(slot, tag)


def _memory_file(size: int) -> int | None:
    """A file descriptor of ``size`` bytes of memory (Linux's memfd), or None where there is
    none (the ring is then an anonymous mapping that only forked workers share)."""
    if not hasattr(os, "memfd_create"):
        return None
    fd = os.memfd_create("syvain-batch-ring", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _attach(fd: Any, workers: int, per_worker: int, slot_bytes: int, key: int) -> BatchRing:
    """In a spawned worker: the ring whose memory file ``fd`` (a ``DupFd``) is."""
    ring = BatchRing.__new__(BatchRing)
    ring._layout(workers, per_worker, slot_bytes)
    descriptor = fd.detach()
    try:
        ring._map(mmap.mmap(descriptor, ring._size))
    finally:
        os.close(descriptor)
    ring._fd, ring.key = None, key
    return ring


class _InSlot:
    """A reference to a tensor in a ring slot, as a worker sends it."""

    __slots__ = ("dtype", "key", "shape", "slot", "tag")

    def __init__(self, key: int, slot: int, tag: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.key, self.slot, self.tag, self.dtype, self.shape = key, slot, tag, dtype, shape

    def __reduce__(self) -> tuple[Any, ...]:
        return (_take, (self.key, self.slot, self.tag, self.dtype, self.shape))


def _take(key: int, slot: int, tag: int, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    ring = _rings.get(key)
    if ring is None:
        raise RuntimeError("A batch arrived through a batch ring that no longer exists")
    return ring.take(slot, tag, getattr(torch, dtype_name), shape)


def for_transfer(batch: Any, ring: BatchRing | None = None) -> Any:
    """``batch`` (a tensor, or a dict, list or tuple holding tensors) ready to leave a
    DataLoader worker: its tensors through ``ring`` when they fit, small CPU tensors otherwise
    wrapped to be sent by value; unchanged in the main process."""
    if get_worker_info() is None:
        return batch
    return _wrap(batch, ring)


def tensor_for_transfer(tensor: torch.Tensor, ring: BatchRing | None) -> Any:
    """In a DataLoader worker: ``tensor`` ready to leave it (:func:`for_transfer` of one
    tensor, for a caller that knows its batch's structure)."""
    slotted = ring.put(tensor) if ring is not None else None
    if slotted is not None:
        return slotted
    small = tensor.device.type == "cpu" and tensor.nbytes <= BY_VALUE_BYTES
    return _ByValue(tensor) if small and not tensor.is_sparse else tensor


def _wrap(value: Any, ring: BatchRing | None) -> Any:
    if isinstance(value, torch.Tensor):
        return tensor_for_transfer(value, ring)
    if isinstance(value, dict):
        return {key: _wrap(item, ring) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(_wrap(item, ring) for item in value)
    return value
