"""How ``load_tokens`` turns a consumer's records into batches, with no Python per token.

- :class:`TokenPacker` (``pack=True``): the records' tokens, each followed by ``eos_id`` when
  given, concatenated and cut into blocks of ``seq_len``; ``batch_size`` blocks make a batch.
- :class:`RowPacker` (``pack=False``): one record per row, truncated to ``seq_len`` or
  right-padded with ``pad_id``, with each row's length.

Either may add channels aligned with the tokens: ``positions`` (each token's index in its
document: 0 at a document's first token, counting on where a document continues from the
previous block or batch; an ``eos_id`` belongs to the document it ends) and ``loss_mask``
(the records' mask column; an appended ``eos_id`` is trained on). Every batch comes with the
position after it: (records of the part wholly consumed, tokens of the next consumed).
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy
import torch

from syvain_training_data import _native
from syvain_training_data.loading.list_columns import int_lists
from syvain_training_data.loading.transfer import BatchRing

__all__ = [
    "TRUNCATE_MODES",
    "BlockPacking",
    "Cut",
    "Records",
    "RowOptions",
    "RowPacker",
    "TokenChannels",
    "TokenPacker",
    "loss_mask",
    "pack_records",
    "pack_run",
]

# (batch, records wholly consumed, tokens of the next record consumed)
Packed = tuple[Any, int, int]


class Records(NamedTuple):
    """Consecutive records of a consumer's part: record i's tokens are
    ``values[bounds[i]:bounds[i + 1]]``; ``mask`` (bool, aligned with ``values``) holds their
    loss mask when the loader reads one."""

    values: torch.Tensor
    bounds: list[int]
    mask: torch.Tensor | None


@dataclass(frozen=True)
class TokenChannels:
    """What a batch holds beside its tokens. With none of them a batch is the tokens tensor
    itself; otherwise a dict of ``tokens`` and the channels."""

    documents: bool = False
    loss_mask: bool = False
    rows: bool = False  # one record per row, with ``lengths``

    @property
    def as_dict(self) -> bool:
        return self.documents or self.loss_mask or self.rows

    @property
    def tensors(self) -> int:
        """Tensors per batch."""
        return 1 + self.documents + self.loss_mask + self.rows


@dataclass(frozen=True)
class RowOptions:
    """``pack=False``: one record per row, padded with ``pad_id``; a record longer than a row
    is cut at its end (``truncate="right"``) or refused (``"error"``)."""

    pad_id: int
    truncate: str = "right"


TRUNCATE_MODES = ("right", "error")


def loss_mask(
    batch: Any, column: str, offsets: torch.Tensor, tokens: int, uri: str, first: int
) -> torch.Tensor:
    """The loss mask column of a decoded batch as a bool tensor aligned with its ``tokens``
    token values (token offsets ``offsets``). ValueError naming the shard and the record for a
    mask that is not a list of 0/1 ints of its record's length; ``first`` numbers the batch's
    first record in the shard."""
    try:
        mask_offsets, values = int_lists(batch, column)
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(
            f"The loss mask column {column!r} of shard {uri} is not a list of 0/1 ints in "
            f"every record ({error})"
        ) from None
    sizes, mask_sizes = offsets.diff(), mask_offsets.diff()
    if not torch.equal(sizes, mask_sizes.to(sizes.dtype)):
        k = int((sizes != mask_sizes).nonzero()[0])
        raise ValueError(
            f"Record {first + k} of shard {uri} has {int(mask_sizes[k])} loss mask values in "
            f"{column!r} for its {int(sizes[k])} tokens"
        )
    low, high = int(mask_offsets[0]), int(mask_offsets[-1])
    # numpy, not torch: torch splits a large elementwise op over its threads, and with the
    # decoder's thread on the other core the split waits out a time slice (the loss-mask case
    # of benchmarks/tokens_loader.py shows it).
    flat = values[low:high].numpy()
    if len(flat) and (flat.min() < 0 or flat.max() > 1):
        bad = int(((flat < 0) | (flat > 1)).nonzero()[0][0])
        k = int(torch.searchsorted(mask_offsets, bad + low, right=True)) - 1
        raise ValueError(
            f"Record {first + k} of shard {uri} has loss mask value {int(flat[bad])} in "
            f"{column!r}; a loss mask holds 0 or 1"
        )
    flags = torch.from_numpy(flat.astype(bool))
    start = int(offsets[0])
    if start == 0 and len(flags) == tokens:
        return flags
    mask = torch.zeros(tokens, dtype=torch.bool)
    mask[start : start + high - low] = flags
    return mask


class _Run:
    """Tokens of consecutive records held by a packer: records ``first``, ``first + 1``, ...
    from token ``offset`` of the first on; ``ends[i]`` is where record ``first + i`` ends in
    the run (the run may stop inside its last record, which then has no end). ``channels``
    are the tokens and the tensors aligned with them; ``taken`` tokens have gone into
    batches."""

    __slots__ = ("channels", "ends", "first", "length", "offset", "taken")

    def __init__(
        self, first: int, offset: int, channels: list[torch.Tensor], ends: list[int]
    ) -> None:
        self.first, self.offset, self.channels, self.ends = first, offset, channels, ends
        self.length = channels[0].shape[0]
        self.taken = 0

    def position(self, at: int) -> tuple[int, int]:
        """(records wholly consumed, tokens of the next consumed) after token ``at``."""
        ends = self.ends
        k = bisect.bisect_left(ends, at)
        if k < len(ends) and ends[k] == at:
            return self.first + k + 1, 0
        if k == 0:
            return self.first, self.offset + at
        return self.first + k, at - ends[k - 1]


class TokenPacker:
    """Cuts a stream of token runs into batches of ``batch_size`` blocks of ``seq_len``.

    A run is the tokens of consecutive records of the consumer's part (a decoded batch's token
    column is one); each batch comes with the position after its last token. In a DataLoader
    worker a batch is built in slots of ``ring`` when they are free (it then travels without a
    copy)."""

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        ring: BatchRing | None = None,
        channels: TokenChannels = TokenChannels(),
    ) -> None:
        self.seq_len = seq_len
        self.batch_tokens = seq_len * batch_size
        self._ring = ring
        self._channels = channels
        self._runs: collections.deque[_Run] = collections.deque()
        self._held = 0

    def add(
        self,
        first: int,
        offset: int,
        tokens: torch.Tensor,
        ends: list[int],
        mask: torch.Tensor | None = None,
    ) -> Iterator[Packed]:
        """Adds the tokens of records ``first``, ``first + 1``, ... from token ``offset`` of the
        first on; ``ends[i]`` is where record ``first + i`` ends in ``tokens``, ascending. A run
        that stops inside its last record (an ``eos_id`` may follow as a run of its own) has no
        end for it. ``mask``: the tokens' loss mask, when the batches hold one."""
        count = tokens.shape[0]
        if count == 0:
            return
        channels = [tokens]
        if self._channels.loss_mask:
            assert mask is not None
            channels.append(mask)
        self._runs.append(_Run(first, offset, channels, ends))
        self._held += count
        while self._held >= self.batch_tokens:
            yield self._take(self.batch_tokens)

    def finish(self, drop_last: bool) -> Iterator[Packed]:
        """The last, smaller batch of whole blocks (unless ``drop_last``); the rest, fewer than
        ``seq_len`` tokens, is left out."""
        blocks = self._held // self.seq_len
        if blocks and not drop_last:
            yield self._take(blocks * self.seq_len)

    def _take(self, count: int) -> Packed:
        pieces: list[list[torch.Tensor]] = [[] for _ in self._runs[0].channels]
        documents = _Documents() if self._channels.documents else None
        left = count
        while True:
            run = self._runs[0]
            start = run.taken
            available = run.length - start
            stop = start + min(available, left)
            for channel, piece in zip(pieces, run.channels, strict=True):
                channel.append(piece[start:stop] if start or stop < run.length else piece)
            if documents is not None:
                documents.add(run, start, stop)
            if available > left:
                run.taken = stop
                position = run.position(stop)
                break
            left -= available
            self._runs.popleft()
            if left == 0:
                position = run.position(stop)
                break
        self._held -= count
        # Its own storage: a view would pin, and send, a whole decoded batch.
        shape = (count // self.seq_len, self.seq_len)
        filled = [
            _joined(channel, _tensor(self._ring, channel[0].dtype, shape)) for channel in pieces
        ]
        if documents is not None:
            filled.insert(1, documents.positions(_tensor(self._ring, torch.int64, shape)))
        return _batch(self._channels, filled, None), *position


class _Documents:
    """Where documents start in a batch being taken, and the position each starts at (a
    record continued from before the batch starts at its count so far)."""

    __slots__ = ("at", "firsts", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.firsts: list[int] = []
        self.at = 0

    def add(self, run: _Run, start: int, stop: int) -> None:
        """Tokens [start, stop) of ``run`` come next in the batch."""
        ends = run.ends
        k = bisect.bisect_right(ends, start)
        self.starts.append(self.at)
        self.firsts.append(start + run.offset if k == 0 else start - ends[k - 1])
        inside = bisect.bisect_left(ends, stop, k)
        base = self.at - start
        self.starts.extend(base + end for end in ends[k:inside])
        self.firsts.extend(itertools.repeat(0, inside - k))
        self.at += stop - start

    def positions(self, out: torch.Tensor) -> torch.Tensor:
        _native.fill_positions(out.view(-1).numpy(), self.starts, self.firsts)
        return out


def _tensor(ring: BatchRing | None, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """An empty tensor for a batch: in a slot of ``ring`` when one is free."""
    slotted = None if ring is None else ring.reserve(dtype, shape)
    return torch.empty(shape, dtype=dtype) if slotted is None else slotted


def _joined(pieces: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    if len(pieces) > 1:
        torch.cat(pieces, out=out.view(-1))
    else:
        out.view(-1).copy_(pieces[0])
    return out


def _batch(
    channels: TokenChannels, tensors: list[torch.Tensor], lengths: torch.Tensor | None
) -> Any:
    """The batch a loader yields: the tokens alone, or a dict of them and their channels
    (``tensors`` in the order tokens, positions, loss mask)."""
    if not channels.as_dict:
        return tensors[0]
    found = iter(tensors)
    batch = {"tokens": next(found)}
    if channels.documents:
        batch["positions"] = next(found)
    if channels.loss_mask:
        batch["loss_mask"] = next(found)
    if lengths is not None:
        batch["lengths"] = lengths
    return batch


class RowPacker:
    """One record per row (``pack=False``): its tokens, then ``eos_id`` when given, truncated
    to ``seq_len`` (the caller refuses longer records when truncation is an error) and
    right-padded with ``pad_id``; ``lengths`` holds each row's tokens before the padding.
    Padding has mask 0 and positions that count on (one sequence per row)."""

    def __init__(
        self,
        seq_len: int,
        batch_size: int,
        pad_id: int,
        eos_id: int | None,
        ring: BatchRing | None = None,
        channels: TokenChannels = TokenChannels(rows=True),
    ) -> None:
        self.seq_len, self.batch_size = seq_len, batch_size
        self.pad_id, self.eos_id = pad_id, eos_id
        self._ring = ring
        self._channels = channels
        self._open: list[torch.Tensor] | None = None
        self._arrays: list[Any] = []  # numpy views of the open batch's tokens and mask
        self._lengths: list[int] = []
        self._read = 0  # records packed so far

    def pack(self, first: int, records: Records) -> Iterator[Packed]:
        """Adds records ``first``, ``first + 1``, ... (``records``), one row each."""
        bounds = records.bounds
        count = len(bounds) - 1
        self._read = first + count
        values = records.values.numpy()
        mask = None if records.mask is None else records.mask.view(torch.uint8).numpy()
        done = 0
        while done < count:
            if self._open is None:
                self._start()
            take = min(count - done, self.batch_size - len(self._lengths))
            self._fill(values, mask, bounds[done : done + take + 1])
            done += take
            if len(self._lengths) == self.batch_size:
                yield self._close(), first + done, 0

    def finish(self, drop_last: bool) -> Iterator[Packed]:
        """The last, smaller batch (unless ``drop_last``)."""
        if self._open is not None and self._lengths and not drop_last:
            yield self._close(), self._read, 0

    def _start(self) -> None:
        shape = (self.batch_size, self.seq_len)
        tokens = _tensor(self._ring, torch.int64, shape)
        self._open = [tokens]
        self._arrays = [tokens.numpy()]
        if self._channels.documents:  # one sequence per row, padding included
            positions = _tensor(self._ring, torch.int64, shape)
            positions.copy_(torch.arange(self.seq_len, dtype=torch.int64).expand(shape))
            self._open.append(positions)
        if self._channels.loss_mask:
            mask = _tensor(self._ring, torch.bool, shape)
            self._open.append(mask)
            self._arrays.append(mask.view(torch.uint8).numpy())
        self._lengths = []

    def _fill(self, values: Any, mask: Any, bounds: list[int]) -> None:
        """Writes the records of ``bounds`` (k + 1 offsets) into the next k rows."""
        rows = slice(len(self._lengths), len(self._lengths) + len(bounds) - 1)
        eos = self.eos_id is not None
        _native.fill_token_rows(
            values, bounds, self._arrays[0][rows], self.seq_len, self.pad_id, self.eos_id
        )
        if mask is not None:
            _native.fill_mask_rows(mask, bounds, self._arrays[1][rows], self.seq_len, eos)
        most = self.seq_len
        self._lengths.extend(
            min(high - low + eos, most) for low, high in itertools.pairwise(bounds)
        )

    def _close(self) -> Any:
        assert self._open is not None
        tensors, rows = self._open, len(self._lengths)
        if rows < self.batch_size:  # the last batch: its own, smaller tensors
            tensors = [tensor[:rows].clone() for tensor in tensors]
        self._open = None
        self._arrays = []
        lengths = torch.tensor(self._lengths, dtype=torch.int64)
        return _batch(self._channels, tensors, lengths)


def pack_run(
    packer: TokenPacker, index: int, records: Records, eos_id: int | None
) -> Iterator[Packed]:
    """Records ``index``, ``index + 1``, ... each followed by ``eos_id`` when given, into
    ``packer`` as one run."""
    values, bounds, mask = records
    low, high = bounds[0], bounds[-1]
    tokens = values[low:high]
    run_mask = None if mask is None else mask[low:high]
    if eos_id is None:
        return packer.add(index, 0, tokens, [end - low for end in bounds[1:]], run_mask)
    # Each record's eos goes after its tokens: record i's end moves by i + 1. numpy inserts
    # them in one pass on this thread (a large torch op waits for its second thread, busy
    # decoding).
    at = [end - low for end in bounds[1:]]
    ends = [end + i for i, end in enumerate(at, 1)]
    joined = torch.from_numpy(numpy.insert(tokens.numpy(), at, eos_id))
    joined_mask = None
    if run_mask is not None:  # an eos is trained on
        joined_mask = torch.from_numpy(numpy.insert(run_mask.numpy(), at, True))
    return packer.add(index, 0, joined, ends, joined_mask)


class Cut(NamedTuple):
    """Records of a consumer's part that a loader state cut: index in the part -> tokens of it
    already consumed; the epoch and the part, to name a record in an error."""

    at: dict[int, int]
    epoch: int
    part: Sequence[tuple[int, int]]


_EOS_MASK = torch.ones(1, dtype=torch.bool)


def pack_records(
    packer: TokenPacker, index: int, records: Records, eos_id: int | None, cut: Cut
) -> Iterator[Packed]:
    """As :func:`pack_run`, record by record, each from the token ``cut`` resumes it at."""
    values, bounds, mask = records
    eos = None if eos_id is None else torch.tensor([eos_id], dtype=torch.int64)
    for record, (low, high) in enumerate(zip(bounds, bounds[1:], strict=False), index):
        count = high - low
        start = cut.at.get(record, 0)
        length = count + (eos is not None)
        if start >= length and start > 0:
            raise ValueError(
                f"The loader state cuts record {_epoch_position(cut.part, record)} of epoch "
                f"{cut.epoch} at token {start}, but it holds {length}: the data changed since"
            )
        first = low + min(start, count)
        tokens = values[first:high]
        run_mask = None if mask is None else mask[first:high]
        if eos is None:
            yield from packer.add(record, start, tokens, [len(tokens)], run_mask)
        else:
            yield from packer.add(record, start, tokens, [], run_mask)
            yield from packer.add(record, count, eos, [1], None if mask is None else _EOS_MASK)


class BlockPacking:
    """``pack=True`` as :class:`RowPacker` is ``pack=False`` (records in, batches out): each run
    goes into ``packer`` whole, or record by record where a loader state cut one of its
    records (``cut``)."""

    def __init__(self, packer: TokenPacker, eos_id: int | None, cut: Cut) -> None:
        self._packer, self._eos_id, self._cut = packer, eos_id, cut
        self._cut_indices = sorted(cut.at)

    def pack(self, index: int, records: Records) -> Iterator[Packed]:
        """Records ``index``, ``index + 1``, ... (``records``) into blocks."""
        count = len(records.bounds) - 1
        k = bisect.bisect_left(self._cut_indices, index)
        if k < len(self._cut_indices) and self._cut_indices[k] < index + count:
            return pack_records(self._packer, index, records, self._eos_id, self._cut)
        return pack_run(self._packer, index, records, self._eos_id)

    def finish(self, drop_last: bool) -> Iterator[Packed]:
        return self._packer.finish(drop_last)


def _epoch_position(part: Sequence[tuple[int, int]], index: int) -> int:
    """The epoch position of the ``index``-th record of ``part``."""
    for start, stop in part:
        if index < stop - start:
            return start + index
        index -= stop - start
    raise IndexError(index)
