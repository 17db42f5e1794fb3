"""The mixed order of several streams (curriculum stages mixed by weight; SPEC section 6): a
pure function of the streams' lengths, the weights, the seed and the epoch."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterator, Sequence

from syvain_training_data import _native
from syvain_training_data.loading.block_order import plan_seed

__all__ = ["MIX_STOPS", "MixedOrder", "PhaseDraws"]

MIX_STOPS = ("first_exhausted", "all_exhausted")


class PhaseDraws:
    """The mixing phases of an epoch, drawn in turn (a schedule draws one set per segment).

    Seeded, they come from the order's one native generator. Unseeded mixing keeps drawing
    from ``random.Random(str).random()``, whose sequence Python promises to keep for a given
    seed, so the unseeded mixing states of earlier releases keep resuming."""

    def __init__(self, seed: int | None, epoch: int) -> None:
        self.seed, self.epoch = seed, epoch
        self.drawn = 0
        self._unseeded = random.Random(f"syvain-plan:None:{epoch}:mix") if seed is None else None

    def take(self, count: int) -> list[float]:
        """The next ``count`` phases, each in [0, 1)."""
        if self._unseeded is not None:
            return [self._unseeded.random() for _ in range(count)]
        seed = plan_seed(self.seed, self.epoch, "mix")
        phases = _native.unit_draws(self.drawn + count, seed)[self.drawn :]
        self.drawn += count
        return phases


class MixedOrder:
    """Streams merged by the key ``((i + phase_s) / share_s, s)`` of stream s's i-th record.

    Shares are the normalised weights and phases are drawn from (seed, epoch), so every stretch of
    the mixed order holds each stream in proportion to its weight. ``first_exhausted`` ends the
    order before the first key a stream cannot fill; ``all_exhausted`` keeps every record.
    ``phases`` given replace the drawn ones (a schedule's later segments continue the draws)."""

    def __init__(
        self,
        lengths: Sequence[int],
        weights: Sequence[float],
        mix_stop: str,
        seed: int | None,
        epoch: int,
        phases: Sequence[float] | None = None,
    ) -> None:
        total_weight = math.fsum(weights)
        self.lengths = list(lengths)
        self.shares = [weight / total_weight for weight in weights]
        if phases is None:
            phases = PhaseDraws(seed, epoch).take(len(lengths))
        self.phases = list(phases)
        if mix_stop == "all_exhausted":
            self.length = sum(self.lengths)
            self._end: tuple[float, int] | None = None
        else:
            self._end = min((self.key(s, n), s) for s, n in enumerate(self.lengths))
            self.length = sum(self._count_before(s, *self._end) for s in range(len(lengths)))

    def key(self, stream: int, index: int) -> float:
        return (index + self.phases[stream]) / self.shares[stream]

    def _count_le(self, stream: int, value: float) -> int:
        """How many of the stream's records have a key <= value (keys never decrease)."""
        length = self.lengths[stream]
        guess = math.floor(value * self.shares[stream] - self.phases[stream]) + 1
        index = min(max(guess, 0), length)
        while index > 0 and self.key(stream, index - 1) > value:
            index -= 1
        while index < length and self.key(stream, index) <= value:
            index += 1
        return index

    def _count_before(self, stream: int, value: float, tie_stream: int) -> int:
        """How many of the stream's records order before the key (value, tie_stream)."""
        if stream < tie_stream:
            return self._count_le(stream, value)
        return self._count_le(stream, math.nextafter(value, -math.inf))

    def prefix(self, position: int) -> list[int]:
        """Per stream, how many of its records are among the first ``position`` mixed ones."""
        if not 0 <= position <= self.length:
            raise ValueError(f"Mixed position {position} outside [0, {self.length}]")
        streams = range(len(self.lengths))
        if position == 0:
            return [0 for _ in streams]
        if position == self.length:
            if self._end is None:
                return list(self.lengths)
            return [self._count_before(s, *self._end) for s in streams]
        # The smallest key value whose records with keys <= it number at least `position`.
        low, high = -1.0, max(self.key(s, n) for s, n in enumerate(self.lengths))
        while True:
            middle = low + (high - low) / 2
            if middle <= low or middle >= high:
                break
            if sum(self._count_le(s, middle) for s in streams) >= position:
                high = middle
            else:
                low = middle
        counts = [self._count_le(s, math.nextafter(high, -math.inf)) for s in streams]
        missing = position - sum(counts)
        for s in streams:  # records whose key equals `high` order by stream
            take = min(missing, self._count_le(s, high) - counts[s])
            counts[s] += take
            missing -= take
        return counts

    def labels(self, start: int, stop: int) -> Iterator[int]:
        """The stream of each mixed position in [start, stop), in order."""
        low, high = self.prefix(start), self.prefix(stop)

        def keys(stream: int) -> Iterator[tuple[float, int]]:
            return ((self.key(stream, i), stream) for i in range(low[stream], high[stream]))

        for _, s in heapq.merge(*map(keys, range(len(self.lengths)))):
            yield s
