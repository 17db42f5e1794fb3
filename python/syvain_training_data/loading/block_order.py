"""The seeded epoch order of one stream (SPEC section 6, the ``seed`` bullet and the order, v4).

Every batch should mix the whole selection about as a uniform permutation would, yet a
consumer must stream: contiguous byte ranges, each shard's bytes fetched about once, memory
bounded whatever the dataset's size. So the order works on *blocks*, runs of consecutive
records of one shard (about 4 MiB of an indexed msgpack.zstf shard, see
``formats.shard_index``; a whole shard where the format or a missing index gives no random
access):

1. The shards are permuted, then cut into *groups* of about equal block counts, at most
   ``GROUP_BLOCKS`` blocks (or ``GROUP_SHARDS`` shards) each; group g covers the positions
   after groups 0..g-1.
2. Inside a group, all its blocks are permuted, and consecutive runs of blocks form *windows*
   of about equal size, ``window`` to ``2 x window - 1`` blocks (fewer only in a group of
   fewer blocks, or to hold no more than ``MAX_WINDOW_RECORDS`` records, as whole shards of
   datasets without indexes may), so no window is a remainder of a few blocks that a batch
   could not mix.
3. Inside a window, the blocks' records are interleaved in a seeded order that keeps each
   block's records in their own order and spreads them about evenly over the window
   (``_native.spread``): record j of a block of n records sits near j/n of the window, moved by
   a per-block phase and a per-record jitter of under half a round. A batch then draws from
   its window's blocks in proportion to their sizes with less spread than a uniformly random
   interleaving, which, among 64 equal blocks, repeats some block in most runs of 32 records
   (25.5 distinct blocks, where a uniform permutation of 100,000 shards gives 32). The previous
   release interleaved uniformly (``_native.interleave``); its states resume with that order.

Every permutation and interleaving comes from one pinned generator in the native core
(``syvain_core::order``: SplitMix64 and Fisher-Yates), seeded by the SHA-256 of the decision's
name (:func:`plan_seed`), so the order is the same on every Python version and platform.

Any stretch of a window then draws from ``window`` blocks spread over the whole group, as a
uniform permutation of the group would or with more distinct blocks. Because interleaving
keeps each block's order, the positions [a, b) of a window hold a contiguous run of records
of each of its blocks: a consumer reads one range per block, concurrently, and a part that
starts inside a window fetches only its own records (through the index). Planning costs one
pass over the shards per epoch and one pass over a group's blocks when a consumer first
reaches the group; a window's interleaving is computed when it is read.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import sys
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from syvain_training_data import _native

__all__ = [
    "DEFAULT_WINDOW_BLOCKS",
    "GROUP_BLOCKS",
    "GROUP_SHARDS",
    "BlockOrder",
    "Window",
    "permutation",
    "plan_seed",
    "window_counts",
]

# Blocks interleaved in a window: spread, a batch of 32 records of 64 equal blocks then comes
# from about 31 of them (uniformly interleaved, 25.3).
DEFAULT_WINDOW_BLOCKS = 64
# A group's block permutation is planned at once (8 bytes a block); about 64 GB of indexed
# shards per group.
GROUP_BLOCKS = 1 << 16
GROUP_SHARDS = 1 << 16
# Records a window interleaves at most (2 bytes of interleaving each), unless one block has more.
MAX_WINDOW_RECORDS = 1 << 21


def plan_seed(*parts: object) -> int:
    """The seed of one decision of the epoch order, named by ``parts``: the first 8 bytes,
    little-endian, of the SHA-256 of ``syvain-plan:{part}:{part}...``."""
    key = ":".join(map(str, ("syvain-plan", *parts)))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


def permutation(count: int, *parts: object) -> array[int]:
    """A uniformly random permutation of ``range(count)`` for the decision named by
    ``parts``, from the native generator."""
    items = array("q", _native.permutation(count, plan_seed(*parts)))
    if sys.byteorder == "big":
        items.byteswap()
    return items


def _even_cuts(total: int, most: int) -> int:
    """The size of the fewest about-equal parts of ``total`` that hold at most ``most`` each:
    a greedy cut at this size leaves no small remainder."""
    parts = max(1, -(-total // most))
    return -(-total // parts)


@dataclass(frozen=True)
class Window:
    """Positions [first, last) of the epoch order, holding ``blocks`` (shard index in the
    stream, first record, records) interleaved by ``labels`` (the block of each position, as
    u16; None when the window is one block read in order)."""

    first: int
    last: int
    blocks: tuple[tuple[int, int, int], ...]
    labels: memoryview | None


class _Group:
    """One group's block permutation and window bounds."""

    def __init__(self, order: BlockOrder, group: int) -> None:
        low, high = order.group_bounds[group], order.group_bounds[group + 1]
        self.shards = order.shard_order[low:high]
        self.sizes = [order.block_sizes[s] for s in self.shards]
        self.counts = [order.counts[s] for s in self.shards]
        per_shard = [-(-n // size) for n, size in zip(self.counts, self.sizes, strict=True)]
        self.block_starts = array("q", [0, *itertools.accumulate(per_shard)])
        blocks = self.block_starts[-1]
        self.permutation = permutation(
            blocks, order.seed, order.epoch, order.number, "blocks", group
        )
        # Windows: about equal runs of `window` to 2 x `window` - 1 consecutive blocks of the
        # permutation (a remainder would mix only its few blocks: 65 blocks are one window,
        # not 64 and one read alone), and no more records than MAX_WINDOW_RECORDS unless one
        # block holds more (its interleaving is then its own order): a window's interleaving
        # stays a few MiB.
        windows = max(blocks // order.window, -(-sum(self.counts) // MAX_WINDOW_RECORDS), 1)
        windows = min(windows, blocks)
        ends = {blocks * (w + 1) // windows for w in range(windows)}  # sizes differ by <= 1
        bounds, totals = [0], []
        held = 0
        for i, block in enumerate(self.permutation):
            count = self.block(block)[2]
            if i > bounds[-1] and (i in ends or held + count > MAX_WINDOW_RECORDS):
                bounds.append(i)
                totals.append(held)
                held = 0
            held += count
        bounds.append(blocks)
        totals.append(held)
        self.window_bounds = bounds
        self.window_starts = [0, *itertools.accumulate(totals)]

    def block(self, block: int) -> tuple[int, int, int]:
        """(shard index in the stream, first record, records) of the group's block."""
        k = bisect.bisect_right(self.block_starts, block) - 1
        shard, size = self.shards[k], self.sizes[k]
        first = (block - self.block_starts[k]) * size
        return shard, first, min(size, self.counts[k] - first)


class BlockOrder:
    """A stream's seeded epoch order; see the module docstring."""

    def __init__(
        self,
        counts: Sequence[int],
        block_sizes: Sequence[int],
        seed: int,
        epoch: int,
        number: int,
        window: int,
        spread: bool = True,
    ) -> None:
        self.counts, self.block_sizes = counts, block_sizes
        self.interleave = _native.spread if spread else _native.interleave
        self.seed, self.epoch, self.number = seed, epoch, number
        self.window = max(1, window)
        shard_order = permutation(len(counts), seed, epoch, number, "shards")
        self.shard_order = shard_order
        # Groups of about equal block and shard counts: a last group of a few blocks would
        # mix only among themselves.
        per_shard = [-(-count // size) for count, size in zip(counts, block_sizes, strict=True)]
        group_blocks = _even_cuts(sum(per_shard), GROUP_BLOCKS)
        group_shards = _even_cuts(len(counts), GROUP_SHARDS)
        bounds, totals = [0], []
        blocks = records = 0
        for i, shard in enumerate(shard_order):
            blocks += per_shard[shard]
            records += counts[shard]
            if blocks >= group_blocks or i + 1 - bounds[-1] >= group_shards:
                bounds.append(i + 1)
                totals.append(records)
                blocks = records = 0
        if bounds[-1] < len(shard_order):
            bounds.append(len(shard_order))
            totals.append(records)
        self.group_bounds = bounds
        self.group_offsets = [0, *itertools.accumulate(totals)]
        self.total = self.group_offsets[-1]
        self._groups: dict[int, _Group] = {}
        self._window: tuple[tuple[int, int], Window] | None = None

    def _group(self, group: int) -> _Group:
        found = self._groups.get(group)
        if found is None:
            if len(self._groups) >= 2:  # a consumer moves forward: keep the last two
                self._groups.pop(next(iter(self._groups)))
            found = self._groups[group] = _Group(self, group)
        return found

    def window_at(self, position: int) -> Window:
        """The window holding ``position`` (0 <= position < total)."""
        g = bisect.bisect_right(self.group_offsets, position) - 1
        group = self._group(g)
        base = self.group_offsets[g]
        w = bisect.bisect_right(group.window_starts, position - base) - 1
        if self._window is not None and self._window[0] == (g, w):
            return self._window[1]
        order = group.permutation
        low, high = group.window_bounds[w], group.window_bounds[w + 1]
        blocks = tuple(group.block(order[i]) for i in range(low, high))
        labels = None
        if len(blocks) > 1:
            seed = plan_seed(self.seed, self.epoch, self.number, "window", g, w)
            raw = self.interleave([count for _, _, count in blocks], seed)
            labels = memoryview(raw).cast("H")
        window = Window(
            base + group.window_starts[w], base + group.window_starts[w + 1], blocks, labels
        )
        self._window = ((g, w), window)
        return window

    def windows(self, start: int, stop: int) -> Iterator[tuple[Window, int, int]]:
        """The windows the positions [start, stop) touch, each with the positions wanted from
        it counted from its first: (window, low, high)."""
        while start < stop:
            window = self.window_at(start)
            end = min(stop, window.last)
            yield window, start - window.first, end - window.first
            start = end

    def records(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """(shard index in the stream, record) at each position of [start, stop), in order:
        the order itself, for tests and the plan-only benchmark."""
        for window, low, high in self.windows(start, stop):
            taken = window_counts(window, low)
            labels = window.labels
            for position in range(low, high):
                k = 0 if labels is None else labels[position]
                shard, first, _ = window.blocks[k]
                yield shard, first + taken[k]
                taken[k] += 1


def window_counts(window: Window, position: int) -> list[int]:
    """Per block of ``window``, how many of its records come before ``position`` (counted from
    the window's first)."""
    if window.labels is None:
        return [position]
    counts = [0] * len(window.blocks)
    if position >= len(window.labels):
        return [count for _, _, count in window.blocks]
    for label, count in Counter(window.labels[:position]).items():
        counts[label] = count
    return counts
